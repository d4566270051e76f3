"""Corpora by name: datasets of the Hugging Face Hub, read through `datasets`.

A split names a dataset (`hub`, or a local folder laid out as one: parquet, JSON or CSV
files), its configuration, split and revision. Its pairs are the `translation` column
({"es": ..., "en": ...}, keyed by data.src_lang and data.tgt_lang) or two named columns.
The tool reads offline (HF_DATASETS_OFFLINE=1 unless the environment says otherwise): a
dataset in `datasets`' cache is read from there; one that is not is refused in one line
saying how to fetch it; a local folder that does not exist is called so. The revision read
(the commit of the dataset on the Hub, or `datasets`' hash of a local folder's files) is what
the run records. `datasets`' Arrow copy of a local folder is kept in the run's cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from seq2seq_cli.config import SplitConfig
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import file_key

READ_BATCH = 1000
FILES_MARKER = "seq2seq-files"  # beside datasets' copy of a local folder: the `_folder_key` it was made from


def _cache_home() -> str:
    import datasets

    return str(datasets.config.HF_DATASETS_CACHE)


def _offline() -> bool:
    return os.environ.get("HF_DATASETS_OFFLINE", "1").lower() in ("1", "true", "yes", "on")


def _problem(spec: SplitConfig, exc: BaseException) -> UserError:
    """One line for a dataset that could not be loaded: not cached while offline, an unknown
    configuration or split, or whatever `datasets` says."""
    name = spec.describe()
    text = " ".join(str(exc).split()) or type(exc).__name__
    missing = isinstance(exc, (ConnectionError, FileNotFoundError)) or type(exc).__name__ in (
        "DatasetNotFoundError", "OfflineModeIsEnabled", "LocalEntryNotFoundError")
    if missing and not os.path.isdir(spec.hub or ""):
        how = ("it is not in the datasets cache" if _offline() else "it could not be fetched")
        return UserError(
            f"hub dataset {name}: {how} ({_cache_home()}); fetch it once by running the same command with "
            "HF_DATASETS_OFFLINE=0 HF_HUB_OFFLINE=0 in the environment, or set HF_DATASETS_CACHE to a cache that holds it")
    return UserError(f"hub dataset {name}: could not be read ({text})")


def _path_like(name: str) -> bool:
    """Whether a `hub:` value can only name a local folder: a name of the Hub is NAME or
    OWNER/NAME (neither starting with a dot), never an absolute path, a path of three parts
    or one under a folder that exists here."""
    parts = name.rstrip("/").split("/")
    return (name.startswith(("/", ".", "~")) or name.endswith("/") or "\\" in name or len(parts) > 2
            or (len(parts) == 2 and os.path.isdir(parts[0])))


def _builder(spec: SplitConfig, cache_dir: Path | None = None):
    """`datasets`' builder of the dataset `spec` names; a local folder's is kept under
    `cache_dir` (the run's cache) where one is given, else in `datasets`' cache."""
    import datasets

    if spec.hub is not None and not os.path.isdir(spec.hub) and _path_like(spec.hub):
        raise UserError(f"hub dataset {spec.describe()}: folder {spec.hub} does not exist (a local folder laid out as "
                        "on the Hub was expected; a name of the Hub is NAME or OWNER/NAME); fix the path")
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    local = spec.hub is not None and os.path.isdir(spec.hub)
    where = {"cache_dir": str(cache_dir / "hub")} if local and cache_dir is not None else {}
    try:
        return datasets.load_dataset_builder(spec.hub, spec.config, revision=spec.revision, **where)
    except Exception as exc:  # datasets raises its own types (and ValueError) for each way a name fails
        raise _problem(spec, exc) from None


def _folder_key(folder: str) -> str:
    """What tells one version of a local folder's files from another without reading them
    (`file_key` of each: size, times, inode): `datasets` goes by their modification times alone,
    so a file rewritten under its old one (`cp -p`, `touch -r`) would be read from its old copy."""
    keys = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        keys += [file_key(Path(root) / name) for name in sorted(names) if not name.startswith(".")]
    return hashlib.sha256(json.dumps(keys).encode()).hexdigest()[:16]


def resolve(spec: SplitConfig) -> str:
    """The revision of the dataset `spec` names that `read_hub` reads (the commit on the Hub,
    or the hash of a local folder's files, with their sizes, times and inodes) -> raise
    UserError when it is not in the cache (offline) or has no such configuration or split."""
    if spec.revision is not None and spec.hub is not None and os.path.isdir(spec.hub):
        raise UserError(f"hub dataset {spec.describe()}: revision {spec.revision!r} means nothing for a local folder, "
                        "which is read as it is on disk; leave revision out (the run records the hash of its files)")
    builder = _builder(spec)
    _check_split(spec, builder.info.splits)
    if spec.hub is not None and os.path.isdir(spec.hub):
        return f"{builder.hash or ''}-{_folder_key(spec.hub)}"
    return str(builder.hash or "")


def _check_split(spec: SplitConfig, splits: Any) -> None:
    """Refuse a split the dataset does not have (where its splits are known; a slice such as
    train[:1000] is left to `datasets`)."""
    if splits and spec.split not in splits and "[" not in str(spec.split):
        raise UserError(f"hub dataset {spec.describe()}: no split {spec.split!r} (it has {', '.join(splits)})")


def _pairs(batch: dict[str, list], indices: list[int], src: str, tgt: str, translation: bool,
           where: str) -> dict[str, list[str]]:
    out_src, out_tgt = [], []
    for i, row in enumerate(indices):
        if translation:
            pair = batch["translation"][i]
            if not isinstance(pair, dict):
                raise UserError(f"{where} row {row}: expected a translation mapping, got {type(pair).__name__}")
            s, t = pair.get(src), pair.get(tgt)
        else:
            s, t = batch[src][i], batch[tgt][i]
        for side, value in ((src, s), (tgt, t)):
            if value is not None and not isinstance(value, str):
                raise UserError(f"{where} row {row}: {side} is {type(value).__name__}, expected text")
        out_src.append(s or "")
        out_tgt.append(t or "")
    return {"src": out_src, "tgt": out_tgt}


def read_hub(spec: SplitConfig, src_lang: str, tgt_lang: str, num_proc: int = 1, cache_dir: Path | None = None):
    """The pairs of a Hub dataset's split as a `datasets.Dataset` with columns `src` and
    `tgt` (a missing side is empty text, which the filters count). Raises UserError when the
    dataset is not cached (offline), lacks the columns or holds something other than text.
    `datasets`' Arrow copy of a local folder goes to `cache_dir`/hub (the run's cache, removed
    with it), that of a dataset of the Hub to `datasets`' cache, where it was downloaded."""
    builder = _builder(spec, cache_dir)
    where = spec.describe()
    local = spec.hub is not None and os.path.isdir(spec.hub)
    marker = Path(builder.cache_dir) / FILES_MARKER
    key = _folder_key(spec.hub) if local and spec.hub is not None else ""
    try:
        # datasets' copy of a local folder is made again where the files changed under their old mtimes
        stale = (local and (not marker.is_file() or marker.read_text(encoding="utf-8") != key)
                 and os.access(str(cache_dir / "hub") if cache_dir is not None else _cache_home(), os.W_OK))
        builder.download_and_prepare(download_mode="force_redownload" if stale else None)
        if local:
            with contextlib.suppress(OSError):
                marker.write_text(key, encoding="utf-8")
        _check_split(spec, builder.info.splits)
        data = builder.as_dataset(split=spec.split)
    except UserError:
        raise
    except Exception as exc:  # as in `_builder`
        raise _problem(spec, exc) from None
    columns = list(data.column_names)
    if spec.src_column is not None and spec.tgt_column is not None:
        src, tgt, translation = spec.src_column, spec.tgt_column, False
        absent = [c for c in (src, tgt) if c not in columns]
        if absent:
            raise UserError(f"hub dataset {where}: no column {', '.join(map(repr, absent))} (its columns: {', '.join(columns)})")
    else:
        src, tgt, translation = src_lang, tgt_lang, True
        if "translation" not in columns:
            raise UserError(f"hub dataset {where}: no translation column (its columns: {', '.join(columns)}); "
                            "name the two columns with src_column and tgt_column")
        feature = data.features["translation"]
        langs = list(getattr(feature, "languages", None) or (feature.keys() if isinstance(feature, dict) else []))
        absent = [lang for lang in (src, tgt) if langs and lang not in langs]
        if absent:
            raise UserError(f"hub dataset {where}: its translation column has no {', '.join(map(repr, absent))} "
                            f"(it has {', '.join(langs)}); data.src_lang and data.tgt_lang name its languages")
    return data.map(_pairs, batched=True, batch_size=READ_BATCH, with_indices=True, remove_columns=columns,
                    fn_kwargs={"src": src, "tgt": tgt, "translation": translation, "where": f"hub dataset {where}"},
                    num_proc=num_proc if num_proc > 1 else None, desc=None)
