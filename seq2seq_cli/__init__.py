"""seq2seq: train and run encoder-decoder Transformers for translation."""

__version__ = "0.1.0"
