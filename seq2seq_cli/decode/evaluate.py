"""Score translations with sacreBLEU (BLEU and chrF, always with their signatures)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import check_output, read_lines, write_lines


@dataclass
class Scores:
    bleu: float
    chrf: float
    bleu_line: str  # sacreBLEU's formatted score with signature
    chrf_line: str
    bleu_signature: str
    chrf_signature: str
    sentences: int
    split: bool | None = None  # whether the source lines were cut into sentences to translate; None: scored --hyp

    def as_dict(self) -> dict[str, object]:
        return {
            "bleu": round(self.bleu, 2),
            "chrf": round(self.chrf, 2),
            "bleu_signature": self.bleu_signature,
            "chrf_signature": self.chrf_signature,
            "sentences": self.sentences,
            "split": self.split,
        }


def score(hyps: list[str], refs: list[str]) -> Scores:
    """Corpus BLEU and chrF of hypotheses against one reference each."""
    from sacrebleu.metrics import BLEU, CHRF

    bleu, chrf = BLEU(), CHRF()
    b, c = bleu.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs])
    bsig, csig = str(bleu.get_signature()), str(chrf.get_signature())
    return Scores(b.score, c.score, b.format(signature=bsig), c.format(signature=csig), bsig, csig, len(hyps))


def text_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file, without the byte-order mark an editor may put first."""
    lines = read_lines(path)
    if lines:
        lines[0] = lines[0].removeprefix("\ufeff")
    return lines


def evaluate(
    ref: Path,
    src: Path | None = None,
    hyp: Path | None = None,
    translator: Translator | None = None,
    output: Path | None = None,
    translate: Callable[[list[str]], list[str]] | None = None,
    split: bool = False,
) -> Scores:
    """Score `hyp` against `ref`, or translate `src` with `translator` first (writing the
    hypotheses to `output` when given). An `output` that is one of the inputs, or lies in the
    model's run directory, is refused before anything is translated. `translate` turns the
    source lines into their translations (default: the translator's, one sentence per line;
    the command line gives one that cuts lines into sentences and joins them back, and says so
    with `split`, which the scores record)."""
    if output is not None and hyp is not None:
        raise UserError(f"-o {output}: --output writes the translations of --src; with --hyp {hyp} there is nothing "
                        "to translate (leave out -o)")
    if output is not None:
        inputs = {flag: path for flag, path in (("--ref", ref), ("--src", src), ("--hyp", hyp)) if path is not None}
        protected: list[Path | None] = [*(translator.run_dirs() if translator is not None else [])] or [None]
        for run_dir in protected:
            check_output(output, inputs, run_dir, "the translations")
    refs = text_lines(ref)
    if not refs:
        raise UserError(f"{ref}: empty file (expected one reference per line; nothing to score)")
    if hyp is not None:
        hyps = text_lines(hyp)
        other = hyp
    else:
        if src is None or translator is None:
            raise UserError("evaluate needs --hyp FILE, or --model RUN with --src FILE")
        sources = text_lines(src)
        if len(sources) != len(refs):
            raise UserError(f"{src} has {len(sources)} lines but {ref} has {len(refs)}; they must be aligned")
        hyps = (translate or translator.translate)(sources)
        other = src
        if output is not None:
            write_lines(output, hyps)
    if len(hyps) != len(refs):
        raise UserError(f"{other} has {len(hyps)} lines but {ref} has {len(refs)}; they must be aligned")
    scores = score(hyps, refs)
    if hyp is None:
        scores.split = split
    return scores
