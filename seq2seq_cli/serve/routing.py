"""Which run translates a request's (source, target): the run that learned the pair, or two runs
through a pivot language (source -> P -> target), English first as Argos Translate pivots, then
any language that connects, in the order the runs name them. A pair two runs offer goes to the
first named; the others are logged at start."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from seq2seq_cli.serve.runs import Pair, ServedRun

log = logging.getLogger("seq2seq.serve")
PIVOT_FIRST = "en"


@dataclass(frozen=True)
class Leg:
    """One run translating one of its pairs."""

    run: ServedRun
    pair: Pair


@dataclass(frozen=True)
class Route:
    """The legs a request goes through: one, or two through a pivot."""

    legs: tuple[Leg, ...]

    @property
    def pivot(self) -> str | None:
        return self.legs[0].pair[1] if len(self.legs) > 1 else None

    @property
    def runs(self) -> list[str]:
        return [leg.run.name for leg in self.legs]

    @property
    def last(self) -> Leg:
        return self.legs[-1]


class Routes:
    """Every pair the server's runs translate, direct or through a pivot."""

    def __init__(self, runs: list[ServedRun]) -> None:
        self.direct: dict[Pair, ServedRun] = {}
        self.shadowed: list[tuple[Pair, ServedRun, ServedRun]] = []  # (pair, the run left out, the run serving it)
        for run in runs:
            for pair in run.pairs:
                if pair in self.direct:
                    self.shadowed.append((pair, run, self.direct[pair]))
                else:
                    self.direct[pair] = run
        self.languages = list(dict.fromkeys(lang for pair in self.direct for lang in pair))
        self._targets = {src: [tgt for tgt in self.languages if tgt != src and self.find(src, tgt) is not None]
                         for src in self.languages}
        for (src, tgt), left, kept in self.shadowed:
            log.warning("%s -> %s: served by %s, named first; %s offers it too and is not asked for it",
                        src, tgt, kept.name, left.name)

    def find(self, src: str, tgt: str) -> Route | None:
        """The route of src -> tgt, or None where no run and no pivot reaches it."""
        run = self.direct.get((src, tgt))
        if run is not None:
            return Route((Leg(run, (src, tgt)),))
        if src == tgt:
            return None
        for pivot in [PIVOT_FIRST, *self.languages] if PIVOT_FIRST in self.languages else self.languages:
            first, second = self.direct.get((src, pivot)), self.direct.get((pivot, tgt))
            if first is not None and second is not None and pivot not in (src, tgt):
                return Route((Leg(first, (src, pivot)), Leg(second, (pivot, tgt))))
        return None

    def targets(self, src: str) -> list[str]:
        """The languages `src` is translated into, direct or through a pivot, in the runs' order."""
        return self._targets.get(src, [])

    def sources(self) -> list[str]:
        """The languages translated into some other."""
        return [lang for lang in self.languages if self._targets[lang]]

    def reached(self) -> list[str]:
        """The languages some other is translated into."""
        return [lang for lang in self.languages if any(lang in targets for targets in self._targets.values())]
