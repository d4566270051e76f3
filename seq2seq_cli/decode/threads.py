"""How decoding on a CPU uses its threads: each thread decodes batches of its own on one
thread (`spread`), and a lone batch decodes on one (`one_thread`): the matrices of a decoding
step are too small to keep several threads busy, and their handshakes at every op cost more
than they save."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def spread(batches: list[list[int]], threads: int) -> list[list[int]]:
    """Batches (of line indices, sorted by length) cut so that `threads` threads have one each
    where there are fewer: the one of most lines is halved, in its order, until there are
    enough or every batch holds one line."""
    batches = list(batches)
    while len(batches) < threads:
        largest = max(range(len(batches)), key=lambda i: len(batches[i]), default=None)
        if largest is None or len(batches[largest]) < 2:
            break
        batch = batches.pop(largest)
        batches[largest:largest] = [batch[: len(batch) // 2], batch[len(batch) // 2 :]]
    return batches


@contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op threads set to one in this thread meanwhile, then restored."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
