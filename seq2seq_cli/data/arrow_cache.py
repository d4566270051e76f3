"""A corpus's rows read once into an Arrow file of the run's cache (text lines, a Moses zip's
pairs, a TMX file's units), then memory-mapped as a `datasets.Dataset`."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from seq2seq_cli.errors import UserError


def cached_dataset(target: Path | None, schema: pa.Schema, batches: Callable[[], Iterator[pa.RecordBatch]],
                   empty: UserError, temp: Path | None = None) -> Any:
    """The rows `batches()` yields as a `datasets.Dataset`: held in memory where `target` is
    None, else streamed into the Arrow file `target` unless it is there already (written under
    `temp`, by default a name of this process beside it, and renamed when complete) and
    memory-mapped from it. No row at all raises `empty`."""
    import datasets

    if target is None:
        table = pa.Table.from_batches(list(batches()), schema=schema)
        if not len(table):
            raise empty
        return datasets.Dataset(table)
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp or target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            count = 0
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
                for batch in batches():
                    writer.write_batch(batch)
                    count += len(batch)
            if not count:
                raise empty
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    return datasets.Dataset.from_file(str(target))
