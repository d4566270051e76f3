"""Scoring pairs under a trained model (`seq2seq score`), as Marian's scorer does: each pair's
target is fed to the decoder after its source (teacher forcing), and its score is the mean
log-probability of the target's tokens, end of sentence included (the length-normalised
log-probability, a negative number; higher is better).

With a model of each direction (source->target A, target->source B) the dual conditional
cross-entropy score of Junczys-Dowmunt (2018): with H_A and H_B the two models' mean negative
log-probabilities, -(|H_A - H_B| + (H_A + H_B) / 2); a pair both models find likely, and
equally likely, scores near 0. A corpus's lowest-scoring share is dropped in training by
`data.train[].scores` and `drop_lowest` (cross-entropy filtering).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import check_output, check_text_file, iter_lines, write_lines
from seq2seq_cli.ids import EOS, PAD
from seq2seq_cli.languages import UNNAMED

CHUNK = 10_000  # pairs read, scored and written at a time


@dataclass
class Scorer:
    """A model and its tokenizers, scoring (source, target) pairs on `device`."""

    model: Any  # a Seq2SeqTransformer in eval mode
    src_sp: Any
    tgt_sp: Any
    decoder_start: int
    max_positions: int
    device: torch.device
    languages: tuple[str, str] = ("src", "tgt")  # the pair scored (the run's, or one of its pairs)
    prefix: tuple[int, ...] = ()  # the ids in front of each source: the target's language token, where the run has one

    @classmethod
    def of_run(cls, run: Any, device: torch.device, src_lang: str | None = None, tgt_lang: str | None = None,
               flags: str = "") -> Scorer:
        """The scorer of a loaded run (`seq2seq_cli.run.loaded.LoadedRun`) for the pair that
        `src_lang` and `tgt_lang` pick (`languages.choose_pair`: needed where the run has
        several targets); `flags` says which flags name them, for messages."""
        from seq2seq_cli.data.tokenizer import language_token_ids
        from seq2seq_cli.languages import choose_pair

        m, d = run.config.model, run.config.data
        try:
            languages = choose_pair(d.pairs, src_lang, tgt_lang, str(run.run_dir))
        except UserError as exc:
            raise UserError(f"{flags}{exc}") from None
        prefix = tuple(language_token_ids(run.src_sp, d.target_token(languages[1]), languages[1], str(run.run_dir)))
        return cls(run.model.to(device).eval(), run.src_sp, run.tgt_sp, m.decoder_start_id, m.max_positions, device,
                   languages, prefix)

    @torch.inference_mode()
    def score(self, pairs: list[tuple[str, str]], batch_tokens: int = 4096) -> list[float]:
        """The mean log-probability of each target given its source (tokens after the model's
        positions are cut off), in the order of `pairs`; batches of similar lengths hold at most
        `batch_tokens` source or target tokens, padding included."""
        keep = self.max_positions - 1
        src = [(list(self.prefix) + ids if ids else ids)[:keep] + [EOS] for ids in self.src_sp.encode([s for s, _ in pairs])]
        tgt = [ids[:keep] for ids in self.tgt_sp.encode([t for _, t in pairs])]
        order = sorted(range(len(pairs)), key=lambda i: (len(tgt[i]), len(src[i])))
        out = [0.0] * len(pairs)
        start = 0
        while start < len(order):
            end, longest = start, 0
            while end < len(order):  # rows while rows x the longest (source, or target with its start) fit
                i = order[end]
                longer = max(longest, len(src[i]), len(tgt[i]) + 1)
                if end > start and (end + 1 - start) * longer > batch_tokens:
                    break
                longest, end = longer, end + 1
            rows = order[start:end]
            for i, value in zip(rows, self._batch([src[i] for i in rows], [tgt[i] for i in rows])):
                out[i] = value
            start = end
        return out

    def _batch(self, src: list[list[int]], tgt: list[list[int]]) -> list[float]:
        b, s_len, t_len = len(src), max(map(len, src)), max(map(len, tgt)) + 1
        src_t = torch.full((b, s_len), PAD, dtype=torch.long)  # (B, S)
        tgt_in = torch.full((b, t_len), PAD, dtype=torch.long)  # (B, T)
        target = torch.full((b, t_len), PAD, dtype=torch.long)  # (B, T)
        for i, (s, t) in enumerate(zip(src, tgt)):
            src_t[i, : len(s)] = torch.tensor(s)
            tgt_in[i, : len(t) + 1] = torch.tensor([self.decoder_start, *t])
            target[i, : len(t) + 1] = torch.tensor([*t, EOS])
        src_t, tgt_in, target = (x.to(self.device) for x in (src_t, tgt_in, target))
        lprobs = torch.log_softmax(self.model(src_t, tgt_in).float(), dim=-1)  # (B, T, V)
        picked = lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, T)
        real = target != PAD
        return (picked.masked_fill(~real, 0.0).sum(-1) / real.sum(-1)).tolist()


def dual_score(forward: float, backward: float) -> float:
    """The dual conditional cross-entropy score of two mean log-probabilities (see the module)."""
    h_a, h_b = -forward, -backward
    return -(abs(h_a - h_b) + (h_a + h_b) / 2)


def read_pairs(pairs_file: Path | None, src: Path | None, tgt: Path | None) -> Iterator[tuple[str, str]]:
    """The pairs of a TSV file (source<TAB>target a line), or of two aligned files, one at a
    time. The files are checked before the first pair (UTF-8, the same number of lines); a TSV
    line without two columns stops the reading with its file and line."""
    if (pairs_file is None) == (src is None and tgt is None) or (src is None) != (tgt is None):
        raise UserError("give the pairs as --input PAIRS.tsv (source<TAB>target a line), or as --src FILE and --tgt FILE")
    if pairs_file is not None:
        check_text_file(pairs_file)
        return _tsv_pairs(pairs_file)
    assert src is not None and tgt is not None
    counts = [check_text_file(p) for p in (src, tgt)]
    if counts[0] != counts[1]:
        raise UserError(f"{src} has {counts[0]} lines but {tgt} has {counts[1]}; source and target files must be "
                        "aligned line by line")
    return zip((line.rstrip("\r") for line in iter_lines(src)), (line.rstrip("\r") for line in iter_lines(tgt)))


def _tsv_pairs(path: Path) -> Iterator[tuple[str, str]]:
    for n, line in enumerate(iter_lines(path), start=1):
        parts = line.rstrip("\r").split("\t")
        if len(parts) != 2:
            raise UserError(f"{path}:{n}: expected 2 tab-separated columns (source, target), found {len(parts)}")
        yield parts[0], parts[1]


def _chunks(pairs: Iterable[tuple[str, str]]) -> Iterator[list[tuple[str, str]]]:
    chunk: list[tuple[str, str]] = []
    for pair in pairs:
        chunk.append(pair)
        if len(chunk) == CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def scores(pairs: Iterable[tuple[str, str]], forward: Scorer, backward: Scorer | None = None,
           batch_tokens: int = 4096) -> Iterator[float]:
    """Each pair's score: the forward model's mean log-probability, or with `backward` (the
    model of the other direction, scoring the source given the target) the dual score."""
    for chunk in _chunks(pairs):
        ahead = forward.score(chunk, batch_tokens)
        if backward is None:
            yield from ahead
            continue
        behind = backward.score([(t, s) for s, t in chunk], batch_tokens)
        yield from (dual_score(a, b) for a, b in zip(ahead, behind))


def check_directions(forward: Any, backward: Any, runs: list[Any]) -> None:
    """Refuse a reverse model whose languages are not the forward model's reversed (where both
    runs name their languages: the defaults src and tgt say nothing); `forward` and `backward`
    are the `Scorer`s of `runs`."""
    a, b = forward.languages, backward.languages
    named = {*a, *b}.isdisjoint({"src", "tgt"})
    if named and b != (a[1], a[0]):
        raise UserError(f"--reverse-model {runs[1].run_dir} translates {b[0]}->{b[1]}; the dual score needs "
                        f"{a[1]}->{a[0]}, the reverse of --model {runs[0].run_dir} ({a[0]}->{a[1]})")


def score_pairs(runs: list[Any], device: torch.device, pairs: Iterable[tuple[str, str]], output: str,
                batch_tokens: int = 4096, inputs: dict[str, Path] | None = None, src_lang: str | None = None,
                tgt_lang: str | None = None) -> int:
    """Write the score of each pair (one number a line, in input order) to `output` (a file,
    written whole or not at all, or - for stdout); `runs` holds the forward run and optionally
    the reverse one; `inputs` (flag -> file) are files the output may not replace; `src_lang`
    and `tgt_lang` pick the pair of a run of several (the reverse run scores the other way) ->
    the number of pairs scored."""
    if output != "-":
        for run in runs:
            check_output(Path(output), inputs or {}, run.run_dir, "the scores")
    forward = Scorer.of_run(runs[0], device, src_lang, tgt_lang, "--model: ")
    backward = None
    if len(runs) > 1:
        # a reverse run of several pairs is asked for the forward pair reversed; one of one pair is checked below
        several = len(runs[1].config.data.pairs) > 1
        src_back, tgt_back = [lang if several and lang not in UNNAMED and "/" not in lang else None
                              for lang in reversed(forward.languages)]
        backward = Scorer.of_run(runs[1], device, src_back, tgt_back, "--reverse-model: ")
        check_directions(forward, backward, runs)
    lines = (f"{value:.6f}" for value in scores(pairs, forward, backward, batch_tokens))
    if output == "-":
        count = 0
        for line in lines:
            print(line, flush=False)
            count += 1
        return count
    return write_lines(Path(output), lines)
