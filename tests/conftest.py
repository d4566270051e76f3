"""Shared fixtures: tiny models and a tiny parallel corpus written into a temp directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import yaml

from helpers import REPO, SHIPPED
from seq2seq_cli.config import ModelConfig
from seq2seq_cli.model.transformer import Seq2SeqTransformer, build_model

SLOW_ENV = "SEQ2SEQ_SLOW"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False,
                     help=f"also run the tests marked slow (or set {SLOW_ENV}=1)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `slow` are skipped unless --runslow or SEQ2SEQ_SLOW=1 asks for them."""
    if config.getoption("--runslow") or os.environ.get(SLOW_ENV, "") not in ("", "0"):
        return
    skip = pytest.mark.skip(reason=f"slow: run with --runslow or {SLOW_ENV}=1")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def tiny_model(seed: int = 0, vocab: int = 23, **overrides) -> Seq2SeqTransformer:
    """A small randomly initialised model in eval mode."""
    settings = {
        "d_model": 16, "heads": 2, "ffn_size": 32, "encoder_layers": 2, "decoder_layers": 2, "dropout": 0.0, "max_positions": 64
    }
    settings.update(overrides)
    torch.manual_seed(seed)
    return build_model(ModelConfig(**settings), vocab, vocab, joint_vocab=True).eval()


def random_sources(n: int = 6, seed: int = 3) -> torch.Tensor:
    """(n, S) source ids for the tiny models: 2 to 8 random tokens, EOS, then padding."""
    from seq2seq_cli.ids import EOS, PAD

    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(2, 9, (n,), generator=g)
    src = torch.full((n, int(lens.max()) + 1), PAD)
    for i, L in enumerate(lens.tolist()):
        src[i, :L] = torch.randint(4, 23, (L,), generator=g)
        src[i, L] = EOS
    return src


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    """train/valid/test splits cut from the shipped corpus (a few hundred short pairs)."""
    out = tmp_path / "corpus"
    out.mkdir()
    for split, (start, count) in {"train": (0, 400), "valid": (400, 60), "test": (460, 40)}.items():
        for lang in ("es", "en"):
            lines = (SHIPPED / f"valid.{lang}").read_text(encoding="utf-8").splitlines()[start : start + count]
            (out / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


@pytest.fixture
def tiny_config(tmp_path: Path, corpus_dir: Path) -> Path:
    """configs/tiny.yaml pointed at the temp corpus and a temp run directory."""
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["run_dir"] = str(tmp_path / "run")
    for split in ("train", "valid", "test"):
        raw["data"][split] = str(corpus_dir / split)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path
