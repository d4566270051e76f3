"""The GPU half of the product on a CUDA device: bf16 and fp16 (loss-scaled) training, incremental
decoding, greedy and beam search against the CPU's, checkpoints moving between CUDA and CPU, and
torch.compile against eager. Every test is marked `cuda` (run them with `pytest -m cuda`) and the
module is skipped where the device is not usable.

SEQ2SEQ_TEST_GPU names the device the tests use (default `cuda`);
`SEQ2SEQ_TEST_GPU=cpu pytest -m cuda tests/test_cuda.py` runs the same tests on the CPU, a way to
check the tests on a machine without a GPU.

float32 runs with TF32 matmuls off (`fp32` fixture), so that CUDA and CPU compute the same
float32 products; "ties aside" means that where two devices' outputs differ, the CPU model
scores the two within `TIE` of each other (forced decoding), so rounding alone chose.
"""

from __future__ import annotations

import copy
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import random_sources, tiny_model
from helpers import make_config, quiet, sequence_log_prob, train_records
from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.decode.hypotheses import Hypothesis, length_penalty
from seq2seq_cli.decode.search import search
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.ids import BOS, EOS, PAD
from seq2seq_cli.model.transformer import Seq2SeqTransformer
from seq2seq_cli.run import checkpoint as ckpt
from seq2seq_cli.run.loaded import load_model

GPU = os.environ.get("SEQ2SEQ_TEST_GPU", "cuda")


def usable(device: str) -> bool:
    """`cpu`, or `cuda` where torch sees a CUDA device."""
    return device == "cpu" or (device == "cuda" and torch.cuda.is_available())


if not usable(GPU):
    pytest.skip(f"SEQ2SEQ_TEST_GPU={GPU}: no usable device (torch.cuda.is_available() is {torch.cuda.is_available()})",
                allow_module_level=True)

pytestmark = pytest.mark.cuda

TIE = 1e-4  # log-probability difference below which two choices are a tie for float32 rounding
COMPILE_REL = 1e-3  # compiled against eager training loss, as the CPU test of train.compile allows


@pytest.fixture
def fp32() -> Iterator[None]:
    """float32 matmuls in full float32 precision (no TF32) for the test's duration."""
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def on(model: Seq2SeqTransformer, device: str) -> Seq2SeqTransformer:
    """A copy of a CPU model on `device`."""
    return copy.deepcopy(model).to(device).eval()


def first_difference(a: list[int], b: list[int]) -> int:
    """The first position where two token lists differ (the shorter one's length if one is a prefix)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def step_log_probs(model: Seq2SeqTransformer, src_row: torch.Tensor, prefix: list[int]) -> torch.Tensor:
    """The model's log-probabilities (V,) of the token after `prefix` (full forward, no cache)."""
    with torch.no_grad():
        logits = model(src_row[None], torch.tensor([[BOS] + prefix]))[0, -1]
    return torch.log_softmax(logits.float(), dim=-1)


def score(model: Seq2SeqTransformer, src_row: torch.Tensor, h: Hypothesis, opts: DecodeConfig) -> float:
    """A hypothesis' search score under `model` by forced decoding: log-probability (EOS
    included where it ended with one) over the length penalty."""
    with torch.no_grad():
        log_prob = sequence_log_prob(model, src_row, h.tokens, h.eos)
    return log_prob / length_penalty(len(h.tokens) + h.eos, opts.length_penalty, opts.length_penalty_type)


def assert_same_ties_aside(cpu_model: Seq2SeqTransformer, src: torch.Tensor, want: list[Hypothesis],
                           got: list[Hypothesis], opts: DecodeConfig) -> None:
    """`got` (another device's outputs) equals `want` (the CPU's), sentence by sentence, except
    where the CPU model scores the two within TIE: for greedy search, the two tokens where the
    outputs part; for beam search, the two whole hypotheses. Most sentences must be identical."""
    identical = 0
    for row, a, b in zip(src, want, got, strict=True):
        row = row[row != PAD]
        if a.tokens == b.tokens:
            identical += 1
            assert b.score == pytest.approx(a.score, abs=TIE), (a.tokens, a.score, b.score)
            continue
        if opts.beam_size == 1:
            i = first_difference(a.tokens, b.tokens)
            lprobs = step_log_probs(cpu_model, row, a.tokens[:i])
            x, y = (t[i] if i < len(t) else EOS for t in (a.tokens, b.tokens))
            assert abs(lprobs[x].item() - lprobs[y].item()) <= TIE, (a.tokens, b.tokens, i)
        else:
            sa, sb = score(cpu_model, row, a, opts), score(cpu_model, row, b, opts)
            assert abs(sa - sb) <= TIE, (a.tokens, sa, b.tokens, sb)
    assert identical >= 0.9 * len(want), f"{identical} of {len(want)} identical"


# --------------------------------------------------------------------------- training in bf16 and fp16


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_training_lowers_the_loss(tiny_config: Path, precision: str) -> None:
    """A few dozen updates in bf16 or fp16 autocast: the training loss falls and stays finite;
    fp16 trains through the loss scaler, whose state (a finite, positive scale) is saved."""
    run = quiet(tiny_config, False, f"train.device={GPU}", f"train.precision={precision}", "train.max_steps=60",
                "train.log_every=10", "train.valid_every=60", "train.warmup_steps=5")
    records = train_records(run)
    losses = [r["train_loss"] for r in records]
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < losses[0] - 0.5, losses
    state = ckpt.load_train_state(run / "checkpoints" / "last.state.pt")
    assert state["step"] == 60
    if precision == "fp16":
        scale = state["scaler"]["scale"]
        assert math.isfinite(scale) and scale > 0, state["scaler"]
        assert records[-1]["fp16_overflows"] < 30  # the scale settles: most updates are applied
    else:
        assert state["scaler"] == {}  # no loss scaling in bf16


# --------------------------------------------------------------------------- incremental decoding


def _batch(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 23, (3, 7), generator=g)
    tgt = torch.randint(4, 23, (3, 6), generator=g)
    tgt[:, 0] = BOS
    src[0, 5:] = PAD
    return src.to(device), tgt.to(device)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 0.1)])
@pytest.mark.parametrize("overrides", [{}, {"norm": "pre"}, {"q_k_size": 5, "v_size": 11}, {"positions": "learned"}])
def test_incremental_decoding_equals_full_forward(fp32: None, overrides: dict, dtype: torch.dtype, tol: float) -> None:
    """Logits of one position at a time through the key/value cache equal those of the whole
    prefix at once, in float32 and in bf16 autocast (within bf16's rounding)."""
    model = tiny_model(**overrides).to(GPU)
    src, tgt = _batch(GPU)
    with torch.no_grad(), torch.autocast(torch.device(GPU).type, dtype=dtype, enabled=dtype != torch.float32):
        full = model(src, tgt).float()
        memory, src_mask, _ = model.encode(src)
        state = model.init_state(memory, src_mask)
        steps = []
        for t in range(tgt.size(1)):
            h, _ = model.decode(tgt[:, t : t + 1], state, incremental=True)
            steps.append(model.logits(h).float())
    incremental = torch.cat(steps, dim=1)
    assert full.device.type == torch.device(GPU).type
    assert (incremental - full).abs().max().item() <= tol
    assert state.length == tgt.size(1)


# --------------------------------------------------------------------------- search against the CPU's


@pytest.mark.parametrize("beam", [1, 4])
def test_search_gives_the_cpus_outputs_ties_aside(fp32: None, beam: int) -> None:
    """Greedy and beam search (batched: sentences finish and leave the batch, beams reorder the
    preallocated cache) on the device give the CPU's hypotheses and scores."""
    cpu_model = tiny_model(seed=2)
    with torch.no_grad():  # sharper distributions than a random init: fewer near-ties to set aside
        cpu_model.tgt_embed.tokens.weight.mul_(3.0)
    src = random_sources(n=24, seed=5)
    opts = DecodeConfig(beam_size=beam, max_len_a=1.5, max_len_b=4)
    want = [h[0] for h in search(cpu_model, src, opts)]
    got = [h[0] for h in search(on(cpu_model, GPU), src.to(GPU), opts)]
    assert_same_ties_aside(cpu_model, src, want, got, opts)


# --------------------------------------------------------------------------- checkpoints across devices


def assert_translators_agree(run: Path, lines: list[str]) -> None:
    """The run loaded on the CPU and on the device: the same weights, and the same float32
    translations of the test sources, ties aside."""
    fp32 = {"precision": "fp32"}  # the device would decode in bf16 by default
    cpu, dev = Translator.load(run, "cpu", fp32), Translator.load(run, GPU, fp32)
    assert next(dev.model.parameters()).device.type == torch.device(GPU).type
    cpu_model = load_model(run, "cpu").model
    dev_model = load_model(run, GPU).model
    for (name, a), b in zip(cpu_model.state_dict().items(), dev_model.state_dict().values()):
        assert torch.equal(a, b.cpu()), name
    ids = cpu.encode(lines)
    want = [h[0] for h in cpu.translate_hypotheses(lines, ids=ids)]
    got = [h[0] for h in dev.translate_hypotheses(lines, ids=ids)]
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(i) for i in ids], batch_first=True, padding_value=PAD)
    assert_same_ties_aside(cpu_model, src, want, got, cpu.decode)


def test_a_checkpoint_saved_on_the_device_loads_on_the_cpu(fp32: None, tiny_config: Path, corpus_dir: Path) -> None:
    run = quiet(tiny_config, False, f"train.device={GPU}", "train.max_steps=12", "train.valid_every=6")
    assert_translators_agree(run, (corpus_dir / "test.es").read_text(encoding="utf-8").splitlines())


def test_a_run_trained_on_the_cpu_resumes_and_loads_on_the_device(fp32: None, tiny_config: Path, corpus_dir: Path) -> None:
    """float32 training on the CPU, then --resume on the device in fp16: the optimizer and
    generators saved on the CPU continue there, the loss scaler (absent from a float32 save)
    starts afresh, and the result loads on both."""
    quiet(tiny_config, False, "train.device=cpu", "train.max_steps=6", "train.valid_every=3", "train.log_every=1")
    run = quiet(tiny_config, True, f"train.device={GPU}", "train.precision=fp16", "train.max_steps=12",
                "train.valid_every=3", "train.log_every=1")
    records = train_records(run)
    assert [r["step"] for r in records] == list(range(1, 13))
    assert all(math.isfinite(r["train_loss"]) for r in records)
    state = ckpt.load_train_state(run / "checkpoints" / "last.state.pt")
    assert state["step"] == 12 and math.isfinite(state["scaler"]["scale"])
    assert_translators_agree(run, (corpus_dir / "test.es").read_text(encoding="utf-8").splitlines())


def test_a_batch_reaches_the_device_whole_without_blocking() -> None:
    """A training batch copied as one pinned buffer (`Batch.to` with non_blocking): every
    tensor arrives with its shape and values, read back after the copy."""
    from seq2seq_cli.data.batching import collate
    from seq2seq_cli.data.encoding import EncodedCorpus

    corpus = EncodedCorpus.from_lists([[7, 8, 9], [9]], [[10], [11, 12, 13, 14]])
    batch = collate(corpus, np.array([0, 1]))
    moved = batch.to(GPU, non_blocking=True)
    for name in ("src", "tgt_in", "tgt_out", "tgt_rows"):
        a, b = getattr(batch, name), getattr(moved, name)
        assert b.device.type == torch.device(GPU).type and torch.equal(a, b.cpu()), name


def test_attention_over_batches_of_many_shapes_runs_without_cudnn(fp32: None) -> None:
    """After the device is picked, the fused attention leaves cuDNN's kernels out, and a model
    trains through padded batches of changing shapes (each a new shape for the kernels)."""
    from seq2seq_cli.device import pick_device

    pick_device(GPU, setting="--device")
    assert GPU == "cpu" or not torch.backends.cuda.cudnn_sdp_enabled()
    model = tiny_model().to(GPU).train()
    shapes = set()
    for batch, seed in ((3, 1), (2, 5), (5, 9), (4, 12)):
        src, tgt = random_sources(batch, seed).to(GPU), random_sources(batch, seed + 1).to(GPU)
        shapes.add((src.shape, tgt.shape))
        logits = model(src, tgt)
        assert logits.shape[:2] == (batch, tgt.size(1)) and torch.isfinite(logits).all()
        logits.float().logsumexp(-1).mean().backward()
    assert len(shapes) == 4
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


# --------------------------------------------------------------------------- torch.compile


# the compilers torch.compile builds with: C++ kernels on the CPU, Triton's launcher on CUDA
COMPILERS = (os.environ.get("CXX", "g++"), "clang++") if GPU == "cpu" else (os.environ.get("CC", "cc"), "gcc", "clang")


@pytest.mark.skipif(not any(map(shutil.which, COMPILERS)),
                    reason=f"torch.compile on {GPU} needs a compiler ({' or '.join(COMPILERS)}) and none is on PATH")
def test_compiled_training_matches_eager(fp32: None, tmp_path: Path) -> None:
    """train.compile on the device: the losses of eager training (within the CPU test's
    tolerance), checkpoint names without `_orig_mod.`, and a compiled run resumes."""
    from safetensors.torch import load_file

    device = f"train.device={GPU}"
    eager = quiet(make_config(tmp_path, "eager", max_steps=4, valid_every=2, log_every=1), False, "model.dropout=0.0", device)
    cfg = make_config(tmp_path, "compiled", max_steps=4, valid_every=2, log_every=1)
    quiet(cfg, False, "model.dropout=0.0", device, "train.compile=true", "train.max_steps=2")
    compiled = quiet(cfg, True, "model.dropout=0.0", device, "train.compile=true")
    assert load_file(str(compiled / "checkpoints" / "last.safetensors")).keys() == \
        load_file(str(eager / "checkpoints" / "last.safetensors")).keys()
    a, b = train_records(eager), train_records(compiled)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for x, y in zip(a, b, strict=True):
        assert y["train_loss"] == pytest.approx(x["train_loss"], rel=COMPILE_REL), x["step"]
