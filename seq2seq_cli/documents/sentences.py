"""Sentences in, paragraphs out: a line split into sentences and the translations joined back.

A model learns sentences; a line of a user's file is often a paragraph. Each line is cut into
sentences by `sentencex` (Wikimedia's splitter: rules and abbreviation lists for ~300
languages, no model to download), the sentences of a whole chunk are translated as one batch,
and each line's translations are joined back with the line's own spacing between them, one
output line per input line. A line that is one sentence is translated exactly as before.

Some of sentencex's cuts are taken back (`_cuts_taken_back`). Its abbreviation lists live in
its compiled extension (the Python module offers only `segment` and `get_sentence_boundaries`),
and it applies them itself: it never cuts after a word its list for the language holds
(Spanish "Dr.", "Sra.", "etc.", "pág."; English "Mr.", "St.", "p.m."), so what is taken back here
is only what those lists miss. (1) A cut followed by a lowercase letter (after any opening
quote, bracket, "¿" or "¡"; a letter of a script that has case): the classic Punkt rule, and the
rule of Spanish spelling after "?" and "!". sentencex has it only where no space follows the
period, so "a las 5 p. m. con" ("m" is in no Spanish list), "¡ay de nosotros! porque pecamos"
were cut. (2) A cut right after a title before a name (TITLES, any case: "Mr. Smith" in Spanish,
"Srta. Ruiz" in English): a title ends no sentence, and the name after it is capitalised, so (1)
does not catch it. The list is by hand because sentencex's lists do not tell a title from an
abbreviation that may end a sentence ("etc.", "vol."); it holds titles of Latin-script
languages that are no word of their own, so it applies whatever the language. (3) A number's
period before an ordinal indicator ("el 2.º", "la 1.ª"; "el 3.er" is (1)).

The splitter was chosen by measuring on the shipped Spanish validation verses (two verses of
a chapter joined with a space: is the boundary between them found; and how often is a single
verse cut), on 571 pairs: sentencex found 0.651 of the boundaries and cut 37 single verses in
under 0.05 s; pysbd 0.653, 35 cuts, 1.1 s; sentence-splitter (Koehn-Schroeder) 0.664, 33, 0.3 s. The three find
the same boundaries (the ones they miss end in ':' or ';', where this translation of the Bible
ends many verses); sentencex is by far the fastest and covers the most languages. A sentence
longer than CLAUSE_WORDS words is then cut into its clauses after ';' and ':' (`Splitter.clauses`).
With sentencex 1.0.32 (installed now) the same measurement gives 0.651 and 40 cuts; with the
cuts taken back, 0.651 and 37 (the three cuts taken back are in verses like "¡ay ahora de
nosotros! porque pecamos", one sentence; no verse of the split starts lowercase).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

CLAUSE_WORDS = 25  # a sentence of more words is cut into its clauses (`Splitter.clauses`); chosen on the valid split
# (bench/documents.py: paragraphs split and joined at 0.861 of the verse-by-verse BLEU uncut, 0.978 at 40 words,
# 0.991-0.995 from 15 to 30, 0.995 at 25)
MIN_CLAUSE_WORDS = 4  # a clause cut off has at least this many words
CLAUSE_END = re.compile(r"(?<=[;:])\s+")
ORDINAL_END = re.compile(r"\d\.\s*$")  # a segment ending in a number's period
ORDINAL_NEXT = re.compile(r"\s*[ºª°]")  # ... and the next one starting with an ordinal indicator
OPENERS = "\"'«‹“‘„([{¿¡—–-"  # skipped before the first letter of what follows a cut
TITLE_END = re.compile(r"(?:^|[\s.(\[«\"“'‘])([^\W\d_]+)\.\s*$")  # a segment ending in a word and its period
TITLES = frozenset({  # titles before a name; sentencex's own lists cover many of them per language
    "dr", "dra", "drs", "dres", "sr", "sra", "sres", "srs", "srta",  # Spanish, Portuguese (Dr., Sra., Srta.)
    "mr", "mrs", "ms", "messrs", "prof", "profa", "st",  # English (Prof. and Profa. Spanish, Portuguese too)
    "mme", "mlle",  # French
})


@dataclass
class Split:
    """A text cut into sentences: text == gaps[0] + sentences[0] + gaps[1] + ... + sentences[-1] + gaps[-1]."""

    sentences: list[str]
    gaps: list[str]  # len(sentences) + 1: leading whitespace, the spacing between sentences, trailing whitespace

    def join(self, translations: list[str]) -> str:
        """The translations of the sentences with the text's spacing between them (not its
        leading and trailing whitespace: a translation is a stripped line, as without splitting)."""
        if len(translations) != len(self.sentences):
            raise ValueError(f"{len(translations)} translations for {len(self.sentences)} sentences")
        if not translations:
            return ""
        out = [translations[0]]
        for gap, text in zip(self.gaps[1:-1], translations[1:]):
            out += [gap, text]
        return "".join(out)

    def spans(self) -> list[tuple[int, int]]:
        """(start, end) of each sentence in the text, in characters."""
        spans, pos = [], len(self.gaps[0])
        for sentence, gap in zip(self.sentences, self.gaps[1:]):
            spans.append((pos, pos + len(sentence)))
            pos += len(sentence) + len(gap)
        return spans


class Splitter:
    """Sentence splitter for one language (a code sentencex knows falls back to its defaults);
    `whole`: a text is one sentence (no splitting, its surrounding whitespace taken off).
    A sentence of more than `clause_words` words (None: no limit) is cut into its clauses."""

    def __init__(self, language: str, whole: bool = False, clause_words: int | None = CLAUSE_WORDS) -> None:
        self.language = language
        self.whole = whole
        self.clause_words = clause_words

    def clauses(self, split: Split) -> Split:
        """`split` with each sentence longer than `clause_words` words cut after its semicolons
        and colons, into clauses of at least MIN_CLAUSE_WORDS words: a model meets sentences as
        long as those it learned from, where no sentence splitter cuts (a third of the verse
        boundaries of the shipped Bible end in ':' or ';')."""
        if self.clause_words is None or not any(len(s.split()) > self.clause_words for s in split.sentences):
            return split
        sentences, gaps = [], [split.gaps[0]]
        for sentence, gap in zip(split.sentences, split.gaps[1:]):
            pieces, seps = [sentence], list[str]()
            if len(sentence.split()) > self.clause_words:
                pieces, seps, start = [], [], 0
                for cut in CLAUSE_END.finditer(sentence):
                    head, tail = sentence[start : cut.start()], sentence[cut.end():]
                    if len(head.split()) >= MIN_CLAUSE_WORDS and len(tail.split()) >= MIN_CLAUSE_WORDS:
                        pieces.append(head)
                        seps.append(cut.group())
                        start = cut.end()
                pieces.append(sentence[start:])
            sentences += pieces
            gaps += [*seps, gap]
        return Split(sentences, gaps)

    def split(self, text: str) -> Split:
        """`text` cut into sentences, each without surrounding whitespace; blank text: none."""
        import sentencex

        if not text.strip():
            return Split([], [text])
        if self.whole:
            core = text.strip()
            start = text.index(core)
            return Split([core], [text[:start], text[start + len(core):]])
        sentences: list[str] = []
        gaps: list[str] = []
        pos = 0
        for segment in _cuts_taken_back(sentencex.segment(self.language, text)):
            core = segment.strip()
            if not core:
                continue
            start = text.find(core, pos)
            if start < 0:  # the splitter changed the text: keep the rest whole
                break
            gaps.append(text[pos:start])
            sentences.append(core)
            pos = start + len(core)
        rest = text[pos:]
        if rest.strip():  # what the splitter did not give back stays a sentence of its own
            core = rest.strip()
            start = pos + rest.index(core)
            gaps.append(text[pos:start])
            sentences.append(core)
            pos = start + len(core)
        gaps.append(text[pos:])
        return self.clauses(Split(sentences, gaps))


def _cut_wrong(before: str, after: str) -> bool:
    """Whether sentencex's cut between segments `before` and `after` ends no sentence (see the
    module docstring): `after` starts lowercase, `before` ends in a title and `after` with a
    letter, or `before` in a number's period and `after` with an ordinal indicator."""
    if not before.strip() or not after.strip():
        return False  # a paragraph break is a blank segment of its own, and stays
    first = after.lstrip().lstrip(OPENERS)[:1]
    if first.islower():
        return True
    title = TITLE_END.search(before)
    if title and title.group(1).lower() in TITLES and after.lstrip()[:1].isalpha():
        return True
    return bool(ORDINAL_END.search(before) and ORDINAL_NEXT.match(after))


def _cuts_taken_back(segments: Iterable[str]) -> list[str]:
    """sentencex's segments, each wrong cut (`_cut_wrong`) taken back: the segments on either
    side joined again (with the whitespace between them, so the text is unchanged)."""
    out: list[str] = []
    for segment in segments:
        if out and _cut_wrong(out[-1], segment):
            out[-1] += segment
        else:
            out.append(segment)
    return out


@dataclass
class SplitPlan:
    """The sentences of a list of lines, and how to put their translations back into lines.
    A line not to be split (see `plan`) is one unit as it is."""

    units: list[str] = field(default_factory=list)  # what is translated: sentences, and whole lines
    owners: list[int] = field(default_factory=list)  # the line of each unit
    splits: list[Split | None] = field(default_factory=list)  # per line: its split, None = one unit as it is

    def join(self, outputs: list[str]) -> list[str]:
        """One output line per input line from one output per unit."""
        lines: list[str] = []
        k = 0
        for split in self.splits:
            if split is None:
                lines.append(outputs[k])
                k += 1
            else:
                n = len(split.sentences)
                lines.append(split.join(outputs[k : k + n]))
                k += n
        return lines

    def first_unit(self) -> list[int]:
        """The unit index each line starts at."""
        starts, k = [], 0
        for split in self.splits:
            starts.append(k)
            k += 1 if split is None else len(split.sentences)
        return starts


def plan(lines: list[str], splitter: Splitter, keep_whole: Sequence[bool] = ()) -> SplitPlan:
    """Cut `lines` into sentences; the lines `keep_whole` marks True, blank lines and lines of
    one sentence stay one unit each, as they are."""
    out = SplitPlan()
    for i, line in enumerate(lines):
        whole = i < len(keep_whole) and keep_whole[i]
        split = None if whole or not line.strip() else splitter.split(line)
        if split is not None and len(split.sentences) < 2:
            split = None
        out.splits.append(split)
        units = [line] if split is None else split.sentences
        out.units += units
        out.owners += [i] * len(units)
    return out
