"""Training metrics: `metrics.jsonl` (one JSON record per line), TensorBoard events and
`plots/curves.png`, all written as training goes."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seq2seq_cli.fileio import atomic_write, atomic_write_text
from seq2seq_cli.layout import RunLayout

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter


class MetricsLog:
    """Appends records to RUN/metrics.jsonl and mirrors their numbers to TensorBoard."""

    def __init__(self, run_dir: Path, resume_step: int | None, tensorboard: bool) -> None:
        self.path = RunLayout(run_dir).metrics
        if resume_step is not None:
            truncate_metrics(self.path, resume_step)
        elif self.path.exists():
            self.path.unlink()  # a fresh run starts a fresh log
        self.file = open(self.path, "a", encoding="utf-8")
        self.writer: SummaryWriter | None = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:  # tensorboard is a dependency; a broken install only loses the events
                warn_once(f"warning: train.tensorboard is on but TensorBoard cannot be imported ({exc}); "
                          f"no events are written to {RunLayout(run_dir).tensorboard} (metrics.jsonl has every record)")
            else:
                self.writer = SummaryWriter(str(RunLayout(run_dir).tensorboard), purge_step=resume_step)

    def write(self, record: dict[str, Any]) -> None:
        try:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        except OSError as exc:  # a full disk: name the file
            raise OSError(exc.errno, exc.strerror, str(self.path)) from None
        if self.writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.writer.add_scalar(key, value, record["step"])
            self.writer.flush()

    def close(self) -> None:
        self.file.close()
        if self.writer is not None:
            self.writer.close()


_warned: set[str] = set()


def warn_once(message: str) -> None:
    """Print a warning line on stderr, once per process."""
    if message not in _warned:
        _warned.add(message)
        print(message, file=sys.stderr)


def metrics_lines(path: Path) -> Iterator[tuple[int, str, dict[str, Any] | None]]:
    """(line number, line, its record or None where the line is not a JSON object: torn by a
    crash, or edited by hand) for each line of a metrics.jsonl."""
    if not path.is_file():
        return
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        yield number, line, record if isinstance(record, dict) else None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl; a line that is not one (torn by a crash, edited) is
    skipped with a warning naming it (once)."""
    records = []
    for number, line, record in metrics_lines(path):
        if record is None:
            if line.strip():
                warn_once(f"warning: {path}:{number}: not a JSON record; skipped")
            continue
        records.append(record)
    return records


def truncate_metrics(path: Path, step: int) -> None:
    """Drop records after `step` (a resumed run recomputes them), and the `final` training
    record at `step`: the record a run writes of its updates since the last log_every step
    where it ends, whose sums the checkpoint kept for the run resumed from it to go on with.
    A line that is not a record is kept as it is (ended by a newline, so records appended
    after a torn line stay whole)."""
    if path.is_file():
        keep = [line for _, line, record in metrics_lines(path) if record is None or kept(record, step)]
        atomic_write_text(path, "".join(line + "\n" for line in keep))


def kept(record: dict[str, Any], step: int) -> bool:
    """Whether a run resumed at `step` keeps this record of metrics.jsonl."""
    at = record.get("step", 0)
    return at < step or (at == step and not record.get("final"))


def plot_curves(records: list[dict[str, Any]], path: Path) -> None:
    """Training loss / validation nll, validation BLEU and learning rate, against steps (top)
    and wall-clock minutes (bottom), as one PNG. A panel is drawn only for what was measured
    (no BLEU panel when validation BLEU is off)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if "train_loss" in r]
    valid = [r for r in records if "valid_nll" in r]
    panels = [
        ("loss", [(train, "train_nll", "train nll"), (valid, "valid_nll", "valid nll")]),
        ("valid BLEU", [(valid, "valid_bleu", "valid BLEU")]),
        ("learning rate", [(train, "lr", "lr")]),
    ]
    panels = [(title, series) for title, series in panels if any(key in r for rows, key, _ in series for r in rows)]
    if not panels:
        return
    fig, axes = plt.subplots(2, len(panels), figsize=(13 * len(panels) / 3, 7), squeeze=False)
    for row, (x_key, x_label) in enumerate((("step", "step"), ("elapsed_s", "minutes"))):
        for col, (title, series) in enumerate(panels):
            ax = axes[row][col]
            for rows, key, label in series:
                pts = [(r[x_key] / (60 if x_key == "elapsed_s" else 1), r[key]) for r in rows if key in r and x_key in r]
                if pts:
                    ax.plot(*zip(*pts), marker="." if rows is valid else None, label=label)
            ax.set_title(title)
            ax.set_xlabel(x_label)
            if ax.get_legend_handles_labels()[0]:
                ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=80))
    plt.close(fig)
