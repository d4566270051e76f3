"""Where the best output is the empty one (EOS first), every engine gives it: CTranslate2 is
asked for no minimum length (its own default is one token, which would give another output than
our search and Hugging Face's `generate`)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from conftest import SHIPPED
from seq2seq_cli.cli import app
from seq2seq_cli.decode.loading import load_translator
from seq2seq_cli.fileio import sha256
from seq2seq_cli.ids import EOS

pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed")
pytestmark = pytest.mark.usefixtures("torch_threads")  # torch gets its threads back after each test

LINES = (SHIPPED / "valid.es").read_text(encoding="utf-8").splitlines()[:6]


@pytest.fixture
def eos_first(small_run, tmp_path) -> Path:
    """A copy of the small run given a fixed logits bias (as an imported Marian model has) that
    makes EOS the likeliest first token of every output."""
    run = tmp_path / "run"
    shutil.copytree(small_run, run, ignore=shutil.ignore_patterns("ctranslate2", "cache", "tensorboard", "*.state.pt"))
    config = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    config["model"]["logits_bias"] = True
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    ckpt = (run / "checkpoints" / "best.safetensors").resolve()
    with safe_open(str(ckpt), framework="pt") as f:
        meta = f.metadata()
    weights = load_file(str(ckpt))
    bias = torch.zeros(int(meta["tgt_vocab"]))
    bias[EOS] = 40.0
    weights["logits_bias"] = bias
    saved = json.loads(meta["config"])
    saved["model"]["logits_bias"] = True
    meta["config"] = json.dumps(saved)
    for path in {ckpt, run / "checkpoints" / "best.safetensors"}:
        path.unlink(missing_ok=True)  # best is a hard link to a step checkpoint's file
    save_file(weights, str(run / "checkpoints" / "best.safetensors"), metadata=meta)
    manifest = run / "checkpoints" / "best.json"
    record = json.loads(manifest.read_text(encoding="utf-8"))
    manifest.unlink()
    manifest.write_text(json.dumps({**record, "sha256": {"weights": sha256(run / "checkpoints" / "best.safetensors")}}),
                        encoding="utf-8")
    return run


@pytest.mark.parametrize("beam", ["1", "4"])
def test_the_default_engine_gives_the_empty_output_where_our_search_does(eos_first, tmp_path, beam):
    src = tmp_path / "in.es"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")

    def translate(*flags: str) -> tuple[list[str], str]:
        out = tmp_path / "out.en"
        r = CliRunner().invoke(app, ["translate", "-m", str(eos_first), "-i", str(src), "-o", str(out), "--no-split",
                                     "--no-progress", "--beam-size", beam, *flags])
        assert r.exit_code == 0, r.output
        return out.read_text(encoding="utf-8").split("\n")[:-1], r.stderr

    ours, _ = translate("--engine", "torch")
    assert ours == [""] * len(LINES)
    default, log = translate()
    assert "searched by CTranslate2" in log
    assert default == ours
    translator = load_translator([eos_first], "cpu", {"beam_size": int(beam)}).translator
    assert translator.engine is not None
    found = translator.engine.search(translator.encode(LINES), translator.decode, 1)
    assert [hyps and hyps[0].tokens for hyps in found] == [[]] * len(LINES)  # the engine's own answer, not left to ours
