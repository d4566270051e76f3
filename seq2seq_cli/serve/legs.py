"""Translating along a route (`routing.py`): each leg by its run, in its run's turns on the
decoding thread; a pivot's second leg translates what the first wrote, as `translate` run twice
(the first's output the second's input) would, for text, HTML and files alike."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.documents.markup import translate_markup
from seq2seq_cli.documents.sentences import Splitter, plan
from seq2seq_cli.serve.batcher import JobOptions
from seq2seq_cli.serve.parse import answered, queued
from seq2seq_cli.serve.routing import Leg, Route
from seq2seq_cli.serve.state import AppState

T = TypeVar("T")


async def translator_of(state: AppState, leg: Leg) -> Translator:
    """The leg's translator, its run loaded first where it is not (off the event loop)."""
    run = leg.run
    if run.loaded:
        return state.pool.translator(run, leg.pair)
    return await asyncio.to_thread(state.pool.translator, run, leg.pair)


async def decode(state: AppState, leg: Leg, lines: list[str], options: JobOptions,
                 prefixes: list[list[int]] | None = None) -> list[dict[str, Any]]:
    """Each line's result by the leg's run, decoded with the requests queued beside it for the same pair."""
    translator = await translator_of(state, leg)
    return await answered(state, queued(lambda: state.batcher.submit(lines, options, prefixes, translator,
                                                                      leg.run.name)))


async def alone(state: AppState, leg: Leg, work: Callable[[Translator, Splitter], T]) -> T:
    """`work` with the leg's translator and the splitter of its source, on the decoding thread in its
    run's turn, alone (a document)."""
    translator = await translator_of(state, leg)
    splitter = state.splitter(leg.pair[0])
    result: T = await answered(state, queued(lambda: state.batcher.run_alone(lambda: work(translator, splitter),
                                                                             leg.run.name)))
    return result


async def split_lines(state: AppState, leg: Leg, lines: list[str]) -> list[str]:
    """`lines` translated by the leg, each cut into sentences and joined back, as `translate` does."""
    split = plan(lines, state.splitter(leg.pair[0]))
    results = await decode(state, leg, split.units, state.batcher.options(leg.run.decode, 1))
    return split.join([r["translation"] for r in results])


async def translate_texts(state: AppState, route: Route, texts: list[str], fmt: str) -> list[str]:
    """LibreTranslate's texts translated along `route`: in `fmt` html with their markup, as
    `translate` does an HTML file; else line by line, one output line per line, each line cut
    into sentences and joined back."""
    for leg in route.legs:
        if fmt == "html":
            texts = await alone(state, leg, functools.partial(markup, texts=texts))
        else:
            per_text = [t.split("\n") for t in texts]
            joined = await split_lines(state, leg, [line for ls in per_text for line in ls])
            texts, k = [], 0
            for ls in per_text:
                texts.append("\n".join(joined[k : k + len(ls)]))
                k += len(ls)
    return texts


def markup(translator: Translator, splitter: Splitter, texts: list[str]) -> list[str]:
    """HTML texts translated with their markup."""
    return [translate_markup(translator, text, "html", splitter) for text in texts]


async def whole_lines(state: AppState, route: Route, lines: list[str], last: JobOptions,
                      prefixes: list[list[int]] | None = None,
                      before: Callable[[Leg], JobOptions] | None = None) -> list[dict[str, Any]]:
    """Each line translated whole along `route`: the legs before the last give their best
    translation (with `before(leg)`'s options: the run's settings by default), the last leg
    decodes with `last` (n-best lists, alignments, prefixes)."""
    for leg in route.legs[:-1]:
        options = before(leg) if before is not None else state.batcher.options(leg.run.decode, 1)
        lines = [r["translation"] for r in await decode(state, leg, lines, options)]
    return await decode(state, route.last, lines, last, prefixes)
