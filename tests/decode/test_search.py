import pytest
import torch

from conftest import random_sources as _sources
from conftest import tiny_model
from helpers import sequence_log_prob
from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.decode.search import beam_search, greedy_search, sample, search
from seq2seq_cli.decode.steps import max_lengths
from seq2seq_cli.ids import PAD, UNK
from seq2seq_cli.model.kv_cache import DecoderState, LayerCache


def opts(beam=1, alpha=1.0, a=1.5, b=4, **kw):
    return DecodeConfig(beam_size=beam, length_penalty=alpha, max_len_a=a, max_len_b=b, **kw)


def _sharpened(seed=0):
    """A random model whose output distribution is peaked enough to end sentences by itself."""
    model = tiny_model(seed=seed)
    with torch.no_grad():
        model.tgt_embed.tokens.weight.mul_(4.0)
    return model


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_size_one_equals_greedy(seed):
    model = _sharpened(seed)
    src = _sources(seed=seed)
    greedy = greedy_search(model, src, opts(a=1.5, b=4))
    beam = beam_search(model, src, opts(1, 1.0, 1.5, 4))
    assert [h.tokens for h in greedy] == [b[0].tokens for b in beam]
    for g, b in zip(greedy, beam):
        assert g.log_prob == pytest.approx(b[0].log_prob, abs=1e-4)


@pytest.mark.parametrize("a,b", [(0.0, 3), (1.0, 2), (0.5, 0)])
def test_max_length_is_never_exceeded_and_an_output_at_it_ends_without_eos(a, b):
    """An output holds at most `limit` tokens before EOS; one still going ends with the token
    of the step after (limit + 1 tokens, EOS counted, as CTranslate2 and HF end it), scored
    without an EOS."""
    model = tiny_model(seed=5)  # unsharpened: rarely stops on its own, so limits bind
    src = _sources()
    limits = max_lengths(src, model, a, b).tolist()
    cut = 0
    for hyps in (greedy_search(model, src, opts(a=a, b=b)), [n[0] for n in beam_search(model, src, opts(3, 1.0, a, b))]):
        for row, h, limit in zip(src, hyps, limits):
            assert len(h.tokens) <= limit + 1
            with torch.no_grad():
                whole = sequence_log_prob(model, row[row != PAD], h.tokens, eos=len(h.tokens) <= limit)
            assert h.log_prob == pytest.approx(whole, abs=1e-4)
            cut += len(h.tokens) == limit + 1
    assert cut  # the limits bind
    assert limits == [int(a * int((row != PAD).sum()) + b) for row in src]


def test_scores_are_sorted_and_equal_the_sequence_log_probability():
    model = _sharpened(1)
    src = _sources()
    alpha = 0.7
    for row, nbest in zip(src, beam_search(model, src, opts(4, alpha, 1.5, 4), nbest=4)):
        scores = [h.score for h in nbest]
        assert scores == sorted(scores, reverse=True)
        for h in nbest:
            lp = sequence_log_prob(model, row[row != PAD], h.tokens, h.eos)
            assert h.log_prob == pytest.approx(lp, abs=1e-4)
            assert h.score == pytest.approx(lp / (len(h.tokens) + h.eos) ** alpha, abs=1e-4)


def test_best_of_nbest_equals_one_best():
    model = _sharpened(2)
    src = _sources()
    one = beam_search(model, src, opts(4, 1.0, 1.5, 4), nbest=1)
    many = beam_search(model, src, opts(4, 1.0, 1.5, 4), nbest=3)
    assert [o[0].tokens for o in one] == [m[0].tokens for m in many]
    assert all(len(m) == 3 for m in many)


def test_batched_beam_search_equals_one_sentence_at_a_time():
    model = _sharpened(3)
    src = _sources(n=5)
    together = beam_search(model, src, opts(3, 1.0, 1.5, 4))
    for i in range(src.size(0)):
        row = src[i : i + 1]
        row = row[:, : int((row != PAD).sum())]
        alone = beam_search(model, row, opts(3, 1.0, 1.5, 4))
        assert alone[0][0].tokens == together[i][0].tokens
        assert alone[0][0].score == pytest.approx(together[i][0].score, abs=1e-4)


def test_nbest_larger_than_beam_is_refused():
    with pytest.raises(ValueError, match="nbest"):
        beam_search(tiny_model(), _sources(), opts(2, 1.0, 1.0, 2), nbest=3)


class _PrefixState(DecoderState):
    """Decoder state that also keeps the decoded prefix, following every reorder/select."""

    prefix: torch.Tensor | None = None

    def reorder(self, index):
        super().reorder(index)
        if self.prefix is not None:
            self.prefix = self.prefix.index_select(0, index)


class _NoCache:
    """A model whose incremental steps re-run the full decoder over the whole prefix."""

    def __init__(self, model):
        self.m, self.cfg = model, model.cfg
        self.candidates = None  # no shortlist

    def encode(self, src):
        return self.m.encode(src)

    def logits(self, h):
        return self.m.logits(h)

    def init_state(self, memory, src_mask, group=1):
        s = self.m.init_state(memory, src_mask, group)
        return _PrefixState(s.layers, s.src_mask, group=s.group)

    def decode(self, last, state, incremental=False):
        assert incremental
        state.prefix = last if state.prefix is None else torch.cat([state.prefix, last], dim=1)
        fresh = DecoderState([LayerCache(c.cross_k, c.cross_v) for c in state.layers], state.src_mask, group=state.group)
        h, w = self.m.decode(state.prefix, fresh)
        return h[:, -1:], w


@pytest.mark.parametrize("beam", [1, 4])
def test_search_with_cache_equals_search_without_cache(beam):
    model = _sharpened(6)
    src = _sources(n=5, seed=6)
    cached = beam_search(model, src, opts(beam), nbest=beam)
    uncached = beam_search(_NoCache(model), src, opts(beam), nbest=beam)
    for c, u in zip(cached, uncached):
        assert [h.tokens for h in c] == [h.tokens for h in u]
        assert [h.score for h in c] == pytest.approx([h.score for h in u], abs=1e-4)
    greedy = greedy_search(_NoCache(model), src, opts())
    assert [h.tokens for h in greedy] == [h.tokens for h in greedy_search(model, src, opts())]


def test_gnmt_length_penalty_is_applied_as_documented():
    model = _sharpened(1)
    src = _sources()
    alpha = 0.6
    for nbest in beam_search(model, src, opts(3, alpha, length_penalty_type="gnmt"), nbest=3):
        for h in nbest:
            assert h.score == pytest.approx(h.log_prob / ((5 + len(h.tokens) + h.eos) / 6) ** alpha, abs=1e-5)


def test_min_length_is_respected():
    model = _sharpened(2)
    src = _sources()
    for o in (opts(1, min_len=3), opts(3, min_len=3)):
        for h in search(model, src, o):
            assert len(h[0].tokens) >= 3


def test_no_repeat_ngram_never_repeats():
    model = tiny_model(seed=7)  # random weights repeat a lot without the constraint
    src = _sources()
    for n in (1, 2, 3):
        for o in (opts(1, a=3.0, b=10, no_repeat_ngram_size=n), opts(4, a=3.0, b=10, no_repeat_ngram_size=n)):
            for hyps in search(model, src, o, nbest=1):
                toks = hyps[0].tokens
                grams = [tuple(toks[i : i + n]) for i in range(len(toks) - n + 1)]
                assert len(grams) == len(set(grams))


def test_banned_unk_never_appears():
    model = tiny_model(seed=8)
    boost = torch.zeros(23)
    boost[UNK] = 5.0  # make UNK the most likely token
    plain = model.logits
    model.logits = lambda h: plain(h) + boost
    src = _sources()
    assert any(UNK in h[0].tokens for h in search(model, src, opts(2)))
    assert not any(UNK in h[0].tokens for h in search(model, src, opts(2, ban_unk=True)))


def test_sampling_is_reproducible_with_a_seed():
    model = tiny_model(seed=9)
    src = _sources()
    o = opts(sampling=True, top_k=5, top_p=0.9, temperature=0.8, seed=11)
    a = [[h.tokens for h in n] for n in sample(model, src, o, nbest=3)]
    b = [[h.tokens for h in n] for n in sample(model, src, o, nbest=3)]
    c = [[h.tokens for h in n] for n in sample(model, src, o.model_copy(update={"seed": 12}), nbest=3)]
    assert a == b and a != c


def test_top_k_one_sampling_is_greedy():
    model = _sharpened(3)
    src = _sources()
    sampled = sample(model, src, opts(sampling=True, top_k=1, seed=1))
    assert [s[0].tokens for s in sampled] == [g.tokens for g in greedy_search(model, src, opts())]


def test_first_step_decodes_one_row_per_sentence():
    model = _sharpened(6)
    src = _sources(n=5, seed=7)
    seen = []
    plain = model.decode

    def counting(last, state, incremental=False, need_weights=False):
        seen.append(last.size(0))
        return plain(last, state, incremental, need_weights)

    model.decode = counting
    beam_search(model, src, opts(4, b=3))
    assert seen[0] == src.size(0)  # one row per sentence, not beam_size rows
    assert max(seen[1:]) == 4 * src.size(0)
