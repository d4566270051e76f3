"""A lone sentence: our search (`Translator.translate` of one line, as `seq2seq serve` decodes
for a lone client) against CTranslate2's `translate_batch` of one sentence, on the same run.

Each system lives in a worker process of its own (their OpenMP runtimes slow each other down
in one process), loads once, and times each sentence it is sent from text to text (subwords
in, search, subwords out). The parent sends the sentences one at a time to each worker in
turn, the order swapped every sentence, so that load from other processes falls on both
alike, and prints p50/p90 milliseconds of each and the ratio ours / CTranslate2's, with the
CPU. Both search with the run's decode settings (beam size, length penalty, output limits
a * source + b), in fp32, on the same threads.

    python -m seq2seq_cli export /tmp/qs-ct2 --model RUN           # once, or leave out --ct2
    python bench/lone_sentence.py RUN --ct2 /tmp/qs-ct2 --sentences 300 --beam 4 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cpu_name() -> str:
    """The CPU's model name, family and model (Linux /proc/cpuinfo; the platform elsewhere)."""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or "unknown CPU"
    fields: dict[str, str] = {}
    for line in info:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
        if not line.strip() and fields:
            break
    return f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1] if len(values) > 1 else values[0]


def worker(system: str, run: str, ct2: str, beam: int, threads: int) -> None:
    """Read one sentence per stdin line, answer `{"ms": ..., "out": ...}` per line on stdout."""
    import torch

    if system == "ours":
        torch.set_num_threads(threads)
        from seq2seq_cli.decode.translate import Translator

        translator = Translator.load(run, "cpu", {"beam_size": beam, "precision": "fp32"})

        def translate(line: str) -> str:
            return translator.translate([line])[0]
    else:
        torch.set_num_threads(1)  # torch only loads the run here: CTranslate2 has the threads
        import ctranslate2

        from seq2seq_cli.decode.search import max_source_subwords, output_limits
        from seq2seq_cli.run.loaded import load_run

        loaded = load_run(run, "cpu")
        d = loaded.config.decode
        cap = max_source_subwords(loaded.model)
        ct = ctranslate2.Translator(ct2, device="cpu", compute_type="float32", intra_threads=threads, inter_threads=1)
        src_sp, tgt_sp = loaded.src_sp, loaded.tgt_sp

        def translate(line: str) -> str:
            pieces = src_sp.encode(line, out_type=str)[:cap]
            limit = int(output_limits(torch.tensor([len(pieces) + 1]), cap, d.max_len_a, d.max_len_b)[0])
            result = ct.translate_batch([pieces], beam_size=beam, length_penalty=d.length_penalty,
                                        max_decoding_length=limit + 1, max_input_length=0)
            return str(tgt_sp.decode(result[0].hypotheses[0]))

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        text = json.loads(line)
        start = time.perf_counter()
        out = translate(text)
        ms = (time.perf_counter() - start) * 1000
        print(json.dumps({"ms": ms, "out": out}), flush=True)


class Worker:
    def __init__(self, system: str, args: argparse.Namespace, ct2: str) -> None:
        self.system = system
        cmd = [sys.executable, __file__, args.run, "--worker", system, "--ct2", ct2, "--beam", str(args.beam),
               "--threads", str(args.threads)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=os.environ.copy())
        self._read()

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the {self.system} worker stopped (exit code {self.proc.wait()})")
        return json.loads(line)

    def translate(self, text: str) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(text) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="the run directory")
    ap.add_argument("--ct2", default=None, help="the run exported for CTranslate2 (seq2seq export); default: exported here")
    ap.add_argument("--src", default="data/bible-es-en/valid.es", help="source sentences, one per line")
    ap.add_argument("--sentences", type=int, default=200, help="sentences timed (after --warmup more)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", choices=["ours", "ct2"], default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.run, args.ct2, args.beam, args.threads)
        return
    with tempfile.TemporaryDirectory(prefix="lone-ct2-") as tmp:
        ct2 = args.ct2
        if ct2 is None:
            ct2 = str(Path(tmp) / "model")
            subprocess.run([sys.executable, "-m", "seq2seq_cli", "export", ct2, "--model", args.run], check=True)
        lines = [s for s in Path(args.src).read_text(encoding="utf-8").splitlines() if s.strip()]
        lines = lines[: args.warmup + args.sentences]
        workers = [Worker("ours", args, ct2), Worker("ct2", args, ct2)]
        times: dict[str, list[float]] = {"ours": [], "ct2": []}
        same = 0
        for i, text in enumerate(lines):
            order = workers if i % 2 == 0 else workers[::-1]
            got = {w.system: w.translate(text) for w in order}
            if i >= args.warmup:
                for system, answer in got.items():
                    times[system].append(answer["ms"])
                same += got["ours"]["out"] == got["ct2"]["out"]
        for w in workers:
            w.close()
    n = len(times["ours"])
    print(f"CPU: {cpu_name()}, {os.cpu_count()} logical CPUs; load average {os.getloadavg()[0]:.1f} at the end")
    print(f"{n} sentences of {args.src}, one at a time, beam {args.beam}, {args.threads} threads, fp32")
    print("| system | p50 ms | p90 ms | mean ms |")
    print("|---|---|---|---|")
    for system, name in (("ours", "ours (Translator.translate)"), ("ct2", "CTranslate2 translate_batch")):
        t = times[system]
        print(f"| {name} | {statistics.median(t):.1f} | {percentile(t, 0.9):.1f} | {statistics.fmean(t):.1f} |")
    print(f"ratio ours / CTranslate2: p50 {statistics.median(times['ours']) / statistics.median(times['ct2']):.2f}x, "
          f"p90 {percentile(times['ours'], 0.9) / percentile(times['ct2'], 0.9):.2f}x; "
          f"same output on {same} of {n} sentences")


if __name__ == "__main__":
    main()
