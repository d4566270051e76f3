"""The training record of the last update: a run that ends between two `log_every` steps still
logs its last updates, in metrics.jsonl and as a line; a run resumed from it logs them as a run
never stopped would."""

from __future__ import annotations

import math

from typer.testing import CliRunner

from helpers import make_config, train_records
from seq2seq_cli.cli import app

runner = CliRunner()
TIMINGS = ("elapsed_s", "tokens_per_s")


def logged_lines(stderr: str) -> list[str]:
    """The plain training lines of a run whose stderr is not a terminal: 'step N/M' of each."""
    return [line.split(":")[0] for line in stderr.splitlines() if line.startswith("step ") and "tok/s" in line]


def untimed(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMINGS} for r in records]


def test_a_run_shorter_than_log_every_logs_its_last_update(tmp_path):
    cfg = make_config(tmp_path, "run", max_steps=20, log_every=100, valid_every=100)
    r = runner.invoke(app, ["train", "-c", str(cfg)])
    assert r.exit_code == 0, r.output
    (record,) = train_records(tmp_path / "run")
    assert record["step"] == 20 and record["final"] and math.isfinite(record["train_loss"]) and record["train_loss"] > 0
    assert logged_lines(r.stderr) == ["step 20/20"]


def test_a_resumed_run_replaces_the_final_record_as_a_run_never_stopped_logs(tmp_path):
    cfg = make_config(tmp_path, "run", max_steps=10, log_every=4, valid_every=100)
    r = runner.invoke(app, ["train", "-c", str(cfg)])
    assert r.exit_code == 0, r.output
    assert logged_lines(r.stderr) == ["step 4/10", "step 8/10", "step 10/10"]
    records = train_records(tmp_path / "run")
    assert [(rec["step"], rec.get("final", False)) for rec in records] == [(4, False), (8, False), (10, True)]
    r = runner.invoke(app, ["train", "-c", str(cfg), "--resume"])  # nothing left to train: the records as they were
    assert r.exit_code == 0, r.output
    assert logged_lines(r.stderr) == [] and train_records(tmp_path / "run") == records
    r = runner.invoke(app, ["train", "-c", str(cfg), "--resume", "--set", "train.max_steps=13"])
    assert r.exit_code == 0, r.output
    assert logged_lines(r.stderr) == ["step 12/13", "step 13/13"]
    resumed = train_records(tmp_path / "run")
    assert [(rec["step"], rec.get("final", False)) for rec in resumed] == [(4, False), (8, False), (12, False), (13, True)]
    straight = make_config(tmp_path, "straight", max_steps=13, log_every=4, valid_every=100)
    assert runner.invoke(app, ["train", "-c", str(straight), "--no-progress"]).exit_code == 0
    assert untimed(train_records(tmp_path / "straight")) == untimed(resumed)
