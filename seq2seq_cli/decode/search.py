"""Greedy search, sampling and beam search over the decoder's key/value cache.
The only place search lives.

Shape legend
    B   sentences still being decoded      K   beam size        V   vocabulary size
    S   source length                      N   rows in the decoder batch (B, B*K or B*samples)
    t   output tokens produced so far      k   rows per sentence this step (beam: 1 at the first step, then K)

Every search decodes a whole batch at once; sentences that are finished leave the batch
(the cache is compacted), so late steps only pay for sentences still going. A sentence's
output limit L = max_len_a * source_len + max_len_b counts its tokens before EOS; a
hypothesis that has not ended by then ends at the step after, with the token it takes
there and no EOS: its L + 1 tokens, EOS counted where there is one, are what CTranslate2's
`max_decoding_length` and HF's `max_new_tokens` allow, and they end an output there the same
way. With min_len, EOS is banned before that many tokens.

The searches decode with the model they are given, or an `Ensemble` of models (see
`seq2seq_cli/decode/ensemble.py`: each member decodes with its own cache, their
distributions are averaged at each step): the callers pack it for oneDNN once
(`seq2seq_cli/decode/onednn.py`); the decoder's self-attention cache is allocated once per search for
the source length, and grows only for outputs longer than that.

Forced prefixes: a sentence may be given target tokens its output must start with (`prefixes`
of `search`). For the first len(prefix) steps its rows take the prefix's tokens, with the
model's own log-probabilities for them (no ban applies to a forced token); then the search
goes on as usual. Sentences with prefixes of different lengths, or none, share a batch. The
output limit of a sentence is raised to its prefix's length where it is shorter, so the prefix
is never cut; scores and log-probabilities include the prefix's tokens.

The host and the device: a decoding step reads nothing back. Finished hypotheses (their
tokens, log-probabilities and lengths) are written into buffers on the device
(`FinishedBeams`), and a sentence that is done stays in the batch, ignored, until the host
next looks (`look_every`): every step on a CPU, where looking costs nothing and finished
sentences leave the batch at once, every `LOOK_EVERY` steps on a GPU, where each look waits
for the device. A look reads which sentences are done, then the finished hypotheses of
those, and drops them from the batch. Options that need the host at every step: sampling
(each row draws from its own generator) and no_repeat_ngram_size (the n-grams are matched
on the host).

Scores: `log_prob` is the sum of the model's token log-probabilities, EOS included where the
output has one. `score` divides it by the length penalty lp(|Y|), |Y| = output tokens + EOS
(if any):
    average (fairseq, HF, CTranslate2):  lp = |Y| ** alpha
    gnmt (OpenNMT, JoeyNMT):             lp = ((5 + |Y|) / 6) ** alpha
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.decode.ensemble import Ensemble, EnsembleState
from seq2seq_cli.decode.hypotheses import NEG_INF, NO_HYPOTHESIS, Hypothesis, length_penalty
from seq2seq_cli.decode.steps import (
    Decoder,
    State,
    draw,
    filter_for_sampling,
    forced_tokens,
    max_lengths,
    prefix_tensor,
    row_generator,
    step_log_probs,
    with_prefixes,
)
from seq2seq_cli.ids import EOS
from seq2seq_cli.model.kv_cache import DecoderState
from seq2seq_cli.model.transformer import Seq2SeqTransformer


def start_state(model: Decoder, src: Tensor, rows: int, room: int) -> State:
    """Encode `src` (B, S) and make the decoder state for up to `rows` decoder rows and outputs
    of up to `room` tokens (`output_room`; see `_decoder_state`); for an ensemble, one per member."""
    if isinstance(model, Ensemble):
        return EnsembleState([_as_one(start_state(m, src, rows, room)) for m in model.models])
    memory, src_mask, _ = model.encode(src)
    state = _decoder_state(model, memory, src_mask, rows, room)
    if model.candidates is not None:
        vocab, allowed = model.candidates(src)
        model.limit_vocabulary(state, vocab.to(src.device), allowed)
    return state


def _as_one(state: State) -> DecoderState:
    assert isinstance(state, DecoderState)
    return state


LOOK_EVERY = 8
"""Decoding steps between the host's looks at a search on a GPU (see the module docstring)."""


def look_every(device: torch.device) -> int:
    """Steps between the host's looks: 1 on a CPU, `LOOK_EVERY` elsewhere."""
    return 1 if device.type == "cpu" else LOOK_EVERY


def look(alive: Tensor, step: int, every: int, room: int) -> tuple[list[int], list[int]] | None:
    """The host's look after `step` steps, every `every` steps and once past `room` (when every
    row is done): alive (N,) read once -> (rows kept, rows gone) when some are gone, else None."""
    if step % every and step <= room:
        return None
    flags = alive.tolist()
    if all(flags):
        return None
    return [i for i, a in enumerate(flags) if a], [i for i, a in enumerate(flags) if not a]


def output_room(limits: Tensor) -> int:
    """The most output tokens any sentence may get (one read of the device per batch)."""
    return int(limits.max()) if limits.numel() else 0


@torch.inference_mode()
def greedy_search(
    model: Decoder, src: Tensor, opts: DecodeConfig, generators: list[torch.Generator] | None = None,
    prefix: Tensor | None = None, every: int | None = None,
) -> list[Hypothesis]:
    """src: (B, S) -> one hypothesis per row: the most likely token each step, or with
    `opts.sampling` a token sampled (temperature, top-k, top-p) with the row's generator in
    `generators` (B of them); `prefix` (B, P): forced prefixes (`prefix_tensor`); `every`:
    steps between the host's looks (default `look_every`)."""
    limits = with_prefixes(max_lengths(src, model, opts.max_len_a, opts.max_len_b), prefix)  # (B,)
    B, device = src.size(0), src.device
    every = every or look_every(device)
    room = output_room(limits)
    state = start_state(model, src, B, room)
    active = torch.arange(B, device=device)  # original row of each decoder row
    rows_of = list(range(B))  # the same, on the host
    alive = torch.ones(B, dtype=torch.bool, device=device)  # (N,) rows still decoding
    last = torch.full((B, 1), model.cfg.decoder_start_id, dtype=torch.long, device=device)
    history = torch.zeros((B, 0), dtype=torch.long, device=device)  # (N, t)
    totals = torch.zeros(B, device=device)  # (N,) log-probability so far
    ended_at = torch.full((B,), -1, dtype=torch.long, device=device)  # (N,) output tokens when the row ended
    ended_total = torch.zeros(B, device=device)  # (N,) log-probability then
    results: list[Hypothesis | None] = [None] * B
    step = 0
    while rows_of:
        forced = forced_tokens(prefix, active, step)
        lprobs = step_log_probs(model, last, state, step, history, opts, forced)
        if opts.sampling:
            if generators is None:
                raise ValueError("sampling needs one generator per row")
            probs = filter_for_sampling(lprobs, opts).softmax(dim=-1)
            nxt = draw(probs, [generators[i] for i in rows_of])  # (N,)
        else:
            nxt = lprobs.argmax(dim=-1)  # (N,)
        totals += lprobs.gather(1, nxt[:, None]).squeeze(1)
        eos = nxt == EOS
        done = (eos | (step >= limits[active])) & alive  # EOS, or the token at the limit (kept, no EOS)
        ended_at = torch.where(done, torch.where(eos, step, step + 1), ended_at)
        ended_total = torch.where(done, totals, ended_total)
        alive &= ~done
        history = torch.cat([history, nxt[:, None]], dim=1)
        last = nxt[:, None]
        step += 1
        looked = look(alive, step, every, room)
        if looked is not None:  # finished rows leave the batch
            keep, gone = looked
            lengths, scores, tokens, row_limits = (x[gone].tolist() for x in (ended_at, ended_total, history, limits[active]))
            for i, n, total, toks, limit in zip(gone, lengths, scores, tokens, row_limits):
                results[rows_of[i]] = finished_hypothesis(toks[:n], n <= limit, total, opts)
            index = torch.tensor(keep, dtype=torch.long, device=device)
            state.select(index)
            active, alive, last, history, totals, ended_at, ended_total = (
                x.index_select(0, index) for x in (active, alive, last, history, totals, ended_at, ended_total))
            rows_of = [rows_of[i] for i in keep]
    return results  # type: ignore[return-value]


def finished_hypothesis(tokens: list[int], eos: bool, log_prob: float, opts: DecodeConfig) -> Hypothesis:
    """A hypothesis that ended with EOS (`eos`), or at its limit without one: ranked by the
    length penalty over its tokens, EOS counted where it has one."""
    penalty = length_penalty(len(tokens) + int(eos), opts.length_penalty, opts.length_penalty_type)
    return Hypothesis(tokens, log_prob / penalty, log_prob, eos)


def _decoder_state(model: Seq2SeqTransformer, memory: Tensor, src_mask: Tensor, rows: int, room: int) -> DecoderState:
    """The decoder state for a search over `rows` decoder rows at most, its self-attention
    cache allocated for as many positions as the longest source has (`memory`: (B, S, D)),
    or the longest output allowed (`room` tokens) plus EOS if that is fewer. Most outputs
    end within that; a longer one grows the buffers once it gets there, sized for the rows
    still decoding then, which is far less than allocating every row for the limit."""
    state = model.init_state(memory, src_mask)
    cfg = model.cfg
    positions = min(room + 1, memory.size(1))
    state.preallocate(rows, positions, cfg.heads, cfg.head_q_k_size, cfg.head_v_size)
    return state


@dataclass
class FinishedBeams:
    """The hypotheses that ended, kept on the device until the host reads them: for each
    sentence of the batch, up to 2K in the order they ended (at most K - 1 before its last
    step, K more in it), and one slot more (2K) where the candidates that did not end go."""

    log_prob: Tensor  # (b, 2K+1)
    length: Tensor  # (b, 2K+1) output tokens, EOS not counted
    eos: Tensor  # (b, 2K+1) ended with EOS (else at the limit, without one)
    tokens: Tensor  # (b, 2K+1, L) L = the longest output allowed
    count: Tensor  # (b,) slots taken

    @classmethod
    def empty(cls, b: int, K: int, room: int, device: torch.device) -> FinishedBeams:
        slots = 2 * K + 1
        return cls(torch.full((b, slots), NEG_INF, device=device), torch.zeros((b, slots), dtype=torch.long, device=device),
                   torch.zeros((b, slots), dtype=torch.bool, device=device),
                   torch.zeros((b, slots, room), dtype=torch.long, device=device),
                   torch.zeros(b, dtype=torch.long, device=device))

    def add(self, ended: Tensor, log_prob: Tensor, tokens: Tensor, eos: Tensor) -> None:
        """ended: (b, J) which candidates end here, log_prob: (b, J) theirs, tokens: (b, J, t+1)
        the output so far and the candidate's token, eos: (b, J) the candidate is EOS (its
        output is then the first t tokens) or not (the output ends at its limit, t+1 tokens)."""
        trash = self.log_prob.size(1) - 1
        dest = torch.where(ended, self.count[:, None] + ended.long().cumsum(1) - 1, trash)  # (b, J)
        self.log_prob.scatter_(1, dest, log_prob)
        self.length.scatter_(1, dest, tokens.size(2) - eos.long())
        self.eos.scatter_(1, dest, eos)
        self.tokens[:, :, : tokens.size(2)].scatter_(1, dest[:, :, None].expand_as(tokens), tokens)
        self.count += ended.sum(1)

    def select(self, index: Tensor) -> FinishedBeams:
        return FinishedBeams(*(x.index_select(0, index) for x in (self.log_prob, self.length, self.eos, self.tokens, self.count)))

    def read(self, groups: list[int], opts: DecodeConfig) -> list[list[Hypothesis]]:
        """The finished hypotheses of batch rows `groups`, in the order they ended (host reads)."""
        index = torch.tensor(groups, dtype=torch.long, device=self.count.device)
        counts, log_probs, lengths, eos, tokens = (x.index_select(0, index).tolist()
                                                   for x in (self.count, self.log_prob, self.length, self.eos, self.tokens))
        return [[finished_hypothesis(toks[j][: lens[j]], ends[j], raws[j], opts) for j in range(n)]
                for n, raws, lens, ends, toks in zip(counts, log_probs, lengths, eos, tokens)]


@torch.inference_mode()
def beam_search(
    model: Decoder, src: Tensor, opts: DecodeConfig, nbest: int = 1, prefix: Tensor | None = None,
    every: int | None = None,
) -> list[list[Hypothesis]]:
    """src: (B, S) -> for each sentence its `nbest` hypotheses, best first; `prefix` (B, P):
    forced prefixes (`prefix_tensor`); `every`: steps between the host's looks (default
    `look_every`).

    Each step scores all k*V continuations of every sentence in one tensor program, keeps
    the top 2K so that beams ending in EOS do not starve the others, moves EOS candidates
    ranked within the top K to the finished ones, and continues with the best K others. A
    sentence is done once it has K finished hypotheses. All K beams of a sentence start
    identical, so the first step decodes one row per sentence (k = 1) and its K best
    continuations become the beams (k = K from then on). While a prefix is forced, a sentence
    has one live beam (the others score -inf); its beams spread once the prefix ends.
    """
    K = opts.beam_size
    if not 1 <= nbest <= K:
        raise ValueError(f"nbest must be between 1 and beam_size ({K}), got {nbest}")
    B, device = src.size(0), src.device
    every = every or look_every(device)
    limits = with_prefixes(max_lengths(src, model, opts.max_len_a, opts.max_len_b), prefix)  # (B,)
    room = output_room(limits)
    state = start_state(model, src, B * K, room)
    active = torch.arange(B, device=device)  # original sentence of each beam group
    sentences = list(range(B))  # the same, on the host
    alive = torch.ones(B, dtype=torch.bool, device=device)  # (b,) sentences still searching
    scores = torch.zeros((B, 1), device=device)  # (b, k) running log-probabilities
    history = torch.zeros((B, 0), dtype=torch.long, device=device)  # (b*k, t)
    finished = FinishedBeams.empty(B, K, room + 1, device)
    results: list[list[Hypothesis]] = [[] for _ in range(B)]
    last = torch.full((B, 1), model.cfg.decoder_start_id, dtype=torch.long, device=device)  # (b*k, 1)
    step = 0
    while sentences:
        b, k = scores.shape
        sentence_limits = limits[active]  # (b,)
        forced = forced_tokens(prefix, active.repeat_interleave(k), step) if prefix is not None else None
        lprobs = step_log_probs(model, last, state, step, history, opts, forced)  # (b*k, V)
        V = lprobs.size(-1)
        cand = lprobs.view(b, k, V).add_(scores[:, :, None]).view(b, k * V)  # (b, k*V), in place
        top_scores, top_idx = cand.topk(min(2 * K, k * V), dim=1)  # (b, 2K)
        top_beam, top_tok = top_idx // V, top_idx % V
        is_eos = top_tok == EOS
        first = top_scores[:, :K]  # (b, J) the candidates ranked within the top K, J <= K
        J = first.size(1)
        # EOS candidates end here; at a sentence's limit every candidate does, with its token.
        ended = (is_eos[:, :K] | (step >= sentence_limits)[:, None]) & first.isfinite() & alive[:, None]  # (b, J)
        ended_tokens = torch.cat([history.view(b, k, step).gather(1, top_beam[:, :K, None].expand(b, J, step)),
                                  top_tok[:, :K, None]], dim=2)  # (b, J, t+1)
        finished.add(ended, first, ended_tokens, is_eos[:, :K])
        # The K best candidates that do not end here continue.
        cont_scores, pos = top_scores.masked_fill(is_eos, NEG_INF).topk(K, dim=1)  # (b, K)
        cont_beam, cont_tok = top_beam.gather(1, pos), top_tok.gather(1, pos)
        rows = (torch.arange(b, device=device)[:, None] * k + cont_beam).view(-1)  # (b*K,)
        history = torch.cat([history.index_select(0, rows), cont_tok.view(-1, 1)], dim=1)  # (b*K, t+1)
        state.reorder(rows)  # the first step's rows become K beams each
        state.group = K  # beams share their sentence's cross-attention keys/values
        scores, last = cont_scores, cont_tok.view(-1, 1)
        alive &= ~((finished.count >= K) | (step >= sentence_limits) | ~cont_scores[:, 0].isfinite())
        step += 1
        looked = look(alive, step, every, room)
        if looked is not None:  # sentences done leave the batch
            keep, gone = looked
            for i, hyps in zip(gone, finished.read(gone, opts)):
                results[sentences[i]] = hyps
            index = torch.tensor(keep, dtype=torch.long, device=device)  # (b',)
            keep_rows = (index[:, None] * K + torch.arange(K, device=device)).view(-1)  # (b'*K,)
            state.select(keep_rows)
            history, last = history.index_select(0, keep_rows), last.index_select(0, keep_rows)
            scores, active, alive = scores.index_select(0, index), active.index_select(0, index), alive.index_select(0, index)
            finished = finished.select(index)
            sentences = [sentences[i] for i in keep]
    return [sorted(f, key=lambda h: h.score, reverse=True)[:nbest] for f in results]


@torch.inference_mode()
def sample(
    model: Decoder, src: Tensor, opts: DecodeConfig, nbest: int = 1, lines: list[int] | None = None,
    prefix: Tensor | None = None,
) -> list[list[Hypothesis]]:
    """`nbest` independent samples per sentence, best first; `lines` are the sentences'
    line numbers in the input (default 0..B-1). Each sample is drawn with its own generator,
    seeded by (`opts.seed`, line, sample), so the same line gives the same samples however
    it is batched, and copies of a line on different lines give different ones."""
    lines = list(range(src.size(0))) if lines is None else lines
    generators = [row_generator(opts.seed, line, k) for line in lines for k in range(nbest)]
    rows_prefix = None if prefix is None else prefix.repeat_interleave(nbest, dim=0)
    hyps = greedy_search(model, src.repeat_interleave(nbest, dim=0), opts, generators, rows_prefix)
    groups = [hyps[i * nbest : (i + 1) * nbest] for i in range(src.size(0))]
    return [sorted(g, key=lambda h: h.score, reverse=True) for g in groups]


def search(
    model: Decoder, src: Tensor, opts: DecodeConfig, nbest: int = 1, lines: list[int] | None = None,
    prefixes: list[list[int]] | None = None, every: int | None = None,
) -> list[list[Hypothesis]]:
    """Sampling when asked (`lines`: the input line of each sentence, see `sample`), greedy
    search for beam size 1 and one output, beam search otherwise; `prefixes`: target ids each
    sentence's outputs must start with ([] = none).

    Always `nbest` hypotheses per sentence: where the output limit leaves fewer distinct
    outputs (a limit of 0 allows only the empty one), the missing ones are empty with score
    and log-probability -inf (NO_HYPOTHESIS), so n-best lines stay aligned with their input.
    `every`: steps between the host's looks (default `look_every`: 1 on a CPU)."""
    prefix = prefix_tensor(prefixes, src.device)
    if opts.sampling:
        found = sample(model, src, opts, nbest, lines, prefix)
    elif opts.beam_size == 1 and nbest == 1:
        found = [[h] for h in greedy_search(model, src, opts, prefix=prefix, every=every)]
    else:
        found = beam_search(model, src, opts, nbest, prefix, every)
    return [hyps + [NO_HYPOTHESIS] * (nbest - len(hyps)) for hyps in found]
