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
