"""Decoding: the searches, the engines (ours and CTranslate2's), the translator, evaluation with sacreBLEU."""
