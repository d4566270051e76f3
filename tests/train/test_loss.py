"""The fused label-smoothed loss against the plain autograd formula."""

import pytest
import torch

from seq2seq_cli.ids import PAD
from seq2seq_cli.train.loss import label_smoothed_nll


def reference(logits: torch.Tensor, target: torch.Tensor, eps: float):
    lprobs = torch.log_softmax(logits.float(), dim=-1)
    keep = target != PAD
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    smooth = -lprobs.mean(dim=-1)
    loss = torch.where(keep, (1 - eps) * nll + eps * smooth, 0.0).sum()
    return loss, torch.where(keep, nll, 0.0).sum(), keep.sum()


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_loss_and_gradient_equal_the_plain_formula(eps: float, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 7, 50, generator=g) * 3).to(dtype)
    target = torch.randint(4, 50, (3, 7), generator=g)
    target[0, 4:] = PAD  # padding at the end of one row, and in the middle of another
    target[2, 2] = PAD
    ours, theirs = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    got, want = label_smoothed_nll(ours, target, eps), reference(theirs, target, eps)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-5, atol=1e-5)
    (got[0] * 0.7).backward()
    (want[0] * 0.7).backward()
    assert ours.grad is not None and ours.grad.dtype == dtype
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-6
    torch.testing.assert_close(ours.grad.double(), theirs.grad.double(), rtol=tol, atol=tol)
    assert ours.grad[0, 4:].abs().sum() == 0 and ours.grad[2, 2].abs().sum() == 0  # pad rows get no gradient


def test_gradient_matches_finite_differences() -> None:
    logits = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([[4, 5, PAD], [1, 2, 3]])
    assert torch.autograd.gradcheck(lambda x: label_smoothed_nll(x, target, 0.1)[0], (logits,))


def test_only_the_smoothed_loss_carries_a_gradient() -> None:
    """The nll sum and the token count are outputs marked non-differentiable: they carry no
    graph, and a backward through the nll is an error rather than a silent wrong gradient."""
    logits = torch.randn(2, 3, 7, requires_grad=True)
    target = torch.tensor([[1, 2, PAD], [3, 4, 5]])
    loss, nll, tokens = label_smoothed_nll(logits, target, 0.1)
    assert loss.requires_grad
    assert not nll.requires_grad and nll.grad_fn is None
    assert not tokens.requires_grad and tokens.item() == 5
    with pytest.raises(RuntimeError, match="does not require grad"):
        nll.backward()
