"""Translate lines, files and stdin with a trained run.

Input is read in chunks; each chunk is sorted by length, cut into batches by a source-token
budget, decoded, detokenised and written back in input order, so memory stays bounded on
large files and the output lines match the input lines one for one (an empty input line
gives an empty output line).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator, TextIO

import numpy as np
import torch

from seq2seq_cli.checkpoint import atomic_write, load_checkpoint
from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.data import pad_batch, token_batches
from seq2seq_cli.errors import UserError
from seq2seq_cli.model import Seq2SeqTransformer
from seq2seq_cli.search import Hypothesis, search
from seq2seq_cli.tokenizer import EOS, load_tokenizers


@dataclass
class Translator:
    """A loaded run: model, tokenizers and the decoding options to use."""

    model: Seq2SeqTransformer
    src_sp: object
    tgt_sp: object
    decode: DecodeConfig
    device: torch.device

    @classmethod
    def load(cls, model_path: str | Path, device: str = "auto", **overrides: object) -> Translator:
        dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device))
        model, config, run_dir, _ = load_checkpoint(model_path, dev)
        src_sp, tgt_sp = load_tokenizers(run_dir, config.tokenizer.joint)
        settings = config.decode.model_dump()
        settings.update({k: v for k, v in overrides.items() if v is not None})
        try:
            decode = DecodeConfig(**settings)
        except ValueError as exc:
            raise UserError(str(exc).splitlines()[0]) from None
        return cls(model, src_sp, tgt_sp, decode, dev)

    def translate_hypotheses(self, lines: list[str], nbest: int = 1) -> list[list[Hypothesis]]:
        """Decode a list of sentences -> their n-best hypotheses, in input order."""
        d = self.decode
        limit = self.model.cfg.max_positions - 1
        ids = [s[: limit - 1] + [EOS] for s in self.src_sp.encode(lines)]
        out: list[list[Hypothesis]] = [[] for _ in lines]
        todo = [i for i, line in enumerate(lines) if line.strip()]
        lens = np.array([len(ids[i]) for i in todo], dtype=np.int64)
        budget = max(d.batch_tokens // d.beam_size, 1)
        for batch in token_batches(lens, lens, budget):
            rows = [todo[j] for j in batch]
            src = pad_batch([ids[i] for i in rows], [], []).to(self.device)
            hyps = search(self.model, src, d.beam_size, d.length_penalty, d.max_len_a, d.max_len_b, nbest)
            for i, h in zip(rows, hyps):
                out[i] = h
        for i in set(range(len(lines))) - set(todo):
            out[i] = [Hypothesis([], 0.0, 0.0)] * nbest
        return out

    def detokenize(self, hyp: Hypothesis) -> str:
        return self.tgt_sp.decode(hyp.tokens)

    def translate(self, lines: list[str]) -> list[str]:
        """Translate sentences (1-best) in input order."""
        return [self.detokenize(h[0]) for h in self.translate_hypotheses(lines)]

    def translate_stream(self, lines: Iterable[str], chunk_lines: int = 10000) -> Iterator[str]:
        """Translate an iterable of lines chunk by chunk; yields one output line per input line."""
        it = iter(lines)
        while chunk := [line.rstrip("\r\n") for line in islice(it, chunk_lines)]:
            yield from self.translate(chunk)


def read_lines(path: Path) -> list[str]:
    """All lines of a UTF-8 text file, with a clear error for a missing file or bad encoding."""
    if not path.is_file():
        raise UserError(f"{path}: input file not found")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        offset = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1)
        raise UserError(f"{path}:{line}: invalid UTF-8 at byte {offset} of the line ({exc.reason})") from None
    return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n") if text else []


def write_lines(path: Path, lines: Iterable[str]) -> int:
    """Write lines to `path` atomically (temp file, then rename); returns the number written."""
    if not path.parent.exists():
        raise UserError(f"{path}: output directory {path.parent} does not exist")
    count = 0

    def write(tmp: str) -> None:
        nonlocal count
        with open(tmp, "w", encoding="utf-8") as f:
            for line in lines:
                f.write(line + "\n")
                count += 1

    atomic_write(path, write)
    return count


def translate_file(translator: Translator, src: str, out: str, progress: bool = True) -> int:
    """Translate `src` ('-' = stdin) into `out` ('-' = stdout); returns the number of lines."""
    from tqdm import tqdm

    if src == "-":
        interactive = sys.stdin.isatty()
        stream: Iterable[str] = sys.stdin
        chunk = 1 if interactive else 10000
    else:
        stream = read_lines(Path(src))
        chunk = 10000
    total = len(stream) if isinstance(stream, list) else None
    outputs = translator.translate_stream(
        tqdm(stream, total=total, unit="sent", disable=not progress or total is None, file=sys.stderr), chunk
    )
    if out == "-":
        count = 0
        sink: TextIO = sys.stdout
        for line in outputs:
            sink.write(line + "\n")
            if chunk == 1:
                sink.flush()
            count += 1
        return count
    return write_lines(Path(out), outputs)
