"""The serving race: closed-loop HTTP clients against `seq2seq serve` with batching across
requests, the same server with batching off (`--no-batching`: one request per decoding batch),
and a CTranslate2 `Translator` on the export of the same run behind the same HTTP stack
(FastAPI + uvicorn, one `translate_batch` per request, as LibreTranslate serves Argos models).

Each client sends one test-split sentence at a time to the LibreTranslate-compatible
`POST /translate` and sends the next when the answer is back, for `--seconds` per level of
concurrency (1, 8, 32, 128 clients). Per system and level: sentences/s, p50/p95/p99 latency,
requests lost (any answer but 200), sentences whose answers were not all the same (mixed up),
and the server's peak resident memory (VmHWM, its whole life). Servers run one at a time,
alternating system by system within each round; each is started fresh for its turn and may be
pinned to CPUs (`--cpus 0,1`) so the clients do not take the server's cores where there are
more. After the race the decode time of each sentence alone (the same translator in this
process, beam as raced) gives the yardstick for the latency at 1 client.

    python bench/serve_race.py runs/quickstart                    # beam 5, 20 s per level, 1 round
    python bench/serve_race.py runs/quickstart --seconds 10 --levels 1,8,32 --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

CT2_SERVER = """
import sys, ctranslate2, sentencepiece as spm, uvicorn
from fastapi import FastAPI, Request
model, sp_path, beam, threads, port, len_a, len_b = sys.argv[1:8]
sp = spm.SentencePieceProcessor(model_file=sp_path)
t = ctranslate2.Translator(model, device="cpu", intra_threads=int(threads), inter_threads=1)
app = FastAPI()

@app.post("/translate")
def translate(body: dict):
    tokens = sp.encode(body["q"], out_type=str)
    limit = int(float(len_a) * (len(tokens) + 1) + int(len_b))  # the output limit of our search: a * source (EOS counted) + b
    out = t.translate_batch([tokens], beam_size=int(beam), max_decoding_length=max(1, min(limit, 254)))
    return {"translatedText": sp.decode(out[0].hypotheses[0])}

@app.get("/health")
def health():
    return {"status": "ok"}

uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], port: int, env: dict[str, str], cpus: str | None) -> subprocess.Popen:
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{' '.join(cmd[:6])} ... exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc
        except OSError:
            time.sleep(0.3)
    proc.kill()
    sys.exit("the server did not answer within 300 s")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def closed_loop(port: int, sentences: list[str], clients: int, seconds: float, pair: tuple[str, str]) -> dict:
    """`clients` threads, each sending one sentence at a time for `seconds` -> figures and answers."""
    latencies: list[float] = []
    answers: dict[str, set[str]] = {}
    lost = [0]
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        i = k
        while time.monotonic() < stop_at:
            sentence = sentences[i % len(sentences)]
            i += clients
            body = json.dumps({"q": sentence, "source": pair[0], "target": pair[1]})
            t0 = time.perf_counter()
            try:
                conn.request("POST", "/translate", body, {"Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
                status = r.status
            except OSError:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
                status, data = 0, b""
            elapsed = time.perf_counter() - t0
            with lock:
                if status != 200:
                    lost[0] += 1
                    continue
                latencies.append(elapsed)
                answers.setdefault(sentence, set()).add(json.loads(data)["translatedText"])
        conn.close()

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else (latencies or [float("nan")]) * 99
    return {"sentences": len(latencies), "sent_per_s": len(latencies) / wall, "p50_ms": 1000 * q[49], "p95_ms": 1000 * q[94],
            "p99_ms": 1000 * q[98], "lost": lost[0], "mixed": sum(len(v) > 1 for v in answers.values()),
            "answers": {s: sorted(v)[0] for s, v in answers.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="trained run directory (e.g. the quick start's)")
    ap.add_argument("--src", type=Path, default=Path("data/bible-es-en/test.es"))
    ap.add_argument("--pair", default="es,en", help="the run's source and target language codes")
    ap.add_argument("--levels", default="1,8,32,128", help="comma list of client counts")
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each level")
    ap.add_argument("--systems", default="batched,unbatched,ct2", help="comma list of: batched, unbatched, ct2")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="decoding threads of each server")
    ap.add_argument("--cpus", default=None, help="pin each server to these CPUs (taskset -c), e.g. 0,1")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONUNBUFFERED="1")
    sentences = [s for s in args.src.read_text(encoding="utf-8").splitlines() if s.strip()]
    pair = tuple(args.pair.split(","))
    levels = [int(n) for n in args.levels.split(",")]
    systems = args.systems.split(",")
    work = Path(tempfile.mkdtemp(prefix="serve-race-"))
    decode = yaml.safe_load((args.run / "config.yaml").read_text(encoding="utf-8"))["decode"]
    if "ct2" in systems:
        subprocess.run([sys.executable, "-m", "seq2seq_cli", "export", "--model", str(args.run), str(work / "ct2")],
                       check=True, env=env, stdout=subprocess.DEVNULL)

    def command(system: str, port: int) -> list[str]:
        if system == "ct2":
            return [sys.executable, "-c", CT2_SERVER, str(work / "ct2"), str(args.run / "spm.model"), str(args.beam),
                    str(args.threads), str(port), str(decode["max_len_a"]), str(decode["max_len_b"])]
        flags = ["--no-batching"] if system == "unbatched" else []
        return [sys.executable, "-m", "seq2seq_cli", "serve", "--model", str(args.run), "--device", "cpu", "--port", str(port),
                "--beam-size", str(args.beam), "--max-queue", "1024", "--timeout", "600", *flags]

    results: dict[tuple[str, int], list[dict]] = {(s, n): [] for s in systems for n in levels}
    for r in range(args.rounds):
        for system in systems:
            port = free_port()
            proc = start(command(system, port), port, env, args.cpus)
            for n in levels:
                figures = closed_loop(port, sentences, n, args.seconds, pair)
                results[(system, n)].append(figures)
                f = figures
                print(f"round {r + 1} {system:9} {n:4} clients {f['sent_per_s']:7.1f} sent/s p50 {f['p50_ms']:7.0f} ms "
                      f"p95 {f['p95_ms']:7.0f} ms p99 {f['p99_ms']:7.0f} ms lost {f['lost']} mixed {f['mixed']}",
                      file=sys.stderr, flush=True)
            rss = peak_rss_mib(proc.pid)
            for n in levels:
                results[(system, n)][-1]["peak_mib"] = rss
            proc.terminate()
            proc.wait()

    # the yardstick: each sentence sent at 1 client, decoded alone by the same translator
    alone_ms: list[float] = []
    if "batched" in systems and 1 in levels:
        import torch

        from seq2seq_cli.decode.translate import Translator

        torch.set_num_threads(args.threads)
        translator = Translator.load(args.run, "cpu", {"beam_size": args.beam})

        def alone() -> None:  # on a thread of its own, as the server decodes (see bench/README.md)
            for sentence in list(results[("batched", 1)][0]["answers"])[:200]:
                t0 = time.perf_counter()
                translator.translate([sentence])
                alone_ms.append(1000 * (time.perf_counter() - t0))

        worker = threading.Thread(target=alone)
        worker.start()
        worker.join()

    rows = []
    for (system, n), runs in results.items():
        row = {"system": system, "clients": n}
        for key in ("sent_per_s", "p50_ms", "p95_ms", "p99_ms", "peak_mib"):
            row[key] = statistics.median(f[key] for f in runs)
        row["lost"] = sum(f["lost"] for f in runs)
        row["mixed"] = sum(f["mixed"] for f in runs)
        rows.append(row)
    # sentences whose answer differs between the batched server and the server without batching
    differ = None
    if {"batched", "unbatched"} <= set(systems):
        a = {s: t for f in sum((results[("batched", n)] for n in levels), []) for s, t in f["answers"].items()}
        b = {s: t for f in sum((results[("unbatched", n)] for n in levels), []) for s, t in f["answers"].items()}
        differ = {"compared": len(a.keys() & b.keys()), "different": sum(a[s] != b[s] for s in a.keys() & b.keys())}

    print(f"\n{'system':9} {'clients':>7} {'sent/s':>7} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} {'MiB':>6} "
          f"{'lost':>4} {'mixed':>5}  vs")
    for row in rows:
        peers = [p for p in rows if p["clients"] == row["clients"] and p["system"] != row["system"]]
        vs = ", ".join(f"{row['sent_per_s'] / p['sent_per_s']:.2f}x {p['system']}" for p in peers if p["sent_per_s"])
        print(f"{row['system']:9} {row['clients']:7} {row['sent_per_s']:7.1f} {row['p50_ms']:7.0f} {row['p95_ms']:7.0f} "
              f"{row['p99_ms']:7.0f} {row['peak_mib']:6.0f} {row['lost']:4} {row['mixed']:5}  {vs}")
    if alone_ms:
        p95_alone = statistics.quantiles(alone_ms, n=20)[18]
        print(f"decode alone, the sentences of the 1-client level: median {statistics.median(alone_ms):.0f} ms, "
              f"p95 {p95_alone:.0f} ms")
    if differ:
        print(f"batched vs unbatched answers: {differ['different']} of {differ['compared']} sentences differ")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "alone_ms": alone_ms, "differ": differ}, indent=1))


if __name__ == "__main__":
    main()
