"""The race on the main job: our trainer against HF `MarianMTModel` at its best, same CPU, same run.

Both systems train on the shipped corpus with the same recipe: the run's own SentencePiece
model, the same model shape, the very same batches in the same order (our token-budget,
length-bucketed epochs), the same label-smoothed loss, fused AdamW, learning-rate schedule and
clipping, and the same precision: HF trains under bf16 autocast wherever ours resolves
`precision: auto` to bf16 (what `TrainingArguments(bf16=True, use_cpu=True)` does), fp32
elsewhere (`--hf-precision` overrides). Ours is the real trainer (`train()` on the config,
validation and checkpoints inside its budget, as the quick start runs it); HF's is a plain
PyTorch loop around `MarianMTModel` (random init, transformers' own initialisation) that
validates nothing while it trains. Each system trains in a process of its own, so that each
has its own peak resident memory (ru_maxrss).

Two modes:

    python bench/race.py --minutes 10 --repeat 2          # timed: ours, hf, ours, hf; medians
    python bench/race.py --steps 300,1000,1500            # equal updates: valid nll at each
    python bench/race.py --speed 60                       # time per update, interleaved, real batches

The timed mode scores BLEU/chrF (sacreBLEU, with signatures) of beam search on `--split`
(ours: the `translate` code path on the run; HF: `generate`) and valid nll (our loss code on
both). Tune on `--split valid`; the test split is for the final figure. Tokens/s counts
non-pad source + target tokens of the updates made over the training wall time (validation
and checkpoints included for ours, as they are part of its budget). The CPU (model, family,
the instruction sets that matter) is printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seq2seq_cli.config import Config
from seq2seq_cli.config_load import load_config
from seq2seq_cli.ids import BOS, EOS, PAD
from seq2seq_cli.layout import RunLayout

SCRIPT = Path(__file__).resolve()


def cpu_info() -> dict[str, Any]:
    """The CPU the figures come from (as the trainer logs it), with torch's view of its vector units."""
    from seq2seq_cli.device import cpu_description

    try:
        capability = sorted(k for k, v in torch._C._cpu._get_cpu_capability().items() if v is True)
    except (AttributeError, RuntimeError):
        capability = []
    return {**cpu_description(), "torch": torch.__version__, "torch_cpu_capability": capability}


def corpora(config: Config):
    from seq2seq_cli.data.encoding import encoded_split
    from seq2seq_cli.data.tokenizer import load_tokenizers

    src_sp, tgt_sp = load_tokenizers(config.run_path, config.tokenizer.joint)
    train = encoded_split(config, config.data.train, src_sp, tgt_sp, training=True)
    valid = encoded_split(config, config.data.valid, src_sp, tgt_sp, training=False)
    return src_sp, tgt_sp, train, valid


def update_tokens(config: Config, train, updates: int) -> int:
    """Non-pad source + target tokens of the first `updates` updates (one batch each)."""
    from seq2seq_cli.data.batching import epoch_batches

    t, total, epoch = config.train, 0, 0
    while updates > 0:
        for b in epoch_batches(train, t.max_tokens, t.seed, epoch)[:updates]:
            total += int(train.src_lens[b].sum()) + int(train.tgt_lens[b].sum()) - len(b)
            updates -= 1
        epoch += 1
    return total


def valid_nll(config: Config, forward: torch.nn.Module, valid) -> float:
    from seq2seq_cli.train.validation import validate

    return validate(forward, valid, config, torch.device("cpu"))["valid_nll"]


def run_ours(config: Config, steps: list[int]) -> dict:
    from seq2seq_cli.decode.translate import Translator
    from seq2seq_cli.run.loaded import load_model
    from seq2seq_cli.train.loop import train
    from seq2seq_cli.train.metrics import read_metrics

    run_dir = train(config, progress=False, overwrite=True)  # each race run starts over
    records = read_metrics(RunLayout(run_dir).metrics)
    last = [r for r in records if "elapsed_s" in r][-1]
    at = {r["step"]: r["valid_nll"] for r in records if "valid_nll" in r and r["step"] in steps}
    translator = Translator.load(run_dir, "cpu", {"beam_size": ARGS.beam})
    return {"updates": last["step"], "train_s": last["elapsed_s"], "translate": translator.translate,
            "forward": load_model(run_dir).model, "valid_nll_at": at}


class MarianAdapter(torch.nn.Module):
    """HF MarianMTModel behind our forward(src, tgt_in) -> logits."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.model(input_ids=src, attention_mask=src != PAD, decoder_input_ids=tgt_in).logits
        return logits if rows is None else logits[rows]  # validation scores target positions only


def hf_model(config: Config, vocab: int):
    from transformers import MarianConfig, MarianMTModel

    m = config.model
    torch.manual_seed(config.train.seed)
    return MarianMTModel(MarianConfig(
        vocab_size=vocab, decoder_vocab_size=vocab, d_model=m.d_model, encoder_layers=m.encoder_layers,
        decoder_layers=m.decoder_layers, encoder_attention_heads=m.heads, decoder_attention_heads=m.heads,
        encoder_ffn_dim=m.ffn_size, decoder_ffn_dim=m.ffn_size, max_position_embeddings=m.max_positions,
        dropout=m.dropout, attention_dropout=m.attention_dropout, activation_dropout=m.activation_dropout,
        activation_function="relu", scale_embedding=True, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS, decoder_start_token_id=BOS,
    ))


def hf_precision(config: Config) -> str:
    """HF's training precision: what ours resolves `train.precision` to, unless --hf-precision says."""
    from seq2seq_cli.device import resolve_precision

    if ARGS.hf_precision != "auto":
        return ARGS.hf_precision
    return resolve_precision(config.train.precision, torch.device("cpu"))


def run_hf(config: Config, steps: list[int]) -> dict:
    import contextlib
    import math

    from seq2seq_cli.data.batching import collate, epoch_batches
    from seq2seq_cli.train.loss import label_smoothed_nll
    from seq2seq_cli.train.schedule import update_lr
    from seq2seq_cli.train.setup import make_optimizer
    from seq2seq_cli.train.state import TrainState

    t = config.train
    src_sp, tgt_sp, train, valid = corpora(config)
    model = hf_model(config, tgt_sp.get_piece_size())
    net = MarianAdapter(model)
    optimizer = make_optimizer(model, t, torch.device("cpu"))
    params = list(model.parameters())
    precision = hf_precision(config)
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    model.train()
    step, epoch, start, at, paused = 0, 0, time.time(), {}, 0.0
    budget = t.max_minutes * 60 if t.max_minutes else math.inf
    limit = t.max_steps or math.inf
    state = TrainState()  # the schedule's view of the run: the same rate as ours at the same point of its budget
    while step < limit and time.time() - start - paused < budget:
        plan = epoch_batches(train, t.max_tokens, t.seed, epoch)
        for i, b in enumerate(plan):
            if step >= limit or time.time() - start - paused >= budget:
                break
            batch = collate(train, b)
            state.step, state.epoch, state.batch_in_epoch = step, epoch, i + 1
            state.minutes = (time.time() - start - paused) / 60
            lr = update_lr(t, state, plan)
            for group in optimizer.param_groups:
                group["lr"] = lr
            optimizer.zero_grad(set_to_none=True)
            with amp:
                logits = net(batch.src, batch.tgt_in)
            loss, _, tokens = label_smoothed_nll(logits, batch.tgt_out, t.label_smoothing)
            (loss / tokens).backward()
            torch.nn.utils.clip_grad_norm_(params, t.clip_norm or float("inf"))
            optimizer.step()
            step += 1
            if step in steps:  # equal-updates mode: not part of the training time
                t0 = time.time()
                at[step] = valid_nll(config, net, valid)
                model.train()
                paused += time.time() - t0
        epoch += 1
    train_s = time.time() - start - paused
    model.eval()

    @torch.no_grad()
    def translate(lines: list[str]) -> list[str]:
        ids = [s[: config.model.max_positions - 2] + [EOS] for s in src_sp.encode(lines)]
        order = np.argsort([len(x) for x in ids], kind="stable")
        out: list[str] = [""] * len(lines)
        for i in range(0, len(order), 32):
            rows = order[i : i + 32]
            width = max(len(ids[r]) for r in rows)
            src = torch.full((len(rows), width), PAD, dtype=torch.long)
            for j, r in enumerate(rows):
                src[j, : len(ids[r])] = torch.tensor(ids[r])
            gen = model.generate(input_ids=src, attention_mask=src != PAD, num_beams=ARGS.beam, length_penalty=1.0,
                                 max_new_tokens=int(config.decode.max_len_a * width + config.decode.max_len_b),
                                 decoder_start_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
            for j, r in enumerate(rows):
                toks = [x for x in gen[j].tolist()[1:] if x not in (PAD, EOS)]
                out[r] = tgt_sp.decode(toks)
        return out

    return {"updates": step, "train_s": train_s, "translate": translate, "forward": net, "valid_nll_at": at,
            "precision": precision}


def speed(config: Config, updates: int) -> dict:
    """Time per update of both systems in one process, interleaved on the same real batches
    (the first `updates` of epoch 0), so that a change in the machine's load hits both alike.
    Each makes its own update as its trainer does: ours `batch_loss` (output layer on target
    positions only), clipping, fused AdamW and the moving average; HF its logits everywhere
    and our loss (as its race loop). Finds causes; the timed race is what claims."""
    from seq2seq_cli.data.batching import collate, epoch_batches
    from seq2seq_cli.device import autocast
    from seq2seq_cli.model.transformer import build_model
    from seq2seq_cli.train.ema import averaged_copy
    from seq2seq_cli.train.loss import batch_loss, label_smoothed_nll
    from seq2seq_cli.train.setup import make_optimizer

    t, cpu = config.train, torch.device("cpu")
    _, tgt_sp, train, _ = corpora(config)
    vocab = tgt_sp.get_piece_size()
    batches = [collate(train, b) for b in epoch_batches(train, t.max_tokens, t.seed, 0)[:updates]]
    torch.manual_seed(t.seed)
    ours = build_model(config.model, vocab, vocab, True)
    hf = MarianAdapter(hf_model(config, vocab))
    average = averaged_copy(ours, t.ema_decay) if t.ema_decay else None
    precision = hf_precision(config)
    steps = {}
    for name, model in (("ours", ours), ("hf", hf)):
        model.train()
        optimizer = make_optimizer(model, t, cpu)

        def step(batch, model=model, optimizer=optimizer, name=name) -> None:
            optimizer.zero_grad(set_to_none=True)
            if name == "ours":
                loss, _, tokens = batch_loss(model, batch, config, cpu)
            else:
                with autocast(cpu, precision):
                    logits = model(batch.src, batch.tgt_in)
                loss, _, tokens = label_smoothed_nll(logits, batch.tgt_out, t.label_smoothing)
            (loss / tokens).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip_norm or float("inf"))
            optimizer.step()
            if name == "ours" and average is not None:
                average.update_parameters(model)

        steps[name] = step
    times: dict[str, list[float]] = {"ours": [], "hf": []}
    for i, batch in enumerate(batches):
        for name in ("ours", "hf") if i % 2 == 0 else ("hf", "ours"):
            t0 = time.perf_counter()
            steps[name](batch)
            times[name].append(time.perf_counter() - t0)
    warm = min(5, len(batches) // 4)
    med = {k: statistics.median(v[warm:]) for k, v in times.items()}
    return {"updates_timed": len(batches) - warm, "s_per_update": {k: round(v, 4) for k, v in med.items()},
            "ours_updates_per_hf": round(med["hf"] / med["ours"], 3), "precision": precision}


def child(system: str, out: Path) -> None:
    """Train and score one system in this process; write its figures as JSON to `out`."""
    from seq2seq_cli.data.formats import read_split
    from seq2seq_cli.decode.evaluate import score

    torch.set_num_threads(ARGS.threads)
    steps = parse_steps(ARGS.steps)
    base = ["train.device=cpu", f"train.threads={ARGS.threads}", f"run_dir={ARGS.run_dir}/{system}"]
    base += [f"train.max_minutes={ARGS.minutes}"] if not steps else ["train.max_minutes=null", f"train.max_steps={max(steps)}"]
    if steps and system == "ours":  # a validation record at every step asked for
        base += [f"train.valid_every={np.gcd.reduce(steps)}", "train.valid_bleu=false"]
    config = load_config(ARGS.config, base + (ARGS.overrides if system == "ours" else []))
    spm_model = RunLayout(config.run_path).spm_models(joint=True)[0]
    if system == "hf" and not spm_model.is_file():
        ours_spm = RunLayout(Path(ARGS.run_dir) / "ours").spm_models(joint=True)[0]
        config.run_path.mkdir(parents=True, exist_ok=True)
        spm_model.write_bytes(ours_spm.read_bytes())  # the very same tokenizer
    r = run_ours(config, steps) if system == "ours" else run_hf(config, steps)
    train_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux; before decoding
    result: dict[str, Any] = {"updates": r["updates"], "train_s": round(r["train_s"], 1),
                              "train_peak_rss_mb": round(train_peak),
                              "valid_nll_at": {str(k): round(v, 4) for k, v in sorted(r["valid_nll_at"].items())}}
    if system == "hf":
        result["precision"] = r["precision"]
    if not steps:
        _, _, train, valid = corpora(config)
        split = read_split(config, getattr(config.data, ARGS.split))
        t0 = time.time()
        hyps = r["translate"](list(split["src"]))
        s = score(hyps, list(split["tgt"]))
        result.update({
            "tokens_per_s": round(update_tokens(config, train, r["updates"]) / r["train_s"], 1),
            "valid_nll": round(valid_nll(config, r["forward"], valid), 4),
            f"{ARGS.split}_bleu": round(s.bleu, 2), f"{ARGS.split}_chrf": round(s.chrf, 2),
            "bleu_line": s.bleu_line, "chrf_line": s.chrf_line, "decode_s": round(time.time() - t0, 1),
        })
    out.write_text(json.dumps(result))


def run_child(system: str, argv: list[str]) -> dict:
    """One system in a process of its own -> its figures, with its peak resident memory."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        proc = subprocess.Popen([sys.executable, str(SCRIPT), *argv, "--child", system, "--out", str(out)])
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"race: {system} failed (exit {proc.returncode})")
        result = json.loads(out.read_text())
    result["peak_rss_mb"] = round(usage.ru_maxrss / 1024)  # KiB on Linux
    return result


def parse_steps(text: str | None) -> list[int]:
    return sorted({int(x) for x in text.split(",")}) if text else []


def median_of(runs: list[dict]) -> dict:
    """Medians of the numeric figures of repeated runs of one system."""
    out: dict[str, Any] = {}
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = round(statistics.median(r[key] for r in runs), 4)
        elif key == "valid_nll_at":
            out[key] = {s: round(statistics.median(r[key][s] for r in runs if s in r[key]), 4) for s in value}
        else:
            out[key] = value
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--minutes", type=float, default=10.0, help="training budget of each system (timed mode)")
    ap.add_argument("--steps", help="equal-updates mode: valid nll of both after these updates, e.g. 300,1000,1500")
    ap.add_argument("--speed", type=int, metavar="N",
                    help="time per update of both, interleaved in one process, on the first N batches (needs RUN_DIR/ours)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each system, alternating; medians are reported")
    ap.add_argument("--systems", nargs="+", default=["ours", "hf"], choices=["ours", "hf"])
    ap.add_argument("--hf-precision", default="auto", choices=["auto", "fp32", "bf16"],
                    help="auto: bf16 autocast where ours trains in bf16, fp32 elsewhere")
    ap.add_argument("--split", default="test", choices=["test", "valid"], help="what BLEU is measured on")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--run-dir", default="runs/race")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="config override for ours")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--child", choices=["ours", "hf"], help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    global ARGS
    ARGS = ap.parse_args()
    if ARGS.child:
        child(ARGS.child, ARGS.out)
        return
    argv = [a for a in sys.argv[1:]]
    cpu = cpu_info()
    print("cpu:", json.dumps(cpu), flush=True)
    if ARGS.speed:
        torch.set_num_threads(ARGS.threads)
        config = load_config(ARGS.config, ["train.device=cpu", f"run_dir={ARGS.run_dir}/ours"] + ARGS.overrides)
        result = {"cpu": cpu, "threads": ARGS.threads, **speed(config, ARGS.speed)}
        print(json.dumps(result, indent=1))
        if ARGS.json:
            ARGS.json.write_text(json.dumps(result, indent=1))
        return
    runs: dict[str, list[dict]] = {s: [] for s in ARGS.systems}
    if "hf" in ARGS.systems and "ours" not in ARGS.systems and not (Path(ARGS.run_dir) / "ours" / "spm.model").is_file():
        raise SystemExit(f"race: hf alone needs {ARGS.run_dir}/ours/spm.model (run ours once first)")
    for i in range(ARGS.repeat):
        for system in ARGS.systems:  # alternating: ours, hf, ours, hf, ...
            print(f"== {system} (run {i + 1}/{ARGS.repeat})", flush=True)
            r = run_child(system, argv)
            runs[system].append(r)
            print(json.dumps({system: r}), flush=True)
    results: dict[str, Any] = {"cpu": cpu, "runs": runs, "median": {s: median_of(rs) for s, rs in runs.items()}}
    if {"ours", "hf"} <= runs.keys():
        o, h = results["median"]["ours"], results["median"]["hf"]
        keys = ["updates", "train_peak_rss_mb", "peak_rss_mb"]
        keys += [] if ARGS.steps else ["tokens_per_s", f"{ARGS.split}_bleu", f"{ARGS.split}_chrf"]
        results["ours/hf"] = {k: round(o[k] / h[k], 3) for k in keys}
        results["valid_nll_at"] = {s: {"ours": o["valid_nll_at"].get(s), "hf": h["valid_nll_at"].get(s)}
                                   for s in h["valid_nll_at"]}
    print("median:", json.dumps(results["median"], indent=1))
    for key in ("ours/hf", "valid_nll_at"):
        if key in results:
            print(f"{key}:", json.dumps(results[key]))
    if ARGS.json:
        ARGS.json.write_text(json.dumps(results, indent=1))


ARGS: argparse.Namespace

if __name__ == "__main__":
    main()
