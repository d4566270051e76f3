"""Another inference engine searching for the translator (`--engine`).

A `Translator` decodes with its own searches (`seq2seq_cli/decode/search.py`) unless an
engine is attached to it (`Translator.engine`): then the sentences the engine can decode
with the request's options go to it, and the rest (forced prefixes, constraints, sampling,
options it lacks, outputs with a token the searches ban) to the searches, so every option works
whichever engine is attached. The engine decodes the same weights with the same settings,
and a sentence gets the output our search would give it. The CTranslate2 engine lives with
the CTranslate2 converter (`seq2seq_cli/decode/ctranslate2_engine.py`); the command line
attaches it.
"""

from __future__ import annotations

from typing import Protocol

from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.decode.hypotheses import Hypothesis


class SearchEngine(Protocol):
    """What a translator needs of an engine."""

    name: str
    workers: int  # the calls it can decode side by side (its threads on a CPU)

    def why_not(self, opts: DecodeConfig, nbest: int) -> str | None:
        """None when the engine decodes with these options, else why not (the searches then do)."""

    def search(self, ids: list[list[int]], opts: DecodeConfig, nbest: int) -> list[list[Hypothesis] | None]:
        """Source ids (each ending in EOS, as `Translator.encode` gives them) -> for each
        sentence its `nbest` hypotheses, best first, or None for a sentence left to the
        searches (where the engines would differ)."""

    def empty_log_prob(self) -> float:
        """The log-probability of the empty output (EOS at once) for an empty source: the score
        of a blank line's translation."""

    def one_thread(self) -> SearchEngine | None:
        """The engine decoding on one of its threads only, so that another decoding can use the
        others beside it (a server of several runs); None where it cannot."""
