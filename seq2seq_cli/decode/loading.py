"""The translator of a run with its engine and threads: the one place where `translate`,
`evaluate` and `serve` decide who searches.

`--engine torch` is our searches alone. `--engine ctranslate2` attaches the CTranslate2 engine
(`ctranslate2_engine.py`), which decodes what it can and leaves the rest to our searches.
`--engine auto` (the default) attaches it where it can run and decode the options given:
CTranslate2 installed, one model (not an ensemble), a compute type it has for the device and
precision, options it decodes as our search does (no sampling, no n-best list, no forced
prefixes or constraints ...); else our searches, and `Choice.why` says why.

On a CPU the CTranslate2 engine starts without torch: the run is checked (`open_run`), the
converted model kept in the run is loaded, and the translator's own model is loaded (torch
imported) the first time a sentence needs our searches (`Deferred`). The CPU threads go to
whichever engine searches: CTranslate2 takes them, torch keeps one (`claim_threads`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seq2seq_cli.choices import Engine
from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.decode.deferred import Deferred
from seq2seq_cli.decode.options import check_nbest, decode_settings, flag_name
from seq2seq_cli.decode.shortlisting import read_shortlist, shortlist_of, shortlisted
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.device import decoding_precision
from seq2seq_cli.errors import UserError
from seq2seq_cli.languages import run_pairs
from seq2seq_cli.run.loaded import RunFiles, open_run

if TYPE_CHECKING:
    import torch

    from seq2seq_cli.decode.steps import Decoder
    from seq2seq_cli.run.loaded import LoadedRun

ENSEMBLE = "--engine ctranslate2 decodes one model; an ensemble (--model given twice or more) decodes with --engine torch"


@dataclass
class Choice:
    """The translator and, when CTranslate2 does not search, why."""

    translator: Translator
    why: str | None = None

    def describe(self) -> str:
        """The path decoding takes, for the first log line: 'es -> en, searched by CTranslate2, shortlist'."""
        t = self.translator
        src, tgt = t.languages
        parts = [f"{src} -> {tgt}", f"searched by {t.engine.name}" if t.engine is not None else "our searches"]
        if t.shortlist_file is not None:
            parts.append("shortlist")
        if t.decode.quantize != "none" and t.engine is not None:  # CTranslate2's int8 is not ours
            parts.append(f"{t.decode.quantize} as CTranslate2 quantizes (outputs differ from --engine torch's)")
        elif t.decode.quantize != "none":
            parts.append(t.decode.quantize)
        if self.why:
            parts.append(f"not CTranslate2: {self.why}")
        return ", ".join(parts)


def load_translator(
    models: Sequence[str | Path], device: str = "auto", overrides: Mapping[str, object] | None = None,
    tag: str | None = None, engine: Engine = Engine.auto, nbest: int = 1, per_line: str | None = None,
    src_lang: str | None = None, tgt_lang: str | None = None,
) -> Choice:
    """The translator of `models` (one run, or several as an ensemble) on `device`, with the
    decoding `overrides` (DecodeConfig keys, checked), `tag` in front of every source line, and
    the engine `engine` names (`auto`: CTranslate2 where it can run and decode `nbest` outputs
    per line; `per_line`, when given, says why the lines need our searches: prefixes, constraints),
    for the language pair `src_lang` and `tgt_lang` pick (`Translator.with_pair`). Options that
    cannot go together are refused here, before the command says which path decodes."""
    choice = choose(models, device, overrides, tag, engine, nbest, per_line)
    check_nbest(nbest, choice.translator.decode, flag_name)
    choice.translator = choice.translator.with_pair(src_lang, tgt_lang)
    return choice


def choose(models: Sequence[str | Path], device: str, overrides: Mapping[str, object] | None, tag: str | None,
           engine: Engine, nbest: int, per_line: str | None) -> Choice:
    """`load_translator`'s choice of engine, its translator loaded."""
    models = list(models)
    overrides = dict(overrides or {})
    if engine is Engine.torch:
        return Choice(Translator.load(models, device, overrides).with_tag(tag))
    why = None
    if len(models) > 1:
        if engine is Engine.ctranslate2:
            raise UserError(ENSEMBLE)
        why = "an ensemble decodes with our searches"
    elif importlib.util.find_spec("ctranslate2") is None:
        if engine is Engine.ctranslate2:
            raise UserError("--engine ctranslate2 needs the ctranslate2 package: pip install ctranslate2")
        why = "ctranslate2 is not installed"
    elif engine is Engine.auto and per_line:
        why = per_line
    if why is not None:
        return Choice(Translator.load(models, device, overrides).with_tag(tag), why)
    files = open_run(models[0])
    decode = decode_settings(files.config.decode, overrides, int(files.meta["tgt_vocab"]), flag_name)
    if on_cpu_without_torch(device):
        decoding_precision(decode, "cpu")  # our searches' settings are refused at once, not when first needed
    if engine is Engine.auto:
        from seq2seq_cli.decode.ctranslate2_engine import why_not

        why = why_not(decode, nbest)
        if why is not None:
            return Choice(Translator.load(models, device, overrides).with_tag(tag), why)
    try:
        if on_cpu_without_torch(device):
            return Choice(with_engine_on_cpu(files, decode).with_tag(tag))
        return Choice(with_engine_on_device(models[0], device, overrides).with_tag(tag))
    except UserError as exc:
        if engine is Engine.ctranslate2:
            raise
        return Choice(Translator.load(models, device, overrides).with_tag(tag), str(exc))


def on_cpu_without_torch(device: str) -> bool:
    """Whether `device` is the CPU, as torch would pick it, decided without torch: cpu, or auto
    where CTranslate2 sees no CUDA device."""
    if device == "cpu":
        return True
    import ctranslate2

    return device == "auto" and ctranslate2.get_cuda_device_count() == 0


def with_engine_on_cpu(files: RunFiles, decode: DecodeConfig) -> Translator:
    """The deferred translator of `files` (`deferred_translator`) with the CTranslate2 engine on
    the CPU's threads; the run's model is loaded here only when the run holds no conversion of
    its checkpoint yet."""
    from seq2seq_cli.decode.ctranslate2_engine import ctranslate2_engine
    from seq2seq_cli.device import cpu_threads

    threads = cpu_threads()
    run: Deferred[LoadedRun] = Deferred(lambda: load_checked(files))
    translator = deferred_translator(files, decode, run)
    engine = ctranslate2_engine(files, decode, "cpu", 0, threads, translator.shortlist_file is not None,
                                lambda: run.get().model)
    return translator.with_engine(engine)


def with_engine_on_device(model: str | Path, device: str, overrides: dict[str, object]) -> Translator:
    """The translator of `model` loaded on `device` (CUDA) with the CTranslate2 engine attached."""
    from seq2seq_cli.decode.ctranslate2_engine import claim_threads, with_ctranslate2

    threads = claim_threads()
    translator = Translator.load([model], device, overrides)
    return with_ctranslate2(translator, model, threads)


def load_checked(files: RunFiles) -> LoadedRun:
    """The run `files` describe, loaded (float32, on the CPU) and verified, with torch's threads
    left to CTranslate2 (`claim_threads`): the weights `files` were opened with, which the
    engine holds, even where training has replaced the checkpoint since (`load_opened`)."""
    from seq2seq_cli.decode.ctranslate2_engine import claim_threads
    from seq2seq_cli.run.loaded import load_opened

    claim_threads()
    return load_opened(files, "cpu")


def deferred_translator(files: RunFiles, decode: DecodeConfig, run: Deferred[LoadedRun]) -> Translator:
    """The translator of the run `files` describe, on the CPU, whose model is `run`'s, loaded
    and packed for decoding the first time our searches need it (`Translator.load` packs it at
    once)."""
    shortlist = shortlist_of(files.layout, decode, 1)

    def load_model() -> Decoder:
        import torch

        from seq2seq_cli.decode.onednn import for_decoding
        from seq2seq_cli.device import decoding_dtype

        return for_decoding(run.get().model.to(decoding_dtype(decode, torch.device("cpu"))), decode.quantize)

    model = Deferred(load_model)

    def load_listed() -> Decoder | None:
        assert shortlist is not None
        one: Any = model.get()  # one model, never an ensemble
        return shortlisted(one, read_shortlist(shortlist, files.src_sp, files.tgt_sp))

    def cpu() -> torch.device:
        run.get()  # torch's threads are claimed first
        import torch

        return torch.device("cpu")

    config = files.config
    tags = None if config.tokenizer.vocabulary == "file" else tuple(config.data.tags)
    later: Any = Deferred  # the fields hold Deferred values (`OnFirstUse`); mypy knows them by their values' types
    return Translator(later(model.get), files.src_sp, files.tgt_sp, decode, later(cpu), files.run_dir,
                      (config.data.src_lang, config.data.tgt_lang), tags=tags,
                      listed=None if shortlist is None else later(load_listed), shortlist_file=shortlist,
                      model_config=config.model, **run_pairs(config.data))
