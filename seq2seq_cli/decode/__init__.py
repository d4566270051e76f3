"""Decoding: search, the translator, oneDNN packing for CPU, evaluation with sacreBLEU."""
