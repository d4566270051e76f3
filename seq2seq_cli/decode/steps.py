"""One step of every search: the output limits (a*|x|+b, capped by the model's positions),
forced prefixes, the model's log-probabilities of the next token (one model, or an ensemble's
average; over a shortlist's candidates where the state has them), the bans and forced tokens
applied to them, and sampling's filters and draws (each row from its own generator). The
searches themselves are in `search.py`."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.decode.ensemble import Ensemble, EnsembleState
from seq2seq_cli.decode.hypotheses import NEG_INF, max_source
from seq2seq_cli.ids import EOS, PAD, UNK
from seq2seq_cli.model.kv_cache import DecoderState
from seq2seq_cli.model.transformer import Seq2SeqTransformer

Decoder = Seq2SeqTransformer | Ensemble  # what the searches decode with: one model, or several as one
State = DecoderState | EnsembleState


def max_source_subwords(model: Decoder) -> int:
    """The most source subwords (EOS not counted) a sentence is decoded from; longer ones are
    cut to this many (`Translator.encode`)."""
    return max_source(model.cfg.max_positions)


def max_lengths(src: Tensor, model: Decoder, a: float, b: int) -> Tensor:
    """src: (B, S) -> (B,) output length limits a*|x|+b (|x| counting EOS), capped by the
    model's positions (the longest source `max_source_subwords` allows)."""
    return output_limits((src != PAD).sum(dim=1), max_source_subwords(model), a, b)


def output_limits(src_len: Tensor, cap: int, a: float, b: int) -> Tensor:
    """src_len: (B,) source lengths, EOS counted -> (B,) output length limits a*|x|+b, at most
    `cap`. The one place output limits are computed: in float64 and capped before they become
    integers, so no setting overflows."""
    limit = (a * src_len.double() + float(b)).clamp(min=0, max=cap).floor()
    return limit.long()


def banned_ngram_tokens(history: list[list[int]], n: int) -> list[list[int]]:
    """For each row, the tokens that would complete an n-gram the row already contains."""
    banned = []
    for toks in history:
        prefix = tuple(toks[len(toks) - n + 1 :]) if n > 1 else ()
        banned.append([toks[i + n - 1] for i in range(len(toks) - n + 1) if tuple(toks[i : i + n - 1]) == prefix])
    return banned


def prefix_tensor(prefixes: list[list[int]] | None, device: torch.device) -> Tensor | None:
    """Forced prefixes (one list of target ids per sentence, [] = none) -> (B, P) ids padded
    with -1, or None when no sentence has one (the searches then run as without)."""
    if not prefixes or not any(prefixes):
        return None
    P = max(len(p) for p in prefixes)
    out = torch.full((len(prefixes), P), -1, dtype=torch.long)
    for i, p in enumerate(prefixes):
        out[i, : len(p)] = torch.tensor(p, dtype=torch.long)
    return out.to(device)


def with_prefixes(limits: Tensor, prefix: Tensor | None) -> Tensor:
    """Output limits (B,) raised to the length of each sentence's forced prefix."""
    return limits if prefix is None else torch.maximum(limits, (prefix >= 0).sum(dim=1))


def forced_tokens(prefix: Tensor | None, sentences: Tensor, step: int) -> Tensor | None:
    """The prefix token each decoder row (of sentence `sentences[row]`) must take at `step`,
    -1 for none; None once every prefix has ended (known on the host: no row has one)."""
    if prefix is None or step >= prefix.size(1):
        return None
    return prefix[sentences, step]


def step_log_probs(
    model: Decoder, last: Tensor, state: State, step: int,
    history: Tensor, opts: DecodeConfig, forced: Tensor | None = None,
) -> Tensor:
    """One decoder step with every constraint applied (the searches end an output at its limit
    themselves).

    last: (N, 1) newest tokens, history: (N, t) output so far,
    forced: (N,) a prefix token each row must take (-1: none) or None
    -> log-probabilities (N, V): PAD and the decoder start token (and UNK with ban_unk) banned, EOS banned before
    min_len, n-gram repeats banned; a forced row keeps only its token.
    """
    lprobs = next_log_probs(model, last, state)
    return constrain(lprobs, step, history, opts, model.cfg.decoder_start_id, forced)


def next_log_probs(model: Decoder, last: Tensor, state: State) -> Tensor:
    """The model's log-probabilities (N, V) of the next token after `last` (N, 1); an
    ensemble's members each decode with their own state, and their probabilities are averaged."""
    if isinstance(model, Ensemble):
        assert isinstance(state, EnsembleState)
        return model.average([next_log_probs(m, last, s) for m, s in zip(model.models, state.states)])
    assert isinstance(state, DecoderState)
    h, _ = model.decode(last, state, incremental=True)
    if state.vocab is not None:  # a shortlist: the softmax over its ids, the others -inf
        listed = model.shortlist_logits(h[:, -1], state).float()  # (N, C)
        if state.vocab_mask is not None:  # each sentence's rows (consecutive, as many each) its own ids only
            mask = state.vocab_mask  # (B, C)
            listed.view(mask.size(0), -1, mask.size(1)).add_(mask[:, None, :])
        lprobs = listed.new_full((listed.size(0), model.tgt_embed.tokens.num_embeddings), NEG_INF)  # (N, V)
        return lprobs.index_copy_(1, state.vocab, torch.log_softmax(listed, dim=-1))
    logits = model.logits(h[:, -1]).float()  # (N, V)
    # In place on CPU: a fresh (N, V) tensor each step costs more in page faults than the op.
    return torch.log_softmax(logits, dim=-1, out=logits) if logits.is_cpu else torch.log_softmax(logits, dim=-1)


def constrain(
    lprobs: Tensor, step: int, history: Tensor, opts: DecodeConfig, start_id: int,
    forced: Tensor | None = None,
) -> Tensor:
    """The bans and forced tokens of `step_log_probs`, applied in place to log-probabilities (N, V),
    by masks over every row (no host sync: nothing depends on which rows they hit)."""
    if forced is not None:
        is_forced = (forced >= 0)[:, None]  # (N, 1)
        tokens = forced.clamp(min=0)[:, None]  # (N, 1)
        # the model's own log-probability of the forced token, kept finite so the row stays alive
        kept = lprobs.gather(1, tokens).clamp(min=torch.finfo(lprobs.dtype).min)  # (N, 1)
    lprobs[:, PAD] = NEG_INF
    lprobs[:, start_id] = NEG_INF
    if opts.ban_unk:
        lprobs[:, UNK] = NEG_INF
    if step < opts.min_len:
        lprobs[:, EOS] = NEG_INF
    if opts.no_repeat_ngram_size:
        for row, toks in enumerate(banned_ngram_tokens(history.tolist(), opts.no_repeat_ngram_size)):
            if toks:
                lprobs[row, toks] = NEG_INF
    if forced is not None:
        lprobs.masked_fill_(is_forced, NEG_INF)
        lprobs.scatter_(1, tokens, torch.where(is_forced, kept, lprobs.gather(1, tokens)))
    return lprobs


def filter_for_sampling(lprobs: Tensor, opts: DecodeConfig) -> Tensor:
    """Temperature, top-k and top-p (nucleus) filtering of log-probabilities (N, V)."""
    logits = lprobs / opts.temperature
    if opts.top_k:
        kth = logits.topk(min(opts.top_k, logits.size(-1)), dim=-1).values[:, -1:]  # (N, 1)
        logits = logits.masked_fill(logits < kth, NEG_INF)
    if opts.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cum - sorted_logits.softmax(dim=-1) >= opts.top_p  # keep the smallest set reaching top_p
        logits = logits.scatter(1, order, sorted_logits.masked_fill(drop, NEG_INF))
    return logits


def row_generator(seed: int, line: int, draw: int) -> torch.Generator:
    """The random generator of one sample: draw `draw` of input line `line` (from 0) under
    `seed`, so a line's samples depend on neither its batch nor the threads decoding."""
    entropy = [int(seed < 0), abs(seed), line, draw]
    return torch.Generator().manual_seed(int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0]))


def draw(probs: Tensor, generators: list[torch.Generator]) -> Tensor:
    """One token per row of probs (N, V), by inverse transform with one uniform number from
    the row's own generator -> (N,)."""
    u = torch.tensor([float(torch.rand((), generator=g, dtype=torch.float64)) for g in generators], device=probs.device)
    cum = probs.double().cumsum(dim=-1)  # (N, V)
    nxt = torch.searchsorted(cum, (u * cum[:, -1])[:, None], right=True).squeeze(1)  # (N,)
    last = probs.size(-1) - 1 - (probs > 0).flip(-1).int().argmax(dim=-1)  # the last token that can be drawn
    return torch.minimum(nxt, last)
