"""The device policy: which device a process trains or decodes on, from a device setting."""

from __future__ import annotations

import torch

from seq2seq_cli.errors import UserError


def pick_device(name: str, local_rank: int = 0, setting: str = "train.device") -> torch.device:
    """A device setting (auto, cpu, cuda, cuda:N) -> the device of this process; with CUDA, GPU
    number `local_rank` (or N). `setting` names the option in errors: train.device, or --device."""
    given = f"{setting} {name}" if setting.startswith("-") else f"{setting}={name}"
    if name.startswith("cuda") and not torch.cuda.is_available():
        use = f"{setting} auto" if setting.startswith("-") else f"{setting}=auto"
        raise UserError(f"{given} but no CUDA device is available; use {use} or cpu")
    if name.startswith("cuda:"):
        index = int(name.split(":", 1)[1])
        if index >= torch.cuda.device_count():
            raise UserError(f"{given} but this machine has {torch.cuda.device_count()} CUDA device(s), numbered from 0")
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise UserError(
                f"LOCAL_RANK {local_rank} but this node has {torch.cuda.device_count()} CUDA device(s); "
                "launch at most one process per GPU (torchrun --nproc_per_node)"
            )
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device(name)
