"""Validation during training: the loss, nll and perplexity of the validation split, its
greedy translation scored with sacreBLEU, and what a validation makes of them (the record,
the best score so far and the patience counter)."""

from __future__ import annotations

import math
from typing import Any

import torch

from seq2seq_cli.config import Config
from seq2seq_cli.data.batching import collate, token_batches
from seq2seq_cli.data.encoding import EncodedCorpus
from seq2seq_cli.model.transformer import Seq2SeqTransformer
from seq2seq_cli.train import distributed
from seq2seq_cli.train.distributed import Processes
from seq2seq_cli.train.loss import batch_loss
from seq2seq_cli.train.setup import Run
from seq2seq_cli.train.state import TrainState


def validation_bleu(
    model: Seq2SeqTransformer, src_sp: Any, tgt_sp: Any, valid_raw: Any, config: Config, device: torch.device
) -> tuple[float, str]:
    """Greedy translation of the validation sources scored with sacreBLEU -> (BLEU, signature)."""
    from seq2seq_cli.decode.evaluate import score
    from seq2seq_cli.decode.onednn import for_decoding
    from seq2seq_cli.decode.translate import Translator

    decode = config.decode.model_copy(update={"beam_size": 1, "sampling": False})
    model.eval()
    # weights are fixed during validation: pack them for decoding once, not once per batch
    hyps = Translator(for_decoding(model), src_sp, tgt_sp, decode, device).translate(list(valid_raw["src"]))
    model.train()
    scores = score(hyps, list(valid_raw["tgt"]))
    return scores.bleu, scores.bleu_signature


@torch.no_grad()
def validate(
    model: Seq2SeqTransformer, corpus: EncodedCorpus, config: Config, device: torch.device, procs: Processes | None = None
) -> dict[str, float]:
    """Validation loss, nll and perplexity; each process scores every world-th batch and the
    sums are added up across processes (one process when `procs` is None)."""
    procs = procs or Processes()
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, nll, tokens
    batches = token_batches(corpus.src_lens, corpus.tgt_lens, config.train.max_tokens)
    for index in batches[procs.rank :: procs.world]:
        b = collate(corpus, index).to(device)
        sums += torch.stack(batch_loss(model, b, config, device)).double()
    loss_sum, nll_sum, tokens = distributed.sum_across(procs, sums).tolist()
    model.train()
    nll_tok = nll_sum / max(tokens, 1)
    return {"valid_loss": loss_sum / max(tokens, 1), "valid_nll": nll_tok, "valid_ppl": math.exp(min(nll_tok, 50))}


def validation_record(run: Run, state: TrainState) -> tuple[dict[str, Any], bool]:
    """Validate the scored model at this step (loss, and BLEU where asked), log one line, move
    the best score and the patience counter on -> (the metrics record, whether the score
    improved). Without a validation split the record holds the step alone."""
    t, procs = run.config.train, run.procs
    record: dict[str, Any] = {"step": state.step, "epoch": state.epoch + 1, "elapsed_s": state.seconds()}
    if run.data.valid is None:
        return record, False
    record.update(validate(run.scored, run.data.valid, run.config, run.device, procs))
    text = (f"step {state.step}: valid loss {record['valid_loss']:.3f}, nll {record['valid_nll']:.3f}, "
            f"ppl {record['valid_ppl']:.2f}")
    if t.valid_bleu:
        d = run.data
        bleu = validation_bleu(run.scored, d.src_sp, d.tgt_sp, d.valid_raw, run.config, run.device) if procs.main else None
        record["valid_bleu"], record["valid_bleu_signature"] = distributed.from_main(procs, bleu)
        text += f", BLEU {record['valid_bleu']:.2f} ({record['valid_bleu_signature']})"
    score = record["valid_bleu"] if t.best_metric == "bleu" else -record["valid_nll"]
    improved, state.since_best = score > state.best, 0 if score > state.best else state.since_best + 1
    state.best = max(state.best, score)
    run.log(text)
    return record, improved
