"""Language identification among a few known languages: a character n-gram model of each
language (naive Bayes over n-grams of 1 to 4 characters), fitted on a run's own training text.

It tells apart the languages a server translates, whether or not a general-purpose identifier
knows them: py3langid has no Chichewa and takes its verses for Shona, while a profile of the
run's Chichewa side names them (bench/README.md, "Language detection").

    profiles = fit({"es": spanish_lines, "en": english_lines, "ny": chichewa_lines})
    profiles.probabilities("Nyimbo yoposa, ndiyo ya Solomoni.")  # {"ny": 1.0, "es": 0.0, "en": 0.0}

A run keeps the profiles of its languages in RUN/languages.json (`seq2seq tokenize` writes it;
`profiles_of_run` fits them from the run's training data where it has none).
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ORDERS = (1, 2, 3, 4)  # n-gram lengths in characters
KEPT = 6000  # n-grams kept per language (the most frequent)
SENTENCES = 20000  # training sentences read per language
VERSION = 1
_NOT_LETTERS = re.compile(r"[^\w']+|[\d_]+")


def normalized(text: str) -> str:
    """Lower case, NFC, every run of characters that are not letters one space, with a space at
    each end (n-grams then see the starts and ends of words)."""
    text = unicodedata.normalize("NFC", text).lower().replace("\u2019", "'")
    return " " + _NOT_LETTERS.sub(" ", text).strip() + " "


def ngrams(text: str) -> Iterable[str]:
    """The character n-grams of `normalized(text)`, of each length of ORDERS."""
    s = normalized(text)
    for n in ORDERS:
        for i in range(len(s) - n + 1):
            gram = s[i : i + n]
            if gram != " " * n:
                yield gram


@dataclass
class Profile:
    """One language: the log-probability of each kept n-gram, and of any other."""

    logprob: dict[str, float]
    unseen: float


@dataclass
class Profiles:
    """A profile per language code."""

    languages: dict[str, Profile]

    def scores(self, text: str, among: Iterable[str] | None = None) -> dict[str, float]:
        """Each language's log-likelihood of `text` (among `among`, the languages with a profile)."""
        codes = [c for c in (among if among is not None else self.languages) if c in self.languages]
        grams = Counter(ngrams(text))
        out = {}
        for code in codes:
            p = self.languages[code]
            out[code] = sum(k * p.logprob.get(g, p.unseen) for g, k in grams.items())
        return out

    def probabilities(self, text: str, among: Iterable[str] | None = None) -> dict[str, float]:
        """The posterior of each language (equal priors) that `text` is in it, adding up to 1."""
        scores = self.scores(text, among)
        if not scores:
            return {}
        top = max(scores.values())
        weights = {c: math.exp(s - top) for c, s in scores.items()}
        total = sum(weights.values())
        return {c: w / total for c, w in weights.items()}

    def merged(self, other: Profiles) -> Profiles:
        """These profiles with `other`'s languages that these lack."""
        return Profiles({**other.languages, **self.languages})

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, "orders": list(ORDERS),
                "languages": {c: {"unseen": p.unseen, "logprob": p.logprob} for c, p in self.languages.items()}}

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> Profiles | None:
        """The profiles stored at `path`, or None where there are none (or not of this version)."""
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(raw, dict) or raw.get("version") != VERSION or raw.get("orders") != list(ORDERS):
            return None
        return cls({c: Profile({g: float(v) for g, v in p["logprob"].items()}, float(p["unseen"]))
                    for c, p in raw["languages"].items()})


def fit_one(lines: Iterable[str], kept: int = KEPT, limit: int = SENTENCES) -> Profile:
    """The profile of one language from its sentences (the first `limit`)."""
    counts: Counter[str] = Counter()
    for i, line in enumerate(lines):
        if i >= limit:
            break
        counts.update(ngrams(line))
    top = counts.most_common(kept)
    total = sum(counts.values()) + 1
    smoothing = 0.5
    other = sum(counts.values()) - sum(k for _, k in top)
    denominator = total + smoothing * (len(top) + 1)
    return Profile({g: math.log((k + smoothing) / denominator) for g, k in top},
                   math.log((smoothing + other / max(1, len(counts) - len(top) + 1)) / denominator))


def fit(texts: Mapping[str, Iterable[str]]) -> Profiles:
    """The profile of each language from its sentences."""
    return Profiles({code: fit_one(lines) for code, lines in texts.items()})


def language_texts(config: Any, limit: int = SENTENCES) -> dict[str, list[str]]:
    """Up to `limit` training sentences of each language of a run (`config`: its `Config`),
    from both sides of every corpus, read as training reads them."""
    from seq2seq_cli.data.formats import read_split

    d = config.data
    texts: dict[str, list[str]] = {}
    for corpus in d.corpora:
        dataset = read_split(config, corpus)
        for column, lang in zip(("src", "tgt"), d.pair_of(corpus)):
            have = texts.setdefault(lang, [])
            if len(have) >= limit:
                continue
            rows = dataset.select(range(min(len(dataset), limit - len(have))))
            have.extend(s for s in rows[column] if s)
    return texts


def write_profiles(config: Any, path: Path) -> Profiles:
    """Fit the profiles of a run's languages on its training text and store them at `path`."""
    profiles = fit(language_texts(config))
    profiles.save(path)
    return profiles


def profiles_of_run(config: Any, path: Path) -> Profiles:
    """The run's profiles stored at `path` where they cover its languages, else fitted on its
    training data (not stored: the run stays as training left it); an error where the data
    cannot be read either."""
    found = Profiles.load(path)
    if found is not None and set(found.languages) >= {lang for pair in config.data.pairs for lang in pair}:
        return found
    return fit(language_texts(config))
