"""English names of the common language codes, for what the tool shows of a run's languages
(`serve`'s /languages, the metadata of an Argos package); an unknown code is shown as itself."""

from __future__ import annotations

from typing import Any

LANGUAGE_NAMES = {
    "ar": "Arabic", "de": "German", "en": "English", "es": "Spanish", "fr": "French", "it": "Italian", "ja": "Japanese",
    "nl": "Dutch", "ny": "Chichewa", "pl": "Polish", "pt": "Portuguese", "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian",
    "zh": "Chinese",
}


def language_name(code: str) -> str:
    """The English name of a language code, or the code itself when it is not one of ours."""
    return LANGUAGE_NAMES.get(code, code)


def pair_text(pairs: list[tuple[str, str]]) -> str:
    """'es -> en, ny -> en'."""
    return ", ".join(f"{s} -> {t}" for s, t in pairs)


UNNAMED = ("src", "tgt")  # the languages of a run that names none (data.src_lang and data.tgt_lang left as they are)


def choose_pair(pairs: list[tuple[str, str]], src: str | None, tgt: str | None, where: str) -> tuple[str, str]:
    """The pair a command translates with a run of `pairs`, from its --src-lang and --tgt-lang
    (None: not given) -> (source, target); the source shown as 'es/ny' where the run has several
    for the target and --src-lang is not given (the model needs no word of it). A missing
    --tgt-lang where the run has several targets, or a language the run does not translate, is a
    UserError naming `where` (the run) and its pairs."""
    from seq2seq_cli.errors import UserError

    if len(pairs) == 1 and pairs[0] == UNNAMED:  # a run that names no language takes the flags' word for it
        return src or pairs[0][0], tgt or pairs[0][1]
    targets = list(dict.fromkeys(t for _, t in pairs))
    if tgt is None:
        if len(targets) > 1:
            raise UserError(f"{where} translates into {', '.join(targets)} ({pair_text(pairs)}): "
                            "give the target language with --tgt-lang")
        tgt = targets[0]
    elif tgt not in targets:
        raise UserError(f"--tgt-lang {tgt}: {where} translates into {', '.join(targets)} ({pair_text(pairs)})")
    sources = [s for s, t in pairs if t == tgt]
    if src is None:
        return "/".join(sources), tgt
    if src not in sources:
        raise UserError(f"--src-lang {src} --tgt-lang {tgt}: {where} translates {pair_text(pairs)}")
    return src, tgt


def run_pairs(data: Any) -> dict[str, Any]:
    """A run's language pairs and the tokens that name its targets, as `Translator` fields
    (`data`: the run's `DataConfig`)."""
    tokens = {t: tok for t in data.targets if (tok := data.target_token(t)) is not None}
    return {"pairs": tuple(data.pairs), "target_tokens": tokens}


def pairs_line(data: Any) -> str:
    """The run's language pairs in one line, with the tokens that name its targets."""
    tokens = [f"{t} {tok}" for t in data.targets if (tok := data.target_token(t))]
    named = f"; the target named by the source token: {', '.join(tokens)}" if tokens else ""
    return f"language pairs: {pair_text(data.pairs)}{named}"
