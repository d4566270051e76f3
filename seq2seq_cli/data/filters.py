"""The cleaning filters: what drops a training pair, checked pair by pair as a corpus is
encoded (`encoding`), so that no filter holds the corpus in memory.

Each pair is dropped by the first filter that rejects it, in the order of `Drop`, and counted
under that filter's name. The text filters follow OpusCleaner's (max_length, src_trg_ratio,
num_mismatch, url_mismatch, alpha_ratio, language identification); duplicates are found after
the pass, from one 8-byte hash per pair; a score file (`seq2seq score`) drops the lowest
share of a corpus (`scored`); the pairs whose words do not go together, by the corpus's own
co-occurrence (`cooccurrence`), are also found after the pass.
"""

from __future__ import annotations

import enum
import hashlib
import math
import re
import unicodedata
from array import array
from dataclasses import dataclass
from functools import lru_cache


class Drop(enum.IntEnum):
    """Why a pair is dropped: the code in the `_drop` column while encoding (duplicates and
    scores are found afterwards, across rows). `key` names it in counts, the cache's stats,
    metrics and the data report."""

    KEPT = 0
    EMPTY = 1
    TOO_LONG = 2
    RATIO = 3
    DUPLICATE = 4
    CONTROL = 5
    SAME = 6
    LONG_WORDS = 7
    LENGTH_RATIO = 8
    NUMBERS = 9
    URLS = 10
    ALPHA = 11
    REPEATS = 12
    LANGID = 13
    SCORE = 14
    COOCCURRENCE = 15

    @property
    def key(self) -> str:
        return self.name.lower()


# the order in which the filters are tried (and listed in reports): the first to reject a pair drops it
ORDER = (Drop.EMPTY, Drop.CONTROL, Drop.SAME, Drop.TOO_LONG, Drop.LONG_WORDS, Drop.RATIO, Drop.LENGTH_RATIO,
         Drop.NUMBERS, Drop.URLS, Drop.ALPHA, Drop.REPEATS, Drop.LANGID, Drop.COOCCURRENCE, Drop.SCORE,
         Drop.DUPLICATE)

DESCRIPTIONS = {
    Drop.EMPTY: "an empty side",
    Drop.CONTROL: "control characters or markup",
    Drop.SAME: "source equal to target",
    Drop.TOO_LONG: "over the subword limits",
    Drop.LONG_WORDS: "over the word limit",
    Drop.RATIO: "over the subword length ratio",
    Drop.LENGTH_RATIO: "word length ratio",
    Drop.NUMBERS: "numbers differ",
    Drop.URLS: "URLs or e-mails differ",
    Drop.ALPHA: "too few letters",
    Drop.REPEATS: "repeated words",
    Drop.LANGID: "not in its language",
    Drop.COOCCURRENCE: "words that do not go together",
    Drop.SCORE: "lowest scores",
    Drop.DUPLICATE: "duplicates",
}


@dataclass(frozen=True)
class Filters:
    """What drops a training pair (lengths in subwords, EOS not counted; words split on
    spaces). None or False: that filter is off. `langs` are the language identifier's codes
    of (source, target), "" where it does not know a side's language."""

    max_src_len: int | None = None
    max_tgt_len: int | None = None
    max_len_ratio: float | None = None
    dedup: str = "off"  # off, exact or normalized
    control: bool = False
    same: bool = False
    max_words: int | None = None
    length_ratio: float | None = None
    numbers: bool = False
    urls: bool = False
    min_alpha: float | None = None
    max_repeats: int | None = None
    langs: tuple[str, str] = ("", "")
    langid_min_prob: float = 0.05
    cooccurrence: float | None = None  # drop pairs scoring below this share of the median (`cooccurrence`)


def training_filters(d, pair: tuple[str, str] | None = None) -> Filters:
    """The filters of a training split from `data` settings (a `DataConfig`); `pair`: the
    corpus's (source, target) languages, which the language identifier checks each side
    against (the run's data.src_lang and data.tgt_lang where not given)."""
    from seq2seq_cli.data.langid import identifier_code

    f = d.filters
    dedup = "exact" if d.dedup else "off"
    if not f.enabled:
        return Filters(d.max_src_len, d.max_tgt_len, d.max_len_ratio, dedup)
    if f.duplicates != "off":
        dedup = f.duplicates
    src_lang, tgt_lang = pair or (d.src_lang, d.tgt_lang)
    langs = (identifier_code(src_lang), identifier_code(tgt_lang)) if f.langid else ("", "")
    return Filters(d.max_src_len, d.max_tgt_len, d.max_len_ratio, dedup, f.control, f.same, f.max_words, f.length_ratio,
                   f.numbers, f.urls, f.min_alpha, f.max_repeats, langs, f.langid_min_prob, f.cooccurrence)


def active(f: Filters, scored: bool = False) -> set[Drop]:
    """The filters that are on (`scored`: a corpus drops its lowest scores)."""
    on = {Drop.EMPTY: True, Drop.CONTROL: f.control, Drop.SAME: f.same,
          Drop.TOO_LONG: bool(f.max_src_len or f.max_tgt_len), Drop.LONG_WORDS: bool(f.max_words),
          Drop.RATIO: bool(f.max_len_ratio), Drop.LENGTH_RATIO: bool(f.length_ratio), Drop.NUMBERS: f.numbers,
          Drop.URLS: f.urls, Drop.ALPHA: bool(f.min_alpha), Drop.REPEATS: bool(f.max_repeats), Drop.LANGID: any(f.langs),
          Drop.COOCCURRENCE: bool(f.cooccurrence), Drop.SCORE: scored, Drop.DUPLICATE: f.dedup != "off"}
    return {code for code, yes in on.items() if yes}


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ufffd]")
MARKUP = re.compile(r"</?[A-Za-z][A-Za-z0-9:-]*(?:\s[^<>]*)?/?>|&(?:[A-Za-z]{2,8}|#\d{1,7}|#x[0-9A-Fa-f]{1,6});")
# OpusCleaner's num_mismatch: a number (leading zeros and separators aside), its sign when not part of a word
NUMBER = re.compile(r"(?:(?P<sign>(?:(?<=\s)|^)[-+])|\b)0*(?P<value>\d+(?:[.,:]\d+)*)\b")
URL = re.compile(
    r"\b[a-z][a-z0-9+.-]*://[^\s<>\"]+"  # with a scheme
    r"|\bwww\.[^\s<>\"]+"  # www.
    r"|\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+"  # an e-mail address
    r"|\b(?:[a-z0-9-]+\.)+(?:com|org|net|edu|gov|int|info|biz|io|eu|es|de|fr|it|pt|nl|uk|ru|cn|jp|br|mx|ar|co)\b(?:/[^\s<>\"]*)?",
    re.IGNORECASE,
)
REPEAT = re.compile(r"\b(\w+(?:\W+\w+){0,2})(?:\W+\1\b){%d,}", re.IGNORECASE)  # %d: the repeats allowed
NOT_WORD = re.compile(r"[\W_]+")


def numbers(text: str) -> set[str]:
    """The numbers of `text` as num_mismatch compares them (separators as '*')."""
    return {(m["sign"] or "") + re.sub(r"\D+", "*", m["value"]) for m in NUMBER.finditer(text)}


def numbers_differ(src: str, tgt: str) -> bool:
    """OpusCleaner's num_mismatch at ratio 1: (numbers in both + 1) / (numbers in one only + 1) < 1."""
    a, b = numbers(src), numbers(tgt)
    return bool(a or b) and (len(a & b) + 1) / (len(a ^ b) + 1) < 1


def urls(text: str) -> set[str]:
    return {m.group(0).rstrip(".,;:!?)]}'\"").lower() for m in URL.finditer(text)}


def alpha_share(text: str) -> float:
    """The share of letters among the characters that are not spaces (1 for an all-space text)."""
    chars = [c for c in text if not c.isspace()]
    return sum(c.isalpha() for c in chars) / len(chars) if chars else 1.0


def log_ratio(src_words: int, tgt_words: int) -> float:
    """log(shorter + 1) / log(longer + 1) of two word counts (OpusCleaner's src_trg_ratio --log)."""
    short, long = sorted((src_words, tgt_words))
    return math.log(short + 1) / math.log(long + 1) if long else 1.0


def normalized(text: str) -> str:
    """`text` lower-cased (NFKC), without punctuation, symbols and spaces: what a normalised
    duplicate shares with the pair it repeats."""
    return NOT_WORD.sub("", unicodedata.normalize("NFKC", text).casefold())


def pair_hash(src: str, tgt: str, dedup: str) -> int:
    """An 8-byte hash of a pair (normalised first when `dedup` is normalized); 0 when off."""
    if dedup == "off":
        return 0
    if dedup == "normalized":
        src, tgt = normalized(src), normalized(tgt)
    digest = hashlib.blake2b(f"{src}\t{tgt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


@lru_cache(maxsize=8)
def _repeats(times: int) -> re.Pattern[str]:
    return re.compile(REPEAT.pattern % times, re.IGNORECASE)


def check_pair(src: str, tgt: str, ls: int, lt: int, f: Filters) -> Drop:
    """The first filter that rejects the pair (text `src`, `tgt`; `ls`, `lt` subwords), or KEPT
    (co-occurrence, scores and duplicates are found across pairs, after this)."""
    if not ls or not lt:
        return Drop.EMPTY
    if f.control and any(CONTROL.search(t) or MARKUP.search(t) for t in (src, tgt)):
        return Drop.CONTROL
    if f.same and " ".join(src.casefold().split()) == " ".join(tgt.casefold().split()):
        return Drop.SAME
    if (f.max_src_len and ls > f.max_src_len) or (f.max_tgt_len and lt > f.max_tgt_len):
        return Drop.TOO_LONG
    ws, wt = len(src.split()), len(tgt.split())
    if f.max_words and max(ws, wt) > f.max_words:
        return Drop.LONG_WORDS
    if f.max_len_ratio and max(ls, lt) > f.max_len_ratio * min(ls, lt):
        return Drop.RATIO
    if f.length_ratio and log_ratio(ws, wt) < f.length_ratio:
        return Drop.LENGTH_RATIO
    if f.numbers and numbers_differ(src, tgt):
        return Drop.NUMBERS
    if f.urls and urls(src) != urls(tgt):
        return Drop.URLS
    if f.min_alpha and min(alpha_share(src), alpha_share(tgt)) < f.min_alpha:
        return Drop.ALPHA
    if f.max_repeats and (_repeats(f.max_repeats).search(src) or _repeats(f.max_repeats).search(tgt)):
        return Drop.REPEATS
    if any(f.langs):
        from seq2seq_cli.data.langid import in_language

        if not all(in_language(text, lang, f.langid_min_prob) for text, lang in ((src, f.langs[0]), (tgt, f.langs[1]))):
            return Drop.LANGID
    return Drop.KEPT


def check_batch(src: list[str], tgt: list[str], src_ids: list[list[int]], tgt_ids: list[list[int]],
                f: Filters) -> tuple[list[int], list[int]]:
    """The drop code and the duplicate hash of each pair of a batch."""
    drop, hashes = [], []
    for s, t, a, b in zip(src, tgt, src_ids, tgt_ids):
        drop.append(int(check_pair(s, t, len(a), len(b), f)))
        hashes.append(pair_hash(s, t, f.dedup))
    return drop, hashes


def read_scores(path: str, pairs: int, corpus: str) -> array:
    """The scores of a corpus's pairs, one number per line (what `seq2seq score` writes; the
    first column of a line with tabs), checked to number the corpus's pairs."""
    from pathlib import Path

    from seq2seq_cli.errors import UserError
    from seq2seq_cli.fileio import check_text_file, iter_lines

    check_text_file(Path(path))
    scores = array("d")
    for n, line in enumerate(iter_lines(Path(path)), start=1):
        field = line.split("\t", 1)[0].strip()
        try:
            value = float(field)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise UserError(f"{path}:{n}: expected a number (one score per pair, as seq2seq score writes), got {field!r}")
        scores.append(value)
    if len(scores) != pairs:
        raise UserError(f"{path} has {len(scores)} scores but {corpus} has {pairs} pairs; score that corpus "
                        "(seq2seq score --model RUN ...) to get one score per pair")
    return scores
