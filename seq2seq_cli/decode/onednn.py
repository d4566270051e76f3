"""Linear layers through oneDNN for decoding on CPU, in float32 or int8.

PyTorch runs fp32 `nn.Linear` on CPU through MKL's sgemm. On the AMD EPYC of
bench/README.md, oneDNN given a weight reordered once into its blocked layout multiplied the
decoding shapes (a few hundred rows) 2.3-2.7x faster than that. `for_decoding`
returns a copy of a model whose linear layers (the tied output projection included) do
that; parameters are shared, not copied, and the model itself is left untouched.

Packing is done where the weights are fixed, once: `Translator.load` and each validation
(`train.validation_bleu`); search decodes with whatever model it is given. The copy is for
inference only: no gradients flow through it, and it holds the weights as they were when it
was made (make a new one after they change).

With quantize="int8" (`translate --quantize int8`) the linear layers are `Int8Linear`
instead: weights quantized once per output channel, inputs per row at each call, int8
products summed in int32 by `torch._int_mm`. The rows of every decoding matmul are padded to
a multiple of ROW_BLOCK (`padded_rows`), so that oneDNN builds a few kernels per layer
rather than one per row count.

The two operators used are private to PyTorch (`torch.ops.mkldnn._reorder_linear_weight`,
`torch.ops.mkldnn._linear_pointwise`). Every packed layer is probed against `F.linear`
before the copy is used; where the operators are missing, fail or disagree, decoding uses
the model as it is and the log says so, once per reason.
"""

from __future__ import annotations

import copy
import functools
import logging
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq_cli.model.transformer import Seq2SeqTransformer

logger = logging.getLogger(__name__)


def _reorder(weight: Tensor) -> Tensor:
    """(out, in) weight -> oneDNN's opaque blocked layout."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, None)


def _linear(x: Tensor, packed: Tensor, bias: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


ROW_BLOCK = 16  # rows of a decoding matmul are padded to a multiple of this


def row_padding(n: int) -> int:
    """The rows `padded_rows` adds to a matmul of n rows."""
    return -n % ROW_BLOCK if n > ROW_BLOCK // 2 or n == 0 else (1 << (n - 1).bit_length()) - n


def padded_rows(x: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
    """fn applied to x (..., in) -> (..., out), its rows padded to a multiple of ROW_BLOCK.

    oneDNN builds (JIT-compiles) one kernel per matrix shape and keeps a bounded number of
    them; the row count of a decoding step changes whenever a sentence finishes, so unpadded
    it asks for hundreds of shapes per layer, and the time and memory of building them
    outgrow the multiplications on small models. Padded, each layer sees a few dozen. Fewer rows
    than half a block go up to a power of two (1, 2, 4, 8) instead: a lone sentence's beams
    (4 rows) padded to 16 made every matmul of a step 2 to 3 times as long."""
    rows = x.reshape(-1, x.size(-1))  # (N, in)
    n = rows.size(0)
    pad = row_padding(n)
    if pad:
        rows = torch.cat([rows, rows.new_zeros(pad, rows.size(1))])
    return fn(rows)[:n].view(*x.shape[:-1], -1)


class PackedLinear(nn.Module):
    """y = x W^T + b with W kept in oneDNN's blocked layout. x: (..., in) -> (..., out)."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        self.packed = _reorder(weight.detach())  # opaque (out, in)
        self.weight = weight.detach()  # the plain weight, shared (a shortlist's rows are taken from it)
        self.bias = None if bias is None else bias.detach()

    def forward(self, x: Tensor) -> Tensor:
        if not row_padding(math.prod(x.shape[:-1])):  # oneDNN takes (..., in) as it is: no reshape, no copy
            return _linear(x, self.packed, self.bias)
        return padded_rows(x, lambda rows: _linear(rows, self.packed, self.bias))


class Int8Linear(nn.Module):
    """y ~ x W^T + b in int8: W quantized once per output channel (symmetric, scale
    max|W_j| / 127), x per row at each call (dynamic quantization), the product accumulated
    in int32 by `torch._int_mm` and scaled back to float32. x: (..., in) -> (..., out)."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        w = weight.detach().float()
        self.weight = weight.detach()  # the plain weight, shared (a shortlist's rows are taken from it)
        self.scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127  # (out,)
        self.weight_t = torch.round(w / self.scale[:, None]).to(torch.int8).t().contiguous()  # (in, out)
        self.bias = None if bias is None else bias.detach().float()

    def _rows(self, x: Tensor) -> Tensor:
        x_scale = x.abs().amax(dim=1, keepdim=True).clamp_(min=1e-12).div_(127)  # (N, 1)
        q = torch.round(x / x_scale).to(torch.int8)  # |x / x_scale| <= 127
        y = torch._int_mm(q, self.weight_t) * self.scale  # (N, out) float32
        y.mul_(x_scale)
        return y if self.bias is None else y.add_(self.bias)

    def forward(self, x: Tensor) -> Tensor:
        return padded_rows(x, self._rows)


def applies(model: object) -> bool:
    """Packing is meant for an fp32 Seq2SeqTransformer on CPU that is not packed already."""
    if not isinstance(model, Seq2SeqTransformer) or getattr(model, "packed_for_decoding", False):
        return False
    p = model.tgt_embed.tokens.weight
    return p.device.type == "cpu" and p.dtype == torch.float32


def missing() -> str | None:
    """Why this PyTorch cannot run linear layers through oneDNN, or None when it can."""
    if not torch.backends.mkldnn.is_available():
        return "this PyTorch is built without oneDNN"
    for op in ("_reorder_linear_weight", "_linear_pointwise"):
        if not hasattr(torch.ops.mkldnn, op):
            return f"this PyTorch has no torch.ops.mkldnn.{op}"
    return None


def available(model: object) -> bool:
    """oneDNN decoding applies to `model` (see `applies`) and this PyTorch supports it."""
    return applies(model) and missing() is None


@functools.cache
def _say_unavailable(reason: str, quantize: str = "none") -> None:
    """Log, once per reason, that decoding on CPU goes without oneDNN (or without int8)."""
    if quantize == "int8":
        logger.warning("warning: int8 linear layers unavailable (%s); decoding in float32", reason)
    else:
        logger.warning("warning: linear layers through oneDNN unavailable (%s); decoding on CPU without them", reason)


def for_decoding(model: Seq2SeqTransformer, quantize: str = "none") -> Seq2SeqTransformer:
    """A copy of `model` whose linear layers run through oneDNN (see the module docstring),
    in float32 or, with quantize="int8", in int8 (`Int8Linear`); or `model` itself where
    that does not apply (GPU, other dtypes, packed already) or is not available: no oneDNN,
    an operator that fails, or a packed layer that does not reproduce F.linear on a probe
    (the last two logged once)."""
    if not applies(model):
        return model
    reason = missing() if quantize == "none" else None
    if reason is None:
        fast, reason = _packed_copy(model, quantize)
        if fast is not None:
            return fast
    _say_unavailable(reason, quantize)
    return for_decoding(model) if quantize != "none" else model


def _agrees(layer: nn.Module, weight: Tensor, bias: Tensor | None, x: Tensor, quantize: str) -> bool:
    """Does `layer` reproduce F.linear(x, weight, bias): to float32 rounding, or in int8 to
    within 3% (relative error of the whole output)?"""
    want, got = F.linear(x, weight, bias), layer(x)
    if quantize == "none":
        return torch.allclose(got, want, atol=1e-5, rtol=1e-4)
    return bool((got - want).norm() <= 0.03 * want.norm())


def _packed_copy(model: Seq2SeqTransformer, quantize: str) -> tuple[Seq2SeqTransformer | None, str]:
    """(the packed copy, "") or (None, why not). Each packed layer is probed against the
    F.linear of its own weight and bias."""
    make: Callable[[Tensor, Tensor | None], nn.Module] = Int8Linear if quantize == "int8" else PackedLinear
    shared = {id(t): t for t in [*model.parameters(), *model.buffers()]}  # share, do not copy, tensors
    fast = copy.deepcopy(model, memo=shared)
    probe = torch.Generator().manual_seed(0)
    try:
        with torch.no_grad():
            packed: list[tuple[str, nn.Module, Tensor, Tensor | None]] = []
            for parent_name, parent in list(fast.named_modules()):
                for name, child in list(parent.named_children()):
                    if type(child) is nn.Linear:
                        replacement = make(child.weight, child.bias)
                        setattr(parent, name, replacement)
                        packed.append((f"{parent_name}.{name}".lstrip("."), replacement, child.weight, child.bias))
            if fast.output is None:  # tied: the target embedding is the output projection (no bias)
                output = make(fast.tgt_embed.tokens.weight, None)
                fast.output = output  # type: ignore[assignment]
                packed.append(("output (tied)", output, fast.tgt_embed.tokens.weight, None))
            for name, layer, weight, bias in packed:
                x = torch.randn(2, weight.size(1), generator=probe)
                if not _agrees(layer, weight, bias, x, quantize):
                    return None, f"the packed layer {name} does not reproduce F.linear"
    except RuntimeError as exc:  # an operator missing or changed in this PyTorch build
        return None, (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    fast.packed_for_decoding = True  # type: ignore[assignment]
    return fast, ""
