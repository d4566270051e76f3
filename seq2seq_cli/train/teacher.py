"""The teacher's side of distillation: its translate function, its passes over the sources of
a student's training corpora, written as they go and resumed where they stopped, and the process
of its own they run in (`distill.py` is the student's side and the whole recipe).

    STUDENT/distilled/train-N.jsonl            corpus N of the student's data.train, its targets
                                               the teacher's translations ({SRC: ..., TGT: ...})
    STUDENT/distilled/train-N.jsonl.partial    ... while the teacher's pass is under way,
    STUDENT/distilled/train-N.progress.json    with how far it got (rows, bytes, teacher, sources, nbest)

The teacher translates on its default path (the fastest: CTranslate2 with its shortlist where
installed), lines cut into sentences as `evaluate` cuts them, in chunks; with `distill.nbest` > 1
each line's translation is the one of its n best closest to the line's original target
(`distill_choice.py`). After each chunk the
partial file is synced and the progress record replaced, so a pass stopped anywhere (Ctrl-C,
SIGTERM, a killed process) resumes at the first row not yet recorded: a row is never
translated twice, and bytes written after the record are cut off. A pass whose teacher
weights, sources or nbest differ from the record starts over.

The passes run in a process of their own (`separate_teacher_passes`), which checks that the
teacher checkpoint still holds the weights `distill` started with, and ends with its parent.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from seq2seq_cli.config import Config
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import atomic_write_text
from seq2seq_cli.layout import RunLayout
from seq2seq_cli.run import runlock
from seq2seq_cli.run.loaded import RunFiles, open_run

CHUNK = 512
"""Rows translated between two progress records: what a stop can lose at most."""

STOP_WAIT = 10.0
"""Seconds the teacher's process is given to stop by SIGTERM before it is killed."""

Translate = Callable[[list[str], list[str]], list[str]]
"""(source lines, their original targets) -> the teacher's translations of the sources."""


@dataclass
class Pass:
    """The teacher's pass over one corpus: where its output goes and how far it got."""

    final: Path
    teacher: str  # the teacher checkpoint's weights sha256
    sources: str  # sha256 of the corpus's source lines
    rows: int
    nbest: int = 1  # the teacher's n best per line, the one closest to the original target kept

    @property
    def partial(self) -> Path:
        return self.final.with_name(self.final.name + ".partial")

    @property
    def progress(self) -> Path:
        return self.final.with_name(self.final.name.removesuffix(".jsonl") + ".progress.json")

    def record(self, done: int, size: int) -> dict[str, object]:
        kept = {"teacher_sha256": self.teacher, "sources_sha256": self.sources, "rows": self.rows, "done": done,
                "bytes": size}
        return kept if self.nbest == 1 else {**kept, "nbest": self.nbest}  # a record of nbest 1 as before it was kept

    def _kept(self) -> dict | None:
        """The progress record on disk, or None where there is none or it is unreadable."""
        try:
            kept = json.loads(self.progress.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return kept if isinstance(kept, dict) else None

    def resume_point(self, log: Callable[[str], None]) -> tuple[int, int]:
        """(rows, bytes) already written by an earlier pass of this teacher over these sources;
        (0, 0) where none was, or where it was another teacher's or other sources'."""
        if not self.progress.is_file() or not self.partial.is_file():
            return 0, 0
        kept = self._kept() or {}
        try:
            done, size = int(kept["done"]), int(kept["bytes"])
        except (ValueError, KeyError, TypeError):
            log(f"{self.progress}: not a progress record; the teacher's pass starts over")
            return 0, 0
        if kept.get("teacher_sha256") != self.teacher or kept.get("sources_sha256") != self.sources:
            log(f"{self.partial}: written by another teacher checkpoint or from other sources; the pass starts over")
            return 0, 0
        if kept.get("nbest", 1) != self.nbest:
            log(f"{self.partial}: chosen from the teacher's {kept.get('nbest', 1)} best, not {self.nbest}; "
                "the pass starts over")
            return 0, 0
        if self.partial.stat().st_size < size or not 0 <= done <= self.rows:
            log(f"{self.partial}: shorter than its progress record; the teacher's pass starts over")
            return 0, 0
        return done, size

    def complete(self) -> bool:
        """Whether the final corpus exists and its record is this teacher's over these sources."""
        return self.final.is_file() and self._kept() == self.record(self.rows, self.final.stat().st_size)


class Sources:
    """The source lines of a corpus read by `read_split` (and their original targets), taken
    from its Arrow table a chunk at a time (a corpus of millions of lines is never held as
    Python strings all at once)."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset.select_columns(["src", "tgt"])

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, rows: slice) -> list[str]:
        return self._column("src", rows)

    def targets(self, rows: slice) -> list[str]:
        """The original targets of the source lines `self[rows]`."""
        return self._column("tgt", rows)

    def _column(self, name: str, rows: slice) -> list[str]:
        start, stop, _ = rows.indices(len(self.dataset))
        return self.dataset[start:stop][name] if stop > start else []

    def sha256(self) -> str:
        """sha256 of the lines joined by newlines, read a chunk at a time."""
        h = hashlib.sha256()
        for start in range(0, len(self), 65536):
            lines = self[start:start + 65536]
            h.update(("\n" if start else "").encode() + "\n".join(lines).encode("utf-8", "surrogatepass"))
        return h.hexdigest()


def distilled_path(config: Config, index: int) -> Path:
    """STUDENT/distilled/train-N.jsonl: the distilled corpus N (from 1) of the student's data.train."""
    return RunLayout(config.run_path).distilled / f"train-{index + 1}.jsonl"


def teacher_passes(config: Config, teacher: RunFiles, translate: Translate, progress: bool = True,
                   log: Callable[[str], None] = lambda _: None) -> list[Path]:
    """The teacher's translations of every training corpus of `config` (the student's config as
    written, before `student_config`), each written by `teacher_pass`; their paths."""
    from seq2seq_cli.data.formats import read_split

    out = []
    with runlock.hold(config.run_path, runlock.command_line()):
        RunLayout(config.run_path).distilled.mkdir(parents=True, exist_ok=True)
        for i, corpus in enumerate(config.data.corpora):
            try:
                pairs = read_split(config, corpus)
            except UserError as exc:
                where = config.where("data", "train", i) if isinstance(config.data.train, list) else config.where("data", "train")
                raise UserError(f"{where}: {exc}") from None
            sources = Sources(pairs)
            nbest = 1 if config.distill is None else config.distill.nbest
            job = Pass(distilled_path(config, i), teacher.weights_sha256, sources.sha256(), len(sources), nbest)
            d = config.data
            keys = (d.src_field or d.src_lang, d.tgt_field or d.tgt_lang)
            teacher_pass(job, sources, keys, translate, progress, log)
            out.append(job.final)
    return out


def teacher_pass(job: Pass, sources: Sources, keys: tuple[str, str], translate: Translate, progress: bool,
                 log: Callable[[str], None]) -> None:
    """Translate `sources` into `job.final` (JSONL rows {keys[0]: source, keys[1]: translation}),
    resuming an earlier pass; see the module docstring."""
    from tqdm import tqdm

    if job.complete():
        log(f"{job.final}: the teacher's translations of {job.rows:,} lines are there already")
        return
    done, size = job.resume_point(log)
    if done:
        log(f"{job.partial}: resuming the teacher's pass at line {done + 1:,} of {job.rows:,}")
    with open(job.partial, "r+b" if done else "wb") as f:
        f.truncate(size)
        f.seek(size)
        with tqdm(total=job.rows, initial=done, unit="line", desc=f"teacher -> {job.final.name}", disable=not progress,
                  dynamic_ncols=True) as bar:
            while done < job.rows:
                rows = slice(done, done + CHUNK)
                chunk = sources[rows]
                hyps = translate(chunk, sources.targets(rows))
                f.write("".join(json.dumps({keys[0]: s, keys[1]: h}, ensure_ascii=False) + "\n"
                                for s, h in zip(chunk, hyps, strict=True)).encode("utf-8", "surrogatepass"))
                f.flush()
                os.fsync(f.fileno())
                done += len(chunk)
                atomic_write_text(job.progress, json.dumps(job.record(done, f.tell())))
                bar.update(len(chunk))
    os.replace(job.partial, job.final)
    atomic_write_text(job.progress, json.dumps(job.record(job.rows, job.final.stat().st_size)))
    log(f"wrote {job.final}: the teacher's translations of {job.rows:,} lines")


def teacher_translate(teacher: RunFiles, beam_size: int | None, nbest: int = 1) -> tuple[Translate, str]:
    """The teacher's translate function on its default path (lines cut into sentences as
    `evaluate` cuts them; with `nbest` > 1 each line's closest to its original target of the n
    best, `distill_choice.best_of`) and the path's description. The beam is `beam_size`, else
    the teacher's own, raised to `nbest`."""
    import dataclasses

    from seq2seq_cli.decode.ctranslate2_engine import CTranslate2Engine
    from seq2seq_cli.decode.loading import load_translator
    from seq2seq_cli.documents.lines import translate_sentences
    from seq2seq_cli.documents.sentences import Splitter
    from seq2seq_cli.train.distill_choice import best_of

    beam = max(beam_size or teacher.config.decode.beam_size, nbest)
    choice = load_translator([teacher.checkpoint], "auto", {"beam_size": beam})  # the checkpoint named, not the run's best
    t = choice.translator
    splitter = Splitter(t.languages[0])
    if nbest == 1:
        return lambda sources, _targets: translate_sentences(t.translate, sources, splitter), choice.describe()
    if isinstance(t.engine, CTranslate2Engine):  # its n-best lists differ from our search's only below the best
        t = t.with_engine(dataclasses.replace(t.engine, any_nbest=True))
    return (lambda sources, targets: best_of(t, splitter, nbest, sources, targets),
            f"{choice.describe()}, each line the closest to its original target (chrF) of the {nbest} best")


def separate_teacher_passes(config: Config, teacher: RunFiles, progress: bool) -> list[str]:
    """`teacher_passes` with the teacher's own translator, in a process of its own -> what it
    logged. The student then trains in a process that never held the teacher's engine: its
    OpenMP threads, which would slow torch's on the same cores, and its memory go with it.
    Ctrl-C or SIGTERM stop both; the pass resumes where its last record says."""
    import multiprocessing

    from seq2seq_cli.fileio import terminate_as_interrupt

    spawn = multiprocessing.get_context("spawn")
    receive, send = spawn.Pipe(duplex=False)
    child = spawn.Process(target=_teacher_process, name="seq2seq-teacher",
                          args=(config, teacher.checkpoint, teacher.weights_sha256, os.getpid(), progress, send))
    child.start()
    send.close()
    try:
        with terminate_as_interrupt():
            child.join()
    except BaseException:
        child.terminate()  # SIGTERM: the child stops as by Ctrl-C, its resources released
        child.join(STOP_WAIT)
        if child.is_alive():  # still inside one long call of the engine
            child.kill()
            child.join()
        raise
    answer = receive.recv() if receive.poll() else None
    if answer is None:
        raise UserError(f"the teacher's pass stopped (exit code {child.exitcode}); run the command again: it resumes "
                        "where the pass was last recorded")
    if answer[0] == "interrupted":
        raise KeyboardInterrupt
    if answer[0] == "error":
        raise UserError(answer[1])
    return answer[1]


def _teacher_process(config: Config, checkpoint: Path, weights_sha256: str, parent: int, progress: bool, send) -> None:
    """The spawned process of `separate_teacher_passes`, translating with the teacher
    `checkpoint` (whose weights must still be `weights_sha256`): sends ("done", log lines),
    ("error", message) or ("interrupted",). It ends with its `parent` (`die_with_parent`)."""
    from seq2seq_cli.fileio import terminate_as_interrupt

    said: list[str] = []
    try:
        die_with_parent(parent)
        with terminate_as_interrupt():
            _teacher_passes_here(config, checkpoint, weights_sha256, progress, said)
        send.send(("done", said))
    except UserError as exc:
        send.send(("error", str(exc)))
    except (KeyboardInterrupt, SystemExit):
        send.send(("interrupted",))


def _teacher_passes_here(config: Config, checkpoint: Path, weights_sha256: str, progress: bool, said: list[str]) -> None:
    """`_teacher_process`'s work: `teacher_passes` with the teacher's own translator."""
    assert config.distill is not None
    teacher = open_run(checkpoint)
    if teacher.weights_sha256 != weights_sha256:
        raise UserError(f"{checkpoint}: written again since distill started (a training run saving it?); "
                        "run the command again once the teacher is settled")
    translate, path = teacher_translate(teacher, config.distill.beam_size, config.distill.nbest)
    said.append(f"teacher {teacher.run_dir}: {path}")
    teacher_passes(config, teacher, translate, progress, said.append)


def die_with_parent(parent: int) -> None:
    """End this process (SIGKILL: at once, in the middle of the engine's work; the pass resumes
    from its last record) when the process `parent` ends, even by SIGKILL, so that a killed
    `distill` leaves no teacher translating on, holding the student run's lock: on
    Linux by the kernel (PR_SET_PDEATHSIG), elsewhere by a thread watching the parent's pid."""
    import signal
    import sys
    import threading
    import time

    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            if os.getppid() != parent:  # the parent ended before the request took hold
                os.kill(os.getpid(), signal.SIGKILL)
            return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="seq2seq-parent-watch", daemon=True).start()
