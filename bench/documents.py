"""Documents: paragraphs translated as lines, split into sentences and joined, or verse by verse;
and the same paragraphs as HTML with inline tags.

A split's verses (the .ref file names book chapter:verse) are grouped into paragraphs of 3 to
8 consecutive verses of one chapter (sizes drawn with `--seed`), each paragraph one line (its
verses joined by a space; its reference: their references joined the same way). Reported,
BLEU and chrF (sacreBLEU) of the paragraphs:

  lines      translated as lines, as `translate --no-split` does
  split      cut into sentences and joined back, as `translate` does
  verses     the verses translated one per line and joined into their paragraphs (what a
             verse-aligned file would give; its verse-level BLEU is printed too)

and an HTML page of the paragraphs, each <p> holding random inline tags over whole words
(<b>, <i>, <span class="x">, <a href="#vN">), translated as `translate --format html` does:
tags kept (count of each kind, source and output), well-formed (the output parsed back as
XML), BLEU of the text with the tags stripped against the references and against `split`.

    python bench/documents.py --model runs/quickstart --split valid
    python bench/documents.py --model runs/quickstart --split test --beam-size 5 --json out.json
"""

from __future__ import annotations

import argparse
import html
import json
import platform
import random
import re
import time
from collections import Counter
from pathlib import Path

import sacrebleu
from lxml import etree

from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.documents.lines import translate_sentences
from seq2seq_cli.documents.markup import translate_markup
from seq2seq_cli.documents.sentences import Splitter

REPO = Path(__file__).resolve().parents[1]
TAGS = ("b", "i", "span", "a")


def paragraphs(refs: list[str], rng: random.Random) -> list[list[int]]:
    """Verse indices grouped into paragraphs of 3-8 consecutive verses of one chapter, in order."""
    chapters: list[list[int]] = []
    for i, ref in enumerate(refs):
        chapter = ref.rsplit(":", 1)[0]
        if not chapters or refs[chapters[-1][-1]].rsplit(":", 1)[0] != chapter:
            chapters.append([])
        chapters[-1].append(i)
    out = []
    for verses in chapters:
        k = 0
        while k < len(verses):
            size = rng.randint(3, 8)
            out.append(verses[k : k + size])
            k += size
    return out


def tagged(text: str, rng: random.Random, number: int) -> tuple[str, Counter[str]]:
    """`text` as HTML with inline tags over 1-3 whole words, about one word in six tagged."""
    words = text.split(" ")
    parts: list[str] = []
    counts: Counter[str] = Counter()
    k = 0
    while k < len(words):
        if rng.random() < 0.08 and words[k]:
            n = min(rng.randint(1, 3), len(words) - k)
            tag = rng.choice(TAGS)
            inner = html.escape(" ".join(words[k : k + n]), quote=False)
            attrs = {"a": f' href="#v{number}-{k}"', "span": ' class="x"'}.get(tag, "")
            parts.append(f"<{tag}{attrs}>{inner}</{tag}>")
            counts[tag] += 1
            k += n
        else:
            parts.append(html.escape(words[k], quote=False))
            k += 1
    return " ".join(parts), counts


def cpu() -> str:
    """The CPU's model name, family and model (lscpu's), or the machine type."""
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8")
        fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        return f"{fields['model name']}, family {fields['cpu family']}, model {fields['model']}"
    except (OSError, KeyError):
        return platform.machine()


def score(hyps: list[str], refs: list[str]) -> dict[str, float]:
    bleu, chrf = sacrebleu.corpus_bleu(hyps, [refs]).score, sacrebleu.corpus_chrf(hyps, [refs]).score
    return {"bleu": round(bleu, 2), "chrf": round(chrf, 2)}


def html_round(translator: Translator, splitter: Splitter, paras: list[str], split_hyps: list[str], refs: list[str],
               rng: random.Random) -> dict[str, object]:
    """The HTML page's figures (see the module docstring)."""
    bodies, source_counts = [], Counter()
    for i, p in enumerate(paras):
        body, counts = tagged(p, rng, i)
        bodies.append(f"<p>{body}</p>")
        source_counts += counts
    page = "<!DOCTYPE html>\n<html><body>\n" + "\n".join(bodies) + "\n</body></html>\n"
    start = time.perf_counter()
    out = translate_markup(translator, page, "html", splitter)
    seconds = time.perf_counter() - start
    try:
        tree = etree.fromstring(out.split("\n", 1)[1].encode("utf-8"))
        well_formed = True
    except etree.XMLSyntaxError:
        tree = etree.fromstring(out.split("\n", 1)[1].encode("utf-8"), etree.XMLParser(recover=True))
        well_formed = False
    got = Counter(e.tag for e in tree.iter() if e.tag in TAGS)
    stripped = [re.sub(r"\s+", " ", "".join(p.itertext())).strip() for p in tree.iter("p")]
    return {
        "tags_source": dict(source_counts), "tags_output": dict(got),
        "tags_kept": round(sum(min(got[t], source_counts[t]) for t in TAGS) / max(1, sum(source_counts.values())), 4),
        "well_formed": well_formed, "paragraphs_out": len(stripped),
        "stripped": score(stripped, refs), "stripped_vs_split": score(stripped, split_hyps), "seconds": round(seconds, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--split", default="test", help="valid or test (data/bible-es-en/SPLIT.{es,en,ref})")
    ap.add_argument("--beam-size", type=int, default=None, help="default: the run's decode.beam_size")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--paragraphs", type=int, default=0, help="only the first N paragraphs (0 = all)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--clause-words", type=int, default=None,
                    help="cut sentences of more words into clauses (0: never); default the splitter's own")
    ap.add_argument("--no-html", action="store_true", help="leave out the HTML round")
    args = ap.parse_args()

    data = REPO / "data" / "bible-es-en"
    src, tgt, ref = ((data / f"{args.split}.{x}").read_text(encoding="utf-8").splitlines() for x in ("es", "en", "ref"))
    rng = random.Random(args.seed)
    groups = paragraphs(ref, rng)
    if args.paragraphs:
        groups = groups[: args.paragraphs]
    paras = [" ".join(src[i] for i in g) for g in groups]
    para_refs = [" ".join(tgt[i] for i in g) for g in groups]
    verses = [i for g in groups for i in g]
    overrides = {} if args.beam_size is None else {"beam_size": args.beam_size}
    translator = Translator.load(args.model, "cpu", overrides)
    clause = {} if args.clause_words is None else {"clause_words": args.clause_words or None}
    splitter = Splitter(translator.languages[0], **clause)
    figures: dict[str, object] = {"data": args.split, "paragraph_count": len(groups), "verse_count": len(verses),
                                  "beam_size": translator.decode.beam_size, "cpu": cpu()}
    timings = {}
    start = time.perf_counter()
    lines = translator.translate(paras)
    timings["lines"] = time.perf_counter() - start
    start = time.perf_counter()
    split = translate_sentences(translator.translate, paras, splitter)
    timings["split"] = time.perf_counter() - start
    start = time.perf_counter()
    verse_hyps = dict(zip(verses, translator.translate([src[i] for i in verses])))
    timings["verses"] = time.perf_counter() - start
    joined = [" ".join(verse_hyps[i] for i in g) for g in groups]
    figures["lines"] = score(lines, para_refs)
    figures["split"] = score(split, para_refs)
    figures["verses"] = score(joined, para_refs)
    figures["verses_per_line"] = score([verse_hyps[i] for i in verses], [tgt[i] for i in verses])
    figures["split_over_verses"] = round(figures["split"]["bleu"] / max(1e-9, figures["verses"]["bleu"]), 3)  # type: ignore[index]
    figures["seconds"] = {k: round(v, 1) for k, v in timings.items()}
    figures["clause_words"] = splitter.clause_words
    if not args.no_html:
        figures["html"] = html_round(translator, splitter, paras, split, para_refs, rng)
    print(json.dumps(figures, indent=1))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
