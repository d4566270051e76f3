"""What the routes of `seq2seq serve` share: the server's settings and one `AppState` record
(the translator, the batcher that decodes for it, the translated files, the request counters), kept on the app as
`app.state.serve`; a route reaches it with `app_state(request)`."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.routing import APIRoute
from starlette.routing import Match

from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.documents.sentences import Splitter
from seq2seq_cli.serve.batcher import Batcher
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


@dataclass
class AppState:
    """One server's translator, settings, batcher and counters."""

    translator: Translator
    settings: ServeSettings
    batcher: Batcher
    splitter: Splitter  # cuts LibreTranslate's texts into sentences (the source language's rules)
    files: FileStore = field(default_factory=FileStore)  # translated files waiting for their download
    requests: Counter[str] = field(default_factory=Counter)  # by route path, OTHER_PATHS for the rest
    responses: Counter[int] = field(default_factory=Counter)  # by status
    started: float = field(default_factory=time.monotonic)
    routes: list[APIRoute] = field(default_factory=list)  # every route of the app

    @classmethod
    def create(cls, translator: Translator, settings: ServeSettings) -> AppState:
        batcher = Batcher(translator, settings.batch_wait_ms / 1000.0, settings.max_queue, settings.batching)
        return cls(translator, settings, batcher, Splitter(translator.languages[0]))

    @property
    def languages(self) -> tuple[str, str]:
        """(source, target) language codes of the run."""
        return self.translator.languages

    @property
    def target_vocabulary(self) -> int:
        return int(self.translator.tgt_sp.get_piece_size())


def app_state(request: Request) -> AppState:
    """The state of the app serving this request."""
    state: AppState = request.app.state.serve
    return state


def path_label(request: Request) -> str:
    """The path a request is counted under: the path of the app's route it matches (by path,
    whatever its method), or OTHER_PATHS where none does."""
    for route in app_state(request).routes:
        if route.matches(request.scope)[0] != Match.NONE:
            return route.path
    return OTHER_PATHS
