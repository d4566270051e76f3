"""The device and precision policy (seq2seq_cli/device.py), shared by training and decoding."""

from __future__ import annotations

import pytest
import torch

from seq2seq_cli import device as policy
from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.errors import UserError

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_training_precision_auto_is_bf16_only_where_the_cpu_has_bf16(monkeypatch):
    from seq2seq_cli.device import autocast

    monkeypatch.setattr(policy, "cpu_has_bf16", lambda: False)
    assert policy.resolve_precision("auto", CPU) == "fp32"
    assert policy.resolve_precision("auto", CUDA) == "bf16"
    assert policy.resolve_precision("bf16", CPU) == "bf16"  # asked for explicitly
    with autocast(CPU, "auto"):
        assert not torch.is_autocast_enabled("cpu")
    monkeypatch.setattr(policy, "cpu_has_bf16", lambda: True)
    assert policy.resolve_precision("auto", CPU) == "bf16"
    assert policy.resolve_precision("fp32", CPU) == "fp32"
    assert policy.resolve_precision("fp16", CUDA) == "fp16"
    with autocast(CPU, "auto"):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


@pytest.mark.parametrize("bf16_cpu", [False, True])
def test_decoding_dtype_auto_is_fp32_on_cpu_bf16_on_cuda(monkeypatch, bf16_cpu):
    monkeypatch.setattr(policy, "cpu_has_bf16", lambda: bf16_cpu)  # the CPU's fast decoding paths are fp32
    assert policy.decoding_dtype(DecodeConfig(), CPU) == torch.float32
    assert policy.decoding_dtype(DecodeConfig(), CUDA) == torch.bfloat16
    assert policy.decoding_dtype(DecodeConfig(precision="bf16"), CPU) == torch.bfloat16
    assert policy.decoding_dtype(DecodeConfig(precision="fp32"), CUDA) == torch.float32
    assert policy.decoding_dtype(DecodeConfig(precision="fp16"), CUDA) == torch.float16
    assert policy.decoding_dtype(DecodeConfig(quantize="int8"), CPU) == torch.float32


@pytest.mark.parametrize(("settings", "device", "message"), [
    ({"precision": "fp16"}, CPU, "--precision fp16: fp16 decoding runs on CUDA only"),
    ({"quantize": "int8"}, CUDA, "--quantize int8: int8 decoding runs on CPU only"),
    ({"quantize": "int8", "precision": "bf16"}, CPU, "--quantize int8 decodes with fp32 activations"),
])
def test_decoding_settings_that_do_not_go_together_are_refused(settings, device, message):
    with pytest.raises(UserError, match=message):
        policy.decoding_dtype(DecodeConfig(**settings), device)


def test_device_settings(monkeypatch):
    assert policy.pick_device("cpu") == CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert policy.pick_device("auto") == CPU
    with pytest.raises(UserError, match=r"--device cuda but no CUDA device is available; use --device auto or cpu"):
        policy.pick_device("cuda", setting="--device")
    with pytest.raises(UserError, match=r"train.device=cuda:1 but no CUDA device is available"):
        policy.pick_device("cuda:1")


@pytest.mark.parametrize("setting", ["cuda", "cuda:0", "auto"])
def test_a_cuda_device_leaves_cudnn_attention_out(monkeypatch, setting):
    """cuDNN's attention builds a graph per shape; a process on CUDA keeps the fused attention
    on the kernels that need none. torch's CUDA calls are stood in for, so this runs anywhere."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        assert policy.pick_device(setting) == torch.device("cuda", 0)
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)


def test_the_cpu_leaves_attention_kernels_as_they_are():
    was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        policy.pick_device("cpu")
        assert torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)
