"""Shared fixtures: tiny models, a tiny parallel corpus written into a temp directory, and the
small trained runs that tests of several wings decode with, each trained once per session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml

from helpers import REPO, SHIPPED, snapshot, train_shipped_tiny
from seq2seq_cli.config import ModelConfig
from seq2seq_cli.layout import CTRANSLATE2
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


# --------------------------------------------------------------------------- small trained runs
# Each is trained once per session and shared by every module that needs it. They are read only:
# a test that writes into a run (a checkpoint, a file the run owns, a resumed training) works on
# its own copy (shutil.copytree into tmp_path). A run found changed at the end of the session
# fails the test session, naming the paths; the run's CTranslate2 conversion (RUN/ctranslate2/,
# a cache that `translate` and `serve` write on first use with no flags) is left out.


def shared_run(tmp_path_factory: pytest.TempPathFactory, name: str, **settings) -> Iterator[Path]:
    """`train_shipped_tiny(**settings)` in a folder of its own; after the session, the check that
    no test wrote into it."""
    run = train_shipped_tiny(tmp_path_factory.mktemp(name), **settings)
    before = snapshot(run)
    yield run
    after = {p: b for p, b in snapshot(run).items() if not p.startswith(f"{CTRANSLATE2}/")}
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    assert not changed, f"a test wrote into the shared run {run} (copy it first): {changed}"


@pytest.fixture
def torch_threads() -> Iterator[None]:
    """Gives torch its threads back after a test: the CTranslate2 engine leaves torch one thread
    for the process (used by the modules that decode with it, `pytestmark`)."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """configs/tiny.yaml trained for 40 updates on the shipped validation split: outputs of a few
    words, different from sentence to sentence."""
    yield from shared_run(tmp_path_factory, "tiny-run")


@pytest.fixture(scope="session")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """configs/tiny.yaml trained for 4 updates, with step checkpoints at 2 and 4 (both kept)."""
    yield from shared_run(tmp_path_factory, "short-run", max_steps=4, valid_every=2, keep_last=2)


SMALL = {"d_model": 64, "heads": 4, "ffn_size": 128, "encoder_layers": 2, "decoder_layers": 2}


@pytest.fixture(scope="session")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A small model (SMALL) trained enough (150 updates) to give sentences of words."""
    yield from shared_run(tmp_path_factory, "small-run", model=SMALL, max_steps=150, lr=0.005, warmup_steps=30)


@pytest.fixture(scope="session")
def sentences() -> list[str]:
    """The first 12 source lines of the shipped test split (a module may define its own)."""
    return (SHIPPED / "test.es").read_text(encoding="utf-8").splitlines()[:12]
