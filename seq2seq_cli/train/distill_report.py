"""Teacher against student, each on its default path: the table `seq2seq distill` ends with.

For each run: BLEU and chrF of the test split (`translate` as a whole command, no flags, its
output scored with sacreBLEU), that command's lines per second over the test split repeated
(start-up included) and its peak RSS, the median time of one sentence translated alone (the
translator loaded once, default path), and the size of the checkpoint.
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import atomic_write_text

LONE = 50
"""Sentences timed one at a time (the first of the test split)."""

ROWS = (("test BLEU", "bleu", "{:.2f}"), ("test chrF", "chrf", "{:.2f}"),
        ("lines/s, translate (whole command)", "lines_per_s", "{:.1f}"), ("one sentence alone, ms (median)", "lone_ms", "{:.1f}"),
        ("checkpoint, MB", "size_mb", "{:.1f}"), ("peak RSS of translate, MB", "peak_rss_mb", "{:.0f}"))


def measure(run: Path, sources: list[str], refs: list[str], repeat: int, workdir: Path) -> dict[str, object]:
    """The figures of `run` on the test split `sources` (with `refs`); see the module docstring."""
    from seq2seq_cli.decode.evaluate import score
    from seq2seq_cli.fileio import read_lines, write_lines
    from seq2seq_cli.run.loaded import open_run

    src, out, err = workdir / "test.src", workdir / f"{run.name}.hyp", workdir / f"{run.name}.log"
    write_lines(src, sources * repeat)
    # this process's package, not one the working directory happens to hold (-P: no cwd on sys.path)
    command = [sys.executable, "-P", "-m", "seq2seq_cli", "translate", "--model", str(run), "-i", str(src), "-o", str(out),
               "--no-progress"]
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    with open(err, "wb") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
    said = err.read_text(encoding="utf-8", errors="replace").splitlines()
    if proc.returncode != 0:
        raise UserError(f"translate --model {run} failed: {said[-1] if said else f'exit {proc.returncode}'}")
    scores = score(read_lines(out)[:len(sources)], refs)
    lone = lone_latency(str(run), sources[:LONE])
    return {"path": said[0] if said else "", "bleu": scores.bleu, "chrf": scores.chrf,
            "lines_per_s": len(sources) * repeat / seconds, "lone_ms": lone,
            "size_mb": open_run(run).checkpoint.stat().st_size / 1e6, "peak_rss_mb": usage.ru_maxrss / 1024}


def lone_latency(run: str, sentences: list[str]) -> float:
    """Median milliseconds of translating each of `sentences` alone with `run`'s default translator."""
    from seq2seq_cli.decode.loading import load_translator

    translator = load_translator([run]).translator
    translator.translate(sentences[:2])  # warm-up: the first calls load and pack
    times = []
    for sentence in sentences:
        start = time.perf_counter()
        translator.translate([sentence])
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def compare(teacher: Path, student: Path, sources: list[str], refs: list[str], repeat: int = 10) -> dict[str, dict]:
    """{"teacher": figures, "student": figures} on one test split. Each run is measured in a
    fresh process of its own, which starts the `translate` command: a process started by this
    one (which trained the student) would count this one's memory in its peak RSS."""
    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="seq2seq-distill-") as tmp:
        figures = {}
        for role, run in (("teacher", teacher), ("student", student)):
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
                figures[role] = pool.submit(measure, run, sources, refs, repeat, Path(tmp)).result()
        return figures


def table(report: dict[str, dict]) -> str:
    """The report as a plain-text table, the last column the student against the teacher: the
    difference of the scores, how many times faster, the ratio of the sizes."""
    t, s = report["teacher"], report["student"]
    width = max(len(name) for name, _, _ in ROWS)
    lines = [f"{'':{width}}  {'teacher':>10}  {'student':>10}  student"]
    for name, key, form in ROWS:
        if key in ("bleu", "chrf"):
            versus = f"{s[key] - t[key]:+.2f}"
        elif key == "lines_per_s":
            versus = f"{s[key] / t[key]:.2f}x as fast" if t[key] else "-"
        elif key == "lone_ms":
            versus = f"{t[key] / s[key]:.2f}x as fast" if s[key] else "-"
        else:
            versus = f"{s[key] / t[key]:.2f}x" if t[key] else "-"
        lines.append(f"{name:{width}}  {form.format(t[key]):>10}  {form.format(s[key]):>10}  {versus}")
    lines += [f"teacher: {t['path']}", f"student: {s['path']}"]
    return "\n".join(lines)


def write_report(path: Path, report: dict[str, dict]) -> None:
    atomic_write_text(path, json.dumps(report, indent=1) + "\n")
