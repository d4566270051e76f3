"""What the training data looks like: the data report of a run.

The training corpora are encoded and filtered as training will encode them (the same caches,
which training then reuses), and their counts and length histograms (kept beside each cache,
`stats`) are summed into RUN/data_report.json: pairs read, kept and dropped by each filter,
subword-length percentiles per side, and where each corpus came from (files, or the Hub
dataset and its revision). RUN/data_report.png plots the lengths and the length ratio of the
pairs read and kept; RUN/dropped.tsv.gz holds every dropped pair with its filter. The counts
add up: read = kept + the sum of the drops.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc

from seq2seq_cli.data.encoding import EncodedCorpus, encoded_split
from seq2seq_cli.data.filters import DESCRIPTIONS, ORDER, active, training_filters
from seq2seq_cli.data.formats import read_split
from seq2seq_cli.data.stats import DROPPED_FILE, DROPPED_HEADER, RATIO_BINS, add_histograms, percentiles
from seq2seq_cli.data.tokenizer import source_prefix
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import atomic_write, atomic_write_text
from seq2seq_cli.layout import RunLayout

REPORT_VERSION = 1


def encode_training(config, src_sp, tgt_sp, log: Callable[[str], None]) -> list[EncodedCorpus]:
    """Each training corpus encoded and filtered (and cached) exactly as `train` does, so that
    training reuses what this encodes."""
    d = config.data
    if not isinstance(d.train, list):
        return [encoded_split(config, d.train, src_sp, tgt_sp, training=True, log=log)]
    corpora = []
    for i, entry in enumerate(d.corpora):
        prefix = source_prefix(config, src_sp, i, entry)
        corpora.append(encoded_split(config, entry, src_sp, tgt_sp, training=True, log=log, label=f"train.{i}",
                                     prefix=prefix))
    return corpora


def build_report(config, corpora: list[EncodedCorpus]) -> dict[str, Any]:
    """The report of the encoded training corpora (each with its cache's stats.json)."""
    if any(corpus.cache_path is None for corpus in corpora):
        raise UserError("the data report needs the encoded corpora's caches")
    return _report(config, [corpus.cache_path for corpus in corpora if corpus.cache_path is not None])


def _report(config, caches: list[Path]) -> dict[str, Any]:
    """The report of the training corpora whose caches are `caches` (in data.train's order)."""
    d = config.data
    rows, hist_read, hist_kept = [], None, None
    several = len(d.pairs) > 1
    for entry, cache in zip(d.corpora, caches):
        stats = json.loads((cache / "stats.json").read_text(encoding="utf-8"))
        rows.append({"corpus": stats["corpus"], "source": stats["source"], "read": stats["read"], "kept": stats["pairs"],
                     "dropped": stats["dropped"], **({"pair": "-".join(d.pair_of(entry))} if several else {})})
        hist_read = add_histograms(hist_read, stats["lengths"]["read"])
        hist_kept = add_histograms(hist_kept, stats["lengths"]["kept"])
    assert hist_read is not None and hist_kept is not None  # at least one corpus
    scored = any(c.scores is not None and c.drop_lowest for c in d.corpora)
    on = set().union(*(active(training_filters(d, pair), scored) for pair in d.pairs))
    dropped = {code.key: sum(r["dropped"].get(code.key, 0) for r in rows) for code in ORDER}
    pairs: dict[str, dict[str, Any]] = {}
    for row in rows if several else []:  # several language pairs: each one's counts
        mine = pairs.setdefault(row["pair"], {"read": 0, "kept": 0, "dropped": {code.key: 0 for code in ORDER}})
        mine["read"] += row["read"]
        mine["kept"] += row["kept"]
        for key, n in row["dropped"].items():
            mine["dropped"][key] = mine["dropped"].get(key, 0) + n
    return {
        "version": REPORT_VERSION,
        "read": sum(r["read"] for r in rows), "kept": sum(r["kept"] for r in rows), "dropped": dropped,
        "filters": {"on": [code.key for code in ORDER if code in on], "settings": d.filters.model_dump(mode="json"),
                    "max_src_len": d.max_src_len, "max_tgt_len": d.max_tgt_len, "max_len_ratio": d.max_len_ratio},
        "lengths": {stage: {side: percentiles(h[side]) for side in ("source", "target")}
                    for stage, h in (("read", hist_read), ("kept", hist_kept))},
        "histograms": {"read": hist_read, "kept": hist_kept, "ratio_bins_log2": RATIO_BINS.tolist()},
        "corpora": rows,
        **({"pairs": pairs} if pairs else {}),
        "caches": [cache.name for cache in caches],  # the encoded caches it counts (RUN/cache/encoded)
    }


def report_table(report: dict[str, Any]) -> str:
    """The report as a table: pairs read and kept, dropped by each filter with its share, and
    subword-length percentiles per side."""
    read = report["read"]
    share = lambda n: f"{100 * n / read:6.2f}%" if read else "      -"  # noqa: E731
    on = set(report["filters"]["on"])
    lines = [f"{'training data':<46}{'pairs':>11} {'share':>7}", f"{'read':<46}{read:>11,} {share(read)}",
             f"{'kept':<46}{report['kept']:>11,} {share(report['kept'])}", "dropped by"]
    for code in ORDER:
        n = report["dropped"].get(code.key, 0)
        if code.key in on or n:
            lines.append(f"  {code.key:<13}{DESCRIPTIONS[code]:<31}{n:>11,} {share(n)}")
    off = [code.key for code in ORDER if code.key not in on]
    if off:
        lines.append(f"  (off: {', '.join(off)})")
    lines.append(f"{'subwords per sentence':<46}{'p50':>6}{'p90':>6}{'p99':>6}{'max':>6}")
    for stage in ("read", "kept"):
        for side in ("source", "target"):
            p = report["lengths"][stage][side]
            lines.append(f"  {side + ' (' + stage + ')':<44}{p['p50']:>6}{p['p90']:>6}{p['p99']:>6}{p['max']:>6}")
    if len(report["corpora"]) > 1:
        for i, row in enumerate(report["corpora"]):
            pair = f" ({row['pair']})" if "pair" in row else ""
            lines.append(f"corpus {i} {row['corpus']}{pair}: {row['read']:,} read, {row['kept']:,} kept")
    for pair, counts in report.get("pairs", {}).items():
        drops = ", ".join(f"{k} {n:,}" for k, n in counts["dropped"].items() if n)
        lines.append(f"pair {pair}: {counts['read']:,} read, {counts['kept']:,} kept"
                     + (f" (dropped: {drops})" if drops else ""))
    revisions = [f"{row['corpus']} @ {row['source']['resolved_revision']}" for row in report["corpora"]
                 if row["source"].get("resolved_revision")]
    lines += [f"revision: {r}" for r in revisions]
    return "\n".join(lines)


def _write_dropped(caches: list[Path], path: Path) -> None:
    """The dropped pairs of every corpus (its cache in `caches`) in one gzip TSV: the corpus's
    number first."""

    def write(tmp: str) -> None:
        with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=5) as out:
            out.write("corpus\t" + DROPPED_HEADER)
            for i, cache in enumerate(caches):
                with gzip.open(cache / DROPPED_FILE, "rt", encoding="utf-8") as f:
                    next(f, None)  # its header
                    for line in f:
                        out.write(f"{i}\t{line}")

    atomic_write(path, write)


def plot_report(report: dict[str, Any], path: Path) -> None:
    """Subword lengths of each side and the length ratio, of the pairs read and kept, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hist = report["histograms"]
    top = max(report["lengths"]["read"][side]["p99"] for side in ("source", "target"))
    top = max(10, min(len(hist["read"]["source"]) - 1, int(top * 1.5)))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, side in zip(axes[:2], ("source", "target")):
        for stage in ("read", "kept"):
            counts = np.asarray(hist[stage][side][: top + 1])
            ax.step(np.arange(len(counts)), counts, where="mid", label=f"{stage} ({sum(hist[stage][side]):,})")
        ax.set_title(f"{side} subwords per sentence")
        ax.set_xlabel("subwords")
        ax.legend()
    bins = np.asarray(hist["ratio_bins_log2"])
    for stage in ("read", "kept"):
        axes[2].step((bins[:-1] + bins[1:]) / 2, hist[stage]["ratio"], where="mid", label=stage)
    axes[2].set_title("length ratio, log2(source / target subwords)")
    axes[2].set_xlabel("log2 ratio")
    axes[2].legend()
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=80))
    plt.close(fig)


def _dumps(report: dict[str, Any]) -> str:
    """The report as indented JSON, each list of numbers (a histogram) on one line."""

    def one_line(match: re.Match[str]) -> str:
        return "[" + ", ".join(x.strip() for x in match.group(0)[1:-1].split(",") if x.strip()) + "]"

    return re.sub(r"\[[\d\s,.eE+-]*\]", one_line, json.dumps(report, indent=1))


def write_data_report(config, src_sp, tgt_sp, log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Encode the training corpora as training will, and write the run's data report, its plot
    and its dropped pairs -> the report."""
    corpora = encode_training(config, src_sp, tgt_sp, log)
    report = build_report(config, corpora)
    _write_report(config, report, [corpus.cache_path for corpus in corpora if corpus.cache_path is not None])
    for corpus in corpora:
        if corpus.release is not None:
            corpus.release()
    return report


def _write_report(config, report: dict[str, Any], caches: list[Path]) -> None:
    layout = RunLayout(config.run_path)
    _write_dropped(caches, layout.dropped)
    plot_report(report, layout.data_plot)
    atomic_write_text(layout.data_report, _dumps(report) + "\n")


def refresh_data_report(config, caches: list[Path | None], log: Callable[[str], None] = lambda _: None) -> None:
    """Rewrite the run's data report (and its plot and dropped pairs) where it counts other
    caches than `caches`, those `train` encoded the training corpora into: a filter or a corpus
    changed since `tokenize` wrote it. A run without a report is left without one."""
    layout = RunLayout(config.run_path)
    if not layout.data_report.is_file() or any(cache is None for cache in caches):
        return
    try:
        old = read_data_report(config.run_path)
    except UserError:
        old = None
    found = [cache for cache in caches if cache is not None]
    if old is not None and old.get("caches") == [cache.name for cache in found]:
        return
    report = _report(config, found)
    _write_report(config, report, found)
    log(f"the training data changed since {layout.data_report} was written: rewrote it ({report['kept']:,} of "
        f"{report['read']:,} pairs kept)")


def no_valid_pairs(where: str, split: Any, read: int) -> UserError:
    """The refusal of a validation split whose every pair has an empty side (`read` pairs)."""
    return UserError(f"{where}: {split}: no validation pairs left: each of its {read} pairs has an empty source or "
                     "target; give a validation split with text on both sides, or leave data.valid out")


def check_valid_splits(config) -> None:
    """Refuse a validation split the filters would leave empty (every pair with a blank side):
    training would report a loss of 0 on nothing and keep the best checkpoint by it."""
    d = config.data
    splits = d.eval_splits("valid")
    for i, split in enumerate(splits):
        raw = read_split(config, split)
        blank = [pc.equal(pc.utf8_trim_whitespace(raw.data.column(side)), "") for side in ("src", "tgt")]
        if not len(raw) or pc.all(pc.or_(*blank)).as_py():
            raise no_valid_pairs(config.where("data", "valid", *([i] if len(splits) > 1 else [])), split, len(raw))


def read_data_report(run_dir: Path) -> dict[str, Any] | None:
    """The data report of a run, or None when it has none (a run tokenized before reports, or imported)."""
    path = RunLayout(run_dir).data_report
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise UserError(f"{path}: not a data report ({exc}); run `seq2seq tokenize` again to rewrite it") from None
