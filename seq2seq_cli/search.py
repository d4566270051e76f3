"""Greedy and beam search over the decoder's key/value cache. The only place search lives.

Shape legend
    B   sentences still being decoded      K   beam size        V   vocabulary size
    S   source length                      N   rows in the decoder batch (B, or B*K for beams)

Both searches decode a whole batch at once; sentences that are finished leave the batch
(the cache is compacted), so late steps only pay for sentences still going. A sentence's
output is limited to max_len_a * source_len + max_len_b tokens (EOS not counted), after
which EOS is forced.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from seq2seq_cli.model import DecoderState, Seq2SeqTransformer
from seq2seq_cli.tokenizer import BOS, EOS, PAD


@dataclass
class Hypothesis:
    tokens: list[int]  # output ids without BOS/EOS
    score: float  # sum of token log-probabilities (EOS included) / length_penalty
    log_prob: float  # sum of token log-probabilities, EOS included


def max_lengths(src: Tensor, model: Seq2SeqTransformer, a: float, b: int) -> Tensor:
    """src: (B, S) -> (B,) output length limits a*|x|+b, capped by the model's positions."""
    src_len = (src != PAD).sum(dim=1).float()
    limit = (a * src_len + b).floor().long()
    return limit.clamp(min=0, max=model.cfg.max_positions - 2)


def _log_probs(model: Seq2SeqTransformer, last: Tensor, state: DecoderState, force_eos: Tensor) -> Tensor:
    """One decoder step. last: (N, 1) -> log-probabilities (N, V) with PAD/BOS banned and EOS
    forced on rows where `force_eos` (N,) is set."""
    h, _ = model.decode(last, state, incremental=True)
    lprobs = torch.log_softmax(model.logits(h[:, -1]).float(), dim=-1)  # (N, V)
    lprobs[:, PAD] = float("-inf")
    lprobs[:, BOS] = float("-inf")
    if force_eos.any():
        eos_col = lprobs[:, EOS].clone()
        lprobs[force_eos] = float("-inf")
        lprobs[:, EOS] = torch.where(force_eos, eos_col, lprobs[:, EOS])
    return lprobs


@torch.no_grad()
def greedy_search(model: Seq2SeqTransformer, src: Tensor, max_len_a: float, max_len_b: int) -> list[Hypothesis]:
    """src: (B, S) -> one hypothesis per sentence, in batch order."""
    memory, src_mask, _ = model.encode(src)
    state = model.init_state(memory, src_mask)
    limits = max_lengths(src, model, max_len_a, max_len_b)  # (B,)
    B = src.size(0)
    active = torch.arange(B, device=src.device)  # original row of each decoder row
    last = torch.full((B, 1), BOS, dtype=torch.long, device=src.device)
    tokens: list[list[int]] = [[] for _ in range(B)]
    totals = torch.zeros(B, device=src.device)
    results: list[Hypothesis | None] = [None] * B
    step = 0
    while active.numel():
        lprobs = _log_probs(model, last, state, step >= limits[active])
        best, nxt = lprobs.max(dim=-1)  # (N,), (N,)
        totals[active] += best
        done = nxt == EOS
        for row, tok, fin in zip(active.tolist(), nxt.tolist(), done.tolist()):
            if fin:
                results[row] = Hypothesis(tokens[row], totals[row].item(), totals[row].item())
            else:
                tokens[row].append(tok)
        keep = (~done).nonzero().squeeze(1)
        if keep.numel() < active.numel():
            state.select(keep)
            active, nxt = active[keep], nxt[keep]
        last = nxt[:, None]
        step += 1
    return results  # type: ignore[return-value]


@torch.no_grad()
def beam_search(
    model: Seq2SeqTransformer,
    src: Tensor,
    beam_size: int,
    length_penalty: float,
    max_len_a: float,
    max_len_b: int,
    nbest: int = 1,
) -> list[list[Hypothesis]]:
    """src: (B, S) -> for each sentence its `nbest` hypotheses, best first.

    Each step scores all K*V continuations of every sentence, keeps the top 2K so that beams
    ending in EOS do not starve the others, moves EOS candidates ranked within the top K to
    the finished list (score / length**length_penalty, length counting EOS), and continues
    with the best K others. A sentence stops once it has K finished hypotheses.
    """
    K = beam_size
    if not 1 <= nbest <= K:
        raise ValueError(f"nbest must be between 1 and beam_size ({K}), got {nbest}")
    B, device = src.size(0), src.device
    memory, src_mask, _ = model.encode(src)
    limits = max_lengths(src, model, max_len_a, max_len_b)  # (B,)
    memory = memory.repeat_interleave(K, dim=0)  # (B*K, S, D)
    state = model.init_state(memory, src_mask.repeat_interleave(K, dim=0))
    active = torch.arange(B, device=device)  # original sentence of each beam group
    scores = torch.full((B, K), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first
    history = torch.full((B * K, 0), BOS, dtype=torch.long, device=device)  # (B*K, t) tokens so far
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    last = torch.full((B * K, 1), BOS, dtype=torch.long, device=device)
    step = 0
    while active.numel():
        b = active.numel()
        force = (step >= limits[active]).repeat_interleave(K)  # (b*K,)
        lprobs = _log_probs(model, last, state, force)
        V = lprobs.size(-1)
        cand = (scores[:, :, None] + lprobs.view(b, K, V)).view(b, K * V)  # (b, K*V)
        top_scores, top_idx = cand.topk(2 * K, dim=1)  # (b, 2K)
        top_beam, top_tok = top_idx // V, top_idx % V
        is_eos = top_tok == EOS
        ended = is_eos[:, :K] & top_scores[:, :K].isfinite()  # (b, K)
        if ended.any():
            hist = history.view(b, K, -1)
            for i, j in ended.nonzero().tolist():
                raw = top_scores[i, j].item()
                toks = hist[i, top_beam[i, j]].tolist()
                norm = raw / float(step + 1) ** length_penalty
                finished[active[i].item()].append(Hypothesis(toks, norm, raw))
        # The K best candidates that do not end here continue.
        cont_scores, pos = top_scores.masked_fill(is_eos, float("-inf")).topk(K, dim=1)  # (b, K)
        cont_beam, cont_tok = top_beam.gather(1, pos), top_tok.gather(1, pos)
        rows = (torch.arange(b, device=device)[:, None] * K + cont_beam).view(-1)  # (b*K,)
        history = torch.cat([history.index_select(0, rows), cont_tok.view(-1, 1)], dim=1)
        state.reorder(rows)
        scores, last = cont_scores, cont_tok.view(-1, 1)
        at_limit = step >= limits[active]
        done = torch.tensor([len(finished[s]) >= K for s in active.tolist()], device=device) | at_limit
        if done.any():
            keep = (~done).nonzero().squeeze(1)  # (b',)
            keep_rows = (keep[:, None] * K + torch.arange(K, device=device)).view(-1)
            state.select(keep_rows)
            history, last = history.index_select(0, keep_rows), last.index_select(0, keep_rows)
            scores, active = scores.index_select(0, keep), active.index_select(0, keep)
        step += 1
    return [sorted(f, key=lambda h: h.score, reverse=True)[:nbest] for f in finished]


def search(
    model: Seq2SeqTransformer,
    src: Tensor,
    beam_size: int,
    length_penalty: float,
    max_len_a: float,
    max_len_b: int,
    nbest: int = 1,
) -> list[list[Hypothesis]]:
    """Greedy search for beam size 1 with one output, beam search otherwise."""
    if beam_size == 1 and nbest == 1:
        return [[h] for h in greedy_search(model, src, max_len_a, max_len_b)]
    return beam_search(model, src, beam_size, length_penalty, max_len_a, max_len_b, nbest)
