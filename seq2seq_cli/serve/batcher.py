"""Dynamic batching across requests: decoding threads, a bounded queue, one future per request.

A server of several runs queues each request in its run's lane: a round decodes one lane's
requests (batches never mix runs, nor a run's pairs), and the lanes take turns, the one served
longest ago first, so a flood of requests on one run does not starve the others. While another
lane has had a request within the last SHARED_S seconds, a round takes no more requests than
the busiest of those lanes has (queued now, or in its last round; at least SHARED_ROUND): a lone
client on a quiet run then waits for a short round, not for a flood's whole batch, while runs
that are all busy still batch as many requests as they have.

A server of several runs has a decoding thread per core (`workers`), and rounds of different
lanes may run side by side, each on one of the engine's threads (`SearchEngine.one_thread`):
a round goes on one thread when the server is loaded (another lane is queued or decoding, or
this lane has more queued than its round takes while another lane has just asked), and a
round beside others must be one too. A lone client on another run then starts at once on a
free core instead of waiting for the flood's round; a lone client on a quiet server, a run
our search decodes (its torch threads are the process's), a file's translation and sampling
still decode alone on every thread.

Each request is a `Job`: its lines and its decoding options (`JobOptions`). The worker thread
takes the oldest job, waits until at most `wait_s` after that job arrived for more jobs with
the same options, and decodes the lines of all of them together through the `Translator`
(which cuts them into token-budget batches); forced prefixes are per line, so jobs with and
without them batch together. Each job's future then receives exactly its own
lines, in order. Jobs with other options wait for their own turn; sampling jobs are decoded
one request at a time, so a seed gives the same samples as `translate` of the same lines.

The window is spent only under concurrency: when the last round decoded a single request (one
client, or a server that was idle), the next request is decoded as soon as the decoder is
free, so a lone client's latency is its decoding time; the requests that queue while the
decoder is busy are decoded together in the round after.

Decoding is CPU-bound work: it runs on these threads, never on the server's event loop.
Other decoding work, a whole file's translation (`run_alone`), takes its turn in the same
queue and runs alone, so it never decodes beside a batch (two decodings side by side on all
threads would share the CPU's threads and slow both far more than they gain).
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.errors import UserError

log = logging.getLogger("seq2seq.serve")
SHARED_S = 1.0  # a lane with a request this recent shares the decoder (see the module's text)
SHARED_ROUND = 2  # the fewest requests a round may take while the decoder is shared


@dataclass(frozen=True)
class JobOptions:
    """What a request asks of the decoder; requests batch together only when these are equal."""

    decode: str  # DecodeConfig as JSON (hashable; equal settings give equal text)
    nbest: int = 1
    alignment: bool = False
    attention: bool = False


@dataclass
class Job:
    lines: list[str]
    options: JobOptions
    prefixes: list[list[int]] | None = None  # forced target prefix of each line ([] = none)
    future: Future = field(default_factory=Future)
    arrived: float = field(default_factory=time.monotonic)
    work: Callable[[], Any] | None = None  # run alone on the decoding thread instead (`Batcher.run_alone`)
    translator: Translator | None = None  # None: the batcher's own
    lane: str = ""  # the run it is queued for (`Batcher` module docstring)

    def together(self, other: Job) -> bool:
        """Whether the two jobs may be decoded in one batch."""
        return (other.work is None and other.lane == self.lane and other.translator is self.translator
                and other.options == self.options)


class QueueFull(Exception):
    """The queue holds `limit` requests already."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"{limit} requests queued")
        self.limit = limit


@dataclass
class Counters:
    batches: int = 0  # decoding rounds: groups of requests decoded together
    sentences: int = 0
    requests: int = 0  # requests decoded (timed-out ones that never started are not counted)
    largest_batch: int = 0  # most requests decoded together
    last_batch: list[int] = field(default_factory=list)  # lines of each request in the last round


class Batcher:
    """The decoding worker. `submit` from any thread; `start` once, `stop` to finish the queue and end."""

    def __init__(self, translator: Translator | None, wait_s: float = 0.005, max_queue: int = 256,
                 batching: bool = True, workers: int = 1) -> None:
        self.translator = translator
        self.wait_s = wait_s
        self.max_queue = max_queue
        self.batching = batching
        self.counters = Counters()
        self._queue: deque[Job] = deque()
        self._busy: dict[str, int] = {}  # lane -> requests of it being decoded now
        self._sharing: dict[str, bool] = {}  # lane being decoded -> whether on one thread (`SearchEngine.one_thread`)
        self._last_round = 0  # requests decoded together in the last round: more than one, the window is used
        self._cond = threading.Condition()
        self._stopping = False
        self._threads = [threading.Thread(target=self._run, name=f"seq2seq-decoder-{k}", daemon=True)
                         for k in range(max(1, workers))]
        self._translators: dict[tuple[str, int, str, bool], tuple[Translator, Translator]] = {}  # see `_translator`
        self.lanes: dict[str, Counters] = {}  # the counters of each lane
        self._served: dict[str, int] = {}  # lane -> the round it was last served in
        self._rounds = 0
        self._arrived: dict[str, float] = {}  # lane -> when its last request arrived
        self._last_size: dict[str, int] = {}  # lane -> requests in its last round

    def options(self, decode: DecodeConfig, nbest: int = 1, alignment: bool = False, attention: bool = False) -> JobOptions:
        return JobOptions(decode.model_dump_json(), nbest, alignment, attention)

    def pending(self, lane: str | None = None) -> int:
        """Requests accepted and not answered yet: queued or being decoded (of `lane` only, where given)."""
        with self._cond:
            if lane is None:
                return len(self._queue) + sum(self._busy.values())
            return sum(job.lane == lane for job in self._queue) + self._busy.get(lane, 0)

    def submit(self, lines: list[str], options: JobOptions, prefixes: list[list[int]] | None = None,
               translator: Translator | None = None, lane: str = "") -> Future:
        """Queue a request -> the future of its results (one dict per line); QueueFull when full.
        `prefixes`: the target ids each line's outputs must start with ([] = none); `translator`
        (None: the batcher's own) decodes it in the turns of `lane` (its run)."""
        return self._queue_job(Job(lines, options, prefixes, translator=translator, lane=lane))

    def run_alone(self, work: Callable[[], Any], lane: str = "") -> Future:
        """Queue `work` (a file's translation) to run on the decoding thread in the turns of `lane`,
        alone -> the future of what it returns; QueueFull when full."""
        return self._queue_job(Job([], JobOptions(""), work=work, lane=lane))

    def forget(self, lane: str) -> None:
        """Drop what the batcher keeps of a lane's translators (its run was unloaded)."""
        with self._cond:
            self._translators = {k: v for k, v in self._translators.items() if k[0] != lane}

    def _queue_job(self, job: Job) -> Future:
        with self._cond:
            if self._stopping:
                raise RuntimeError("the decoder is stopping")
            if len(self._queue) + sum(self._busy.values()) >= self.max_queue:
                raise QueueFull(self.max_queue)
            self._queue.append(job)
            self._arrived[job.lane] = job.arrived
            self._cond.notify_all()
        return job.future

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Decode what is queued, then end the worker threads."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout)

    # ------------------------------------------------------------------ the worker thread

    def _lane_ready(self) -> str | None:
        """The lane this worker may decode now, the one served longest ago of those it may
        (None: none). Beside a round being decoded, only a round on one thread of its own
        (`_shares`) beside rounds that are too, as many as the engine has workers."""
        lanes = [lane for lane in dict.fromkeys(j.lane for j in self._queue) if lane not in self._busy]
        if self._busy:
            if not all(self._sharing.values()):
                return None
            lanes = [lane for lane in lanes if (n := self._shares(lane)) and len(self._busy) < n]
        return min(lanes, key=lambda lane: self._served.get(lane, -1), default=None)

    def _shares(self, lane: str) -> int:
        """How many rounds may decode side by side with the next job of `lane` decoded on one
        thread (its engine's workers), or 0 where it cannot be (a file's translation, sampling,
        a run our search decodes on every thread)."""
        first = next(j for j in self._queue if j.lane == lane)
        base = first.translator or self.translator
        engine = base.engine if base is not None else None
        if first.work is not None or _sampling(first.options) or engine is None or engine.one_thread() is None:
            return 0
        return engine.workers

    def _take(self) -> tuple[str, list[Job], bool] | None:
        """The next lane, the group of its jobs to decode together, and whether on one thread
        (None: stopping and nothing left)."""
        with self._cond:
            while (turn := self._lane_ready()) is None:
                if self._stopping and not self._queue:
                    return None
                self._cond.wait()
            # the lane served longest ago goes first; the oldest job of it
            first = next(j for j in self._queue if j.lane == turn)
            self._rounds += 1
            self._served[turn] = self._rounds
            self._busy[turn], self._sharing[turn] = 0, False  # the lane is this worker's from now
            alone = first.work is not None or not self.batching or _sampling(first.options)
            if not alone and self._last_round > 1:  # concurrent clients: wait for companions
                deadline = first.arrived + self.wait_s
                while not self._stopping and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
            group = [first] if alone else [j for j in self._queue if first.together(j)]
            now = time.monotonic()
            waiting = collections.Counter(j.lane for j in self._queue)
            others = [max(waiting[lane], self._last_size.get(lane, 1)) for lane, at in self._arrived.items()
                      if lane != turn and now - at < SHARED_S]
            if others:  # other runs are asking too: a round no larger than theirs
                group = group[: max(SHARED_ROUND, *others)]
            # On one thread where another run is decoding or queued, or this one has more queued
            # than its round takes while another has just asked: the other threads stay free for it.
            loaded = len(self._busy) > 1 or len(waiting) > 1 or (bool(others) and waiting[turn] > len(group))
            sharing = len(self._threads) > 1 and loaded and self._shares(turn) > 1
            self._last_size[turn] = len(group)
            for job in group:
                self._queue.remove(job)
            group = [j for j in group if j.future.set_running_or_notify_cancel()]  # timed out while queued: dropped
            self._last_round = len(group)
            self._busy[turn], self._sharing[turn] = len(group), sharing
            return turn, group, sharing

    def _run(self) -> None:
        while (taken := self._take()) is not None:
            lane, group, sharing = taken
            try:
                if group and group[0].work is not None:
                    _run_work(group[0])
                elif group:
                    self._decode(group, sharing)
            finally:
                with self._cond:
                    self._busy.pop(lane, None)
                    self._sharing.pop(lane, None)
                    self._cond.notify_all()

    def _translator(self, job: Job, sharing: bool = False) -> Translator:
        """The job's translator with its decoding settings (kept, one per translator and
        settings), its engine on one thread where `sharing`."""
        base = job.translator or self.translator
        assert base is not None
        key = (job.lane, id(base), job.options.decode, sharing)
        with self._cond:
            kept = self._translators.get(key)
        if kept is not None and kept[0] is base:
            return kept[1]
        t = base.replaced(decode=DecodeConfig.model_validate_json(job.options.decode))
        if sharing and t.engine is not None:
            t = t.with_engine(t.engine.one_thread())
        with self._cond:
            self._translators[key] = (base, t)
        return t

    def _decode(self, group: list[Job], sharing: bool = False) -> None:
        options = group[0].options
        lines = [line for job in group for line in job.lines]
        try:
            translator = self._translator(group[0], sharing)
            ids = translator.encode(lines)
            prefixes = None
            if any(job.prefixes for job in group):
                prefixes = [p for job in group for p in (job.prefixes or [[] for _ in job.lines])]
            hyps = translator.translate_hypotheses(lines, options.nbest, ids, prefixes=prefixes)
            results = [line_result(translator, options, line, src, h) for line, src, h in zip(lines, ids, hyps)]
        except Exception as exc:  # each request of the group gets the error; the worker goes on
            if not isinstance(exc, UserError):
                log.exception("decoding failed")
            for job in group:
                job.future.set_exception(exc)
            return
        with self._cond:
            for c in (self.counters, self.lanes.setdefault(group[0].lane, Counters())):
                c.batches += 1
                c.sentences += len(lines)
                c.requests += len(group)
                c.largest_batch = max(c.largest_batch, len(group))
                c.last_batch = [len(job.lines) for job in group]
        start = 0
        for job in group:
            job.future.set_result(results[start : start + len(job.lines)])
            start += len(job.lines)


def _run_work(job: Job) -> None:
    assert job.work is not None
    try:
        result = job.work()
    except Exception as exc:  # the request gets the error; the worker goes on
        if not isinstance(exc, UserError):
            log.exception("decoding failed")
        job.future.set_exception(exc)
        return
    job.future.set_result(result)


def _sampling(options: JobOptions) -> bool:
    return DecodeConfig.model_validate_json(options.decode).sampling


def line_result(translator: Translator, options: JobOptions, line: str, src_ids: list[int], hyps: list) -> dict[str, Any]:
    """One line's answer: the translation and its score, the n-best list when asked, and the
    alignment and cross-attention (source pieces x output pieces) of the best one when asked."""
    wants_attention = options.alignment or options.attention or translator.decode.replace_unk
    rendered = []
    best_attention = None
    for rank, h in enumerate(hyps):
        attention = None
        if wants_attention and line.strip():
            attention = translator.cross_attention(src_ids, h.tokens, -1, None)
        if rank == 0:
            best_attention = attention
        score = round(h.score, 4) if math.isfinite(h.score) else None  # null: an n-best list the search could not fill
        rendered.append({"translation": translator.render(h.tokens, line, attention), "score": score})
    out: dict[str, Any] = dict(rendered[0])
    if options.nbest > 1:
        out["nbest"] = rendered
    best = hyps[0]
    if options.alignment:
        pairs = [] if best_attention is None else best_attention[: len(best.tokens), : len(src_ids) - 1].argmax(dim=1).tolist()
        out["alignment"] = " ".join(f"{i}-{j}" for j, i in enumerate(pairs))
    if options.attention:
        out["attention"] = {
            "source": [translator.src_sp.id_to_piece(t) for t in src_ids[:-1]] + ["</s>"] if line.strip() else [],
            "target": [translator.tgt_sp.id_to_piece(t) for t in best.tokens] + ["</s>"] if line.strip() else [],
            "weights": [] if best_attention is None else [[round(w, 4) for w in row] for row in best_attention.tolist()],
        }
    return out
