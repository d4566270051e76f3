"""Updates skipped for a non-finite loss or gradient: the device's tally of the updates read
into the logging window and the counters (`settle`), the warnings, and the stop after
train.max_nonfinite skipped in a row."""

from __future__ import annotations

from seq2seq_cli.errors import UserError
from seq2seq_cli.train.setup import Run
from seq2seq_cli.train.state import TrainState


def settle(run: Run, state: TrainState) -> None:
    """Read what the updates since the last reading did (one host sync): their sums go into
    the logging window, skipped updates into the counters and a warning; after
    train.max_nonfinite skipped in a row, the run stops."""
    read = run.tally.read() if run.tally is not None else None
    if read is None:
        return
    for key in ("loss", "nll", "tokens", "src_tokens"):
        state.window[key] += read[key]
    state.counters["skipped_nonfinite"] += int(read["skipped"])
    state.consecutive_bad = int(read["in_a_row"])
    if read["skipped"]:
        run.log(f"warning: non-finite loss or gradients in {int(read['skipped'])} of the updates up to step "
                f"{state.step}; skipped ({state.counters['skipped_nonfinite']} so far)")
    if read["most_in_a_row"] >= run.config.train.max_nonfinite:
        stop_nonfinite(run, state, int(read["most_in_a_row"]))


def report_nonfinite(run: Run, state: TrainState) -> None:
    """Warn about a skipped update (fp16); stop the run after train.max_nonfinite in a row."""
    run.log(f"warning: non-finite loss or gradients at step {state.step + 1}; batch skipped "
            f"({state.counters['skipped_nonfinite']} so far)")
    if state.consecutive_bad >= run.config.train.max_nonfinite:
        stop_nonfinite(run, state, state.consecutive_bad)


def stop_nonfinite(run: Run, state: TrainState, in_a_row: int) -> None:
    last = run.layout.last
    saved = (f"stopped without saving, so {last} is the last good state" if last.is_file()
             else "stopped before any checkpoint was saved")
    raise UserError(
        f"non-finite loss or gradients in {in_a_row} consecutive updates up to step {state.step}; "
        f"{saved}; "
        "lower train.lr, raise train.warmup_steps or set train.clip_norm"
    )
