"""A local folder read as a Hub dataset (`hub: FOLDER`) leaves `datasets`' Arrow copy of its
files in the run's cache (RUN/cache/hub), removed with the run, never in `datasets`' own cache
outside it (one copy a version of the folder, which nothing removed)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from typer.testing import CliRunner

from helpers import REPO, SHIPPED
from seq2seq_cli.cli import app

ES = (SHIPPED / "valid.es").read_text(encoding="utf-8").splitlines()[:120]
EN = (SHIPPED / "valid.en").read_text(encoding="utf-8").splitlines()[:120]


def test_a_local_folders_copy_stays_in_the_run(tmp_path, monkeypatch):
    import datasets

    shared = tmp_path / "hf-cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", shared)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    (tmp_path / "corpus" / "data").mkdir(parents=True)
    table = pa.table({"translation": [{"es": s, "en": t} for s, t in zip(ES, EN)]})
    pq.write_table(table, tmp_path / "corpus" / "data" / "train-00000-of-00001.parquet")
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["run_dir"] = str(tmp_path / "run")
    raw["data"].update(train={"hub": str(tmp_path / "corpus"), "split": "train"}, valid=None, test=None)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(raw), encoding="utf-8")
    for _ in range(2):  # the second time, the copy in the run is read again
        result = CliRunner().invoke(app, ["tokenize", "-c", str(config)])
        assert result.exit_code == 0, result.output
    outside = [p for p in shared.rglob("*") if p.is_file() and p.suffix == ".arrow"] if shared.exists() else []
    assert outside == []
    copies = [p for p in (tmp_path / "run" / "cache" / "hub").rglob("*.arrow") if not p.name.startswith("cache-")]
    assert [pa.ipc.open_stream(pa.memory_map(str(p))).read_all().num_rows for p in copies] == [len(ES)]
