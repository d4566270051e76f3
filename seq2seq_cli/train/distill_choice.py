"""The teacher's translation a student learns, chosen from its n best (`distill.nbest` > 1).

The teacher translates each line's sentences with `nbest` hypotheses each; of the lines these
make, the one closest to the line's original target by sentence chrF is kept (the Bergamot
pipeline keeps the best of 8 by BLEU; chrF, unlike BLEU, still ranks short sentences that share
no 4-gram with the reference). The student then learns output that is the teacher's own, and
as close to the reference as the teacher's n best allow. A line of several sentences is chosen
a sentence at a time, each the candidate whose whole line scores highest with the others as
chosen so far, ties kept in the teacher's order.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.documents.sentences import Split, Splitter, plan


def closest_line(candidates: list[list[str]], split: Split | None, reference: str,
                 score: Callable[[str, str], float]) -> str:
    """The line made of one candidate per sentence (`candidates[j]`: sentence j's, teacher's
    order; `split`: how the line joins its sentences, None for a line of one) that `score`
    (hypothesis, reference) rates highest against `reference`, chosen a sentence at a time."""
    choice = [0] * len(candidates)

    def line(picks: list[int]) -> str:
        outputs = [c[k] for c, k in zip(candidates, picks)]
        return outputs[0] if split is None else split.join(outputs)

    for j, options in enumerate(candidates):
        best, best_score = 0, -math.inf
        for k in range(len(options)):
            s = score(line(choice[:j] + [k] + choice[j + 1:]), reference)
            if s > best_score:
                best, best_score = k, s
        choice[j] = best
    return line(choice)


def best_of(translator: Translator, splitter: Splitter, nbest: int, sources: list[str], references: list[str]) -> list[str]:
    """Each source line's translation by `translator` chosen from its n best (`closest_line`)."""
    from sacrebleu.metrics import CHRF

    chrf = CHRF()
    split = plan(sources, splitter)
    hyps = translator.translate_hypotheses(split.units, nbest)
    texts = [[translator.tgt_sp.decode(h.tokens) for h in unit if math.isfinite(h.score)] or [""] for unit in hyps]
    out = []
    for line, (start, reference) in enumerate(zip(split.first_unit(), references, strict=True)):
        whole = split.splits[line]
        n = 1 if whole is None else len(whole.sentences)
        out.append(closest_line(texts[start:start + n], whole, reference,
                                lambda hyp, ref: chrf.sentence_score(hyp, [ref]).score))
    return out
