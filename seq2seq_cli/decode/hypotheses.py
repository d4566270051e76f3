"""What a search returns, without torch: a hypothesis, its length penalty and a sentence's
output limit. The CTranslate2 engine and the document wing need them before (or without) torch
being imported; the searches (`search.py`) use the same ones."""

from __future__ import annotations

from dataclasses import dataclass

NEG_INF = float("-inf")


@dataclass
class Hypothesis:
    tokens: list[int]  # output ids without the start token and EOS
    score: float  # log_prob / length penalty
    log_prob: float  # sum of token log-probabilities, EOS included where it has one
    eos: bool = True  # it ended with EOS; False: at its output limit, without one


NO_HYPOTHESIS = Hypothesis([], NEG_INF, NEG_INF)  # fills n-best lists the search could not fill


def length_penalty(length: int, alpha: float, kind: str) -> float:
    """lp(|Y|) for a hypothesis of `length` tokens (EOS counted)."""
    if kind == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    return float(length) ** alpha


def output_limit(src_len: int, cap: int, a: float, b: int) -> int:
    """One sentence's output limit a*|x|+b (`src_len` counting EOS), at most `cap`: the value
    `steps.output_limits` gives a batch, computed the same way (float64, capped, floored)."""
    return int(min(max(a * float(src_len) + float(b), 0.0), float(cap)))


def max_source(max_positions: int) -> int:
    """The most source subwords (EOS not counted) a model of `max_positions` positions decodes
    a sentence from; longer ones are cut to this many (`Translator.encode`)."""
    return max_positions - 2
