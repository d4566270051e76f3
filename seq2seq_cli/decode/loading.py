"""The translator of a run with its engine and threads: the one place where `translate`,
`evaluate` and `serve` decide who searches.

`--engine torch` is our searches alone. `--engine ctranslate2` attaches the CTranslate2 engine
(`ctranslate2_engine.py`), which decodes what it can and leaves the rest to our searches.
`--engine auto` attaches it where it can run: CTranslate2 installed, one model (not an
ensemble), a compute type it has for the device and precision; else our searches, and
`Choice.why` says why. The CPU threads go to whichever engine searches: CTranslate2 takes them
from torch before torch computes anything (`claim_threads`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from seq2seq_cli.choices import Engine
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.errors import UserError


@dataclass
class Choice:
    """The translator and, when the engine asked for was not the one that searches, why."""

    translator: Translator
    why: str | None = None

    def describe(self) -> str:
        """The path decoding takes, for the first log line: 'es -> en, searched by CTranslate2, shortlist'."""
        t = self.translator
        src, tgt = t.languages
        parts = [f"{src} -> {tgt}", f"searched by {t.engine.name}" if t.engine is not None else "our searches"]
        if t.listed is not None:
            parts.append("shortlist")
        if t.decode.quantize != "none":
            parts.append(t.decode.quantize)
        if self.why:
            parts.append(f"not CTranslate2: {self.why}")
        return ", ".join(parts)


def load_translator(
    models: Sequence[str | Path], device: str = "auto", overrides: Mapping[str, object] | None = None,
    tag: str | None = None, engine: Engine = Engine.auto,
) -> Choice:
    """The translator of `models` (one run, or several as an ensemble) on `device`, with the
    decoding `overrides` (DecodeConfig keys, checked), `tag` in front of every source line, and
    the engine `engine` names (`auto`: CTranslate2 where it can run)."""
    models = list(models)
    ctranslate2_possible = engine is not Engine.torch and len(models) == 1
    why = None
    if engine is Engine.auto and importlib.util.find_spec("ctranslate2") is None:
        ctranslate2_possible, why = False, "ctranslate2 is not installed"
    elif engine is Engine.auto and len(models) > 1:
        why = "an ensemble decodes with our searches"
    threads = torch.get_num_threads()
    if ctranslate2_possible:
        from seq2seq_cli.decode.ctranslate2_engine import claim_threads

        claim_threads()
    translator = Translator.load(models, device, dict(overrides or {})).with_tag(tag)
    if not ctranslate2_possible:
        if engine is Engine.ctranslate2:  # several models
            raise UserError("--engine ctranslate2 decodes one model; an ensemble (--model given twice or more) "
                            "decodes with --engine torch")
        return Choice(translator, why)
    from seq2seq_cli.decode.ctranslate2_engine import with_ctranslate2

    try:
        return Choice(with_ctranslate2(translator, models[0], threads))
    except UserError as exc:
        if engine is Engine.ctranslate2:
            raise
        torch.set_num_threads(threads)  # our searches take the threads back
        return Choice(translator, str(exc))
