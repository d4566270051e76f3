"""The batching window of `seq2seq serve` is spent only under concurrency: a lone request is
decoded at once, however long the window; requests of concurrent clients still wait for each
other within it. The decoding itself is replaced by a recorder: these tests are about when
requests are decoded and with which others."""

from __future__ import annotations

import threading
import time

from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.serve.batcher import Batcher, JobOptions

OPTIONS = JobOptions(DecodeConfig().model_dump_json())


class RecordingBatcher(Batcher):
    """Decodes nothing: each round records its requests' lines and answers each with its own."""

    def __init__(self, wait_s: float, decode_s: float = 0.0) -> None:
        super().__init__(None, wait_s=wait_s)  # type: ignore[arg-type]
        self.rounds: list[list[list[str]]] = []
        self.decode_s = decode_s
        self.decoding = threading.Event()

    def _decode(self, group, sharing=False) -> None:
        self.decoding.set()
        self.rounds.append([job.lines for job in group])
        time.sleep(self.decode_s)
        for job in group:
            job.future.set_result(job.lines)


def test_a_lone_request_is_not_delayed_by_the_window():
    batcher = RecordingBatcher(wait_s=5.0)
    batcher.start()
    try:
        for n in range(3):  # one client: each request after the last one's answer
            start = time.monotonic()
            assert batcher.submit([f"s{n}"], OPTIONS).result(timeout=30) == [f"s{n}"]
            assert time.monotonic() - start < 1.0  # the window is 5 s
    finally:
        batcher.stop()
    assert batcher.rounds == [[["s0"]], [["s1"]], [["s2"]]]


def test_requests_queued_while_the_decoder_is_busy_are_decoded_together_at_once():
    batcher = RecordingBatcher(wait_s=5.0, decode_s=0.3)
    batcher.start()
    try:
        first = batcher.submit(["a"], OPTIONS)
        assert batcher.decoding.wait(10)
        start = time.monotonic()
        rest = [batcher.submit([x], OPTIONS) for x in ("b", "c", "d")]  # while "a" is decoded
        assert first.result(timeout=30) == ["a"]
        assert [f.result(timeout=30) for f in rest] == [["b"], ["c"], ["d"]]
        assert time.monotonic() - start < 3.0  # not held for the 5 s window
    finally:
        batcher.stop()
    assert batcher.rounds == [[["a"]], [["b"], ["c"], ["d"]]]


def test_under_concurrency_the_window_gathers_requests():
    batcher = RecordingBatcher(wait_s=0.5)
    for x in ("a", "b"):  # queued before the worker starts: one round of two
        batcher.submit([x], OPTIONS)
    batcher.start()
    try:
        while len(batcher.rounds) < 1:
            time.sleep(0.01)
        time.sleep(0.05)
        late = [batcher.submit(["c"], OPTIONS)]
        time.sleep(0.1)  # well within the window of "c"
        late.append(batcher.submit(["d"], OPTIONS))
        assert [f.result(timeout=30) for f in late] == [["c"], ["d"]]
    finally:
        batcher.stop()
    assert batcher.rounds == [[["a"], ["b"]], [["c"], ["d"]]]
