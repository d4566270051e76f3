"""Training curves (`metrics.plot_curves`): a panel for each thing measured, none empty."""

from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from seq2seq_cli.train.metrics import plot_curves


def _titles(records: list[dict], path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to look at its panels
    plot_curves(records, path)
    assert path.read_bytes()[:4] == b"\x89PNG"
    (fig,) = figures
    assert all(ax.lines for ax in fig.axes)  # no empty panel
    return [ax.get_title() for ax in fig.axes]


TRAIN = [{"step": s, "elapsed_s": s * 2.0, "train_loss": 5.0 / s, "train_nll": 4.0 / s, "lr": 1e-3} for s in (1, 2, 3)]


def test_no_bleu_panels_when_validation_bleu_is_off(tmp_path, monkeypatch):
    valid = [{"step": 3, "elapsed_s": 6.0, "valid_nll": 3.0}]
    titles = _titles(TRAIN + valid, tmp_path / "curves.png", monkeypatch)
    assert titles == ["loss", "learning rate"] * 2


def test_bleu_panels_when_bleu_was_measured(tmp_path, monkeypatch):
    valid = [{"step": 3, "elapsed_s": 6.0, "valid_nll": 3.0, "valid_bleu": 12.5}]
    titles = _titles(TRAIN + valid, tmp_path / "curves.png", monkeypatch)
    assert titles == ["loss", "valid BLEU", "learning rate"] * 2


def test_a_malformed_line_is_skipped_with_a_warning_naming_it_and_kept_by_truncation(tmp_path, monkeypatch, capsys):
    import json

    from seq2seq_cli.train import metrics

    monkeypatch.setattr(metrics, "_warned", set())
    path = tmp_path / "metrics.jsonl"
    lines = ['{"step": 1, "train_loss": 2.0}', "# a note kept by hand", '{"step": 2, "train_loss": 1.5}', "[3]",
             '{"step": 3, "train_loss": 1.0}', '{"step": 4, "train_lo']  # the last one torn by a crash
    path.write_text("\n".join(lines), encoding="utf-8")
    assert [r["step"] for r in metrics.read_metrics(path)] == [1, 2, 3]
    assert capsys.readouterr().err.splitlines() == [f"warning: {path}:2: not a JSON record; skipped",
                                                    f"warning: {path}:4: not a JSON record; skipped",
                                                    f"warning: {path}:6: not a JSON record; skipped"]
    metrics.read_metrics(path)
    assert capsys.readouterr().err == ""  # each line is reported once

    metrics.truncate_metrics(path, 2)  # a resume from step 2: later records go, the other lines stay
    assert path.read_text(encoding="utf-8") == "\n".join(lines[:4] + lines[5:]) + "\n"
    log = metrics.MetricsLog(tmp_path, 2, tensorboard=False)
    log.write({"step": 3, "train_loss": 0.5})
    log.close()
    assert metrics.read_metrics(path)[-1] == {"step": 3, "train_loss": 0.5}  # not glued to the torn line
    assert json.loads(path.read_text(encoding="utf-8").splitlines()[-1])["step"] == 3


def test_tensorboard_unavailable_is_one_warning(tmp_path, monkeypatch, capsys):
    import sys

    from seq2seq_cli.train import metrics

    monkeypatch.setattr(metrics, "_warned", set())
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    for _ in range(2):
        log = metrics.MetricsLog(tmp_path, None, tensorboard=True)
        log.write({"step": 1, "train_loss": 1.0})
        log.close()
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("warning: train.tensorboard is on but TensorBoard cannot be imported (")
    assert line.endswith(f"no events are written to {tmp_path / 'tensorboard'} (metrics.jsonl has every record)")
    assert log.writer is None
