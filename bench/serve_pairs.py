"""The many-pairs serving race: one `seq2seq serve` holding several runs (one `--model` each)
against LibreTranslate serving the same runs as Argos packages, with traffic spread evenly over
the runs' pairs plus pairs that both servers translate through English (es -> ny: es -> en -> ny).

Closed-loop clients (as in `serve_race.py`): client k's request j asks pair (k + j) mod P, with
the next test sentence of that pair's source language, and sends the next when the answer is
back, `--seconds` per level of clients. Per server and level: sentences/s, p50/p95 latency,
requests lost and the server's peak resident memory (VmHWM). Each server starts fresh, answers
every pair once untimed (LibreTranslate loads its models on first use), then the levels run.

`--fair` measures instead what a flood on one pair does to a lone client on another: the p95 of
one client on the first pair alone, then again while `--flood` clients load the second pair.

    python bench/serve_pairs.py es-en=runs/es-en en-es=runs/en-es ny-en=runs/ny-en en-ny=runs/en-ny \\
        --pivots es-ny --levels 1,8,32 --seconds 20 --lt-python /work/lt-venv/bin/python
    python bench/serve_pairs.py es-en=runs/es-en en-es=runs/en-es --fair --seconds 20 --systems ours
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from serve_race import LT_SERVER, free_port, libretranslate_env, peak_rss_mib, run_clients, start, translate_one

TEST = {"es": Path("data/bible-es-en/test.es"), "en": Path("data/bible-es-en/test.en"), "ny": Path("data/bible-ny-en/test.ny")}
Pair = tuple[str, str]


def closed_loop(port: int, texts: dict[str, list[str]], pairs: list[Pair], clients: int, seconds: float) -> dict:
    """`clients` threads, each sending one sentence at a time, the pairs in turn -> figures."""
    latencies: dict[Pair, list[float]] = {p: [] for p in pairs}
    lost = [0]
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        j = 0
        while time.monotonic() < stop_at:
            pair = pairs[(k + j) % len(pairs)]
            sentences = texts[pair[0]]
            body = json.dumps({"q": sentences[(k * 7919 + j) % len(sentences)], "source": pair[0], "target": pair[1]})
            j += 1
            t0 = time.perf_counter()
            try:
                conn.request("POST", "/translate", body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                r.read()
                status = r.status
            except OSError:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
                status = 0
            with lock:
                if status != 200:
                    lost[0] += 1
                else:
                    latencies[pair].append(time.perf_counter() - t0)
        conn.close()

    wall = run_clients(client, clients)
    every = [x for xs in latencies.values() for x in xs]
    q = statistics.quantiles(every, n=100) if len(every) > 1 else (every or [float("nan")]) * 99
    return {"sent_per_s": len(every) / wall, "p50_ms": 1000 * q[49], "p95_ms": 1000 * q[94], "lost": lost[0],
            "per_pair": {f"{s}-{t}": len(xs) for (s, t), xs in latencies.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="SRC-TGT=RUN, one per run (one-pair runs)")
    ap.add_argument("--pivots", default="", help="comma list of SRC-TGT pairs no run translates, asked through English")
    ap.add_argument("--levels", default="1,8,32")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--systems", default="ours,libretranslate", help="ours and/or libretranslate")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cpus", default=None, help="pin each server to these CPUs (taskset -c)")
    ap.add_argument("--lt-python", default=os.environ.get("LIBRETRANSLATE_PYTHON"))
    ap.add_argument("--lt-compute-type", default="float32")
    ap.add_argument("--ours-flags", default="", help="more flags for `seq2seq serve`")
    ap.add_argument("--fair", action="store_true", help="the lone client's p95 on the first pair, idle and under a flood "
                                                        "of --flood clients on the second")
    ap.add_argument("--flood", type=int, default=32)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    runs: list[tuple[Path, Pair]] = []
    for item in args.runs:
        name, _, path = item.partition("=")
        src, _, tgt = name.partition("-")
        runs.append((Path(path), (src, tgt)))
    pairs = [pair for _, pair in runs] + [tuple(p.split("-", 1)) for p in args.pivots.split(",") if p]  # type: ignore[misc]
    languages = sorted({lang for pair in pairs for lang in pair})
    texts = {lang: [s for s in TEST[lang].read_text(encoding="utf-8").splitlines() if s.strip()] for lang in languages
             if lang in TEST}
    systems = args.systems.split(",")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONUNBUFFERED="1")
    work = Path(tempfile.mkdtemp(prefix="serve-pairs-"))
    lt_env = None
    if "libretranslate" in systems:
        if not args.lt_python:
            ap.error("the libretranslate system needs --lt-python (or LIBRETRANSLATE_PYTHON): see serve_race.py")
        (first_run, first_pair), *more = runs
        lt_env = libretranslate_env(first_run, work, args.lt_python, first_pair, args.beam, args.threads,
                                    args.lt_compute_type, env, tuple(more))

    def command(system: str, port: int) -> tuple[list[str], dict[str, str]]:
        if system == "libretranslate":
            assert lt_env is not None and args.lt_python
            return [args.lt_python, "-c", LT_SERVER, "--host", "127.0.0.1", "--port", str(port), "--load-only",
                    ",".join(languages), "--disable-web-ui", "--disable-files-translation"], lt_env
        models = [a for path, _ in runs for a in ("--model", str(path))]
        return [sys.executable, "-m", "seq2seq_cli", "serve", *models, "--device", "cpu", "--port", str(port),
                "--beam-size", str(args.beam), "--max-queue", "1024", "--timeout", "600", *args.ours_flags.split()], env

    rows = []
    for system in systems:
        port = free_port()
        cmd, system_env = command(system, port)
        proc = start(cmd, port, system_env, args.cpus, work / f"{system}.log")
        try:
            for pair in pairs:  # untimed: every pair once (LibreTranslate loads its models on first use)
                print(f"{system} {pair[0]}->{pair[1]}: {translate_one(port, texts[pair[0]][0], pair)[:80]!r}",
                      file=sys.stderr, flush=True)
            if args.fair:
                alone = closed_loop(port, texts, pairs[:1], 1, args.seconds)
                # the flood from a process of its own: its threads would otherwise hold the lone client's GIL
                with multiprocessing.get_context("fork").Pool(1) as flooding:
                    pending = flooding.apply_async(closed_loop, (port, texts, pairs[1:2], args.flood, args.seconds + 2))
                    time.sleep(1)
                    loaded = closed_loop(port, texts, pairs[:1], 1, args.seconds)
                    flood = pending.get()
                row = {"system": system, "idle_p95_ms": alone["p95_ms"], "flooded_p95_ms": loaded["p95_ms"],
                       "ratio": loaded["p95_ms"] / alone["p95_ms"], "flood_sent_per_s": flood["sent_per_s"]}
                print(f"{system}: lone client on {pairs[0]} p95 {alone['p95_ms']:.0f} ms idle, {loaded['p95_ms']:.0f} ms "
                      f"while {args.flood} clients load {pairs[1]} ({row['ratio']:.2f}x; the flood "
                      f"{flood['sent_per_s']:.1f} sent/s)", flush=True)
                rows.append(row)
                continue
            for n in (int(x) for x in args.levels.split(",")):
                f = closed_loop(port, texts, pairs, n, args.seconds)
                rows.append({"system": system, "clients": n, **f})
                print(f"{system:14} {n:4} clients {f['sent_per_s']:7.1f} sent/s p50 {f['p50_ms']:6.0f} ms "
                      f"p95 {f['p95_ms']:6.0f} ms lost {f['lost']} {f['per_pair']}", flush=True)
            rss = peak_rss_mib(proc.pid)
            for row in rows:
                if row["system"] == system:
                    row["peak_mib"] = rss
            print(f"{system}: peak RSS {rss:.0f} MiB", flush=True)
        finally:
            proc.terminate()
            proc.wait()
    if not args.fair and len(systems) == 2:
        for row in rows:
            if row["system"] == systems[0]:
                peer = next(r for r in rows if r["system"] == systems[1] and r["clients"] == row["clients"])
                print(f"{row['clients']:4} clients: {row['sent_per_s'] / peer['sent_per_s']:.2f}x {systems[1]}'s sentences/s, "
                      f"peak RSS {row['peak_mib'] / peer['peak_mib']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
