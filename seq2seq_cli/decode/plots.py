"""`translate --attention-plots DIR`: one cross-attention heatmap (PNG) per sentence."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from seq2seq_cli.fileio import atomic_write

if TYPE_CHECKING:
    from torch import Tensor


def plot_attention(weights: Tensor, src_pieces: list[str], tgt_pieces: list[str], path: Path) -> None:
    """Heatmap of cross-attention (target pieces x source pieces) written as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    T, S = weights.shape
    fig, ax = plt.subplots(figsize=(max(4.0, 0.35 * S + 1.5), max(3.0, 0.35 * T + 1.0)))
    ax.imshow(weights.numpy(), cmap="Greys", vmin=0.0, aspect="auto")
    ax.set_xticks(range(S), src_pieces, rotation=90, fontsize=8)
    ax.set_yticks(range(T), tgt_pieces, fontsize=8)
    ax.set_xlabel("source")
    ax.set_ylabel("output")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)
