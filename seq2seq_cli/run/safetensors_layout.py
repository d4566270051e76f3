"""What can be checked of a safetensors file without a manifest, and without torch: its header
and the byte ranges of its tensors (`check_safetensors_layout`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from seq2seq_cli.errors import UserError

SAFETENSORS_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
                           "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def check_safetensors_layout(path: Path) -> None:
    """What can be checked of a safetensors file without a manifest: the header is valid JSON,
    each tensor's byte range fits its dtype and shape, the ranges tile the data exactly and the
    file is as long as they say. UserError naming the first problem."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise UserError(f"{path}: not a readable checkpoint ({size} bytes, shorter than its header)")
            n = int.from_bytes(head, "little")
            if n > size - 8:
                raise UserError(f"{path}: not a readable checkpoint (truncated: header of {n} bytes, file of {size})")
            header = json.loads(f.read(n))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a readable checkpoint (header is not JSON: {exc})") from None
    if not isinstance(header, dict):
        raise UserError(f"{path}: not a readable checkpoint (header is not a JSON object)")
    ranges = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = info["data_offsets"]
            count = math.prod(info["shape"])
            width = SAFETENSORS_DTYPE_BYTES[info["dtype"]]
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{path}: not a readable checkpoint (tensor {name!r} has a malformed header entry)") from None
        if end - begin != count * width:
            raise UserError(f"{path}: not a readable checkpoint "
                            f"(tensor {name!r} has {end - begin} bytes, {count * width} expected for its shape)")
        ranges.append((begin, end))
    position = 0
    for begin, end in sorted(ranges):
        if begin != position:
            raise UserError(f"{path}: not a readable checkpoint (tensor data overlaps or leaves gaps at byte {position})")
        position = end
    if 8 + n + position != size:
        raise UserError(f"{path}: not a readable checkpoint "
                        f"(truncated or padded: {size} bytes, the header describes {8 + n + position})")
