"""Terminology: how often reference terms reach the output, without and with constraints.

From the test split (or `--split`), each sentence gets up to two words of its reference that the
unconstrained output misses (whole words, same case; see `pick_terms`): proper nouns first,
then rare words of the training targets; a sentence without such a word gets none ([]) and
decodes as without constraints. The sentences are then translated again with those words
as constraints (`translate --constraints`). Reported: term use (share of the terms the
output holds as whole words), BLEU and chrF (sacreBLEU, against the reference) and
sentences/s, of both decodes (medians of `--repeat` alternating runs), on the same
sentences, with the same decoding settings (constrained lines search with the wider
`constraint_beam_size` those settings give: 1.5 times the beam, rounded up, unless set).

    python bench/terminology.py --model runs/quickstart --beam-size 5 --repeat 3
    python bench/terminology.py --model runs/quickstart --split valid     # to tune: the valid split
    python bench/terminology.py --model runs/quickstart --lines 200 --write-constraints terms.jsonl
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import subprocess
import time
from collections import Counter
from pathlib import Path

import sacrebleu
import torch

from seq2seq_cli.decode.constraints import constraint_beam
from seq2seq_cli.decode.terms import Terminology
from seq2seq_cli.decode.translate import Translator

REPO = Path(__file__).resolve().parents[1]
RARE = 20  # a word seen at most this many times in the training targets is rare
WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)?")


def has_word(text: str, word: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text) is not None


def pick_terms(reference: str, output: str, counts: Counter[str], most: int = 2) -> list[str]:
    """Up to `most` terms of `reference` that `output` misses (whole words, same case), words
    of 4 letters or more: proper nouns (written capitalised more often than not in the
    training targets) first, then rare words (at most RARE times there), rarest first."""
    words = dict.fromkeys(w for w in WORD.findall(reference) if len(w) >= 4 and not has_word(output, w))
    proper = [w for w in words if w[0].isupper() and counts[w] > counts[w.lower()]]
    rare = [w for w in words if w not in proper and w[0].islower() and counts[w] <= RARE]
    return (proper + sorted(rare, key=lambda w: counts[w]))[:most]


def decode(translator: Translator, lines: list[str], constraints: list[list[str]] | None) -> tuple[list[str], float]:
    """The 1-best outputs of `lines` and the seconds they took."""
    phrases = None
    if constraints is not None:
        terms = Terminology(constraints, Path("terms"))
        phrases = translator.constraints(terms, lines, 0, "test")
    start = time.perf_counter()
    hyps = translator.translate_hypotheses(lines, 1, constraints=phrases)
    seconds = time.perf_counter() - start
    return [translator.tgt_sp.decode(h[0].tokens) for h in hyps], seconds


def term_use(outputs: list[str], terms: list[list[str]]) -> float:
    found = [has_word(o, t) for o, ts in zip(outputs, terms) for t in ts]
    return 100.0 * sum(found) / max(1, len(found))


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        return platform.processor() or "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", "-m", required=True, help="run directory (read only)")
    ap.add_argument("--data", default=str(REPO / "data" / "bible-es-en"), help="directory with test.es, test.en, train.en")
    ap.add_argument("--src-lang", default="es")
    ap.add_argument("--tgt-lang", default="en")
    ap.add_argument("--split", default="test", help="the split whose sentences are decoded (valid to tune, test to report)")
    ap.add_argument("--lines", type=int, default=0, help="only the first N sentences (0 = all)")
    ap.add_argument("--beam-size", type=int, default=5)
    ap.add_argument("--constraint-beam-size", type=int, help="beam of constrained lines; default 1.5 x --beam-size, rounded up")
    ap.add_argument("--length-penalty", type=float, help="the run's decode.length_penalty unless given")
    ap.add_argument("--terms", type=int, default=2, help="at most this many terms per sentence")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--write-constraints", type=Path, help="also write the constraints, one JSON list per line")
    ap.add_argument("--repeat", type=int, default=1, help="decode both this many times, alternating; median times")
    ap.add_argument("--json", action="store_true", help="print one JSON line instead of the table")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    data = Path(args.data)
    src = (data / f"{args.split}.{args.src_lang}").read_text(encoding="utf-8").splitlines()
    ref = (data / f"{args.split}.{args.tgt_lang}").read_text(encoding="utf-8").splitlines()
    if args.lines:
        src, ref = src[: args.lines], ref[: args.lines]
    train_path = data / f"train.{args.tgt_lang}"
    counts: Counter[str] = Counter(WORD.findall(train_path.read_text(encoding="utf-8"))) if train_path.exists() else Counter()

    options: dict[str, float] = {"beam_size": args.beam_size}
    if args.length_penalty is not None:
        options["length_penalty"] = args.length_penalty
    if args.constraint_beam_size is not None:
        options["constraint_beam_size"] = args.constraint_beam_size
    translator = Translator.load(args.model, args.device, options)
    decode(translator, src[:8], None)  # warm-up
    plain, plain_s = decode(translator, src, None)
    terms = [pick_terms(r, o, counts, args.terms) for r, o in zip(ref, plain)]
    if args.write_constraints:
        args.write_constraints.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in terms), encoding="utf-8")
    held, held_s = decode(translator, src, terms)
    plain_times, held_times = [plain_s], [held_s]
    for _ in range(args.repeat - 1):  # alternating, so that a slow spell of the machine hits both
        plain_times.append(decode(translator, src, None)[1])
        held_times.append(decode(translator, src, terms)[1])
    plain_s, held_s = statistics.median(plain_times), statistics.median(held_times)

    result = {
        "cpu": cpu_name(), "threads": torch.get_num_threads(), "split": args.split, "beam_size": args.beam_size,
        "constraint_beam_size": constraint_beam(translator.decode, translator.tgt_sp.get_piece_size()), "repeat": args.repeat,
        "length_penalty": translator.decode.length_penalty, "sentences": len(src),
        "sentences_with_terms": sum(1 for t in terms if t), "terms": sum(map(len, terms)),
    }
    for name, outputs, seconds in (("without", plain, plain_s), ("with", held, held_s)):
        result[name] = {
            "term_use": round(term_use(outputs, terms), 1),
            "bleu": round(sacrebleu.corpus_bleu(outputs, [ref]).score, 2),
            "chrf": round(sacrebleu.corpus_chrf(outputs, [ref]).score, 2),
            "sentences_per_s": round(len(src) / seconds, 2),
        }
    result["speed_ratio"] = round(result["with"]["sentences_per_s"] / result["without"]["sentences_per_s"], 2)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['cpu']}, {result['threads']} threads, beam {args.beam_size}: {len(src)} sentences, "
          f"{result['terms']} terms in {result['sentences_with_terms']} of them")
    print("| constraints | term use | BLEU | chrF | sentences/s |")
    print("|---|---|---|---|---|")
    for name in ("without", "with"):
        r = result[name]
        print(f"| {name} | {r['term_use']}% | {r['bleu']} | {r['chrf']} | {r['sentences_per_s']} |")
    print(f"constrained speed: {result['speed_ratio']}x unconstrained")


if __name__ == "__main__":
    main()
