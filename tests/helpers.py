"""Plain functions shared by several test modules (fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

from seq2seq_cli.config_load import load_config
from seq2seq_cli.ids import BOS, EOS
from seq2seq_cli.model.transformer import Seq2SeqTransformer

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "data" / "bible-es-en"


def train_shipped_tiny(tmp: Path, name: str = "run", model: dict | None = None, **train_overrides) -> Path:
    """configs/tiny.yaml trained on the shipped validation split (as training and validation
    data) in tmp/NAME, 40 updates unless `train_overrides` say otherwise, `model` overriding
    model settings -> the run directory."""
    from seq2seq_cli.train.loop import train

    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["run_dir"] = str(tmp / name)
    raw["data"]["train"] = raw["data"]["valid"] = str(SHIPPED / "valid")
    raw["model"].update(model or {})
    raw["train"].update({"max_steps": 40, **train_overrides})
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return train(load_config(path), progress=False, log=lambda _: None)


def make_config(tmp: Path, name: str, **train_overrides) -> Path:
    """configs/tiny.yaml with dropout on (so RNG state matters), frequent saves, its own run dir."""
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["run_dir"] = str(tmp / name)
    raw["data"]["train"] = raw["data"]["valid"] = str(SHIPPED / "valid")
    raw["model"]["dropout"] = 0.1
    raw["train"].update({"max_steps": 30, "valid_every": 7, "log_every": 3, **train_overrides})
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def quiet(cfg_path: Path, resume: bool = False, *overrides: str) -> Path:
    """Train from a config file without progress bar or log -> the run directory."""
    from seq2seq_cli.train.loop import train

    return train(load_config(cfg_path, list(overrides)), resume=resume, progress=False, log=lambda _: None)


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / "last.safetensors"))


def train_records(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "train_loss" in r]


def assert_same(a: Path, b: Path) -> None:
    """Two runs ended with the same weights and logged the same training records (timings aside)."""
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa), "final weights differ"
    ra, rb = train_records(a), train_records(b)
    assert len(ra) == len(rb), f"{len(ra)} training records against {len(rb)}"
    assert ra == [{**r, "elapsed_s": x["elapsed_s"], "tokens_per_s": x["tokens_per_s"]} for r, x in zip(rb, ra, strict=True)]


def sequence_log_prob(model: Seq2SeqTransformer, src_row: torch.Tensor, tokens: list[int], eos: bool = True) -> float:
    """Sum of log-probabilities of tokens + EOS (without EOS: `eos` False, an output ended at
    its limit) under the model (full forward, no cache)."""
    tgt_in = torch.tensor([[BOS] + tokens])
    target = torch.tensor(tokens + [EOS])
    lprobs = torch.log_softmax(model(src_row[None], tgt_in)[0], dim=-1)
    return lprobs[torch.arange(len(target)), target][: len(target) - (not eos)].sum().item()


def snapshot(root: Path) -> dict[str, bytes]:
    """{path under root: bytes} of every file under `root` (the run lock left out: its holder writes it)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock"}


@contextlib.contextmanager
def held_lock(run: Path) -> Iterator[int]:
    """Another process (its pid yielded) holds the run lock of `run` as `seq2seq train` would."""
    code = (f"import sys, time; sys.path.insert(0, {str(REPO)!r}); sys.argv = ['seq2seq', 'train', '-c', 'x.yaml'];"
            f"from seq2seq_cli.run import runlock; runlock.acquire({str(run)!r}, runlock.command_line());"
            "print('locked', flush=True); time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()


def corpora(tmp: Path) -> list[dict]:
    """Three corpora in three formats, from the shipped validation split: text files (weight 2),
    TSV (weight 0.5, tagged) and JSONL (weight 1, another tag)."""
    es = (SHIPPED / "valid.es").read_text(encoding="utf-8").splitlines()
    en = (SHIPPED / "valid.en").read_text(encoding="utf-8").splitlines()
    (tmp / "a.es").write_text("\n".join(es[:120]) + "\n", encoding="utf-8")
    (tmp / "a.en").write_text("\n".join(en[:120]) + "\n", encoding="utf-8")
    (tmp / "b.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in zip(es[120:221], en[120:221])), encoding="utf-8")
    (tmp / "c.jsonl").write_text("".join(json.dumps({"es": s, "en": t}) + "\n" for s, t in zip(es[221:300], en[221:300])),
                                 encoding="utf-8")
    return [{"path": str(tmp / "a"), "weight": 2},
            {"path": str(tmp / "b.tsv"), "weight": 0.5, "tag": "<bt>"},
            {"path": str(tmp / "c.jsonl"), "weight": 1, "tag": ">>en<<"}]


def corpora_config(tmp: Path, name: str, **train_overrides) -> Path:
    """`make_config` (dropout on, frequent saves) training on the three `corpora`."""
    tmp.mkdir(parents=True, exist_ok=True)
    path = make_config(tmp, name, **train_overrides)
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    raw["data"]["train"] = corpora(tmp)
    raw["data"]["valid"] = str(tmp / "a")  # a short validation keeps the runs quick
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


class HostSyncs:
    """Counts, while active, the operations that make the host wait for the device on a GPU:
    a tensor read into Python (item, tolist, bool, int, float, numpy, a copy to the CPU) and
    the ops whose output size depends on values (nonzero, masked_select, boolean-mask indexing
    and assignment, repeat_interleave without output_size, unique). On a CPU none of them
    waits, but each one is a place that would: counting them here is how a test sees, without
    a GPU, that a training update or a decoding step leaves the device alone.
    `where` lists "op at file:line" of each, for the failure message."""

    READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu"}
    SIZED = {"nonzero", "masked_select", "_unique2", "unique_consecutive", "unique_dim", "argwhere"}

    def __init__(self) -> None:
        from torch.overrides import TorchFunctionMode
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Functions(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                name = getattr(func, "__name__", "")
                if name in HostSyncs.READS and not (name == "cpu" and args and not args[0].is_cpu):
                    counter.note(name)
                return func(*args, **(kwargs or {}))

        class Dispatch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                name = func._overloadpacket.__name__
                kwargs = kwargs or {}
                if name in HostSyncs.SIZED or (name == "repeat_interleave" and kwargs.get("output_size") is None
                                               and isinstance(args[0], torch.Tensor) and len(args) < 2):
                    counter.note(name)
                elif name in ("index", "index_put", "index_put_") and any(
                        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1] or ()):
                    counter.note(f"{name}[bool mask]")
                return func(*args, **kwargs)

        self.modes = (Functions(), Dispatch())
        self.where: list[str] = []

    def note(self, name: str) -> None:
        import traceback

        frames = [f for f in traceback.extract_stack()[:-3] if "seq2seq_cli" in f.filename]
        at = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
        self.where.append(f"{name} at {at}")

    @property
    def count(self) -> int:
        return len(self.where)

    def __enter__(self) -> HostSyncs:
        for mode in self.modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for mode in reversed(self.modes):
            mode.__exit__(*exc)


def headless_chromium():
    """A Selenium driver of Debian's chromium, headless (the caller quits it); the test is skipped,
    saying why, where chromium or chromedriver is not installed."""
    import shutil

    import pytest

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not chromium or not driver_path:
        print("skipped: chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")
        pytest.skip("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver_path), options=options)


def documented_errors(section: str) -> dict[str, str]:
    """{case: the message of its row} in docs/errors.md, the section whose title starts with
    `section` (rows: | case | example | 1 or 2 | `error: ...` |)."""
    text = (REPO / "docs" / "errors.md").read_text(encoding="utf-8")
    part = text.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| ([a-z0-9-]+) \| .* \| [12] \| `(error: [^`]+)` \|$", part, flags=re.MULTILINE))


def one_error_line(result, *fragments: str) -> str:
    """The CliRunner result failed with exactly one `error:` line on stderr holding every fragment
    -> that line."""
    assert result.exit_code != 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def subprocess_env() -> dict[str, str]:
    """The environment of a `python -m seq2seq_cli` subprocess: this checkout first on its path."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
