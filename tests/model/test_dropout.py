"""The CPU dropout: drop rate, expectation, gradient, determinism under the saved RNG state."""

import pytest
import torch

from seq2seq_cli.model.dropout import Dropout, cpu_mask, dropout, keep_threshold


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_drop_rate_and_expectation(p):
    torch.manual_seed(0)
    mask = cpu_mask(torch.empty(400_001), p)  # an odd size: the last draw is half used
    dropped = (mask == 0).float()
    # both halves of each 32-bit draw drop at the same rate (even and odd positions)
    for part in (dropped[0::2], dropped[1::2]):
        assert abs(part.mean().item() - p) < 0.005
    _, scale = keep_threshold(p)
    values = mask.unique().tolist()
    assert len(values) == 2 and values[0] == 0.0 and values[1] == pytest.approx(scale)
    assert abs(mask.mean().item() - 1.0) < 0.01  # expectation kept
    assert abs(keep_threshold(p)[1] * (1 - p) - 1.0) < 1e-4


def test_gradient_is_the_forward_mask():
    x = torch.randn(7, 9, 16, requires_grad=True)
    torch.manual_seed(3)
    y = dropout(x, 0.25, training=True)
    g = torch.randn_like(y)
    y.backward(g)
    _, scale = keep_threshold(0.25)
    kept = y != 0
    assert 0 < kept.float().mean().item() < 1
    torch.testing.assert_close(y[kept], x.detach()[kept] * scale)
    torch.testing.assert_close(x.grad, torch.where(kept, g * scale, 0.0))


def test_same_generator_state_same_mask_and_training_off_is_identity():
    x = torch.randn(5, 11, 8)
    torch.manual_seed(7)
    state = torch.get_rng_state()
    a = dropout(x, 0.1, training=True)
    torch.set_rng_state(state)  # as an exact resume restores it
    b = dropout(x, 0.1, training=True)
    assert torch.equal(a, b)
    assert not torch.equal(a, dropout(x, 0.1, training=True))  # the generator moved on
    assert dropout(x, 0.1, training=False) is x
    assert dropout(x, 0.0, training=True) is x
    module = Dropout(0.1).eval()
    assert module(x) is x
    with pytest.raises(ValueError):
        Dropout(1.5)


def test_bf16_mask_keeps_dtype():
    x = torch.randn(4, 6, 8, dtype=torch.bfloat16)
    y = dropout(x, 0.2, training=True)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
