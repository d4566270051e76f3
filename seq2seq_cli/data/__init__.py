"""Data: corpus formats, tokenizers, encoding to the Arrow cache, token-budget batches."""
