"""The model: the encoder-decoder Transformer, its masks and key/value cache, its parameter and FLOP accounting."""
