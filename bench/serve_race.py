"""The serving race: closed-loop HTTP clients against `seq2seq serve` with batching across
requests, the same server with batching off (`--no-batching`: one request per decoding batch),
a CTranslate2 `Translator` on the export of the same run behind the same HTTP stack (FastAPI +
uvicorn, one `translate_batch` per request), and LibreTranslate itself serving the Argos
export (`seq2seq export --format argos`) of the same run.

Each client sends one test-split sentence at a time to the LibreTranslate-compatible
`POST /translate` and sends the next when the answer is back, for `--seconds` per level of
concurrency (1, 8, 32, 128 clients). Per system and level: sentences/s, p50/p95/p99 latency,
requests lost (any answer but 200), sentences whose answers were not all the same (mixed up),
and the server's peak resident memory (VmHWM, its whole life). Before any timing each system
is started once and translates the same sentence; the answers are printed side by side and the
race stops if one is empty or the source itself. Servers run one at a time, alternating system
by system within each round; each is started fresh for its turn, answers one untimed request
(LibreTranslate loads its model on the first), and may be pinned to CPUs (`--cpus 0,1`) so the
clients do not take the server's cores where there are more. After the race the decode time of
each sentence alone (the same translator in this process, beam as raced) gives the yardstick
for the latency at 1 client.

LibreTranslate runs from a virtual environment of its own (never this project's), with spaCy
for its sentence splitting; the race needs nothing else from the network:

    python3 -m venv /work/lt-venv
    /work/lt-venv/bin/pip install libretranslate==1.9.6 spacy   # one command, so that pip resolves both

The race exports the run for Argos, installs the package with argostranslate's
`package.install_from_path` into a LibreTranslate home under a temporary folder (XDG_*_HOME,
ARGOS_PACKAGES_DIR), and starts `libretranslate --load-only SRC,TGT` there with:
ARGOS_BEAM_SIZE = --beam (LibreTranslate asks for one hypothesis, so argostranslate searches
with beam max(1, ARGOS_BEAM_SIZE); its default is 4), ARGOS_INTRA_THREADS = --threads and
ARGOS_INTER_THREADS = 1 (one CTranslate2 translator with that many threads; the default, 0,
lets CTranslate2 choose), ARGOS_COMPUTE_TYPE = --lt-compute-type (float32 as ours; argos's
default, auto, computes in int8 where the CPU has it), ARGOS_CHUNK_TYPE = SPACY (the
package's own rule-based splitter, spacy/; the default splitter, MiniSBD, fetches a model for
the source language on first use), ARGOS_PACKAGE_INDEX = an empty index on disk (with
fewer than two packages installed LibreTranslate looks for models to install at start), and
ORT_DISABLE_TELEMETRY = 1 (onnxruntime, which argostranslate imports, otherwise sends usage events).

    python bench/serve_race.py runs/quickstart                    # beam 5, 20 s per level, 1 round
    python bench/serve_race.py runs/quickstart --seconds 10 --levels 1,8,32 --rounds 3 --json out.json
    python bench/serve_race.py runs/quickstart --systems ours,libretranslate --levels 1,8,32 --seconds 30 \
        --rounds 2 --lt-python /work/lt-venv/bin/python    # or LIBRETRANSLATE_PYTHON=/work/lt-venv/bin/python
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
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


# Run with LibreTranslate's Python: install the package as argostranslate installs one.
LT_INSTALL = """
import sys, argostranslate.package as package
package.install_from_path(sys.argv[1])
print(*(f"{p.from_code}->{p.to_code} in {p.package_path}" for p in package.get_installed_packages()))
"""

# LibreTranslate's own console script (`libretranslate`): its flags as sys.argv[1:].
LT_SERVER = "from libretranslate.main import main; main()"

SYSTEMS = ("batched", "ours", "ours-ct2", "unbatched", "ct2", "libretranslate")  # ours: `seq2seq serve` as shipped, as batched


def libretranslate_env(run: Path, work: Path, lt_python: str, pair: tuple[str, str], beam: int, threads: int,
                       compute_type: str, env: dict[str, str], more: tuple[tuple[Path, tuple[str, str]], ...] = ()
                       ) -> dict[str, str]:
    """Export `run` (and the runs of `more`, each with its pair) for Argos and install them into a
    LibreTranslate home of its own under `work`; -> the server's environment (see the module's
    text for each setting)."""
    home = work / "libretranslate"
    packages = []
    for each, (src, tgt) in ((run, pair), *more):  # one-pair runs: each package names its run's pair
        package = work / f"{src}_{tgt}.argosmodel"
        subprocess.run([sys.executable, "-m", "seq2seq_cli", "export", "--model", str(each), "--format", "argos", str(package)],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        packages.append(package)
    # Imported with ARGOS_CHUNK_TYPE=SPACY, argostranslate fetches spaCy's multilingual sentence
    # model unless this folder exists (and spaCy's downloader ends the process when it cannot);
    # it is never loaded, as the package carries its own splitter (spacy/).
    (home / "cache" / "argos-translate" / "spacy" / "senter" / "model").mkdir(parents=True)
    (home / "index").mkdir()
    (home / "index" / "index.json").write_text("[]\n", encoding="utf-8")
    lt_env = {k: v for k, v in env.items() if not k.startswith(("ARGOS_", "LT_", "XDG_"))}  # LT_*: LibreTranslate's flags
    lt_env.update(
        HOME=str(home), XDG_DATA_HOME=str(home / "data"), XDG_CONFIG_HOME=str(home / "config"),
        XDG_CACHE_HOME=str(home / "cache"), ARGOS_PACKAGES_DIR=str(home / "packages"),
        ARGOS_PACKAGE_INDEX=(home / "index").as_uri() + "/", ARGOS_CHUNK_TYPE="SPACY", ARGOS_DEVICE_TYPE="cpu",
        ARGOS_BEAM_SIZE=str(beam), ARGOS_INTRA_THREADS=str(threads), ARGOS_INTER_THREADS="1",
        ARGOS_COMPUTE_TYPE=compute_type,
        ORT_DISABLE_TELEMETRY="1",  # onnxruntime (imported by argostranslate's sentence splitters) sends usage events
    )
    for package in packages:
        r = subprocess.run([lt_python, "-c", LT_INSTALL, str(package)], env=lt_env, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"installing {package} with {lt_python} failed:\n{r.stderr[-2000:]}")
        print(f"libretranslate: installed {r.stdout.strip()}", file=sys.stderr, flush=True)
    return lt_env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], port: int, env: dict[str, str], cpus: str | None, log: Path) -> subprocess.Popen:
    """Start a server, its output to `log`, and wait until its /health answers."""
    if cpus:
        cmd = ["taskset", "-c", cpus, *cmd]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{' '.join(cmd[:6])} ... exited:\n{log.read_text(errors='replace')[-2000:]}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc
        except OSError:
            time.sleep(0.3)
    proc.kill()
    sys.exit(f"the server did not answer within 300 s (its output: {log})")


def translate_one(port: int, sentence: str, pair: tuple[str, str]) -> str:
    """One request, untimed -> the translation (RuntimeError on any answer but 200)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/translate", json.dumps({"q": sentence, "source": pair[0], "target": pair[1]}),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    if r.status != 200:
        raise RuntimeError(f"POST /translate answered {r.status}: {data[:500]!r}")
    return json.loads(data)["translatedText"]


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_clients(client, clients: int) -> float:
    """Run `client(k)` for k < `clients`, each on a thread of its own, all at once -> the seconds
    until the last one ends."""
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


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

    wall = run_clients(client, clients)
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
    ap.add_argument("--systems", default="batched,unbatched,ct2",
                    help="comma list of: batched (or ours), ours-ct2 (ours with --engine ctranslate2), unbatched, ct2, "
                         "libretranslate")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="decoding threads of each server")
    ap.add_argument("--cpus", default=None, help="pin each server to these CPUs (taskset -c), e.g. 0,1")
    ap.add_argument("--lt-python", default=os.environ.get("LIBRETRANSLATE_PYTHON"),
                    help="the Python of LibreTranslate's own virtual environment (default: $LIBRETRANSLATE_PYTHON)")
    ap.add_argument("--lt-compute-type", default="float32",
                    help="ARGOS_COMPUTE_TYPE of LibreTranslate's CTranslate2 translator (auto: argos's default)")
    ap.add_argument("--lt-settings", action="store_true",
                    help="our servers search with argostranslate's fixed settings (length penalty 0.2, outputs of up to "
                         "256 tokens, EOS counted) instead of the run's, so that both answer alike")
    ap.add_argument("--ours-flags", default="",
                    help="more flags for our servers' `seq2seq serve` command line, e.g. --ours-flags=--shortlist")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONUNBUFFERED="1")
    sentences = [s for s in args.src.read_text(encoding="utf-8").splitlines() if s.strip()]
    pair = tuple(args.pair.split(","))
    levels = [int(n) for n in args.levels.split(",")]
    systems = args.systems.split(",")
    if unknown := [s for s in systems if s not in SYSTEMS]:
        ap.error(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    if "libretranslate" in systems and not args.lt_python:
        ap.error("the libretranslate system needs --lt-python (or LIBRETRANSLATE_PYTHON): see the module's text")
    shipped = next((s for s in systems if s in ("batched", "ours")), None)  # `seq2seq serve` as shipped
    work = Path(tempfile.mkdtemp(prefix="serve-race-"))
    decode = yaml.safe_load((args.run / "config.yaml").read_text(encoding="utf-8"))["decode"]
    if "ct2" in systems:
        subprocess.run([sys.executable, "-m", "seq2seq_cli", "export", "--model", str(args.run), str(work / "ct2")],
                       check=True, env=env, stdout=subprocess.DEVNULL)
    lt_env = None
    if "libretranslate" in systems:
        lt_env = libretranslate_env(args.run, work, args.lt_python, pair, args.beam, args.threads, args.lt_compute_type, env)

    def command(system: str, port: int) -> tuple[list[str], dict[str, str]]:
        if system == "ct2":
            return [sys.executable, "-c", CT2_SERVER, str(work / "ct2"), str(args.run / "spm.model"), str(args.beam),
                    str(args.threads), str(port), str(decode["max_len_a"]), str(decode["max_len_b"])], env
        if system == "libretranslate":
            return [args.lt_python, "-c", LT_SERVER, "--host", "127.0.0.1", "--port", str(port), "--load-only", ",".join(pair),
                    "--disable-web-ui", "--disable-files-translation"], lt_env
        flags = {"unbatched": ["--no-batching"], "ours-ct2": ["--engine", "ctranslate2"]}.get(system, [])
        if args.lt_settings:
            flags += ["--length-penalty", "0.2", "--max-len-a", "0", "--max-len-b", "255"]
        flags += shlex.split(args.ours_flags)
        return [sys.executable, "-m", "seq2seq_cli", "serve", "--model", str(args.run), "--device", "cpu", "--port", str(port),
                "--beam-size", str(args.beam), "--max-queue", "1024", "--timeout", "600", *flags], env

    def serve(system: str, turn: str) -> tuple[subprocess.Popen, int]:
        port = free_port()
        cmd, system_env = command(system, port)
        return start(cmd, port, system_env, args.cpus, work / f"{system}-{turn}.log"), port

    def ask(system: str, proc: subprocess.Popen, port: int, sentence: str) -> str:
        try:
            return translate_one(port, sentence, pair)
        except (OSError, RuntimeError) as exc:
            proc.terminate()
            proc.wait()
            sys.exit(f"{system}: {exc} (its output: {work})")

    # Before any timing: every system translates the same sentence, printed side by side.
    probe = sentences[0]
    first: dict[str, str] = {}
    for system in systems:
        proc, port = serve(system, "check")
        first[system] = ask(system, proc, port, probe)
        proc.terminate()
        proc.wait()
    print(f"check, the same sentence to every system:\n  source          {probe}", file=sys.stderr)
    for system, text in first.items():
        print(f"  {system:15} {text}", file=sys.stderr)
    if bad := [s for s, t in first.items() if not t.strip() or t.strip() == probe.strip()]:
        sys.exit(f"no translation (empty, or the source sent back) from: {', '.join(bad)}")
    sys.stderr.flush()

    results: dict[tuple[str, int], list[dict]] = {(s, n): [] for s in systems for n in levels}
    for r in range(args.rounds):
        for system in systems:
            proc, port = serve(system, f"round{r + 1}")
            warm = ask(system, proc, port, probe)  # untimed: LibreTranslate loads its model on the first request
            if warm != first[system]:
                print(f"round {r + 1} {system}: the check sentence now reads {warm!r}", file=sys.stderr)
            for n in levels:
                figures = closed_loop(port, sentences, n, args.seconds, pair)
                results[(system, n)].append(figures)
                f = figures
                print(f"round {r + 1} {system:14} {n:4} clients {f['sent_per_s']:7.1f} sent/s p50 {f['p50_ms']:7.0f} ms "
                      f"p95 {f['p95_ms']:7.0f} ms p99 {f['p99_ms']:7.0f} ms lost {f['lost']} mixed {f['mixed']}",
                      file=sys.stderr, flush=True)
            rss = peak_rss_mib(proc.pid)
            for n in levels:
                results[(system, n)][-1]["peak_mib"] = rss
            proc.terminate()
            proc.wait()

    # the yardstick: each sentence sent at 1 client, decoded alone by the same translator
    alone_ms: list[float] = []
    if shipped and 1 in levels:
        import torch

        from seq2seq_cli.decode.translate import Translator

        torch.set_num_threads(args.threads)
        translator = Translator.load(args.run, "cpu", {"beam_size": args.beam})

        def alone() -> None:  # on a thread of its own, as the server decodes (see bench/README.md)
            for sentence in list(results[(shipped, 1)][0]["answers"])[:200]:
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

    # sentences whose answer from another system differs from the shipped server's
    def answers(system: str) -> dict[str, str]:
        return {s: t for n in levels for f in results[(system, n)] for s, t in f["answers"].items()}

    differ = {}
    if shipped:
        ours = answers(shipped)
        for system in systems:
            if system != shipped:
                theirs = answers(system)
                both = ours.keys() & theirs.keys()
                differ[system] = {"compared": len(both), "different": sum(ours[s] != theirs[s] for s in both)}

    print(f"\n{'system':14} {'clients':>7} {'sent/s':>7} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} {'MiB':>6} "
          f"{'lost':>4} {'mixed':>5}  vs")
    for row in rows:
        peers = [p for p in rows if p["clients"] == row["clients"] and p["system"] != row["system"]]
        vs = ", ".join(f"{row['sent_per_s'] / p['sent_per_s']:.2f}x {p['system']}" for p in peers if p["sent_per_s"])
        print(f"{row['system']:14} {row['clients']:7} {row['sent_per_s']:7.1f} {row['p50_ms']:7.0f} {row['p95_ms']:7.0f} "
              f"{row['p99_ms']:7.0f} {row['peak_mib']:6.0f} {row['lost']:4} {row['mixed']:5}  {vs}")
    if alone_ms:
        p95_alone = statistics.quantiles(alone_ms, n=20)[18] if len(alone_ms) > 1 else alone_ms[0]
        print(f"decode alone, the sentences of the 1-client level: median {statistics.median(alone_ms):.0f} ms, "
              f"p95 {p95_alone:.0f} ms")
    for system, d in differ.items():
        print(f"{system} vs {shipped} answers: {d['different']} of {d['compared']} sentences differ")
    if args.json:
        check = {"source": probe, **first}
        args.json.write_text(json.dumps({"rows": rows, "alone_ms": alone_ms, "differ": differ, "check": check}, indent=1))


if __name__ == "__main__":
    main()
