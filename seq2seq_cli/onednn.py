"""Linear layers through oneDNN for decoding on CPU.

PyTorch runs fp32 `nn.Linear` on CPU through MKL's sgemm. On the AMD EPYC of
bench/README.md, oneDNN given a weight reordered once into its blocked layout multiplied the
decoding shapes (a few hundred rows) 2.3-2.7x faster than that. `for_decoding`
returns a copy of a model whose linear layers (the tied output projection included) do
that; parameters are shared, not copied, and the model itself is left untouched.

The copy is for inference only: no gradients flow through it, and it holds the weights
as they were when it was made (make a new one after they change).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from seq2seq_cli.model import Seq2SeqTransformer


class PackedLinear(nn.Module):
    """y = x W^T + b with W kept in oneDNN's blocked layout. x: (..., in) -> (..., out)."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)  # opaque (out, in)
        self.bias = None if bias is None else bias.detach()

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def available(model: nn.Module) -> bool:
    """oneDNN decoding applies to an fp32 Seq2SeqTransformer on CPU in a PyTorch with oneDNN."""
    if not isinstance(model, Seq2SeqTransformer) or getattr(model, "packed_for_decoding", False):
        return False
    p = model.tgt_embed.tokens.weight
    return (
        p.device.type == "cpu" and p.dtype == torch.float32 and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise") and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def for_decoding(model: Seq2SeqTransformer) -> Seq2SeqTransformer:
    """A copy of `model` whose linear layers run through oneDNN (see the module docstring),
    or `model` itself where that does not apply (GPU, other dtypes, no oneDNN, or if a
    packed layer does not reproduce F.linear on a probe)."""
    if not available(model):
        return model
    shared = {id(t): t for t in [*model.parameters(), *model.buffers()]}  # share, do not copy, tensors
    fast = copy.deepcopy(model, memo=shared)
    try:
        with torch.no_grad():
            for parent in list(fast.modules()):
                for name, child in list(parent.named_children()):
                    if type(child) is nn.Linear:
                        setattr(parent, name, PackedLinear(child.weight, child.bias))
            if fast.output is None:  # tied: the target embedding is the output projection
                fast.output = PackedLinear(fast.tgt_embed.tokens.weight, None)
            layer = model.decoder[0].self_attn.w_q  # a cheap probe of one packed layer against F.linear
            probe = torch.randn(2, layer.in_features, generator=torch.Generator().manual_seed(0))
            if not torch.allclose(fast.decoder[0].self_attn.w_q(probe), layer(probe), atol=1e-5, rtol=1e-4):
                return model
    except RuntimeError:  # an op missing or changed in this PyTorch build
        return model
    fast.packed_for_decoding = True
    return fast
