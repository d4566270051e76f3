"""The 10-minute race on the main job: our trainer against HF `MarianMTModel`, same CPU, same run.

Both systems train for the same wall-clock budget on the shipped corpus with the same recipe:
the run's own SentencePiece model, the same model shape, the very same batches in the same
order (our token-budget, length-bucketed epochs), the same label-smoothed loss, fused AdamW,
learning-rate schedule and clipping. Ours is the real trainer (`seq2seq_cli.train.loop.train` on the
config, validation and checkpoints included in its budget, as the quick start runs it); HF's
is a plain PyTorch loop around `MarianMTModel` (random init, transformers' own initialisation)
that validates nothing while it trains. Afterwards both are scored on the same split:
validation nll (our loss code on both), and BLEU/chrF (sacreBLEU, with signatures) of beam
search (ours: the `translate` code path; HF: `generate`).

    python bench/race.py --minutes 10                    # the race as the quick start runs
    python bench/race.py --minutes 3 --split valid       # iterate (tune on valid only)
    python bench/race.py --systems ours --set train.lr=0.002

Tokens/s counts non-pad source + target tokens of the updates made, over the training wall
time (validation and checkpoints included for ours, as they are part of its budget).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from seq2seq_cli.config import Config, load_config
from seq2seq_cli.data.formats import read_split
from seq2seq_cli.decode.evaluate import score
from seq2seq_cli.ids import BOS, EOS, PAD


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


def run_ours(config: Config) -> dict:
    from seq2seq_cli.decode.translate import Translator
    from seq2seq_cli.run.checkpoint import load_checkpoint
    from seq2seq_cli.train.loop import train
    from seq2seq_cli.train.metrics import read_metrics

    run_dir = train(config, progress=False)
    records = read_metrics(run_dir / "metrics.jsonl")
    last = [r for r in records if "elapsed_s" in r][-1]
    translator = Translator.load(run_dir, "cpu", {"beam_size": ARGS.beam})
    return {"run_dir": run_dir, "updates": last["step"], "train_s": last["elapsed_s"],
            "translate": translator.translate, "forward": load_checkpoint(run_dir)[0]}


class MarianAdapter(torch.nn.Module):
    """HF MarianMTModel behind our forward(src, tgt_in) -> logits."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=src, attention_mask=src != PAD, decoder_input_ids=tgt_in).logits


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


def run_hf(config: Config) -> dict:
    from seq2seq_cli.data.batching import collate, epoch_batches
    from seq2seq_cli.train.loop import learning_rate, make_optimizer
    from seq2seq_cli.train.loss import label_smoothed_nll

    t = config.train
    src_sp, tgt_sp, train, _ = corpora(config)
    model = hf_model(config, tgt_sp.get_piece_size())
    net = MarianAdapter(model)
    optimizer = make_optimizer(model, t, torch.device("cpu"))
    params = list(model.parameters())
    model.train()
    step, epoch, start = 0, 0, time.time()
    budget = t.max_minutes * 60 if t.max_minutes else math.inf
    while step < (t.max_steps or math.inf) and time.time() - start < budget:
        for b in epoch_batches(train, t.max_tokens, t.seed, epoch):
            if step >= (t.max_steps or math.inf) or time.time() - start >= budget:
                break
            batch = collate(train, b)
            src, tgt_in, tgt_out = batch.src, batch.tgt_in, batch.tgt_out
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step + 1, t)
            optimizer.zero_grad(set_to_none=True)
            loss, _, tokens = label_smoothed_nll(net(src, tgt_in), tgt_out, t.label_smoothing)
            (loss / tokens).backward()
            torch.nn.utils.clip_grad_norm_(params, t.clip_norm or float("inf"))
            optimizer.step()
            step += 1
        epoch += 1
    train_s = time.time() - start
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

    return {"updates": step, "train_s": train_s, "translate": translate, "forward": net}


def valid_nll(config: Config, forward: torch.nn.Module, valid) -> float:
    from seq2seq_cli.train.loop import validate

    return validate(forward, valid, config, torch.device("cpu"))["valid_nll"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/quickstart.yaml")
    ap.add_argument("--minutes", type=float, default=10.0, help="training budget of each system")
    ap.add_argument("--steps", type=int, help="also stop both systems after this many updates (compare learning per update)")
    ap.add_argument("--systems", nargs="+", default=["ours", "hf"], choices=["ours", "hf"])
    ap.add_argument("--split", default="test", choices=["test", "valid"], help="what BLEU is measured on")
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--run-dir", default="runs/race")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="config override for ours")
    ap.add_argument("--json", type=Path, help="also write the results here")
    global ARGS
    ARGS = ap.parse_args()
    torch.set_num_threads(ARGS.threads)
    base = [f"train.max_minutes={ARGS.minutes}", "train.device=cpu", f"train.threads={ARGS.threads}"]
    base += [f"train.max_steps={ARGS.steps}"] if ARGS.steps else []
    results = {}
    for system in ARGS.systems:
        overrides = base + [f"run_dir={ARGS.run_dir}/{system}"] + (ARGS.overrides if system == "ours" else [])
        config = load_config(ARGS.config, overrides)
        if system == "hf" and not (config.run_path / "spm.model").is_file():
            ours_spm = Path(ARGS.run_dir) / "ours" / "spm.model"
            config.run_path.mkdir(parents=True, exist_ok=True)
            (config.run_path / "spm.model").write_bytes(ours_spm.read_bytes())  # the very same tokenizer
        print(f"== {system}: training for {ARGS.minutes:g} min", flush=True)
        r = run_ours(config) if system == "ours" else run_hf(config)
        _, _, train, valid = corpora(config)
        split = read_split(config, getattr(config.data, ARGS.split))
        t0 = time.time()
        hyps = r["translate"](list(split["src"]))
        decode_s = time.time() - t0
        s = score(hyps, list(split["tgt"]))
        results[system] = {
            "updates": r["updates"], "train_s": round(r["train_s"], 1),
            "tokens_per_s": round(update_tokens(config, train, r["updates"]) / r["train_s"], 1),
            "valid_nll": round(valid_nll(config, r["forward"], valid), 4),
            f"{ARGS.split}_bleu": round(s.bleu, 2), f"{ARGS.split}_chrf": round(s.chrf, 2),
            "bleu_line": s.bleu_line, "chrf_line": s.chrf_line, "decode_s": round(decode_s, 1),
        }
        print(json.dumps({system: results[system]}, indent=1), flush=True)
    if {"ours", "hf"} <= results.keys():
        o, h = results["ours"], results["hf"]
        ratios = {k: round(o[k] / h[k], 3) for k in ("updates", "tokens_per_s", f"{ARGS.split}_bleu", f"{ARGS.split}_chrf")}
        results["ours/hf"] = ratios
        print("ours / hf:", json.dumps(ratios))
    if ARGS.json:
        ARGS.json.write_text(json.dumps(results, indent=1))


ARGS: argparse.Namespace

if __name__ == "__main__":
    main()
