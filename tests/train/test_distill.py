"""`seq2seq distill`: the teacher's pass (written as it goes, resumed where it stopped, never
translating a line twice), the student as an ordinary run on the teacher's tokenizer and
translations, the report, every refusal as one line, and `distill.nbest`: the one of the teacher's
n best closest to the original target is kept."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from distill_helpers import DOCUMENTED, REFUSALS, student_yaml
from sacrebleu.metrics import CHRF
from typer.testing import CliRunner

from helpers import documented_errors, one_error_line
from seq2seq_cli.cli import app
from seq2seq_cli.config_load import load_config
from seq2seq_cli.documents.sentences import Splitter, plan
from seq2seq_cli.fileio import read_lines, sha256
from seq2seq_cli.layout import RunLayout
from seq2seq_cli.run.loaded import open_run
from seq2seq_cli.train import distill as distilling
from seq2seq_cli.train import teacher as teaching
from seq2seq_cli.train.distill_choice import closest_line

runner = CliRunner()


class Counting:
    """A translate function that counts the lines it is given and stops the process (as Ctrl-C
    does) at its call number `stop_at`."""

    def __init__(self, translate, stop_at: int | None = None):
        self.translate, self.stop_at, self.lines, self.calls = translate, stop_at, 0, 0

    def __call__(self, lines: list[str], targets: list[str]) -> list[str]:
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt
        self.lines += len(lines)
        return self.translate(lines, targets)


@pytest.fixture
def teacher_translate(tiny_run):
    translate, path = teaching.teacher_translate(open_run(tiny_run), None)
    assert "searched by" in path or "our searches" in path
    return translate


def test_an_interrupted_teachers_pass_resumes_without_translating_a_line_twice(
        tiny_run, corpus_dir, tmp_path, teacher_translate, monkeypatch):
    monkeypatch.setattr(teaching, "CHUNK", 64)
    config = load_config(student_yaml(tmp_path, corpus_dir, tiny_run))
    _, teacher = distilling.student_config(config)
    first = Counting(teacher_translate, stop_at=4)
    with pytest.raises(KeyboardInterrupt):
        teaching.teacher_passes(config, teacher, first, progress=False)
    out = teaching.distilled_path(config, 0)
    partial = out.with_name(out.name + ".partial")
    assert first.lines == 3 * 64 and not out.exists()
    assert len(read_lines(partial)) == 3 * 64
    with open(partial, "ab") as f:  # a process killed while writing its 4th chunk leaves a torn row behind
        f.write(b'{"es": "torn')
    second = Counting(teacher_translate)
    teaching.teacher_passes(config, teacher, second, progress=False)
    assert first.lines + second.lines == 400  # the corpus's 400 lines, each once
    resumed = [json.loads(line) for line in read_lines(out)]
    assert [r["es"] for r in resumed] == read_lines(corpus_dir / "train.es")

    again = tmp_path / "again"
    again.mkdir()
    whole = load_config(student_yaml(again, corpus_dir, tiny_run))
    teaching.teacher_passes(whole, teacher, teacher_translate, progress=False)
    assert read_lines(teaching.distilled_path(whole, 0)) == read_lines(out)  # as if never stopped
    third = Counting(teacher_translate)
    teaching.teacher_passes(config, teacher, third, progress=False)
    assert third.lines == 0  # complete: nothing translated again


def test_a_pass_of_another_teacher_starts_over(tiny_run, corpus_dir, tmp_path, teacher_translate, monkeypatch):
    monkeypatch.setattr(teaching, "CHUNK", 100)
    config = load_config(student_yaml(tmp_path, corpus_dir, tiny_run))
    _, teacher = distilling.student_config(config)
    with pytest.raises(KeyboardInterrupt):
        teaching.teacher_passes(config, teacher, Counting(teacher_translate, stop_at=2), progress=False)
    teacher.weights_sha256 = "0" * 64  # the teacher trained on meanwhile
    said: list[str] = []
    fresh = Counting(teacher_translate)
    teaching.teacher_passes(config, teacher, fresh, progress=False, log=said.append)
    assert fresh.lines == 400
    assert any("another teacher checkpoint" in line for line in said), said


def test_the_student_is_an_ordinary_run_of_the_teachers_tokenizer_and_translations(small_run, corpus_dir, tmp_path):
    tiny_run = small_run  # a teacher that writes sentences
    cfg = student_yaml(tmp_path, corpus_dir, tiny_run)
    result = runner.invoke(app, ["distill", "--config", str(cfg), "--no-progress", "--no-report"])
    assert result.exit_code == 0, result.output
    student = tmp_path / "student"
    assert result.stdout.strip().splitlines()[-1] == str(student)
    assert sha256(student / "spm.model") == sha256(tiny_run / "spm.model")
    saved = load_config(student / "config.yaml")
    assert saved.distill is not None and saved.distill.teacher == str(tiny_run)
    # the distilled corpus, and the original one at its share (distill.original_weight: 1.0)
    assert [(c.path, c.weight) for c in saved.data.corpora] == [(str(student / "distilled" / "train-1.jsonl"), 1.0),
                                                                (str(corpus_dir / "train"), 1.0)]
    assert (student / "shortlist.tsv").is_file() and RunLayout(student).best.is_file()
    translated = runner.invoke(app, ["translate", "--model", str(student)], input="Y dijo Dios.\n")
    assert translated.exit_code == 0 and len(translated.stdout.splitlines()) == 1, translated.output
    # run again: nothing translated again, training resumes (at its end already) and stops
    again = runner.invoke(app, ["distill", "--config", str(cfg), "--no-progress", "--no-report"])
    assert again.exit_code == 0, again.output
    assert "are there already" in again.stderr and "training resumes" in again.stderr


def test_original_targets_join_at_their_share_of_the_weight(tiny_run, corpus_dir, tmp_path):
    config = load_config(student_yaml(tmp_path, corpus_dir, tiny_run), ["distill.original_weight=0.5"])
    student, _ = distilling.student_config(config)
    assert [(Path(c.path).name, c.weight) for c in student.data.corpora] == [("train-1.jsonl", 1.0), ("train", 0.5)]
    assert student.tokenizer.src_model == str(tiny_run / "spm.model")


def test_distill_ends_with_the_table_of_teacher_and_student(small_run, corpus_dir, tmp_path, monkeypatch):
    tiny_run = small_run  # a teacher that writes sentences
    cfg = student_yaml(tmp_path, corpus_dir, tiny_run)
    other = tmp_path / "elsewhere" / "seq2seq_cli"  # another checkout in the working directory is not what measures
    other.mkdir(parents=True)
    (other / "__main__.py").write_text("raise SystemExit('not this package')\n", encoding="utf-8")
    monkeypatch.chdir(other.parent)
    result = runner.invoke(app, ["distill", "--config", str(cfg), "--no-progress"])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "student" / "distill_report.json").read_text(encoding="utf-8"))
    for role in ("teacher", "student"):
        figures = report[role]
        assert 0 <= figures["bleu"] <= 100 and figures["lines_per_s"] > 0 and figures["lone_ms"] > 0
        assert 50 < figures["peak_rss_mb"] < 2000  # the translate command's own, not this process's
        assert "translating with" in figures["path"]
    assert report["teacher"]["size_mb"] == pytest.approx(RunLayout(tiny_run).best.stat().st_size / 1e6)
    rows = result.stdout.splitlines()
    assert rows[0].split() == ["teacher", "student", "student"]
    assert any(r.startswith("test BLEU") for r in rows) and any(r.startswith("peak RSS") for r in rows)


ERROR_CASES = {
    "no-teacher": (lambda tmp, teacher: [], "distill.teacher", "give --teacher RUN"),
    "not-a-run": (lambda tmp, teacher: ["--teacher", str(tmp / "nowhere")], "nowhere", "model not found"),
    "own-teacher": (lambda tmp, teacher: ["--teacher", str(tmp / "student")], "its teacher"),
    "other-languages": (lambda tmp, teacher: ["--teacher", str(teacher), "--set", "data.src_lang=fr"], "fr -> en",
                        "es -> en"),
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_bad_distillation_is_one_line(case, tiny_run, corpus_dir, tmp_path):
    make, *fragments = ERROR_CASES[case]
    cfg = student_yaml(tmp_path, corpus_dir, None)
    if case == "own-teacher":
        shutil.copytree(tiny_run, tmp_path / "student")
    if case == "other-languages":
        for split in ("train", "valid", "test"):
            shutil.copy(corpus_dir / f"{split}.es", corpus_dir / f"{split}.fr")
    result = runner.invoke(app, ["distill", "--config", str(cfg), *make(tmp_path, tiny_run)])
    one_error_line(result, *fragments)
    assert not (tmp_path / "student" / "distilled").exists()


def test_every_error_case_is_documented():
    assert set(documented_errors("Distillation")) == set(ERROR_CASES) | set(REFUSALS) | DOCUMENTED


def test_the_table_says_how_many_times_faster_the_student_is():
    from seq2seq_cli.train.distill_report import table

    teacher = {"bleu": 22.0, "chrf": 44.0, "lines_per_s": 100.0, "lone_ms": 20.0, "size_mb": 20.0, "peak_rss_mb": 300.0,
               "path": "translating with t"}
    student = {"bleu": 21.5, "chrf": 44.5, "lines_per_s": 300.0, "lone_ms": 5.0, "size_mb": 10.0, "peak_rss_mb": 150.0,
               "path": "translating with s"}
    rows = {line.split("  ")[0]: line for line in table({"teacher": teacher, "student": student}).splitlines()}
    assert rows["test BLEU"].endswith("-0.50") and rows["test chrF"].endswith("+0.50")
    assert rows["lines/s, translate (whole command)"].endswith("3.00x as fast")
    assert rows["one sentence alone, ms (median)"].endswith("4.00x as fast")
    assert rows["checkpoint, MB"].endswith("0.50x") and rows["peak RSS of translate, MB"].endswith("0.50x")


def test_a_student_starts_from_the_teachers_tensors_that_fit(tmp_path):
    import torch
    from safetensors.torch import save_file

    from conftest import tiny_model
    from seq2seq_cli.run.checkpoint import load_matching

    teacher = tiny_model(seed=1, encoder_layers=2, decoder_layers=2)
    student = tiny_model(seed=2, encoder_layers=3, decoder_layers=1)
    path = tmp_path / "teacher.safetensors"
    # as a checkpoint holds them: the tied target embedding is the source one
    save_file({k: v.contiguous() for k, v in teacher.state_dict().items() if k != "tgt_embed.tokens.weight"}, str(path))
    fresh = {k: v.clone() for k, v in student.state_dict().items()}
    copied, total = load_matching(student, path)
    after, given = student.state_dict(), teacher.state_dict()
    for name, value in after.items():
        if name.startswith(("encoder.0.", "encoder.1.", "decoder.0.", "src_embed.", "tgt_embed.")):
            assert torch.equal(value, given[name]), name
        else:  # the third encoder layer, the teacher's second decoder layer has no place here
            assert torch.equal(value, fresh[name]), name
    shared = ("encoder.0.", "encoder.1.", "decoder.0.", "src_embed.tokens")
    assert copied == sum(1 for n in after if n in given and n.startswith(shared))
    assert total == len(after) and 0 < copied < total


def test_the_sources_are_read_a_chunk_at_a_time_and_hashed_as_one_text():
    import hashlib

    import datasets

    lines = [f"línea {i}" for i in range(70_000)]
    sources = teaching.Sources(datasets.Dataset.from_dict({"src": lines, "tgt": lines}).select(range(3, 70_000)))
    assert len(sources) == 69_997 and sources[0:2] == lines[3:5] and sources[69_990:80_000] == lines[69_993:]
    assert sources.sha256() == hashlib.sha256("\n".join(lines[3:]).encode()).hexdigest()


# distill.nbest: the teacher's translation kept is the one of its n best closest to the original target

CHRF_SCORE = CHRF()


def chrf(hyp: str, ref: str) -> float:
    return CHRF_SCORE.sentence_score(hyp, [ref]).score


def test_each_sentence_takes_the_candidate_that_brings_the_line_closest():
    split = Splitter("en").split("Uno. Dos.")
    candidates = [["The dog runs.", "A dog ran."], ["It is red.", "It was red.", "Red."]]
    assert closest_line(candidates, split, "A dog ran. It was red.", chrf) == "A dog ran. It was red."
    assert closest_line([["x", "a b c", "a b"]], None, "a b c", chrf) == "a b c"


def test_ties_keep_the_teachers_order():
    assert closest_line([["first", "second", "third"]], None, "ref", lambda hyp, ref: 1.0) == "first"
    assert closest_line([["a", "b"], ["c", "d"]], Splitter("en").split("Uno. Dos."), "r", lambda hyp, ref: 0.0) == "a c"


def test_the_kept_line_is_one_of_the_n_best_and_no_further_from_the_reference_than_the_best(tiny_run, corpus_dir):
    teacher = open_run(tiny_run)
    sources = read_lines(corpus_dir / "train.es")[:48]
    targets = read_lines(corpus_dir / "train.en")[:48]
    best, _ = teaching.teacher_translate(teacher, 4, 1)
    kept_of_4, path = teaching.teacher_translate(teacher, 4, 4)
    assert "closest to its original target (chrF) of the 4 best" in path
    firsts, kept = best(sources, targets), kept_of_4(sources, targets)
    assert all(chrf(k, ref) >= chrf(f, ref) - 1e-9 for k, f, ref in zip(kept, firsts, targets, strict=True))
    assert sum(chrf(k, ref) > chrf(f, ref) + 1e-9 for k, f, ref in zip(kept, firsts, targets)) >= 5
    # every kept line is one of the teacher's own n best (its CTranslate2 lists, as the pass takes them)
    import dataclasses

    from seq2seq_cli.decode.loading import load_translator

    t = load_translator([tiny_run], "auto", {"beam_size": 4}).translator
    assert t.engine is not None
    t = t.with_engine(dataclasses.replace(t.engine, any_nbest=True))
    split = plan(sources, Splitter("es"))
    options = [{t.tgt_sp.decode(h.tokens) for h in hs} for hs in t.translate_hypotheses(split.units, 4)]
    starts = split.first_unit()
    for line, k in enumerate(kept[:12]):
        if split.splits[line] is None:
            assert k in options[starts[line]], (line, k)


def test_a_pass_chosen_from_another_nbest_starts_over(tiny_run, corpus_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(teaching, "CHUNK", 100)
    config = load_config(student_yaml(tmp_path, corpus_dir, tiny_run))
    _, teacher = distilling.student_config(config)
    echo = lambda sources, targets: [s.upper() for s in sources]  # noqa: E731
    with pytest.raises(KeyboardInterrupt):
        teaching.teacher_passes(config, teacher, Counting(echo, stop_at=3), progress=False)
    progress = teaching.distilled_path(config, 0).with_name("train-1.progress.json")
    assert json.loads(progress.read_text())["nbest"] == config.distill.nbest == 8
    fewer = config.model_copy(update={"distill": config.distill.model_copy(update={"nbest": 1})})
    said: list[str] = []
    fresh = Counting(echo)
    teaching.teacher_passes(fewer, teacher, fresh, progress=False, log=said.append)
    assert fresh.lines == 400
    assert any("chosen from the teacher's 8 best, not 1; the pass starts over" in line for line in said), said
    assert "nbest" not in json.loads(progress.read_text())  # nbest 1 records as before nbest was kept


def test_the_beam_must_hold_the_n_best(tmp_path, corpus_dir, tiny_run):
    from seq2seq_cli.errors import UserError

    path = student_yaml(tmp_path, corpus_dir, tiny_run)
    raw = yaml.safe_load(path.read_text())
    raw["distill"].update({"beam_size": 4, "nbest": 8})
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(UserError, match=r"beam_size \(4\) is below nbest \(8\)"):
        load_config(path)
