"""Training metrics: `metrics.jsonl` (one JSON record per line), TensorBoard events and
`plots/curves.png`, all written as training goes."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seq2seq_cli.fileio import atomic_write, atomic_write_text
from seq2seq_cli.layout import RunLayout

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter


class MetricsLog:
    """Appends records to RUN/metrics.jsonl and mirrors their numbers to TensorBoard.

    A run ending between two log_every steps writes the record of its last updates marked
    `final`, and its checkpoint keeps their sums. Resumed from that checkpoint, the run keeps
    the record until it goes on past that step (`final_at`): then the record is dropped, and
    the record of the next log_every step covers those updates, as in a run never stopped."""

    def __init__(self, run_dir: Path, resume_step: int | None, tensorboard: bool) -> None:
        self.path = RunLayout(run_dir).metrics
        self.final_at: int | None = None  # the step of the `final` record kept from the run resumed
        if resume_step is not None:
            truncate_metrics(self.path, resume_step)
            if any(r is not None and r.get("step") == resume_step and r.get("final") for _, _, r in metrics_lines(self.path)):
                self.final_at = resume_step
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
        if self.final_at is not None and record.get("step", 0) > self.final_at:
            self.drop_final()
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

    def drop_final(self) -> None:
        """The run goes on past its `final` record: drop it (see the class)."""
        at, self.final_at = self.final_at, None
        self.file.close()
        drop_records(self.path, lambda record: record.get("step") == at and bool(record.get("final")))
        self.file = open(self.path, "a", encoding="utf-8")

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
    """Drop records after `step` (a resumed run recomputes them). A line that is not a record
    is kept as it is (ended by a newline, so records appended after a torn line stay whole)."""
    drop_records(path, lambda record: record.get("step", 0) > step)


def drop_records(path: Path, drop: Callable[[dict[str, Any]], bool]) -> None:
    """Rewrite a metrics.jsonl without the records `drop` picks; lines that are not records stay."""
    if path.is_file():
        keep = [line for _, line, record in metrics_lines(path) if record is None or not drop(record)]
        atomic_write_text(path, "".join(line + "\n" for line in keep))


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
