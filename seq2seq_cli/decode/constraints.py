"""Lexically constrained beam search: every given target phrase appears in each output.

Dynamic beam allocation (Post & Vilar 2018), in the vectorised form of Hu et al. (2019):
each hypothesis has met some number of constraint tokens (a phrase in progress counts the
tokens it has so far), and hypotheses are grouped into banks by that number. Each step, the
candidates of a sentence are
    the top 2K continuations of its whole beam (as in ordinary beam search),
    for each hypothesis the next constraint token(s) it may take: the next token of the
        phrase in progress, else the first token of each phrase not met yet,
    for each hypothesis its single best token;
duplicates are dropped, each candidate goes to the bank of the constraint tokens it would
have met, and the K beam slots are shared among banks round robin: the best candidate of
each bank (highest bank first), then the second best of each, and so on, so a bank without
candidates leaves its slots to the others. EOS is allowed only once every phrase is met.

The banks share the beam, so constrained lines search with a wider one (`constraint_beam`:
1.5 times `beam_size`, rounded up, unless `constraint_beam_size` says otherwise), and a sentence ends, as in
ordinary beam search, once `beam_size` hypotheses have finished. A finished hypothesis is
scored with the length penalty over its unforced tokens and its constraint tokens' log-
probability added whole (`constrained_score`).

With `word_start`, a phrase is met only as whole words: after its last token, the next one
begins a new word (or is punctuation, or EOS). Phrases are unordered and do not overlap: a
phrase in progress either continues with its next token or is abandoned (its tokens stop
counting), and a token that starts a phrase starts the first unmet phrase that begins with it.

Output limits: a line's limit (max_len_a * source_len + max_len_b) is raised to the number
of its constraint tokens when it is lower, and a hypothesis that could not meet its
remaining phrases within the limit any more is held to constraint tokens, so every
sentence ends with all its phrases (n-best included). An output ends at its limit as in
`search.py` (with the token of the step after it, no EOS), where it holds every phrase.

Shape legend (as in search.py)
    B   sentences still being decoded      K   the constrained beam   V   vocabulary size
    k   rows per sentence this step         N   decoder rows (b*k)
    C   phrases per sentence (padded)       L   tokens per phrase (padded)
    M   candidates per sentence
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.decode.hypotheses import NEG_INF, Hypothesis, length_penalty
from seq2seq_cli.decode.search import output_room, start_state
from seq2seq_cli.decode.steps import max_lengths, step_log_probs
from seq2seq_cli.ids import EOS
from seq2seq_cli.model.transformer import Seq2SeqTransformer

Phrases = list[list[int]]  # the constraints of one sentence: each a phrase of target token ids


def constrained_limits(src: Tensor, model: Seq2SeqTransformer, opts: DecodeConfig, totals: Tensor) -> Tensor:
    """(B,) output limits of `max_lengths`, each raised to its sentence's number of
    constraint tokens `totals` (B,) where lower."""
    return torch.maximum(max_lengths(src, model, opts.max_len_a, opts.max_len_b), totals)


def constraint_beam(opts: DecodeConfig, vocab: int) -> int:
    """The beam of constrained lines: `constraint_beam_size`, else 1.5 times `beam_size`,
    rounded up (the beam is shared among banks, one per constraint token met), at most the
    vocabulary."""
    return min(opts.constraint_beam_size or math.ceil(1.5 * opts.beam_size), vocab)


def constrained_score(log_prob: float, forced: float, length: int, n_forced: int, opts: DecodeConfig) -> float:
    """The score of a finished constrained hypothesis of `length` tokens (EOS counted) whose
    `n_forced` constraint tokens have log-probability `forced` in all: the length penalty
    normalises the other tokens only, and the constraint tokens' cost is added whole. Divided
    by the whole length, a badly placed constraint token's cost would shrink with every token
    added after it, and outputs would grow to dilute it."""
    lp = length_penalty(max(1, length - n_forced), opts.length_penalty, opts.length_penalty_type)
    return (log_prob - forced) / lp + forced


def _pack(constraints: list[Phrases], device: torch.device) -> tuple[Tensor, Tensor]:
    """Phrases of B sentences -> tokens (B, C, L) padded with -1 and lengths (B, C), 0 for padding."""
    B = len(constraints)
    C = max(1, max(len(p) for p in constraints))
    L = max(1, max((len(t) for p in constraints for t in p), default=1))
    tokens = torch.full((B, C, L), -1, dtype=torch.long)
    lengths = torch.zeros((B, C), dtype=torch.long)
    for b, phrases in enumerate(constraints):
        for c, phrase in enumerate(phrases):
            tokens[b, c, : len(phrase)] = torch.tensor(phrase, dtype=torch.long)
            lengths[b, c] = len(phrase)
    return tokens.to(device), lengths.to(device)


def _advance(
    tokens: Tensor, lengths: Tensor, met: Tensor, cur: Tensor, pos: Tensor, tok: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The constraint state after one token, for M candidates at once.

    tokens (M, C, L), lengths (M, C): the phrases of each candidate's sentence; met (M, C)
    phrases met, cur (M,) the phrase in progress (-1: none), pos (M,) its tokens so far; tok
    (M,) the token taken -> new (met, cur, pos), whether the token completed a phrase (M,) and
    whether it was a constraint token (it continued or started a phrase) (M,)."""
    M = tok.size(0)
    rows = torch.arange(M, device=tok.device)
    in_progress = cur >= 0
    c = cur.clamp(min=0)
    expected = tokens[rows, c, pos.clamp(max=tokens.size(2) - 1)]  # (M,)
    continues = in_progress & (tok == expected)
    # Not continuing: the token may start the first unmet phrase beginning with it.
    starts = ~met & (tokens[:, :, 0] == tok[:, None])  # (M, C)
    started = starts.any(dim=1) & ~continues
    first = starts.int().argmax(dim=1)  # (M,)
    new_cur = torch.where(continues, cur, torch.where(started, first, torch.full_like(cur, -1)))
    new_pos = torch.where(continues, pos + 1, started.long())
    length = lengths[rows, new_cur.clamp(min=0)]
    complete = (new_cur >= 0) & (new_pos >= length)
    met = met.clone()
    met[rows[complete], new_cur[complete]] = True
    new_cur = torch.where(complete, torch.full_like(new_cur, -1), new_cur)
    new_pos = torch.where(complete, torch.zeros_like(new_pos), new_pos)
    return met, new_cur, new_pos, complete, continues | started


@dataclass
class _Rows:
    """The constraint state of each decoder row (N = b*k rows, or b*M candidates)."""

    met: Tensor  # (N, C) phrases met (padding counts as met)
    cur: Tensor  # (N,) the phrase in progress, -1: none
    pos: Tensor  # (N,) its tokens so far
    ended: Tensor  # (N,) the last token completed a phrase
    forced_lp: Tensor  # (N,) the log-probability of the constraint tokens taken
    forced_n: Tensor  # (N,) their number

    def take(self, index: Tensor) -> _Rows:
        """Rows `index` of each field."""
        return _Rows(*(getattr(self, f.name).index_select(0, index) for f in fields(self)))


@dataclass
class _Candidates:
    """The candidates of one step, M per sentence: their scores and tokens (b, M), the row each
    extends and the constraint state after it (b*M rows), and the bank each goes to (b, M)."""

    scores: Tensor  # (b, M) the hypothesis score with the token
    beam: Tensor  # (b, M) the beam slot extended
    tok: Tensor  # (b, M) the token
    parent: Tensor  # (b*M,) the decoder row extended
    rows: _Rows  # (b*M,) the constraint state after the token
    bank: Tensor  # (b, M) constraint tokens met after it


def _restrict(lprobs: Tensor, rows: _Rows, tokens: Tensor, lengths: Tensor, totals: Tensor, limits: Tensor, step: int,
              word_start: Tensor | None) -> tuple[Tensor, Tensor]:
    """Mask `lprobs` (N, V) in place: EOS until every phrase is met, a token that goes on with a
    word right after a phrase ends (with `word_start`), and anything but constraint tokens for a
    row that could otherwise not meet its phrases within its limit. tokens (N, C, L), lengths
    (N, C), totals (N,) and limits (N,) are each row's sentence's -> the next constraint token
    of each phrase (N, C) and which of them the row may take (N, C): the next of the phrase in
    progress, else the first of each unmet phrase."""
    full = (rows.met.long() * lengths).sum(dim=1)  # (N,) tokens of the phrases met
    unmet = full < totals
    lprobs[unmet, EOS] = NEG_INF
    in_progress = rows.cur >= 0
    index = torch.arange(lprobs.size(0), device=lprobs.device)
    following = tokens[index, rows.cur.clamp(min=0), rows.pos.clamp(max=tokens.size(2) - 1)]  # (N,)
    next_tok = torch.where(in_progress[:, None], following[:, None], tokens[:, :, 0])  # (N, C)
    only_cur = torch.nn.functional.one_hot(rows.cur.clamp(min=0), rows.met.size(1)).bool()
    allowed = torch.where(in_progress[:, None], only_cur, ~rows.met)  # (N, C)
    if word_start is not None and rows.ended.any():  # a phrase just met ends a word
        er = rows.ended.nonzero().squeeze(1)
        sub = lprobs[er]  # (E, V)
        ei, ec = allowed[er].nonzero().unbind(1)
        phrase_start = next_tok[er][ei, ec]
        kept = sub[ei, phrase_start]
        sub.masked_fill_(~word_start, NEG_INF)
        sub[ei, phrase_start] = kept  # the next phrase may follow at once
        lprobs[er] = sub
    # A row that could no longer meet its phrases within the limit after another token takes
    # only constraint tokens (the output ends at the step after its limit: steps 0..limit).
    held = unmet & (step + totals - full > limits)
    if held.any():
        hr, hc = (held[:, None] & allowed).nonzero().unbind(1)
        kept = lprobs[hr, next_tok[hr, hc]]
        lprobs[held] = NEG_INF
        lprobs[hr, next_tok[hr, hc]] = kept
    return next_tok, allowed


def _candidates(lprobs: Tensor, scores: Tensor, rows: _Rows, tokens: Tensor, lengths: Tensor, next_tok: Tensor,
                allowed: Tensor, K: int) -> _Candidates:
    """The candidates of each sentence: the top 2K of the beam, the constraint tokens, each row's
    best token; duplicates and constraint padding scored -inf. lprobs (N, V), scores (b, k);
    tokens (N, C, L) and lengths (N, C) the phrases of each row's sentence."""
    b, k = scores.shape
    V, device = lprobs.size(-1), lprobs.device
    # The top 2K of the beam lie among the rows' own top 2K: two small top-k instead of one over
    # k * V, and the rows' best tokens come with them.
    R = min(2 * K, V)
    row_val, row_tok = lprobs.topk(R, dim=1)  # (N, R), best first
    beam_row = (row_val + scores.view(-1, 1)).view(b, k * R)
    top_pos = beam_row.topk(min(2 * K, k * R), dim=1).indices  # (b, 2K) positions in (k, R)
    top_idx = (top_pos // R) * V + row_tok.view(b, k * R).gather(1, top_pos)
    beam_of_row = torch.arange(k, device=device).repeat(b)  # (N,)
    cons_idx = (beam_of_row[:, None] * V + next_tok.clamp(min=0)).masked_fill(~allowed, -1).view(b, -1)  # (b, k*C)
    best_idx = (beam_of_row * V + row_tok[:, 0]).view(b, k)  # (b, k)
    idx = torch.cat([top_idx, cons_idx, best_idx], dim=1)  # (b, M)
    idx, _ = idx.sort(dim=1)
    dup = torch.zeros_like(idx, dtype=torch.bool)
    dup[:, 1:] = idx[:, 1:] == idx[:, :-1]
    invalid = dup | (idx < 0)
    idx = idx.clamp(min=0)
    cand_lp = lprobs.view(b, k * V).gather(1, idx).masked_fill(invalid, NEG_INF)  # (b, M) the token's own
    cand_scores = cand_lp + scores.gather(1, idx // V)
    M = idx.size(1)
    cand_beam, cand_tok = idx // V, idx % V
    parent = (torch.arange(b, device=device)[:, None] * k + cand_beam).view(-1)  # (b*M,)
    tok = cand_tok.view(-1)
    met, cur, pos, ended, advanced = _advance(tokens[parent], lengths[parent], rows.met[parent], rows.cur[parent],
                                              rows.pos[parent], tok)
    forced_lp = rows.forced_lp[parent] + cand_lp.view(-1).masked_fill(~advanced, 0.0)
    forced_n = rows.forced_n[parent] + advanced.long()
    bank = ((met.long() * lengths[parent]).sum(dim=1) + pos).view(b, M)  # (b, M)
    return _Candidates(cand_scores, cand_beam, cand_tok, parent, _Rows(met, cur, pos, ended, forced_lp, forced_n), bank)


def _bank_order(scores: Tensor, bank: Tensor, banks: int) -> Tensor:
    """Candidate positions (b, M), best first, in round robin over banks: the best of each bank
    (the higher bank first), then the second best of each, and so on; -inf candidates last."""
    M = scores.size(1)
    alive = scores.isfinite()
    order = scores.argsort(dim=1, descending=True, stable=True)
    sorted_bank = bank.gather(1, order)
    onehot = torch.nn.functional.one_hot(sorted_bank, banks)  # (b, M, banks)
    rank_sorted = (onehot.cumsum(dim=1) * onehot).sum(dim=2) - 1  # (b, M)
    rank = torch.empty_like(rank_sorted).scatter_(1, order, rank_sorted)
    key = rank * banks + (banks - 1 - bank)
    key = key.masked_fill(~alive, M * banks * 2)
    return key.argsort(dim=1, stable=True)


def _finish(cands: _Candidates, chosen: Tensor, history: Tensor, active: Tensor, K: int, step: int, opts: DecodeConfig,
            finished: list[list[Hypothesis]], n_finished: Tensor, at_limit: Tensor) -> None:
    """Record the hypotheses that end among the K first `chosen` (b, M) of each sentence: with
    EOS, or, at the sentence's limit (`at_limit` (b,)), with their token and every phrase met."""
    b, M = chosen.shape
    k = history.size(0) // b
    chosen_scores = cands.scores.gather(1, chosen)
    top = min(K, M)
    is_eos = cands.tok.gather(1, chosen)[:, :top] == EOS  # (b, K)
    flat = torch.arange(b, device=chosen.device)[:, None] * M + chosen[:, :top]  # (b, K) candidate rows
    cut = at_limit[:, None] & cands.rows.met[flat.view(-1)].all(dim=1).view(b, top)
    ends = (is_eos | cut) & chosen_scores[:, :top].isfinite()  # (b, K)
    if not ends.any():
        return
    i, j = ends.nonzero().unbind(1)
    sentences = active[i]
    n_finished.index_add_(0, sentences, torch.ones_like(sentences))
    ended_rows = i * k + cands.beam[i, chosen[i, j]]
    c = i * M + chosen[i, j]
    for s, raw, toks, tok, eos, forced, n_forced in zip(
        sentences.tolist(), chosen_scores[i, j].tolist(), history[ended_rows].tolist(), cands.tok.view(-1)[c].tolist(),
        is_eos[i, j].tolist(), cands.rows.forced_lp[c].tolist(), cands.rows.forced_n[c].tolist(),
    ):
        score = constrained_score(raw, forced, step + 1, n_forced, opts)
        finished[s].append(Hypothesis(toks if eos else toks + [tok], score, raw, eos))


def _continue(cands: _Candidates, chosen: Tensor, history: Tensor, K: int) -> tuple[Tensor, Tensor, Tensor, _Rows, Tensor]:
    """The K best candidates of each sentence (in bank order) that do not end with EOS (M >= K:
    the top 2K alone give K) -> their scores (b, K), the decoder rows they extend (b*K,), the
    history with their tokens (b*K, t+1), their constraint state and tokens (b*K,)."""
    b, M = chosen.shape
    go = cands.scores.gather(1, chosen).masked_fill(cands.tok.gather(1, chosen) == EOS, NEG_INF)
    cont_key = (~go.isfinite()).long().argsort(dim=1, stable=True)[:, :K]  # (b, K) positions in `chosen`
    pick = chosen.gather(1, cont_key)  # (b, K) candidate positions
    flat_pick = (torch.arange(b, device=chosen.device)[:, None] * M + pick).view(-1)  # (b*K,)
    rows_next = cands.parent[flat_pick]
    new_tok = cands.tok.view(-1)[flat_pick]
    history = torch.cat([history.index_select(0, rows_next), new_tok[:, None]], dim=1)
    return go.gather(1, cont_key), rows_next, history, cands.rows.take(flat_pick), new_tok


@torch.inference_mode()
def constrained_beam_search(
    model: Seq2SeqTransformer, src: Tensor, opts: DecodeConfig, constraints: list[Phrases], nbest: int = 1,
    word_start: Tensor | None = None,
) -> list[list[Hypothesis]]:
    """src: (B, S), `constraints`: the phrases (target ids) of each sentence -> for each
    sentence its `nbest` hypotheses, best first, each holding every phrase of its sentence.
    With beam size 1 (and no `constraint_beam_size`) it is a beam of two that stops at the
    first finished hypothesis, not greedy search. With `word_start` (V,) (the tokens that begin a
    word, or hold no letter: SentencePiece's "▁" pieces and punctuation, EOS), a phrase is
    met as whole words: the token after its last one must be one of those."""
    stop = opts.beam_size  # finished hypotheses that end a sentence, as in ordinary beam search
    K = constraint_beam(opts, model.tgt_embed.tokens.num_embeddings)
    if not 1 <= nbest <= stop:
        raise ValueError(f"nbest must be between 1 and beam_size ({stop}), got {nbest}")
    if len(constraints) != src.size(0):
        raise ValueError(f"{len(constraints)} constraint lists for {src.size(0)} sentences")
    B, device = src.size(0), src.device
    phrase_tokens, phrase_lengths = _pack(constraints, device)  # (B, C, L), (B, C)
    totals = phrase_lengths.sum(dim=1)  # (B,) constraint tokens of each sentence
    banks = int(totals.max()) + 1
    limits = constrained_limits(src, model, opts, totals)  # (B,)
    state = start_state(model, src, B * K, output_room(limits))
    active = torch.arange(B, device=device)
    scores = torch.zeros((B, 1), device=device)  # (b, k)
    history = torch.zeros((B, 0), dtype=torch.long, device=device)  # (b*k, t)
    zeros = torch.zeros(B, dtype=torch.long, device=device)
    rows = _Rows(phrase_lengths == 0, torch.full((B,), -1, dtype=torch.long, device=device), zeros.clone(),
                 torch.zeros(B, dtype=torch.bool, device=device), torch.zeros(B, device=device), zeros)
    n_finished = torch.zeros(B, dtype=torch.long, device=device)
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    last = torch.full((B, 1), model.cfg.decoder_start_id, dtype=torch.long, device=device)
    step = 0
    while active.numel():
        sent = active.repeat_interleave(scores.size(1))  # (N,) the sentence of each row
        row_tokens, row_lengths, row_limits = phrase_tokens[sent], phrase_lengths[sent], limits[sent]
        lprobs = step_log_probs(model, last, state, step, history, opts)  # (N, V)
        next_tok, allowed = _restrict(lprobs, rows, row_tokens, row_lengths, totals[sent], row_limits, step, word_start)
        cands = _candidates(lprobs, scores, rows, row_tokens, row_lengths, next_tok, allowed, K)
        chosen = _bank_order(cands.scores, cands.bank, banks)  # (b, M), best first
        _finish(cands, chosen, history, active, K, step, opts, finished, n_finished, step >= limits[active])
        scores, rows_next, history, rows, new_tok = _continue(cands, chosen, history, K)
        state.reorder(rows_next)
        state.group = K
        last = new_tok[:, None]
        done = (n_finished[active] >= stop) | (step >= limits[active]) | ~scores.isfinite().any(dim=1)
        if done.any():
            keep_s = (~done).nonzero().squeeze(1)
            keep_rows = (keep_s[:, None] * K + torch.arange(K, device=device)).view(-1)
            state.select(keep_rows)
            history, last, rows = history.index_select(0, keep_rows), last.index_select(0, keep_rows), rows.take(keep_rows)
            scores, active = scores.index_select(0, keep_s), active.index_select(0, keep_s)
        step += 1
    return [sorted(f, key=lambda h: h.score, reverse=True)[:nbest] for f in finished]
