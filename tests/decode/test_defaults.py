"""With no flags, translate, evaluate and serve take the fastest path that gives our answers:
CTranslate2 where it can decode the run and the options, over the whole vocabulary (the run's
shortlist with `--shortlist`), and the first log line says which; flags turn each off. The CTranslate2 model is converted once
into the run (RUN/ctranslate2/NAME-SHA/), atomically, and a later start loads it without torch."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch
import typer
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from conftest import SHIPPED
from helpers import REPO
from seq2seq_cli.choices import Engine
from seq2seq_cli.cli import app
from seq2seq_cli.decode.hypotheses import output_limit
from seq2seq_cli.decode.steps import output_limits
from seq2seq_cli.fileio import sha256
from seq2seq_cli.layout import RunLayout

pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed")
from seq2seq_cli.convert import ctranslate2_cache  # noqa: E402
from seq2seq_cli.decode import ctranslate2_engine  # noqa: E402
from seq2seq_cli.decode.loading import load_translator  # noqa: E402

SMALL = {"d_model": 64, "heads": 4, "ffn_size": 128, "encoder_layers": 2, "decoder_layers": 2}
LINES = (SHIPPED / "test.es").read_text(encoding="utf-8").splitlines()[:12]


pytestmark = pytest.mark.usefixtures("torch_threads")  # torch gets its threads back after each test


@pytest.fixture(scope="module")
def trained(small_run) -> Path:
    """A small model trained enough (150 updates) to end its sentences: the session's."""
    return small_run


@pytest.fixture
def run_dir(trained, tmp_path) -> Path:
    """A copy of the trained run (its checkpoints and tokenizer, no conversion yet) for one test."""
    copy = tmp_path / "run"
    shutil.copytree(trained, copy, ignore=shutil.ignore_patterns("ctranslate2", "cache", "tensorboard", "*.state.pt"))
    return copy


def first_line(run_dir: Path, *flags: str, command: str = "translate") -> tuple[int, str]:
    """(exit code, the first line on stderr as a terminal shows it: the progress bar redraws itself
    after each carriage return, and the line is written above it) of `command` on three test lines
    with `flags`."""
    src, ref = run_dir.parent / "three.es", run_dir.parent / "three.en"
    src.write_text("\n".join(LINES[:3]) + "\n", encoding="utf-8")
    ref.write_text("\n".join((SHIPPED / "test.en").read_text(encoding="utf-8").splitlines()[:3]) + "\n", encoding="utf-8")
    args = ["translate", "-m", str(run_dir), "-i", str(src), *flags] if command == "translate" else [
        "evaluate", "-m", str(run_dir), "--src", str(src), "--ref", str(ref), *flags]
    r = CliRunner().invoke(app, args)
    shown = [line.rsplit("\r", 1)[-1] for line in r.stderr.split("\n")]
    return r.exit_code, next((line for line in shown if line.strip()), "")


def test_no_flags_decode_with_ctranslate2_over_the_whole_vocabulary_and_say_so(run_dir):
    assert (run_dir / "shortlist.tsv").is_file()
    assert first_line(run_dir) == (0, f"translating with {run_dir} (es -> en, searched by CTranslate2)")
    assert first_line(run_dir, "--shortlist") == (0, f"translating with {run_dir} (es -> en, searched by CTranslate2, shortlist)")
    assert first_line(run_dir, "--engine", "torch") == (0, f"translating with {run_dir} (es -> en, our searches)")
    assert first_line(run_dir, "--engine", "torch", "--shortlist") == (
        0, f"translating with {run_dir} (es -> en, our searches, shortlist)")
    code, line = first_line(run_dir, "--sampling")
    assert code == 0 and line.endswith("our searches, not CTranslate2: sampling draws from each line's own "
                                       "seeded generator)")
    code, line = first_line(run_dir, "--nbest", "2")
    assert code == 0 and "our searches" in line and "n-best" in line
    code, line = first_line(run_dir, command="evaluate")
    assert (code, line) == (0, f"translating with {run_dir} (es -> en, searched by CTranslate2)")


def test_int8_says_whose_quantization_decodes(run_dir):
    assert first_line(run_dir, "--quantize", "int8") == (
        0, f"translating with {run_dir} (es -> en, searched by CTranslate2, int8 as CTranslate2 quantizes "
           "(outputs differ from --engine torch's))")
    assert first_line(run_dir, "--quantize", "int8", "--engine", "torch") == (
        0, f"translating with {run_dir} (es -> en, our searches, int8)")


def test_translate_evaluate_and_serve_default_to_auto():
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    for name in ("translate", "evaluate", "serve"):
        engine = next(p for p in commands[name].params if p.name == "engine")
        assert engine.default == "auto", name
        shortlist = next(p for p in commands[name].params if p.name == "shortlist")
        assert shortlist.default is None, name  # the run's decode.shortlist, whose default is null


def test_the_output_is_what_the_same_engine_gives_in_process(run_dir, tmp_path):
    src = tmp_path / "in.es"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    out = tmp_path / "out.en"
    r = CliRunner().invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "-o", str(out), "--no-split",
                                 "--no-progress"])
    assert r.exit_code == 0, r.output
    choice = load_translator([run_dir])
    assert choice.translator.engine is not None and choice.translator.shortlist_file is None
    assert out.read_text(encoding="utf-8").splitlines() == choice.translator.translate(LINES)


def test_a_run_without_a_shortlist_decodes_without_one_unless_asked(run_dir):
    (run_dir / "shortlist.tsv").unlink()
    assert first_line(run_dir) == (0, f"translating with {run_dir} (es -> en, searched by CTranslate2)")
    assert first_line(run_dir, "--engine", "torch") == (0, f"translating with {run_dir} (es -> en, our searches)")
    r = CliRunner().invoke(app, ["translate", "-m", str(run_dir), "--shortlist"], input="Hola.\n")
    assert r.exit_code == 1 and r.stderr.strip().splitlines() == [
        f"error: {run_dir / 'shortlist.tsv'}: the run has no shortlist (seq2seq train writes it from the training data "
        "when it starts); decode without --shortlist"]


def test_the_conversion_is_written_once_into_the_run(run_dir, monkeypatch, tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    first = load_translator([run_dir]).translator
    layout = RunLayout(run_dir)
    folder = layout.converted("best", sha256(layout.best))
    assert sorted(p.name for p in layout.ctranslate2.iterdir()) == [folder.name]
    assert (folder / "model.bin").is_file() and (folder / "vmap.txt").read_bytes() == layout.shortlist.read_bytes()
    assert list(tmp.iterdir()) == []

    def no_conversion(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(ctranslate2_engine, "convert_ctranslate2", no_conversion)
    again = load_translator([run_dir]).translator
    assert again.translate(LINES[:4]) == first.translate(LINES[:4])


def rewrite_weights(ckpt: Path) -> None:
    """Change `ckpt`'s weights a little, with a manifest that matches: the checkpoint training
    writes when it finds a better model."""
    from safetensors import safe_open

    with safe_open(str(ckpt), framework="pt") as f:
        meta = f.metadata()
    weights = load_file(str(ckpt))
    name = next(k for k, v in weights.items() if v.is_floating_point())
    weights[name] = weights[name] + 1e-3
    ckpt.unlink()  # best is a hard link to a step checkpoint's file
    save_file(weights, str(ckpt), metadata=meta)
    manifest = ckpt.with_suffix(".json")
    record = json.loads(manifest.read_text(encoding="utf-8"))
    manifest.unlink()
    manifest.write_text(json.dumps({**record, "sha256": {"weights": sha256(ckpt)}}), encoding="utf-8")


def test_a_changed_checkpoint_is_converted_again_and_its_old_conversion_removed(run_dir):
    layout = RunLayout(run_dir)
    load_translator([run_dir])
    old = layout.converted("best", sha256(layout.best))
    rewrite_weights(layout.best)
    load_translator([run_dir])
    new = layout.converted("best", sha256(layout.best))
    assert new != old and (new / "model.bin").is_file() and not old.exists()


def test_a_run_that_cannot_be_written_converts_into_a_temporary_folder(run_dir, monkeypatch, tmp_path, capsys):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))

    def read_only(dest):
        raise PermissionError(13, "Permission denied", str(dest.parent))

    monkeypatch.setattr(ctranslate2_cache, "replacing_dir", read_only)
    translator = load_translator([run_dir]).translator
    assert translator.engine is not None and translator.translate(LINES[:2])
    assert not any(RunLayout(run_dir).ctranslate2.glob("*/model.bin"))
    assert list(tmp.iterdir()) == []  # removed once CTranslate2 had loaded it
    assert "converted into a temporary folder" in capsys.readouterr().err


SLOW_CONVERSION = textwrap.dedent("""
    import sys, time
    from seq2seq_cli.convert.ctranslate2_cache import converted_model
    from seq2seq_cli.run.loaded import open_run

    def convert(folder):
        (folder / "model.bin").write_bytes(b"half")
        print("converting", flush=True)
        time.sleep(120)

    with converted_model(open_run(sys.argv[1]), convert):
        pass
""")


def test_sigterm_while_converting_leaves_no_temporary_folder(run_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen([sys.executable, "-c", SLOW_CONVERSION, str(run_dir)], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "converting"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert list(RunLayout(run_dir).ctranslate2.iterdir()) == []
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_line_the_engine_decodes_needs_no_torch_once_converted(run_dir):
    translator = load_translator([run_dir]).translator  # converts
    assert translator.engine is not None
    ends = [line for line in LINES if translator.engine.search(translator.encode([line]), translator.decode, 1)[0]]
    assert ends, "no line the engine decodes to its end"
    code = ("import sys; from seq2seq_cli.cli import main\n"
            "try:\n    main()\nfinally:\n    print('torch' in sys.modules, file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code, "translate", "-m", str(run_dir)], input=ends[0] + "\n",
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == translator.translate([ends[0]])[0]
    assert r.stderr.splitlines()[-1] == "False"


def test_blank_lines_are_scored_by_the_engine_as_by_our_search(run_dir):
    with_engine = load_translator([run_dir]).translator
    ours = load_translator([run_dir], engine=Engine.torch).translator
    got, want = (t.translate_hypotheses(["", LINES[0]])[0][0] for t in (with_engine, ours))
    assert got.tokens == want.tokens == []
    assert got.score == pytest.approx(want.score, abs=1e-4) and got.log_prob == pytest.approx(want.log_prob, abs=1e-4)


def test_without_ctranslate2_auto_decodes_with_our_searches(run_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 fails
    choice = load_translator([run_dir])
    assert choice.translator.engine is None
    assert choice.describe() == "es -> en, our searches, not CTranslate2: ctranslate2 is not installed"


@pytest.mark.parametrize("a,b", [(0.0, 0), (1.2, 10), (0.5, 1), (2.7, 3), (1000.0, 1_000_000), (1.1, 0)])
def test_one_sentence_s_output_limit_is_the_batch_s(a, b):
    lengths = list(range(0, 300, 7))
    assert [output_limit(n, 254, a, b) for n in lengths] == output_limits(torch.tensor(lengths), 254, a, b).tolist()
