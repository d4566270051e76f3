"""`seq2seq score`: each pair's length-normalised log-probability under a run, teacher-forced
(the same as summing the model's token log-probabilities one pair at a time), the dual score
with a run of the other direction, and the score file as a training filter."""

from __future__ import annotations

import gzip
import json

import pytest
import torch
import yaml
from typer.testing import CliRunner

from helpers import REPO, SHIPPED, sequence_log_prob, train_shipped_tiny
from seq2seq_cli.cli import app
from seq2seq_cli.data.scoring import Scorer, dual_score
from seq2seq_cli.ids import EOS
from seq2seq_cli.run.loaded import load_run

ES = (SHIPPED / "valid.es").read_text(encoding="utf-8").splitlines()
EN = (SHIPPED / "valid.en").read_text(encoding="utf-8").splitlines()
PAIRS = list(zip(ES[:40], EN[:40]))
runner = CliRunner()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny es->en run and a tiny en->es run of the shipped validation split."""
    tmp = tmp_path_factory.mktemp("score")
    forward = train_shipped_tiny(tmp, "es-en", max_steps=6)
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw.update(run_dir=str(tmp / "en-es"))
    raw["data"].update(src_lang="en", tgt_lang="es", train=str(SHIPPED / "valid"), valid=str(SHIPPED / "valid"))
    raw["train"].update(max_steps=6)
    (tmp / "en-es.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    from seq2seq_cli.config_load import load_config
    from seq2seq_cli.train.loop import train

    backward = train(load_config(tmp / "en-es.yaml"), progress=False, log=lambda _: None)
    return forward, backward


def one_by_one(run, pairs):
    """Each pair's mean log-probability, one pair at a time, by the tests' own full forward."""
    out = []
    for s, t in pairs:
        src = torch.tensor(run.src_sp.encode(s) + [EOS])
        tokens = run.tgt_sp.encode(t)
        out.append(sequence_log_prob(run.model, src, tokens) / (len(tokens) + 1))
    return out


def test_batched_scores_are_each_pairs_own_mean_log_probability(runs):
    run = load_run(runs[0])
    scorer = Scorer.of_run(run, torch.device("cpu"))
    expected = one_by_one(run, PAIRS)
    small, large = scorer.score(PAIRS, batch_tokens=64), scorer.score(PAIRS, batch_tokens=100_000)
    assert small == pytest.approx(expected, abs=1e-4) and large == pytest.approx(expected, abs=1e-4)
    assert all(v < 0 for v in expected) and len(set(round(v, 4) for v in expected)) > 30


def test_the_command_writes_one_score_per_pair_from_tsv_or_two_files(runs, tmp_path):
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in PAIRS), encoding="utf-8")
    (tmp_path / "p.es").write_text("".join(s + "\n" for s, _ in PAIRS), encoding="utf-8")
    (tmp_path / "p.en").write_text("".join(t + "\n" for _, t in PAIRS), encoding="utf-8")
    r = runner.invoke(app, ["score", "--model", str(runs[0]), "-i", str(tsv), "-o", str(tmp_path / "a.txt"), "--device", "cpu"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["score", "-m", str(runs[0]), "--src", str(tmp_path / "p.es"), "--tgt", str(tmp_path / "p.en"),
                            "--device", "cpu"])
    assert r.exit_code == 0, r.output
    from_tsv = [float(x) for x in (tmp_path / "a.txt").read_text(encoding="utf-8").splitlines()]
    assert from_tsv == [float(x) for x in r.stdout.splitlines()]
    assert from_tsv == pytest.approx(one_by_one(load_run(runs[0]), PAIRS), abs=1e-4)


def test_the_dual_score_combines_both_directions(runs, tmp_path):
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in PAIRS[:10]), encoding="utf-8")
    r = runner.invoke(app, ["score", "-m", str(runs[0]), "--reverse-model", str(runs[1]), "-i", str(tsv), "--device", "cpu"])
    assert r.exit_code == 0, r.output
    ahead = one_by_one(load_run(runs[0]), PAIRS[:10])
    behind = one_by_one(load_run(runs[1]), [(t, s) for s, t in PAIRS[:10]])
    assert [float(x) for x in r.stdout.splitlines()] == pytest.approx([dual_score(a, b) for a, b in zip(ahead, behind)],
                                                                      abs=1e-4)
    assert dual_score(-1.0, -3.0) == pytest.approx(-4.0) and dual_score(-2.0, -2.0) == pytest.approx(-2.0)
    r = runner.invoke(app, ["score", "-m", str(runs[0]), "--reverse-model", str(runs[0]), "-i", str(tsv), "--device", "cpu"])
    assert r.exit_code == 1 and "translates es->en; the dual score needs en->es" in r.stderr


@pytest.mark.parametrize("lines,message", [
    (["uno\tone", "dos\ttwo\textra"], "pairs.tsv:2: expected 2 tab-separated columns (source, target), found 3"),
    (None, "give the pairs as --input PAIRS.tsv"),
])
def test_bad_pairs_are_one_line(runs, tmp_path, lines, message):
    args = ["score", "-m", str(runs[0]), "--device", "cpu", "-o", str(tmp_path / "out.txt")]
    if lines is not None:
        (tmp_path / "pairs.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
        args += ["-i", str(tmp_path / "pairs.tsv")]
    (tmp_path / "out.txt").write_text("earlier\n", encoding="utf-8")
    r = runner.invoke(app, args)
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and message in r.stderr, r.output
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "earlier\n"  # nothing half-written


def test_a_score_file_filters_the_lowest_share_of_a_corpus(runs, tmp_path):
    """Cross-entropy filtering: the share of a corpus with the lowest scores of `seq2seq
    score` is dropped, exactly those pairs."""
    pairs = PAIRS + [(ES[100 + i], EN[200 + i]) for i in range(10)]  # 10 misaligned pairs
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    scores = tmp_path / "scores.txt"
    r = runner.invoke(app, ["score", "-m", str(runs[0]), "-i", str(tsv), "-o", str(scores), "--device", "cpu"])
    assert r.exit_code == 0, r.output
    values = [float(x) for x in scores.read_text(encoding="utf-8").splitlines()]
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw.update(run_dir=str(tmp_path / "run"))
    raw["data"].update(train=[{"path": str(tsv), "scores": str(scores), "drop_lowest": 0.2}], filters=False,
                       max_src_len=200, max_tgt_len=200)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    assert runner.invoke(app, ["tokenize", "-c", str(tmp_path / "c.yaml")]).exit_code == 0
    report = json.loads((tmp_path / "run" / "data_report.json").read_text(encoding="utf-8"))
    assert report["dropped"]["score"] == int(0.2 * len(pairs)) == 10
    with gzip.open(tmp_path / "run" / "dropped.tsv.gz", "rt", encoding="utf-8") as f:
        dropped = sorted(int(line.split("\t")[1]) - 1 for line in f.read().splitlines()[1:])
    assert dropped == sorted(sorted(range(len(values)), key=lambda i: values[i])[:10])
