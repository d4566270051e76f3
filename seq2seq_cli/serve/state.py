"""What the routes of `seq2seq serve` share: the server's settings and one `AppState` record
(the runs and the routes between their languages, the batcher that decodes for them, the language
detector, the translated files, the request counters), kept on the app as `app.state.serve`; a
route reaches it with `app_state(request)`."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.routing import APIRoute
from starlette.routing import Match

from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.device import cpu_threads
from seq2seq_cli.documents.sentences import Splitter
from seq2seq_cli.serve.batcher import Batcher
from seq2seq_cli.serve.detection import Detector
from seq2seq_cli.serve.routing import Routes
from seq2seq_cli.serve.runs import Pool, ServedRun
from seq2seq_cli.serve.store import FileStore

# The label under which /metrics counts requests for paths the server has no route for, so
# that clients asking for new paths cannot grow the counters.
OTHER_PATHS = "other"


@dataclass
class ServeSettings:
    """Limits and behaviour of the server (the `serve` command's options)."""

    batch_wait_ms: float = 5.0  # how long the oldest queued request waits for others to batch with
    max_queue: int = 256  # requests queued or being decoded; beyond it 503
    max_chars: int = 20000  # characters of text per request; beyond it 413
    max_lines: int = 200  # lines (sentences) per request; beyond it 413
    timeout_s: float = 60.0  # a request not answered in this time gets 504
    api_keys: frozenset[str] | None = None  # None: no key needed
    batching: bool = True  # False: one request per decoding batch
    max_loaded: int | None = None  # runs loaded at once, on first use; None: all, at start


@dataclass
class AppState:
    """One server's runs, routes, settings, batcher and counters."""

    pool: Pool
    routes: Routes
    settings: ServeSettings
    batcher: Batcher
    detector: Detector
    splitters: dict[str, Splitter] = field(default_factory=dict)  # by language: cut texts into sentences
    files: FileStore = field(default_factory=FileStore)  # translated files waiting for their download
    requests: Counter[str] = field(default_factory=Counter)  # by route path, OTHER_PATHS for the rest
    responses: Counter[int] = field(default_factory=Counter)  # by status
    started: float = field(default_factory=time.monotonic)
    api_routes: list[APIRoute] = field(default_factory=list)  # every route of the app

    @classmethod
    def create(cls, served: Translator | list[ServedRun], settings: ServeSettings) -> AppState:
        """The state of a server of `served`: a translator (its one pair), or runs."""
        runs = [ServedRun.of_translator(served)] if isinstance(served, Translator) else served
        # a decoding thread per run, up to one per core: rounds of different runs may decode side by side
        batcher = Batcher(None, settings.batch_wait_ms / 1000.0, settings.max_queue, settings.batching,
                          min(len(runs), cpu_threads()))
        pool = Pool(runs, settings.max_loaded, lambda run: batcher.forget(run.name))
        routes = Routes(runs)
        splitters = {lang: Splitter(lang) for lang in routes.languages}  # made at start: the first request waits for none
        return cls(pool, routes, settings, batcher, Detector(routes.languages, runs), splitters)

    def splitter(self, language: str) -> Splitter:
        """The sentence splitter of `language`."""
        found = self.splitters.get(language)
        if found is None:
            found = self.splitters[language] = Splitter(language)
        return found


def app_state(request: Request) -> AppState:
    """The state of the app serving this request."""
    state: AppState = request.app.state.serve
    return state


def path_label(request: Request) -> str:
    """The path a request is counted under: the path of the app's route it matches (by path,
    whatever its method), or OTHER_PATHS where none does."""
    for route in app_state(request).api_routes:
        if route.matches(request.scope)[0] != Match.NONE:
            return route.path
    return OTHER_PATHS
