import pytest
import torch

from conftest import tiny_model
from seq2seq_cli.search import beam_search, greedy_search, max_lengths
from seq2seq_cli.tokenizer import BOS, EOS, PAD


def _sources(n=6, seed=3):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(2, 9, (n,), generator=g)
    src = torch.full((n, int(lens.max()) + 1), PAD)
    for i, L in enumerate(lens.tolist()):
        src[i, :L] = torch.randint(4, 23, (L,), generator=g)
        src[i, L] = EOS
    return src


def _sharpened(seed=0):
    """A random model whose output distribution is peaked enough to end sentences by itself."""
    model = tiny_model(seed=seed)
    with torch.no_grad():
        model.tgt_embed.tokens.weight.mul_(4.0)
    return model


def sequence_log_prob(model, src_row, tokens):
    """Sum of log-probabilities of tokens + EOS under the model (full forward, no cache)."""
    tgt_in = torch.tensor([[BOS] + tokens])
    target = torch.tensor(tokens + [EOS])
    lprobs = torch.log_softmax(model(src_row[None], tgt_in)[0], dim=-1)
    return lprobs[torch.arange(len(target)), target].sum().item()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_size_one_equals_greedy(seed):
    model = _sharpened(seed)
    src = _sources(seed=seed)
    greedy = greedy_search(model, src, 1.5, 4)
    beam = beam_search(model, src, 1, 1.0, 1.5, 4)
    assert [h.tokens for h in greedy] == [b[0].tokens for b in beam]
    for g, b in zip(greedy, beam):
        assert g.log_prob == pytest.approx(b[0].log_prob, abs=1e-4)


@pytest.mark.parametrize("a,b", [(0.0, 3), (1.0, 2), (0.5, 0)])
def test_max_length_is_never_exceeded(a, b):
    model = tiny_model(seed=5)  # unsharpened: rarely stops on its own, so limits bind
    src = _sources()
    limits = max_lengths(src, model, a, b).tolist()
    for hyps in (greedy_search(model, src, a, b), [n[0] for n in beam_search(model, src, 3, 1.0, a, b)]):
        for h, limit in zip(hyps, limits):
            assert len(h.tokens) <= limit
    assert limits == [int(a * int((row != PAD).sum()) + b) for row in src]


def test_scores_are_sorted_and_equal_the_sequence_log_probability():
    model = _sharpened(1)
    src = _sources()
    alpha = 0.7
    for row, nbest in zip(src, beam_search(model, src, 4, alpha, 1.5, 4, nbest=4)):
        scores = [h.score for h in nbest]
        assert scores == sorted(scores, reverse=True)
        for h in nbest:
            lp = sequence_log_prob(model, row[row != PAD], h.tokens)
            assert h.log_prob == pytest.approx(lp, abs=1e-4)
            assert h.score == pytest.approx(lp / (len(h.tokens) + 1) ** alpha, abs=1e-4)


def test_best_of_nbest_equals_one_best():
    model = _sharpened(2)
    src = _sources()
    one = beam_search(model, src, 4, 1.0, 1.5, 4, nbest=1)
    many = beam_search(model, src, 4, 1.0, 1.5, 4, nbest=3)
    assert [o[0].tokens for o in one] == [m[0].tokens for m in many]
    assert all(len(m) == 3 for m in many)


def test_batched_beam_search_equals_one_sentence_at_a_time():
    model = _sharpened(3)
    src = _sources(n=5)
    together = beam_search(model, src, 3, 1.0, 1.5, 4)
    for i in range(src.size(0)):
        row = src[i : i + 1]
        row = row[:, : int((row != PAD).sum())]
        alone = beam_search(model, row, 3, 1.0, 1.5, 4)
        assert alone[0][0].tokens == together[i][0].tokens
        assert alone[0][0].score == pytest.approx(together[i][0].score, abs=1e-4)


def test_nbest_larger_than_beam_is_refused():
    with pytest.raises(ValueError, match="nbest"):
        beam_search(tiny_model(), _sources(), 2, 1.0, 1.0, 2, nbest=3)
