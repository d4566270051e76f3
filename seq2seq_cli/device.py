"""The device and precision policy, one place for training, decoding and serving: which device a
process runs on (`pick_device`), the precision training computes in (`resolve_precision`,
`autocast`), the compiled kernels a process keeps (`limit_kernel_caches`), the precision and
dtype a loaded model decodes in (`decoding_precision`, `decoding_dtype`), and what the CPU
offers. torch is imported by the functions that need it, so that the CTranslate2 engine
decides without it."""

from __future__ import annotations

import contextlib
import functools
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seq2seq_cli.config import DEVICE_PATTERN, DecodeConfig
from seq2seq_cli.errors import UserError

if TYPE_CHECKING:  # imported where a device or dtype is made: the decoding precision is decided without it
    import torch


def pick_device(name: str, local_rank: int = 0, setting: str = "train.device") -> torch.device:
    """A device setting (auto, cpu, cuda, cuda:N) -> the device of this process; with CUDA, GPU
    number `local_rank` (or N). `setting` names the option in errors: train.device, or --device."""
    import torch

    given = f"{setting} {name}" if setting.startswith("-") else f"{setting}={name}"
    if not re.fullmatch(DEVICE_PATTERN, name):
        raise UserError(f"{setting} {name!r}: expected auto, cpu, cuda or cuda:N")
    if name.startswith("cuda") and not torch.cuda.is_available():
        use = f"{setting} auto" if setting.startswith("-") else f"{setting}=auto"
        raise UserError(f"{given} but no CUDA device is available; use {use} or cpu")
    if name.startswith("cuda:"):
        index = int(name.split(":", 1)[1])
        if index >= torch.cuda.device_count():
            raise UserError(f"{given} but this machine has {torch.cuda.device_count()} CUDA device(s), numbered from 0")
        return use_cuda(index)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise UserError(
                f"LOCAL_RANK {local_rank} but this node has {torch.cuda.device_count()} CUDA device(s); "
                "launch at most one process per GPU (torchrun --nproc_per_node)"
            )
        return use_cuda(local_rank)
    return torch.device(name)


def use_cuda(index: int) -> torch.device:
    """CUDA device `index`, made this process's current device, with cuDNN's attention left out."""
    import torch

    torch.cuda.set_device(index)
    leave_out_cudnn_attention()
    return torch.device("cuda", index)


def leave_out_cudnn_attention() -> None:
    """Keep torch's fused attention off cuDNN's kernels on CUDA (flash, memory-efficient and the
    plain product stay). cuDNN builds an execution graph for every new shape (batch, heads,
    query and key lengths), where the others need no build, and a shape is new at nearly every
    call here: token-budget batches come in hundreds of shapes, and a search's keys grow by one
    each step. On an H100 (torch 2.11+cu130), which picks cuDNN first, the trainer spent 17.4 s
    of 31.7 s of updates inside attention's forward calls (14 ms of host time a call, 0.26 s
    an update) and made 10,700 tokens/s where its update of 32,768 tokens alone ran at 539,000."""
    import torch

    torch.backends.cuda.enable_cudnn_sdp(False)


@functools.cache
def cpu_description() -> dict[str, Any]:
    """The CPU figures come from (/proc/cpuinfo's model name, family and model, and the vector
    instructions that decide training speed), for the log and metrics.jsonl: the same run makes
    ~1.8x more updates in bf16 on a Zen 5 core than on a Zen 4 one."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.strip():
                break  # the first processor's block is enough
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:  # not Linux: the platform's own name
        import platform

        fields["model name"] = platform.processor() or platform.machine()
    flags = set(fields.get("flags", "").split())
    return {"name": fields.get("model name", "unknown"), "family": fields.get("cpu family"), "model": fields.get("model"),
            "flags": [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags], "cores": os.cpu_count()}


def describe_cpu() -> str:
    """One line: 'AMD EPYC 9R14 (family 25, model 17; avx2 avx512f avx512_bf16), 2 cores'."""
    c = cpu_description()
    where = f"family {c['family']}, model {c['model']}; " if c["family"] else ""
    return f"{c['name']} ({where}{' '.join(c['flags']) or 'no AVX2'}), {c['cores']} cores"


def cpu_threads() -> int:
    """The threads decoding takes on a CPU, as torch counts them without being imported:
    OMP_NUM_THREADS where set, else one per physical core this process may run on."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            cores.add((topology / "physical_package_id").read_text().strip() + ":" + (topology / "core_id").read_text().strip())
        except OSError:
            cores.add(str(cpu))
    return max(1, len(cores))


@functools.cache
def cpu_has_bf16() -> bool:
    """Whether this CPU has native bf16 matrix instructions (AVX512-BF16 or AMX-BF16); asked
    once per process (autocast resolves the precision for every batch)."""
    import torch

    try:
        caps = torch._C._cpu._get_cpu_capability()
    except (AttributeError, RuntimeError):  # a build of torch without the query: assume not
        return False
    return bool(caps.get("avx512_bf16") or caps.get("amx_bf16"))


def resolve_precision(precision: str, device: torch.device) -> str:
    """The precision training computes in (train.precision): `auto` -> bf16 on CUDA and on CPUs
    with native bf16 instructions, fp32 elsewhere; anything else as given."""
    if precision != "auto":
        return precision
    return "bf16" if device.type == "cuda" or (device.type == "cpu" and cpu_has_bf16()) else "fp32"


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 or fp16 autocast as the (resolved) precision says; plain fp32 otherwise."""
    import torch

    precision = resolve_precision(precision, device)
    if precision == "fp16":
        return torch.autocast(device.type, dtype=torch.float16)
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


KERNEL_CACHE = 64
"""The compiled matrix-product kernels a process keeps. PyTorch's bf16 products on CPU go
through oneDNN, which compiles a kernel for every shape; oneDNN's primitive cache and ideep's
keep up to 1024 of them by default, each with about a megabyte of code and buffers. Token-
budget batches come in thousands of shapes, so a trainer kept every one it met until the
caches were full: its memory grew by gigabytes, update after update. An update needs about
15 kernels; compiling one takes a few milliseconds, a few percent of an update, and most
kernels were compiled anew even with the large caches (their shapes come round too seldom)."""

KERNEL_CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def limit_kernel_caches() -> None:
    """Keep at most KERNEL_CACHE compiled kernels (see there); a capacity set in the environment
    is kept. oneDNN and ideep read these variables when they first compile a kernel, so this is
    called before anything computes."""
    for name in KERNEL_CACHE_VARIABLES:
        os.environ.setdefault(name, str(KERNEL_CACHE))


def decoding_precision(decode: DecodeConfig, device_type: str) -> str:
    """The precision a loaded model decodes in on a device of `device_type` (cpu, cuda):
    decode.precision, where auto is bf16 on CUDA and fp32 on CPU (whose fast paths, oneDNN
    packing and int8, are fp32). Settings that cannot go together on the device are refused here."""
    if decode.quantize != "none" and device_type != "cpu":
        raise UserError(f"--quantize {decode.quantize}: int8 decoding runs on CPU only; add --device cpu")
    precision = decode.precision
    if precision == "auto":
        precision = "bf16" if device_type == "cuda" else "fp32"
    if precision == "fp16" and device_type != "cuda":
        raise UserError("--precision fp16: fp16 decoding runs on CUDA only; use bf16 or fp32 on this device")
    if decode.quantize != "none" and precision != "fp32":
        raise UserError(f"--quantize {decode.quantize} decodes with fp32 activations; leave out --precision {precision}")
    return precision


def decoding_dtype(decode: DecodeConfig, device: torch.device) -> torch.dtype:
    """The dtype of `decoding_precision` on `device`. Scores are accumulated in float32
    whatever the model's dtype (`search`)."""
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[decoding_precision(decode, device.type)]
