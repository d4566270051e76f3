"""The run directory's layout has one owner: `seq2seq_cli/layout.py` names every path a run
holds; no other module spells one."""

from __future__ import annotations

import ast
from pathlib import Path

from seq2seq_cli import layout
from seq2seq_cli.layout import RunLayout, managed, run_of_config

REPO = Path(__file__).resolve().parents[2]
OWNER = REPO / "seq2seq_cli" / "layout.py"
RUN_NAMES = {
    "config.yaml", "metrics.jsonl", "last.safetensors", "best.safetensors", "last.json", "best.json",
    "last.state.pt", "checkpoints", "tensorboard", "plots", "curves.png", "cache", "encoded", ".lock",
    "spm.model", "spm.src.model", "spm.tgt.model", "source.spm", "target.spm", "vocab.json", "target_vocab.json",
    "shortlist.tsv",
}


def run_names_spelled(path: Path) -> list[str]:
    """`file:line name` for each string literal of a module equal to a run-directory name
    (the literal parts of f-strings included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [f"{path.name}:{node.lineno} {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in RUN_NAMES]


def test_the_scan_finds_a_spelled_name(tmp_path):
    module = tmp_path / "probe.py"
    module.write_text('CONFIG = "config.yaml"\nx = f"{1}metrics.jsonl"\ny = "the config.yaml of a run"\n',
                      encoding="utf-8")
    assert run_names_spelled(module) == ["probe.py:1 'config.yaml'", "probe.py:2 'metrics.jsonl'"]


def test_no_module_but_the_layout_spells_a_run_directory_name():
    spelled = [f"{path.parent.name}/{hit}" for path in sorted((REPO / "seq2seq_cli").rglob("*.py")) if path != OWNER
               for hit in run_names_spelled(path)]
    assert not spelled, "run-directory names outside seq2seq_cli/layout.py:\n" + "\n".join(spelled)


def test_the_layout_spells_them():
    assert {n for n in RUN_NAMES if "." not in n or n in {"config.yaml", "metrics.jsonl", ".lock"}} <= {
        hit.rsplit(" ", 1)[1].strip("'") for hit in run_names_spelled(OWNER)}


def test_every_path_of_a_run(tmp_path):
    run = RunLayout(tmp_path)
    assert run.config == tmp_path / "config.yaml"
    assert run.last == tmp_path / "checkpoints" / "last.safetensors"
    assert run.best == tmp_path / "checkpoints" / "best.safetensors"
    assert run.train_state(layout.step_name(1000)) == tmp_path / "checkpoints" / "step-00001000.state.pt"
    assert run.manifest("best") == tmp_path / "checkpoints" / "best.json"
    assert run.spm_models(True) == (tmp_path / "spm.model", tmp_path / "spm.model")
    assert run.spm_models(False) == (tmp_path / "spm.src.model", tmp_path / "spm.tgt.model")
    assert run.vocab_files(True) == (tmp_path / "vocab.json", tmp_path / "vocab.json")
    assert run.vocab_files(False) == (tmp_path / "vocab.json", tmp_path / "target_vocab.json")
    assert run.curves == tmp_path / "plots" / "curves.png"
    assert run.encoded == tmp_path / "cache" / "encoded"
    # --overwrite clears one training run's outputs; the tokenizer, the cache and the config stay
    assert sorted(p.name for p in run.outputs) == ["checkpoints", "ctranslate2", "metrics.jsonl", "plots", "shortlist.tsv",
                                                   "tensorboard"]
    assert run.shortlist == tmp_path / "shortlist.tsv" and run.shortlist in run.owned_files()


def test_managed_checkpoint_names():
    for name in ("last", "best", "step-00000010", "best.safetensors", "last.json", "step-00000010.state.pt"):
        assert managed(name), name
    for name in ("average-last-2", "average-last-2.safetensors", "mine.safetensors", "step-x", "bestish"):
        assert not managed(name), name


def test_a_config_among_a_runs_files_belongs_to_that_run(tmp_path):
    (tmp_path / "config.yaml").write_text("name: x\n")
    assert run_of_config(tmp_path / "config.yaml") is None  # a config alone is not a run
    (tmp_path / "checkpoints").mkdir()
    assert run_of_config(tmp_path / "config.yaml") == tmp_path
    (tmp_path / "other.yaml").write_text("name: x\n")
    assert run_of_config(tmp_path / "other.yaml") is None  # a run's config is its config.yaml
