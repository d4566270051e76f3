"""The runs one `seq2seq serve` holds: each run's pairs, checked at start, and its translators,
loaded at start (the default) or on first use with `--max-loaded N`, the least recently used
unloaded to make room.

A run gives one translator per language pair it learned (`Translator.with_pair`: a multilingual
run's target token in front of each source), all sharing the run's model.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from seq2seq_cli.choices import Engine
from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.errors import UserError
from seq2seq_cli.languages import pair_text
from seq2seq_cli.layout import CHECKPOINTS, CONFIG

log = logging.getLogger("seq2seq.serve")
Pair = tuple[str, str]


@dataclass
class ServedRun:
    """One run of the server: its name (the path it was given by), its pairs, the decoding settings
    requests start from, and its translators while loaded (`load` loads them)."""

    name: str
    pairs: list[Pair]
    decode: DecodeConfig
    target_vocabulary: int
    load: Callable[[], tuple[dict[Pair, Translator], str]] | None = None  # None: given loaded, never unloaded
    translators: dict[Pair, Translator] | None = None
    path: Path | None = None
    describe: str = ""  # the path its decoding takes ('searched by CTranslate2, shortlist')
    last_used: float = 0.0
    loads: int = 0  # times it was loaded

    @classmethod
    def of_translator(cls, translator: Translator, name: str | None = None) -> ServedRun:
        """A run served with the translator given (for its one pair), loaded for good."""
        pair = translator.languages
        label = name or (str(translator.run_dir) if translator.run_dir is not None else "model")
        return cls(label, [pair], translator.decode, int(translator.tgt_sp.get_piece_size()),
                   translators={pair: translator}, path=translator.run_dir)

    @property
    def loaded(self) -> bool:
        return self.translators is not None


def run_paths(models: Sequence[Path]) -> list[Path]:
    """The runs `--model` names: each a run directory or a checkpoint, or a folder holding runs
    (each subfolder with a config.yaml, in name order)."""
    found: list[Path] = []
    for model in models:
        if model.is_dir() and not (model / CONFIG).is_file() and not model.name == CHECKPOINTS:
            runs = sorted(p for p in model.iterdir() if p.is_dir() and (p / CONFIG).is_file())
            if not runs:
                raise UserError(f"{model}: neither a run (no {CONFIG}) nor a folder holding runs (no subfolder has one)")
            found.extend(runs)
        else:
            found.append(model)
    return found


def open_served(path: Path, device: str, overrides: Mapping[str, object], tag: str | None, engine: Engine) -> ServedRun:
    """The run at `path`, checked (`open_run`) and not loaded yet."""
    from seq2seq_cli.decode.options import decode_settings, flag_name
    from seq2seq_cli.run.loaded import open_run

    files = open_run(path)
    data = files.config.data
    pairs = list(data.pairs) or [(data.src_lang, data.tgt_lang)]
    vocabulary = int(files.meta["tgt_vocab"])
    decode = decode_settings(files.config.decode, dict(overrides), vocabulary, flag_name)

    def load() -> tuple[dict[Pair, Translator], str]:
        from seq2seq_cli.decode.loading import choose

        choice = choose([path], device, overrides, tag, engine, 1, None)
        base = choice.translator
        translators = {pair: base.with_pair(*pair) for pair in pairs}
        choice.translator = translators[pairs[0]]
        described = choice.describe().split(", ", 1)
        return translators, described[1] if len(described) > 1 else ""

    return ServedRun(str(path), pairs, decode, vocabulary, load, path=files.run_dir)


@dataclass
class Pool:
    """The server's runs, loaded at most `max_loaded` at once (None: all, at start)."""

    runs: list[ServedRun]
    max_loaded: int | None = None
    unloaded: Callable[[ServedRun], None] = lambda run: None  # told when a run is unloaded
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def load_all(self) -> None:
        for run in self.runs:
            self.translator(run, run.pairs[0])

    def translator(self, run: ServedRun, pair: Pair) -> Translator:
        """The translator of `run` for `pair`, the run loaded first where it is not (and the least
        recently used loaded run unloaded where `max_loaded` are loaded)."""
        with self._lock:
            run.last_used = time.monotonic()
            if run.translators is None:
                assert run.load is not None
                loaded = [r for r in self.runs if r.loaded and r.load is not None]
                if self.max_loaded is not None and len(loaded) >= self.max_loaded:
                    oldest = min(loaded, key=lambda r: r.last_used)
                    oldest.translators = None
                    self.unloaded(oldest)
                    log.warning("unloaded %s (--max-loaded %d)", oldest.name, self.max_loaded)
                started = time.monotonic()
                run.translators, run.describe = run.load()
                run.loads += 1
                if run.loads > 1 or self.max_loaded is not None:
                    log.warning("loaded %s in %.1f s", run.name, time.monotonic() - started)
            return run.translators[pair]

    def loaded_count(self) -> int:
        return sum(r.loaded for r in self.runs)


def describe_runs(pool: Pool) -> list[str]:
    """One line per run for the server's first lines: its name, pairs and decoding path."""
    lines = []
    for run in pool.runs:
        how = f", {run.describe}" if run.describe else ""
        state = "" if run.loaded else ", loaded on first use"
        lines.append(f"{run.name} ({pair_text(run.pairs)}{how}{state})")
    return lines
