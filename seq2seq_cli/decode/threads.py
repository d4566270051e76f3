"""How decoding on a CPU uses its threads: each thread decodes batches of its own on one
thread (`spread`), and a lone batch decodes on one (`one_thread`): the matrices of a decoding
step are too small to keep several threads busy, and their handshakes at every op cost more
than they save."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
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


def decode_on_threads(batches: list[list[int]], decode: Callable[[list[int]], None], device: torch.device) -> None:
    """Run `decode` over `batches`: on a CPU the threads decode batches side by side, one thread
    each (`spread`), a lone batch on one (`one_thread`)."""
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1:
        for rows in batches:
            decode(rows)
        return
    batches = spread(batches, threads)
    if len(batches) <= 1:  # one batch, or none (blank lines only)
        with one_thread():
            for rows in batches:
                decode(rows)
        return
    pool = ThreadPoolExecutor(min(threads, len(batches)), initializer=torch.set_num_threads, initargs=(1,))
    try:
        list(pool.map(decode, batches))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # stopped (Ctrl-C, SIGTERM): no batch waiting starts
        torch.set_num_threads(threads)
