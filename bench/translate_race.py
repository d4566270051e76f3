"""The translation race: `seq2seq translate` (the command, as a process) against CTranslate2's
`Translator.translate_file` on the export of the same run, same CPU, same run of this script.

Each system is a whole process, timed from its start to its exit (imports, model load,
tokenisation, decoding, writing): ours is `python -m seq2seq_cli translate`, CTranslate2's a
small Python program around `translate_file` (token batches of 4,096, SentencePiece in and
out through the run's own model). Both decode with beam 5 and 2 threads, in fp32 and in int8
(ours `--quantize int8`, CTranslate2 `compute_type="int8"` on the fp32 export). Inputs: the
test split and the test split repeated 10 times. Runs alternate between systems, round by
round, so load from other processes falls on all of them alike; each keeps its median wall
time, CPU time (user + system: steadier than wall time on a loaded machine) and peak resident
memory (the process's own `ru_maxrss`). Each output is scored with sacreBLEU against the
reference. Ours is `translate` with no flags but `--beam-size` (CTranslate2 with the run's
shortlist, as the defaults pick); `ct2-vmap` is CTranslate2 with the same shortlist as its
vocabulary map; one untimed `translate` before the rounds converts the run once (RUN/ctranslate2/).

    python bench/translate_race.py runs/quickstart                 # trains nothing
    python bench/translate_race.py runs/quickstart --rounds 3 --inputs test --precisions fp32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CT2_PROGRAM = """
import sys, ctranslate2, sentencepiece as spm
model, sp_path, src, out, compute_type, beam, threads, batch, vmap = sys.argv[1:10]
sp = spm.SentencePieceProcessor(model_file=sp_path)
t = ctranslate2.Translator(model, device="cpu", compute_type=compute_type, intra_threads=int(threads), inter_threads=1)
t.translate_file(src, out, max_batch_size=int(batch), batch_type="tokens", beam_size=int(beam), use_vmap=vmap == "1",
                 source_tokenize_fn=lambda line: sp.encode(line, out_type=str),
                 target_detokenize_fn=lambda tokens: sp.decode(tokens))
"""


def run_timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """Run `cmd` to its end -> (wall seconds, peak resident MiB, CPU seconds (user + system) of
    that process)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.read().decode() if proc.stderr else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(cmd[:4])} ... failed:\n{err[-2000:]}")
    return wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def bleu(hyp: Path, ref: Path) -> float:
    import sacrebleu

    hyps = hyp.read_text(encoding="utf-8").splitlines()
    refs = ref.read_text(encoding="utf-8").splitlines()
    return sacrebleu.corpus_bleu(hyps, [refs]).score


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="trained run directory (e.g. the quick start's)")
    ap.add_argument("--src", type=Path, default=Path("data/bible-es-en/test.es"))
    ap.add_argument("--ref", type=Path, default=Path("data/bible-es-en/test.en"))
    ap.add_argument("--repeat", type=int, default=10, help="the long input is the source repeated this many times")
    ap.add_argument("--inputs", default="test,long", help="comma list of: test, long")
    ap.add_argument("--precisions", default="fp32,int8", help="comma list of: fp32, int8")
    ap.add_argument("--systems", default="ours,ct2,ct2-vmap",
                    help="comma list of: ours (`translate` with no flags but the beam), ct2, ct2-vmap (its vocabulary map, "
                         "the run's shortlist)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                    help="also race `translate` with these extra flags, e.g. lowmem='--batch-tokens 1024'")
    ap.add_argument("--json", type=Path, help="also write the medians here")
    args = ap.parse_args()

    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONUNBUFFERED="1")
    work = Path(tempfile.mkdtemp(prefix="translate-race-"))
    ct2_dir = work / "ct2"
    subprocess.run([sys.executable, "-m", "seq2seq_cli", "export", "--model", str(args.run), str(ct2_dir)],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    inputs = {"test": (args.src, args.ref)}
    if "long" in args.inputs.split(","):
        long_src, long_ref = work / "long.src", work / "long.ref"
        long_src.write_text(args.src.read_text(encoding="utf-8") * args.repeat, encoding="utf-8")
        long_ref.write_text(args.ref.read_text(encoding="utf-8") * args.repeat, encoding="utf-8")
        inputs["long"] = (long_src, long_ref)
    inputs = {k: v for k, v in inputs.items() if k in args.inputs.split(",")}

    variants = {"ours": []} | {v.split("=", 1)[0]: v.split("=", 1)[1].split() for v in args.variant}

    def command(system: str, precision: str, src: Path, out: Path) -> list[str]:
        if system in variants:
            cmd = [sys.executable, "-m", "seq2seq_cli", "translate", "--model", str(args.run), "-i", str(src),
                   "-o", str(out), "--beam-size", str(args.beam), *variants[system]]
            return cmd + (["--quantize", "int8"] if precision == "int8" else [])
        compute = "int8" if precision == "int8" else "float32"
        return [sys.executable, "-c", CT2_PROGRAM, str(ct2_dir), str(args.run / "spm.model"), str(src), str(out),
                compute, str(args.beam), str(args.threads), "4096", "1" if system == "ct2-vmap" else "0"]

    # untimed: the first `translate` converts the run for CTranslate2 (kept in RUN/ctranslate2/)
    warm = work / "warm.src"
    warm.write_text(args.src.read_text(encoding="utf-8").splitlines()[0] + "\n", encoding="utf-8")
    run_timed(command("ours", "fp32", warm, work / "warm.out"), env)
    systems = args.systems.split(",") + [v.split("=", 1)[0] for v in args.variant]
    cases = [(i, p, s) for i in inputs for p in args.precisions.split(",") for s in systems]
    times: dict[tuple[str, str, str], list[tuple[float, float, float]]] = {c: [] for c in cases}
    for r in range(args.rounds):
        for case in cases:
            name, precision, system = case
            out = work / f"{name}.{precision}.{system}.out"
            times[case].append(run_timed(command(system, precision, inputs[name][0], out), env))
            print(f"round {r + 1} {name:4} {precision} {system:8} {times[case][-1][0]:7.2f} s "
                  f"{times[case][-1][1]:6.0f} MiB {times[case][-1][2]:7.2f} CPU s", file=sys.stderr, flush=True)

    rows = []
    for case in cases:
        name, precision, system = case
        lines = sum(1 for _ in inputs[name][0].open(encoding="utf-8"))
        wall = statistics.median(t for t, _, _ in times[case])
        mem = statistics.median(m for _, m, _ in times[case])
        cpu = statistics.median(c for _, _, c in times[case])
        score = bleu(work / f"{name}.{precision}.{system}.out", inputs[name][1])
        rows.append({"input": name, "lines": lines, "precision": precision, "system": system, "wall_s": wall,
                     "sent_per_s": lines / wall, "peak_mib": mem, "cpu_s": cpu, "bleu": score})
    print(f"\n{'input':6} {'prec':5} {'system':8} {'wall s':>7} {'CPU s':>7} {'sent/s':>7} {'MiB':>6} {'BLEU':>6}  "
          "vs CTranslate2 (wall time)")
    for row in rows:
        peers = [p for p in rows if p["system"] in ("ct2", "ct2-vmap") and p["system"] != row["system"]
                 and p["input"] == row["input"] and p["precision"] == row["precision"]]
        ratio = "; ".join(f"{p['wall_s'] / row['wall_s']:.2f}x {p['system']}'s speed ({p['cpu_s'] / row['cpu_s']:.2f}x "
                          f"by CPU time), {row['peak_mib'] / p['peak_mib']:.2f}x its memory" for p in peers)
        print(f"{row['input']:6} {row['precision']:5} {row['system']:8} {row['wall_s']:7.2f} {row['cpu_s']:7.2f} "
              f"{row['sent_per_s']:7.1f} "
              f"{row['peak_mib']:6.0f} {row['bleu']:6.2f}  {ratio}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(f"outputs kept in {work}", file=sys.stderr)


if __name__ == "__main__":
    main()
