"""English names of the common language codes, for what the tool shows of a run's languages
(`serve`'s /languages, the metadata of an Argos package); an unknown code is shown as itself."""

from __future__ import annotations

LANGUAGE_NAMES = {
    "ar": "Arabic", "de": "German", "en": "English", "es": "Spanish", "fr": "French", "it": "Italian", "ja": "Japanese",
    "nl": "Dutch", "pl": "Polish", "pt": "Portuguese", "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}


def language_name(code: str) -> str:
    """The English name of a language code, or the code itself when it is not one of ours."""
    return LANGUAGE_NAMES.get(code, code)
