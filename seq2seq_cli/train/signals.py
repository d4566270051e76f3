"""Ctrl-C and SIGTERM during training: taken between updates, not in the middle of one."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any


class StopRequest:
    """Set by SIGINT (Ctrl-C) or SIGTERM while the loop runs; the loop looks at it between
    updates, once an update, its validation and its saves are complete, so the `last` it then
    saves resumes exactly. A second signal interrupts at once (KeyboardInterrupt)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __call__(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """SIGINT and SIGTERM set the yielded `StopRequest` instead of interrupting (in the main
    thread; elsewhere signals keep their handlers and the request is never set)."""
    stop = StopRequest()
    previous: dict[signal.Signals, Any] = {}
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, stop)
    except ValueError:  # not the main thread
        pass
    try:
        yield stop
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
