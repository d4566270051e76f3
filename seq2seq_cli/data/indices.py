"""Integer indices over a corpus: their type, and the slice size that keeps a temporary the
size of a corpus out of memory. Both the batches and the mixing of corpora use them."""

from __future__ import annotations

import numpy as np

CHUNK = 1 << 18  # pairs handled at a time where a whole-corpus temporary would be needed


def index_dtype(n: int) -> type[np.signedinteger]:
    """The integer type of indices below `n`: int32 where they fit, to halve the memory of an
    epoch's order of ten million pairs."""
    return np.int32 if n < 2**31 else np.int64
