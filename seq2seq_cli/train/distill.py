"""Sequence-level distillation: a teacher run translates the sources of a student's training
corpora, and the student trains on the teacher's translations (`seq2seq distill`).

The teacher's passes (`teacher.py`) write STUDENT/distilled/train-N.jsonl, one per corpus of the
student's data.train, resumed where they stopped.

The student is then an ordinary run: it takes the teacher's SentencePiece model (so the
shortlist and the exports work unchanged), trains on the distilled corpora (each with its
corpus's weight and tag, and the original corpora too at `distill.original_weight` of
theirs), and resumes where it stopped when `distill` is run again. STUDENT/distilled/teacher.json
records the teacher whose translations its checkpoints learned; a student is not resumed on
another teacher's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from seq2seq_cli.config import Config, CorpusConfig
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import atomic_write_text
from seq2seq_cli.layout import RunLayout
from seq2seq_cli.run import runlock
from seq2seq_cli.run.loaded import RunFiles, open_run
from seq2seq_cli.train.teacher import Translate, distilled_path, separate_teacher_passes, teacher_passes


def student_config(config: Config) -> tuple[Config, RunFiles]:
    """`config` (a student's, with `distill.teacher`) checked against its teacher -> (the
    config the student trains with: the teacher's tokenizer, the distilled corpora, the teacher run)."""
    if config.distill is None or config.distill.teacher is None:
        raise UserError(f"{config.where('distill', 'teacher')}: no teacher; give --teacher RUN or set distill.teacher")
    teacher = open_run(config.distill.teacher)
    tc = teacher.config
    if tc.tokenizer.vocabulary != "sentencepiece":
        raise UserError(f"{teacher.run_dir}: its vocabulary is a file of pieces (an imported model); a student "
                        "learns from a run with a SentencePiece vocabulary")
    if (tc.data.src_lang, tc.data.tgt_lang) != (config.data.src_lang, config.data.tgt_lang):
        raise UserError(f"{config.where('data', 'src_lang')}: the student translates {config.data.src_lang} -> "
                        f"{config.data.tgt_lang}, its teacher {teacher.run_dir} {tc.data.src_lang} -> {tc.data.tgt_lang}")
    if config.data.format not in ("auto", "jsonl"):
        raise UserError(f"{config.where('data', 'format')}: {config.data.format}; the distilled corpora are JSONL "
                        "files, read with format auto (each file by its name)")
    mine, theirs = config.run_path.resolve(), teacher.run_dir.resolve()
    if mine == theirs:
        raise UserError(f"{config.where('run_dir')}: the student's run is its teacher's ({teacher.run_dir}); "
                        "give the student a run of its own")
    if mine.is_relative_to(theirs) or theirs.is_relative_to(mine):
        inside = (f"is inside its teacher's run {teacher.run_dir}" if mine.is_relative_to(theirs)
                  else f"holds its teacher's run {teacher.run_dir}")
        raise UserError(f"{config.where('run_dir')}: the student's run {config.run_path} {inside}; give the student "
                        "a run of its own, beside the teacher's")
    check_beam(config, teacher)
    src_spm, tgt_spm = RunLayout(teacher.run_dir).spm_models(tc.tokenizer.joint)
    tokenizer = tc.tokenizer.model_copy(update={
        "src_model": str(src_spm), "tgt_model": None if tc.tokenizer.joint else str(tgt_spm),
        "sampling": config.tokenizer.sampling, "alpha": config.tokenizer.alpha, "nbest": config.tokenizer.nbest})
    corpora = []
    for i, corpus in enumerate(config.data.corpora):
        distilled = CorpusConfig(path=str(distilled_path(config, i)), weight=corpus.weight, tag=corpus.tag,
                                 scores=corpus.scores, drop_lowest=corpus.drop_lowest)
        corpora.append(distilled)
    share = config.distill.original_weight
    if share > 0:
        corpora += [c.model_copy(update={"weight": c.weight * share}) for c in config.data.corpora]
    data = config.data.model_copy(update={"train": corpora})
    student = config.model_copy(update={"data": data, "tokenizer": tokenizer})
    student._origin, student._lines = config._origin, config._lines
    return student, teacher


def check_beam(config: Config, teacher: RunFiles) -> None:
    """The teacher's beam (`teacher_translate`) within its target vocabulary, refused naming
    the config key that makes it: distill.beam_size, distill.nbest or the teacher's decode.beam_size."""
    assert config.distill is not None
    d, vocab = config.distill, int(teacher.meta["tgt_vocab"])
    own = teacher.config.decode.beam_size
    beam = max(d.beam_size or own, d.nbest)
    if beam <= vocab:
        return
    if d.beam_size is not None:
        key, why = config.where("distill", "beam_size"), ""
    elif d.nbest > own:
        key, why = config.where("distill", "nbest"), " (the teacher's beam is raised to hold the n best)"
    else:
        key, why = f"{teacher.checkpoint}: decode.beam_size (the teacher's, taken where distill.beam_size is null)", ""
    raise UserError(f"{key}: a beam of {beam}{why} is larger than the teacher's target vocabulary ({vocab} tokens); "
                    "give a smaller one")



@dataclass
class Distilled:
    run: Path
    report: str | None  # the table of teacher against student (`distill_report.py`), None when not made


def distill(config: Config, progress: bool = True, log: Callable[[str], None] = print,
            translate: Translate | None = None, report: bool = True, repeat: int = 10) -> Distilled:
    """The whole recipe: the teacher's passes, the student's tokenizer and data, its training
    (resumed when the student run holds checkpoints), then with `report` and a data.test split
    the table of teacher against student (written to STUDENT/distill_report.json; the test
    split translated `repeat` times for the speed). `translate` replaces the teacher's own,
    run in this process (tests); the teacher's own runs in a process of its own
    (`separate_teacher_passes`)."""
    from seq2seq_cli.run.tokenizing import train_tokenizer
    from seq2seq_cli.train.loop import train

    student, teacher = student_config(config)
    check_same_teacher(student, teacher)
    again = resume_command(config)
    try:
        if translate is None:
            for line in separate_teacher_passes(config, teacher, progress):
                log(line)
        else:
            teacher_passes(config, teacher, translate, progress, log)
    except (KeyboardInterrupt, SystemExit):
        log(f"interrupted; the teacher's pass resumes where it was last recorded with: {again}")
        raise
    resume = runlock.has_checkpoints(student.run_path)
    if resume:
        log(f"{student.run_path}: holds the student's checkpoints; training resumes")
    else:
        for path in train_tokenizer(student, log):
            log(f"wrote {path}")
    assert student.distill is not None
    atomic_write_text(teacher_record(student.run_path), json.dumps(
        {"teacher": str(teacher.checkpoint), "teacher_sha256": teacher.weights_sha256}) + "\n")
    warm = teacher.checkpoint if student.distill.init_from_teacher else None
    run = train(student, resume=resume, progress=progress, log=log, warm_start=warm, resume_with=again)
    tests = student.data.eval_splits("test")
    if not report or len(tests) != 1:  # no test split, or one per pair: no table
        return Distilled(run, None)
    from seq2seq_cli.data.formats import read_split
    from seq2seq_cli.train import distill_report

    test = read_split(student, tests[0])
    log(f"measuring teacher and student on the test split ({len(test):,} lines, x{repeat} for the speed)")
    figures = distill_report.compare(teacher.run_dir, run, list(test["src"]), list(test["tgt"]), repeat)
    distill_report.write_report(RunLayout(run).distill_report, figures)
    return Distilled(run, distill_report.table(figures))


def resume_command(config: Config) -> str:
    """The command that resumes this distillation where it stops (the teacher's pass, or the
    student's training, then the report)."""
    assert config.distill is not None
    return f"seq2seq distill --config {config._origin or 'CONFIG'} --teacher {config.distill.teacher}"


def teacher_record(run: Path) -> Path:
    """STUDENT/distilled/teacher.json: the teacher checkpoint (path, weights sha256) whose
    translations the student's checkpoints learned, written when its training starts."""
    return RunLayout(run).distilled / "teacher.json"


def trained_on(run: Path) -> tuple[str, str] | None:
    """(weights sha256, checkpoint) of the teacher whose translations the student run `run`
    learned: its `teacher_record`, else (a student distilled before the record was kept) the
    teacher of its distilled corpora's progress records; None where neither says."""
    try:
        kept = json.loads(teacher_record(run).read_text(encoding="utf-8"))
        return str(kept["teacher_sha256"]), str(kept["teacher"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    distilled = RunLayout(run).distilled
    for progress in sorted(distilled.glob("train-*.progress.json")) if distilled.is_dir() else []:
        try:
            return str(json.loads(progress.read_text(encoding="utf-8"))["teacher_sha256"]), "its teacher then"
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def check_same_teacher(student: Config, teacher: RunFiles) -> None:
    """Refuse to resume a student whose checkpoints learned another teacher's translations
    (the teacher trained on since, or another one named): the pass would translate again and
    the resumed training, at its end already, would leave the student the old teacher's."""
    if not runlock.has_checkpoints(student.run_path):
        return
    kept = trained_on(student.run_path)
    if kept is None or kept[0] == teacher.weights_sha256:
        return
    sha, where = kept
    raise UserError(f"{student.run_path}: the student learned the translations of other teacher weights "
                    f"({where}, sha256 {sha[:12]}) than {teacher.checkpoint} holds now (sha256 "
                    f"{teacher.weights_sha256[:12]}); give the student a new run_dir, or remove "
                    f"{RunLayout(student.run_path).checkpoints} to train it again on this teacher's translations")
