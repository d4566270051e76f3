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
    model: Seq2SeqTransformer, src_sp: Any, tgt_sp: Any, valid_raw: Any, config: Config, device: torch.device,
    prefix: list[int] | None = None,
) -> tuple[float, str]:
    """Greedy translation of the validation sources (each after `prefix`, the target's language
    token where the run has one) scored with sacreBLEU -> (BLEU, signature)."""
    from seq2seq_cli.decode.evaluate import score
    from seq2seq_cli.decode.onednn import for_decoding
    from seq2seq_cli.decode.translate import Translator

    decode = config.decode.model_copy(update={"beam_size": 1, "sampling": False})
    model.eval()
    # weights are fixed during validation: pack them for decoding once, not once per batch
    translator = Translator(for_decoding(model), src_sp, tgt_sp, decode, device, tag_ids=list(prefix or []))
    hyps = translator.translate(list(valid_raw["src"]))
    model.train()
    scores = score(hyps, list(valid_raw["tgt"]))
    return scores.bleu, scores.bleu_signature


@torch.no_grad()
def validation_sums(
    model: Seq2SeqTransformer, corpus: EncodedCorpus, config: Config, device: torch.device, procs: Processes | None = None
) -> list[float]:
    """The validation loss and nll summed over target tokens, and the tokens -> [loss, nll,
    tokens]; each process scores every world-th batch and the sums are added up across
    processes (one process when `procs` is None)."""
    procs = procs or Processes()
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, nll, tokens
    batches = token_batches(corpus.src_lens, corpus.tgt_lens, config.train.max_tokens)
    for index in batches[procs.rank :: procs.world]:
        b = collate(corpus, index).to(device)
        sums += torch.stack(batch_loss(model, b, config, device)).double()
    model.train()
    return distributed.sum_across(procs, sums).tolist()


def per_token(sums: list[float]) -> dict[str, float]:
    """Loss, nll and perplexity per target token of `validation_sums`."""
    loss_sum, nll_sum, tokens = sums
    nll_tok = nll_sum / max(tokens, 1)
    return {"valid_loss": loss_sum / max(tokens, 1), "valid_nll": nll_tok, "valid_ppl": math.exp(min(nll_tok, 50))}


def validate(
    model: Seq2SeqTransformer, corpus: EncodedCorpus, config: Config, device: torch.device, procs: Processes | None = None
) -> dict[str, float]:
    """Validation loss, nll and perplexity of one split."""
    return per_token(validation_sums(model, corpus, config, device, procs))


def validation_record(run: Run, state: TrainState) -> tuple[dict[str, Any], bool]:
    """Validate the scored model at this step (loss, and BLEU where asked), log one line, move
    the best score and the patience counter on -> (the metrics record, whether the score
    improved). Several validation splits (one per language pair): each pair's figures under
    `valid_nll/es-en` ..., and over all of them the loss per token and the mean BLEU, which
    pick the best checkpoint. Without a validation split the record holds the step alone."""
    t, procs = run.config.train, run.procs
    record: dict[str, Any] = {"step": state.step, "epoch": state.epoch + 1, "elapsed_s": state.seconds()}
    valids = run.data.valids
    if not valids:
        return record, False
    sums = [validation_sums(run.scored, v.corpus, run.config, run.device, procs) for v in valids]
    record.update(per_token([sum(column) for column in zip(*sums)]))
    several = len(valids) > 1
    text = (f"step {state.step}: valid loss {record['valid_loss']:.3f}, nll {record['valid_nll']:.3f}, "
            f"ppl {record['valid_ppl']:.2f}")
    if several:
        for v, mine in zip(valids, sums):
            record.update({f"{key}/{v.name}": value for key, value in per_token(mine).items()})
    if t.valid_bleu:
        d = run.data
        bleus = [validation_bleu(run.scored, d.src_sp, d.tgt_sp, v.raw, run.config, run.device, v.prefix)
                 for v in valids] if procs.main else None
        bleus = distributed.from_main(procs, bleus)
        record["valid_bleu"] = sum(b for b, _ in bleus) / len(bleus)
        record["valid_bleu_signature"] = bleus[0][1]
        if several:
            record.update({f"valid_bleu/{v.name}": b for v, (b, _) in zip(valids, bleus)})
            text += f", BLEU {record['valid_bleu']:.2f} (mean of the pairs; {record['valid_bleu_signature']})"
        else:
            text += f", BLEU {record['valid_bleu']:.2f} ({record['valid_bleu_signature']})"
    if several:
        text += "; " + ", ".join(
            f"{v.name} nll {record[f'valid_nll/{v.name}']:.3f}"
            + (f" BLEU {record[f'valid_bleu/{v.name}']:.2f}" if t.valid_bleu else "") for v in valids)
    score = record["valid_bleu"] if t.best_metric == "bleu" else -record["valid_nll"]
    improved, state.since_best = score > state.best, 0 if score > state.best else state.since_best + 1
    state.best = max(state.best, score)
    run.log(text)
    return record, improved
