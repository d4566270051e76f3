"""Decoding, evaluation and averaging under hostile but realistic use: outputs that would
destroy an input or the run, n-best line counts, sampling seeds, stdin answered as it
arrives, option ranges, blank lines and byte-order marks, plots and signals, unknown words."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import REPO, SHIPPED
from helpers import train_shipped_tiny
from seq2seq_cli.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny run trained for 4 updates, with step checkpoints at 2 and 4."""
    return train_shipped_tiny(tmp_path_factory.mktemp("decode"), max_steps=4, valid_every=2, keep_last=2)


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


@pytest.mark.parametrize("name, owner", [("spm.model", "spm.model"), ("config.yaml", "config.yaml"),
                                         ("metrics.jsonl", "metrics.jsonl"), ("checkpoints/best.safetensors", "checkpoints"),
                                         ("checkpoints/x", "checkpoints"), ("cache/new.txt", "cache"), (".lock", ".lock")])
def test_translate_refuses_to_write_a_path_the_run_owns(run, name, owner):
    target = run / name
    before = target.read_bytes() if target.is_file() else None
    r = runner.invoke(app, ["translate", "-m", str(run), "-o", str(target), "--no-progress"], input="hola\n")
    one_error_line(r, f"{target}: belongs to the model's run {run} ({owner}); write the translation to another file")
    assert (target.read_bytes() if target.is_file() else None) == before


@pytest.mark.parametrize("name", ["spm.model", "config.yaml", "checkpoints/x"])
def test_evaluate_refuses_to_write_a_path_the_run_owns(run, name):
    target = run / name
    before = target.read_bytes() if target.is_file() else None
    r = runner.invoke(app, ["evaluate", "-m", str(run), "--src", str(SHIPPED / "test.es"), "--ref", str(SHIPPED / "test.en"),
                            "-o", str(target)])
    one_error_line(r, f"{target}: belongs to the model's run {run}", "write the translations to another file")
    assert (target.read_bytes() if target.is_file() else None) == before


def test_a_new_file_beside_the_run_s_files_is_the_user_s(run, tmp_path):
    """evaluate -o RUN/test.hyp.en writes there (as the quick start does); training with --resume or
    --overwrite leaves such a file alone."""
    run = Path(shutil.copytree(run, tmp_path / "copy"))
    src, ref = tmp_path / "e.es", tmp_path / "e.en"
    src.write_text("hola\nadiós\n", encoding="utf-8")
    ref.write_text("hello\ngoodbye\n", encoding="utf-8")
    hyp = run / "test.hyp.en"
    r = runner.invoke(app, ["evaluate", "-m", str(run), "--src", str(src), "--ref", str(ref), "-o", str(hyp), "-b", "1"])
    assert r.exit_code == 0, r.output
    assert "BLEU|" in r.stdout and len(hyp.read_text(encoding="utf-8").splitlines()) == 2
    r = runner.invoke(app, ["translate", "-m", str(run), "-o", str(run / "mine.txt"), "--no-progress"], input="hola\n")
    assert r.exit_code == 0 and (run / "mine.txt").read_text(encoding="utf-8").count("\n") == 1
    written = hyp.read_bytes()
    for flag in ("--resume", "--overwrite"):
        r = runner.invoke(app, ["train", "-c", str(run / "config.yaml"), flag, "--no-progress",
                                "--set", "train.max_steps=5", "--set", "train.valid_every=5"])
        assert r.exit_code == 0, r.output
        assert hyp.read_bytes() == written, flag
        assert (run / "mine.txt").is_file(), flag


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
    args = ["translate", "-m", str(run), "--sampling", "--seed", "3", "--max-len-a", "0", "--max-len-b", "8",
            "--batch-tokens", "8"]  # a few sentences per batch: each batch must not start the same samples over
    r = runner.invoke(app, args, input="hola amigo\n" * 40)
    assert r.exit_code == 0, r.output
    rows = r.stdout.splitlines()
    assert len(rows) == 40 and len(set(rows)) >= 20


def test_samples_do_not_depend_on_batches_chunks_or_threads(run, sentences):
    import torch

    from seq2seq_cli.decode.translate import Translator
    from seq2seq_cli.documents.lines import OutputOptions, translate_stream

    lines = sentences[:6] * 2
    settings = {"sampling": True, "seed": 5, "max_len_a": 0, "max_len_b": 8}
    outputs = []
    threads = torch.get_num_threads()
    try:
        for batch_tokens, chunk_lines, n_threads in ((100000, 10000, 1), (8, 5, 1), (30, 7, 2)):
            torch.set_num_threads(n_threads)
            tr = Translator.load(run, "cpu", {**settings, "batch_tokens": batch_tokens})
            outputs.append(list(translate_stream(tr, lines, OutputOptions(nbest=2), chunk_lines=chunk_lines)))
    finally:
        torch.set_num_threads(threads)
    assert outputs[0] == outputs[1] == outputs[2]
    assert len(outputs[0]) == 24 and outputs[0][:12] != outputs[0][12:]  # the copies got samples of their own
    tr = Translator.load(run, "cpu", {**settings, "seed": 6})
    assert list(translate_stream(tr, lines, OutputOptions(nbest=2))) != outputs[0]


# --------------------------------------------------------------------------- stdin answered as it arrives


def read_line_within(stream, seconds: float) -> str:
    """The next line of a pipe, or AssertionError when none comes within `seconds`."""
    import select

    deadline = time.monotonic() + seconds
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        assert left > 0 and select.select([stream], [], [], left)[0], f"no line within {seconds} s (got {line!r})"
        byte = os.read(stream.fileno(), 1)
        assert byte, f"output ended (got {line!r})"
        line += byte
    return line.decode("utf-8")


def test_a_pipe_is_answered_line_by_line_before_its_end(run):
    """A program writes a line and waits for its translation before writing the next."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "seq2seq_cli", "translate", "-m", str(run), "--device", "cpu"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=subprocess_env(),
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        answers = []
        for line in ("hola", "adiós amigo", ""):
            proc.stdin.write(line.encode("utf-8") + b"\n")
            proc.stdin.flush()
            answers.append(read_line_within(proc.stdout, 240 if not answers else 60))
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
        assert answers[2] == "\n" and proc.stdout.read() == b""
    finally:
        proc.kill()
        proc.wait()
    one = runner.invoke(app, ["translate", "-m", str(run), "--device", "cpu"], input="hola\nadiós amigo\n\n")
    assert one.stdout.splitlines() == [a.rstrip("\n") for a in answers]


# --------------------------------------------------------------------------- option ranges and stdin bytes


@pytest.mark.parametrize("data, line, offset", [(b"hola\n\xff\xfe\n", 2, 0), (b"hola\nad\xc3i\xc3\xb3s\n", 2, 2)])
def test_invalid_utf8_on_stdin_names_stdin_and_the_line(run, data, line, offset):
    r = runner.invoke(app, ["translate", "-m", str(run), "--device", "cpu"], input=data)
    one_error_line(r, f"<stdin>:{line}: invalid UTF-8 at byte {offset} of the line")


def test_a_byte_order_mark_is_skipped_on_stdin_and_in_an_input_file(run, tmp_path):
    """An editor's BOM in front of the first line is not text to translate, on stdin or in -i."""
    plain = runner.invoke(app, ["translate", "-m", str(run), "--device", "cpu"], input="hola\nadiós\n")
    assert plain.exit_code == 0, plain.output
    bom = runner.invoke(app, ["translate", "-m", str(run), "--device", "cpu"], input="\ufeffhola\nadiós\n".encode())
    assert bom.exit_code == 0 and bom.stdout == plain.stdout, bom.output
    src = tmp_path / "bom.es"
    src.write_text("\ufeffhola\nadiós\n", encoding="utf-8")
    from_file = runner.invoke(app, ["translate", "-m", str(run), "--device", "cpu", "-i", str(src)])
    assert from_file.exit_code == 0 and from_file.stdout == plain.stdout, from_file.output


def test_invalid_utf8_on_a_real_pipe_names_stdin_and_the_line(run):
    proc = subprocess.run([sys.executable, "-m", "seq2seq_cli", "translate", "-m", str(run), "--device", "cpu"],
                          input=b"hola\n\xff\n", capture_output=True, env=subprocess_env(), timeout=300)
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr
    last = proc.stderr.decode().strip().splitlines()[-1]
    assert last == "error: <stdin>:2: invalid UTF-8 at byte 0 of the line (invalid start byte)"


@pytest.mark.parametrize("flags", [
    ["--sampling", "--temperature", "1e-45"], ["--sampling", "--temperature", "inf"], ["--sampling", "--temperature", "nan"],
    ["--max-len-b", "100000000000000000000"], ["--max-len-a", "1e30"], ["--max-len-a", "inf"],
    ["--length-penalty", "-1e308"], ["--length-penalty", "inf"], ["--beam-size", "301"],
])
def test_out_of_range_decoding_options_are_refused_up_front(run, flags):
    r = runner.invoke(app, ["translate", "-m", str(run), "--device", "cpu", *flags], input="hola\n")
    one_error_line(r, flags[-2])
    assert r.stdout == ""


def test_the_run_config_beam_size_above_the_vocabulary_names_the_config(run, monkeypatch):
    from seq2seq_cli.decode import translate as module
    from seq2seq_cli.errors import UserError

    real = module.load_run

    def with_beam(*args, **kwargs):
        loaded = real(*args, **kwargs)
        decode = loaded.config.decode.model_copy(update={"beam_size": 500})
        loaded.config = loaded.config.model_copy(update={"decode": decode})
        return loaded

    monkeypatch.setattr(module, "load_run", with_beam)
    with pytest.raises(UserError, match=r"^decode.beam_size \(the run's config\) 500: larger than the target vocabulary"):
        module.Translator.load(run, "cpu")


# --------------------------------------------------------------------------- evaluate and scores


def test_evaluate_ignores_a_byte_order_mark(tmp_path):
    hyp, bom, ref = tmp_path / "hyp.en", tmp_path / "bom.en", tmp_path / "ref.en"
    hyp.write_text("the cat sat on the mat\ngood morning\n", encoding="utf-8")
    bom.write_text("\ufeffthe cat sat on the mat\ngood morning\n", encoding="utf-8")
    ref.write_text("\ufeffthe cat sat on the mat\ngood morning\n", encoding="utf-8")
    plain = runner.invoke(app, ["evaluate", "--hyp", str(hyp), "--ref", str(ref), "--json"])
    marked = runner.invoke(app, ["evaluate", "--hyp", str(bom), "--ref", str(ref), "--json"])
    assert plain.exit_code == marked.exit_code == 0, plain.output + marked.output
    assert plain.stdout == marked.stdout and '"bleu": 100.0' in plain.stdout


def test_evaluate_hyp_with_an_output_is_refused(tmp_path):
    hyp, ref, out = tmp_path / "hyp.en", tmp_path / "ref.en", tmp_path / "x.en"
    hyp.write_text("hello\n", encoding="utf-8")
    ref.write_text("hello\n", encoding="utf-8")
    r = runner.invoke(app, ["evaluate", "--hyp", str(hyp), "--ref", str(ref), "-o", str(out)])
    one_error_line(r, f"-o {out}: --output writes the translations of --src; with --hyp {hyp} there is nothing to translate")
    assert not out.exists()


def test_a_blank_line_is_scored_as_the_empty_translation(run):
    import torch

    from helpers import sequence_log_prob
    from seq2seq_cli.decode.translate import Translator
    from seq2seq_cli.ids import EOS

    r = runner.invoke(app, ["translate", "-m", str(run), "--device", "cpu", "--scores", "--beam-size", "2", "--nbest", "2"],
                      input="hola\n\n")
    assert r.exit_code == 0, r.output
    rows = r.stdout.splitlines()
    assert len(rows) == 4
    assert rows[2].split("\t")[0] == "" and rows[3] == "\t-inf"
    tr = Translator.load(run, "cpu")
    expected = sequence_log_prob(tr.model, torch.tensor([EOS]), [])  # log P(EOS | empty source), lp(1) = 1
    assert float(rows[2].split("\t")[1]) == pytest.approx(expected, abs=1e-4) and expected < 0


# --------------------------------------------------------------------------- plots and signals


def test_attention_plots_onto_a_file_fails_before_decoding(run, tmp_path, monkeypatch):
    from seq2seq_cli.decode import translate as module

    taken = tmp_path / "plots"
    taken.write_text("not a directory\n", encoding="utf-8")
    monkeypatch.setattr(module, "search", lambda *a, **k: pytest.fail("decoded before checking --attention-plots"))
    r = runner.invoke(app, ["translate", "-m", str(run), "--attention-plots", str(taken)], input="hola\n")
    one_error_line(r, f"{taken}: --attention-plots names a directory to write one PNG per sentence into; this is a file")
    r = runner.invoke(app, ["translate", "-m", str(run), "--attention-plots", str(taken / "sub")], input="hola\n")
    one_error_line(r, f"{taken / 'sub'}: cannot create the --attention-plots directory")


@pytest.mark.parametrize("from_file", [True, False])
def test_many_attention_plots_are_warned_about(run, tmp_path, monkeypatch, from_file):
    from seq2seq_cli.documents import lines, text

    drawn: list[Path] = []
    monkeypatch.setattr(text, "PLOT_WARNING", 3)
    monkeypatch.setattr(lines, "plot_attention", lambda weights, src, tgt, path: drawn.append(path))
    src = tmp_path / "in.es"
    src.write_text("hola\nadiós\nsí\nno\n", encoding="utf-8")
    args = ["translate", "-m", str(run), "--attention-plots", str(tmp_path / "plots"), "--no-progress"]
    few = runner.invoke(app, args, input="hola\nadiós\n")
    assert few.exit_code == 0 and "warning" not in few.stderr
    r = runner.invoke(app, [*args, "-i", str(src)] if from_file else args, input=None if from_file else src.read_text())
    assert r.exit_code == 0, r.output
    want = "4 sentences" if from_file else "more than 3 sentences"
    assert r.stderr.count("warning: --attention-plots draws one PNG per sentence") == 1 and want in r.stderr
    assert len(drawn) == 6


def test_sigterm_while_writing_an_output_leaves_no_temporary_file(run, tmp_path, sentences):
    src, out = tmp_path / "many.es", tmp_path / "out.en"
    src.write_text("\n".join(sentences * 300) + "\n", encoding="utf-8")
    out.write_text("earlier results\n", encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, "-m", "seq2seq_cli", "translate", "-m", str(run), "-i", str(src), "-o", str(out),
         "--device", "cpu", "--batch-tokens", "64", "--no-progress"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=subprocess_env(),
    )
    try:
        deadline = time.monotonic() + 240
        while not list(tmp_path.glob(".out.en.*.tmp")):
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "no temporary output file appeared"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many.es", "out.en"]
    assert out.read_text(encoding="utf-8") == "earlier results\n"


# --------------------------------------------------------------------------- unknown words and attention options


def test_replace_unk_puts_the_most_attended_source_piece_in_place_of_unk(run):
    import torch

    from seq2seq_cli.decode.translate import Translator
    from seq2seq_cli.ids import UNK

    tr = Translator.load(run, "cpu", {"replace_unk": True})
    line = "Jerusalén grande"
    surfaces = [p.surface for p in tr.src_sp.encode(line, return_type="proto").pieces]
    the = tr.tgt_sp.piece_to_id("\u2581the")
    assert the != UNK
    for i in range(len(surfaces)):
        attention = torch.zeros(3, len(surfaces) + 1)  # rows: the, <unk>, EOS; columns: pieces, EOS
        attention[1, i] = 1.0
        assert tr.render([the, UNK], line, attention) == ("the" + surfaces[i]).strip()
    plain = Translator.load(run, "cpu")
    assert plain.render([the, UNK], line, attention) == tr.tgt_sp.decode([the, UNK])


def test_replace_unk_in_translation_follows_the_cross_attention(run, monkeypatch):
    from seq2seq_cli.decode import translate as module
    from seq2seq_cli.decode.search import Hypothesis
    from seq2seq_cli.documents.lines import OutputOptions, translate_stream
    from seq2seq_cli.ids import UNK

    tr = module.Translator.load(run, "cpu", {"replace_unk": True, "beam_size": 1})
    the = tr.tgt_sp.piece_to_id("\u2581the")
    monkeypatch.setattr(module, "search", lambda model, src, opts, nbest=1, lines=None: [[Hypothesis([the, UNK], -1.0, -1.0)]
                                                                                         for _ in range(src.size(0))])
    line = "Jerusalén grande"
    [row] = translate_stream(tr, [line], OutputOptions())
    ids = tr.encode([line])[0]
    column = int(tr.cross_attention(ids, [the, UNK], -1, None)[1, : len(ids) - 1].argmax())
    surfaces = [p.surface for p in tr.src_sp.encode(line, return_type="proto").pieces]
    assert row == ("the" + surfaces[column]).strip() and "\u2047" not in row


def test_attention_is_computed_only_for_hypotheses_that_use_it(run, sentences, monkeypatch):
    from seq2seq_cli.decode.translate import Translator
    from seq2seq_cli.documents.lines import OutputOptions, translate_stream

    calls: list[int] = []
    tr = Translator.load(run, "cpu", {"replace_unk": True, "ban_unk": True, "beam_size": 3})
    real = tr.cross_attention
    monkeypatch.setattr(tr, "cross_attention", lambda *a: calls.append(1) or real(*a))
    rows = list(translate_stream(tr, sentences[:4], OutputOptions(nbest=3)))
    assert len(rows) == 12 and calls == []  # no <unk> in any output: no extra attention pass
    list(translate_stream(tr, sentences[:4], OutputOptions(nbest=3, attention_plots=None, alignment=True)))
    assert len(calls) == 12


def test_attention_layer_and_head_choose_the_weights(run, sentences):
    import torch

    from seq2seq_cli.decode.translate import Translator
    from seq2seq_cli.documents.lines import OutputOptions, translate_stream

    tr = Translator.load(run, "cpu", {"beam_size": 1})
    ids = tr.encode(sentences[:1])[0]
    tokens = tr.translate_hypotheses(sentences[:1])[0][0].tokens
    heads = [tr.cross_attention(ids, tokens, -1, h) for h in range(tr.model.cfg.heads)]
    assert torch.allclose(tr.cross_attention(ids, tokens, 0, None), torch.stack(heads).mean(dim=0), atol=1e-6)
    assert not torch.allclose(heads[0], heads[1])
    for h in range(tr.model.cfg.heads):
        [row] = translate_stream(tr, sentences[:1], OutputOptions(alignment=True, attention_head=h))
        pairs = [tuple(map(int, p.split("-"))) for p in row.split("\t")[1].split()]
        assert [i for i, _ in pairs] == heads[h][: len(tokens), : len(ids) - 1].argmax(dim=1).tolist()


@pytest.mark.parametrize("flags, message", [
    (["--attention-layer", "1"], "--attention-layer 1: the model has 1 decoder layers"),
    (["--attention-layer", "-2"], "--attention-layer -2: the model has 1 decoder layers"),
    (["--attention-head", "2"], "--attention-head 2: the model has 2 heads"),
])
def test_attention_layer_or_head_out_of_range_is_one_line(run, flags, message):
    r = runner.invoke(app, ["translate", "-m", str(run), "--alignment", *flags], input="hola\n")
    one_error_line(r, message)


def test_one_function_owns_the_output_limit(run):
    import torch

    from seq2seq_cli.decode.search import max_lengths, max_source_subwords
    from seq2seq_cli.decode.translate import Translator
    from seq2seq_cli.ids import EOS, PAD

    tr = Translator.load(run, "cpu")
    cap = max_source_subwords(tr.model)
    assert cap == tr.model.cfg.max_positions - 2
    src = torch.tensor([[5, 6, EOS, PAD], [5, 6, 7, EOS]])
    assert max_lengths(src, tr.model, 1000.0, 1_000_000).tolist() == [cap, cap]  # never overflows to 0
    assert max_lengths(src, tr.model, 1.5, 1).tolist() == [5, 7]
    long_line = " ".join(["Jerusalén"] * 400)
    assert len(tr.encode([long_line])[0]) == cap + 1  # the source cut to the same cap, EOS added


def test_stdin_s_first_line_loses_its_byte_order_mark():
    import io

    from seq2seq_cli.documents.streams import stdin_chunks

    chunks = list(stdin_chunks(io.BytesIO("\ufeffhola\n\ufeffadiós\n".encode()), 10))  # no descriptor
    assert chunks == [["hola", "\ufeffadiós"]]
