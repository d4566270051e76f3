"""One line at stdin, as a whole command: `echo LINE | seq2seq translate -m RUN` from the
process's start to its exit, with no flags and with `--engine torch`, against the smallest
program that answers the same line with CTranslate2 alone (SentencePiece in and out, the run's
export loaded, one `translate_batch`: the floor a Python command over CTranslate2 can reach).

Runs alternate system by system, round by round, so load from other processes falls on all of
them alike; each keeps its median wall time, CPU time (user + system) and peak resident memory.
One untimed `translate` first converts the run for CTranslate2 (kept in RUN/ctranslate2/).

    python bench/one_line.py runs/quickstart --rounds 7
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CT2_ONE_LINE = """
import sys, ctranslate2, sentencepiece as spm
model, sp_path, beam = sys.argv[1:4]
sp = spm.SentencePieceProcessor(model_file=sp_path)
t = ctranslate2.Translator(model, device="cpu", intra_threads=2, inter_threads=1)
line = sys.stdin.readline()
out = t.translate_batch([sp.encode(line, out_type=str)], beam_size=int(beam))
print(sp.decode(out[0].hypotheses[0]))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--line", default="Y dijo Dios: Sea la luz; y fue la luz.")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--beam", type=int, default=4, help="CTranslate2's beam (ours takes the run's decode.beam_size)")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    work = Path(tempfile.mkdtemp(prefix="one-line-"))
    subprocess.run([sys.executable, "-m", "seq2seq_cli", "export", "--model", str(args.run), str(work / "ct2")],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    ours = [sys.executable, "-m", "seq2seq_cli", "translate", "-m", str(args.run)]
    systems = {"ours": ours, "ours-torch": [*ours, "--engine", "torch"],
               "ct2-alone": [sys.executable, "-c", CT2_ONE_LINE, str(work / "ct2"), str(args.run / "spm.model"),
                             str(args.beam)]}
    subprocess.run(ours, input=args.line + "\n", text=True, env=env, capture_output=True, check=True)  # converts once
    figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in systems}
    answers: dict[str, str] = {}
    for r in range(args.rounds):
        for name, cmd in systems.items():
            start = time.perf_counter()
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
            proc.stdin.write((args.line + "\n").encode())
            proc.stdin.close()
            out, err = proc.stdout.read(), proc.stderr.read()
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - start
            if os.waitstatus_to_exitcode(status) != 0:
                sys.exit(f"{name} failed:\n{err.decode()[-2000:]}")
            figures[name].append((wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024))
            answers[name] = out.decode().strip()
            print(f"round {r + 1} {name:10} {wall:6.2f} s wall {figures[name][-1][1]:6.2f} s CPU "
                  f"{figures[name][-1][2]:5.0f} MiB", file=sys.stderr, flush=True)
    print(f"\n{'system':10} {'wall s':>7} {'CPU s':>7} {'MiB':>6}  answer")
    for name, rows in figures.items():
        wall, cpu, mib = (statistics.median(row[i] for row in rows) for i in range(3))
        print(f"{name:10} {wall:7.2f} {cpu:7.2f} {mib:6.0f}  {answers[name]}")


if __name__ == "__main__":
    main()
