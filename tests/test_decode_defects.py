"""Decoding, evaluation and averaging under hostile but realistic use: outputs that would
destroy an input or the run, n-best line counts, sampling seeds, stdin answered as it
arrives, option ranges, blank lines and byte-order marks, plots and signals, unknown words."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import REPO, SHIPPED
from seq2seq_cli.cli import app
from seq2seq_cli.config import load_config
from seq2seq_cli.train.loop import train

runner = CliRunner()


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny run trained for 4 updates, with step checkpoints at 2 and 4."""
    tmp = tmp_path_factory.mktemp("decode")
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["run_dir"] = str(tmp / "run")
    raw["data"]["train"] = raw["data"]["valid"] = str(SHIPPED / "valid")
    raw["train"].update(max_steps=4, valid_every=2, keep_last=2)
    (tmp / "tiny.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    return train(load_config(tmp / "tiny.yaml"), progress=False, log=lambda _: None)


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    return (SHIPPED / "test.es").read_text(encoding="utf-8").splitlines()[:12]


def one_error_line(result, *fragments: str) -> str:
    """The result failed with exactly one `error:` line on stderr holding every fragment."""
    assert result.exit_code != 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def subprocess_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


# --------------------------------------------------------------------------- outputs that destroy inputs


@pytest.mark.parametrize("target", ["--ref", "--src"])
def test_evaluate_refuses_to_write_over_its_reference_or_source(run, tmp_path, target):
    src, ref = tmp_path / "e.es", tmp_path / "e.en"
    src.write_text("hola\nadiós\n", encoding="utf-8")
    ref.write_text("hello\ngoodbye\n", encoding="utf-8")
    out = ref if target == "--ref" else src
    r = runner.invoke(app, ["evaluate", "-m", str(run), "--src", str(src), "--ref", str(ref), "-o", str(out)])
    one_error_line(r, f"{out}: is the {target} file {out}; write the translations to another file")
    assert r.stdout == ""
    assert src.read_text(encoding="utf-8") == "hola\nadiós\n" and ref.read_text(encoding="utf-8") == "hello\ngoodbye\n"


def test_evaluate_refuses_a_symbolic_link_to_its_reference(run, tmp_path):
    src, ref, link = tmp_path / "e.es", tmp_path / "e.en", tmp_path / "link.en"
    src.write_text("hola\n", encoding="utf-8")
    ref.write_text("hello\n", encoding="utf-8")
    link.symlink_to(ref)
    r = runner.invoke(app, ["evaluate", "-m", str(run), "--src", str(src), "--ref", str(ref), "-o", str(link)])
    one_error_line(r, f"{link}: is the --ref file {ref}")
    assert ref.read_text(encoding="utf-8") == "hello\n"


@pytest.mark.parametrize("name", ["spm.model", "config.yaml", "checkpoints/best.safetensors", "new.txt"])
def test_translate_refuses_to_write_into_the_run(run, name):
    target = run / name
    before = target.read_bytes() if target.exists() else None
    r = runner.invoke(app, ["translate", "-m", str(run), "-o", str(target), "--no-progress"], input="hola\n")
    one_error_line(r, f"{target}: is inside the model's run directory {run}; write the translation outside it")
    assert (target.read_bytes() if target.exists() else None) == before


def test_translate_refuses_a_symbolic_link_to_its_input(run, tmp_path):
    src, link = tmp_path / "in.es", tmp_path / "link.txt"
    src.write_text("hola\n", encoding="utf-8")
    link.symlink_to(src)
    r = runner.invoke(app, ["translate", "-m", str(run), "-i", str(src), "-o", str(link), "--no-progress"])
    one_error_line(r, f"{link}: is the input file {src}")
    assert src.read_text(encoding="utf-8") == "hola\n"


# --------------------------------------------------------------------------- average


@pytest.mark.parametrize("name", ["best.safetensors", "last.safetensors", "step-00000002.safetensors"])
def test_average_refuses_the_name_of_a_managed_checkpoint(run, name):
    ckpt = run / "checkpoints"
    before = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    r = runner.invoke(app, ["average", "-m", str(run), "--last", "2", "-o", str(ckpt / name)])
    one_error_line(r, f"{ckpt / name}: {name} is a checkpoint the run manages (best, last, step-N)")
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == before


@pytest.mark.parametrize("name", ["best.json", "mine.json", "mine", ".safetensors"])
def test_average_refuses_a_name_that_is_not_safetensors(run, name):
    ckpt = run / "checkpoints"
    before = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    r = runner.invoke(app, ["average", "-m", str(run), "--last", "2", "-o", str(ckpt / name)])
    one_error_line(r, f"{ckpt / name}: an averaged checkpoint is a NAME.safetensors file (its manifest is NAME.json)")
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == before
    assert runner.invoke(app, ["translate", "-m", str(run)], input="hola\n").exit_code == 0


def test_average_with_a_name_of_its_own_is_usable(run):
    out = run / "checkpoints" / "mine.safetensors"
    r = runner.invoke(app, ["average", "-m", str(run), "--last", "2", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.is_file() and out.with_suffix(".json").is_file()
    assert runner.invoke(app, ["translate", "-m", str(out)], input="hola\n").exit_code == 0


def test_average_racing_checkpoint_rotation_lists_again_then_reports_one_line(run, monkeypatch):
    """A checkpoint that goes away between the listing and the reading: listed again once;
    when it keeps happening, one line, no traceback."""
    import safetensors.torch

    from seq2seq_cli.run import checkpoint

    real = safetensors.torch.load_file
    calls: list[str] = []

    def vanishing(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 1 or always:
            raise FileNotFoundError(2, "No such file or directory", path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(safetensors.torch, "load_file", vanishing)
    monkeypatch.setattr(checkpoint.time, "sleep", lambda s: None)
    always = False
    out = run / "checkpoints" / "raced.safetensors"
    r = runner.invoke(app, ["average", "-m", str(run), "--last", "2", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.is_file()
    always = True
    r = runner.invoke(app, ["average", "-m", str(run), "--last", "2", "-o", str(out)])
    one_error_line(r, "step checkpoints changed while they were read", "training is rotating them")


# --------------------------------------------------------------------------- n-best line counts


@pytest.mark.parametrize("limits", [["--max-len-a", "0", "--max-len-b", "0"], ["--max-len-a", "0", "--max-len-b", "1"]])
def test_nbest_writes_exactly_n_lines_per_input_whatever_the_output_limit(run, sentences, tmp_path, limits):
    src = tmp_path / "in.es"
    src.write_text("\n".join(sentences[:5]) + "\n", encoding="utf-8")
    out = tmp_path / "out.en"
    args = ["translate", "-m", str(run), "-i", str(src), "-o", str(out), "--beam-size", "4", "--nbest", "4",
            "--scores", "--no-progress", *limits]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    rows = out.read_text(encoding="utf-8").splitlines()
    assert len(rows) == 20
    for k in range(5):
        scores = [float(row.rsplit("\t", 1)[1]) for row in rows[4 * k : 4 * k + 4]]
        assert scores == sorted(scores, reverse=True) and scores[0] > float("-inf")
    if limits[-1] == "0":  # only the empty output fits: it, then three empty lines without a hypothesis
        assert all(row.split("\t")[0] == "" for row in rows)
        assert [row.rsplit("\t", 1)[1] for row in rows[1:4]] == ["-inf"] * 3


def test_evaluate_with_a_zero_output_limit_scores_empty_translations(run, tmp_path):
    src, ref = tmp_path / "e.es", tmp_path / "e.en"
    src.write_text("hola\nadiós\n", encoding="utf-8")
    ref.write_text("hello\ngoodbye\n", encoding="utf-8")
    r = runner.invoke(app, ["evaluate", "-m", str(run), "--src", str(src), "--ref", str(ref), "--json",
                            "--max-len-a", "0", "--max-len-b", "0"])
    assert r.exit_code == 0, r.output
    assert '"bleu": 0.0' in r.stdout


def test_evaluate_refuses_an_nbest_file_against_one_reference_per_line(run, tmp_path):
    src, ref, hyp = tmp_path / "e.es", tmp_path / "e.en", tmp_path / "nbest.en"
    src.write_text("hola\nadiós\n", encoding="utf-8")
    ref.write_text("hello\ngoodbye\n", encoding="utf-8")
    r = runner.invoke(app, ["translate", "-m", str(run), "-i", str(src), "-o", str(hyp), "--beam-size", "2", "--nbest", "2",
                            "--max-len-b", "0", "--max-len-a", "0", "--no-progress"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["evaluate", "--hyp", str(hyp), "--ref", str(ref)])
    one_error_line(r, f"{hyp} has 4 lines but {ref} has 2; they must be aligned")


# --------------------------------------------------------------------------- sampling seeds


def test_copies_of_a_line_get_different_samples(run):
    args = ["translate", "-m", str(run), "--sampling", "--seed", "3", "--max-len-a", "0", "--max-len-b", "8"]
    r = runner.invoke(app, args, input="hola amigo\n" * 40)
    assert r.exit_code == 0, r.output
    rows = r.stdout.splitlines()
    assert len(rows) == 40 and len(set(rows)) >= 20


def test_samples_do_not_depend_on_batches_chunks_or_threads(run, sentences):
    import torch

    from seq2seq_cli.decode.translate import OutputOptions, Translator

    lines = sentences[:6] * 2
    settings = {"sampling": True, "seed": 5, "max_len_a": 0, "max_len_b": 8}
    outputs = []
    threads = torch.get_num_threads()
    try:
        for batch_tokens, chunk_lines, n_threads in ((100000, 10000, 1), (8, 5, 1), (30, 7, 2)):
            torch.set_num_threads(n_threads)
            tr = Translator.load(run, "cpu", {**settings, "batch_tokens": batch_tokens})
            outputs.append(list(tr.translate_stream(lines, OutputOptions(nbest=2), chunk_lines=chunk_lines)))
    finally:
        torch.set_num_threads(threads)
    assert outputs[0] == outputs[1] == outputs[2]
    assert len(outputs[0]) == 24 and outputs[0][:12] != outputs[0][12:]  # the copies got samples of their own
    tr = Translator.load(run, "cpu", {**settings, "seed": 6})
    assert list(tr.translate_stream(lines, OutputOptions(nbest=2))) != outputs[0]
