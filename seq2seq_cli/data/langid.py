"""Language identification of a side of a pair: py3langid (langid.py's naive Bayes model over
byte n-grams, 97 languages, shipped inside the package: nothing is downloaded).

A side is in its language unless the model gives that language a probability below
`min_prob` (over all 97). The model's single best guess would be stricter than needed: on
the shipped corpus's 1909 Spanish it names Extremaduran or Galician for 3% of the verses,
while English text in the Spanish slot gets a Spanish probability under 0.01.
"""

from __future__ import annotations

from functools import cache, lru_cache
from typing import Any

# ISO 639-2/3 codes of languages the model knows by their two-letter codes
THREE_LETTERS = {
    "eng": "en", "spa": "es", "fra": "fr", "fre": "fr", "deu": "de", "ger": "de", "ita": "it", "por": "pt", "nld": "nl",
    "dut": "nl", "rus": "ru", "zho": "zh", "chi": "zh", "jpn": "ja", "kor": "ko", "ara": "ar", "cat": "ca", "pol": "pl",
    "tur": "tr", "ukr": "uk", "ces": "cs", "cze": "cs", "swe": "sv", "dan": "da", "fin": "fi", "ell": "el", "gre": "el",
    "hun": "hu", "ron": "ro", "rum": "ro", "bul": "bg", "heb": "he", "hin": "hi", "eus": "eu", "baq": "eu", "glg": "gl",
}


@lru_cache(maxsize=1)
def _identifier() -> Any:
    """The model, loaded once per process (about a second)."""
    try:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier
    except ImportError as exc:  # a broken install: py3langid is a dependency
        from seq2seq_cli.errors import UserError

        raise UserError(f"data.filters.langid needs py3langid ({exc}); pip install py3langid, "
                        "or set data.filters.langid: false") from None
    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


@cache
def languages() -> tuple[str, ...]:
    return tuple(_identifier().labels)


def identifier_code(lang: str) -> str:
    """The model's code of a data.src_lang/tgt_lang setting (es, es-MX, es_ES, spa -> es), or
    "" when the model does not know the language (that side is not checked)."""
    base = lang.strip().lower().replace("_", "-").split("-", 1)[0]
    base = THREE_LETTERS.get(base, base)
    return base if base in languages() else ""


def probabilities(text: str) -> dict[str, float]:
    """The model's probability of each language it knows (by its code) for `text`."""
    return {lang: float(p) for lang, p in _identifier().rank(text)}


def probability(text: str, code: str) -> float:
    """The model's probability that `text` is in language `code`."""
    return probabilities(text).get(code, 0.0)


def in_language(text: str, code: str, min_prob: float) -> bool:
    """Whether `text` is in language `code` (see the module); always true where code is ""."""
    return not code or probability(text, code) >= min_prob
