"""Corpora by name and as people download them: a dataset laid out as on the Hugging Face Hub
(read through `datasets` from a local folder, offline), OPUS's Moses zips and .xz text, each
training a tiny run from a config; what is refused, in one line."""

from __future__ import annotations

import json
import lzma
import subprocess
import sys
import zipfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from helpers import REPO, SHIPPED
from seq2seq_cli.config_load import load_config
from seq2seq_cli.data.formats import read_parallel
from seq2seq_cli.errors import UserError

ES = (SHIPPED / "valid.es").read_text(encoding="utf-8").splitlines()
EN = (SHIPPED / "valid.en").read_text(encoding="utf-8").splitlines()


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """`datasets`' cache of Hub datasets in the test's own folder, read offline."""
    import datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


def hub_folder(root: Path, columns: str = "translation") -> Path:
    """A dataset as the Hub lays it out: data/SPLIT-00000-of-00001.parquet, a `translation`
    column of {"es": ..., "en": ...} (or two plain columns)."""
    (root / "data").mkdir(parents=True)
    for split, (a, b) in {"train": (0, 300), "validation": (300, 360)}.items():
        if columns == "translation":
            table = pa.table({"id": [str(i) for i in range(a, b)],
                              "translation": [{"en": t, "es": s} for s, t in zip(ES[a:b], EN[a:b])]})
        else:
            table = pa.table({"spanish": ES[a:b], "english": EN[a:b]})
        pq.write_table(table, root / "data" / f"{split}-00000-of-00001.parquet")
    return root


def tiny_config(tmp_path: Path, data: dict) -> Path:
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["run_dir"] = str(tmp_path / "run")
    raw["data"].update({"test": None, **data})
    raw["train"].update({"max_steps": 4, "valid_every": 2, "log_every": 2})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def train_quietly(config: Path) -> tuple[Path, list[str]]:
    from seq2seq_cli.train.loop import train

    lines: list[str] = []
    return train(load_config(config), progress=False, log=lines.append), lines


def first_record(run: Path) -> dict:
    return json.loads((run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()[0])


def test_a_hub_dataset_trains_a_run_and_the_run_records_its_revision(tmp_path):
    folder = hub_folder(tmp_path / "opus-books")
    config = tiny_config(tmp_path, {"train": {"hub": str(folder), "split": "train"},
                                    "valid": {"hub": str(folder), "split": "validation"}})
    run, log = train_quietly(config)
    assert (run / "checkpoints" / "last.safetensors").is_file()
    (corpus,) = first_record(run)["train_corpora"]
    assert corpus["read"] == 300 and corpus["kept"] > 0
    source = corpus["source"]
    assert source["format"] == "hub" and source["split"] == "train" and source["hub"] == str(folder)
    revision = source["resolved_revision"]
    assert revision and any(revision in line for line in log)
    valid = read_parallel(load_config(config).data.valid, "es", "en")
    assert valid["src"][:2] == ES[300:302] and valid["tgt"][:2] == EN[300:302]
    saved = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    assert saved["data"]["train"][0]["hub"] == str(folder) and saved["data"]["valid"]["split"] == "validation"


def test_two_named_columns_are_the_pairs(tmp_path):
    folder = hub_folder(tmp_path / "plain", columns="plain")
    data = load_config(tiny_config(tmp_path, {"train": {"hub": str(folder), "split": "validation",
                                                        "src_column": "spanish", "tgt_column": "english"}})).data
    pairs = read_parallel(data.corpora[0], "es", "en")
    assert pairs["src"] == ES[300:360] and pairs["tgt"] == EN[300:360]


@pytest.mark.parametrize("change,message", [
    ({"split": "dev"}, "no split 'dev' (it has train, validation)"),
    ({"src_column": "spanish", "tgt_column": "inglés"}, "no column 'spanish', 'inglés' (its columns: id, translation)"),
])
def test_a_hub_dataset_without_the_split_or_columns_is_one_line(tmp_path, change, message):
    folder = hub_folder(tmp_path / "ds")
    data = load_config(tiny_config(tmp_path, {"train": {"hub": str(folder), "split": "train", **change}})).data
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_parallel(data.corpora[0], "es", "en")


def test_other_languages_than_the_translation_columns_are_refused(tmp_path):
    folder = hub_folder(tmp_path / "ds")
    with pytest.raises(UserError, match=r"its translation column has no 'fr' \(it has en, es\)"):
        read_parallel(load_config(tiny_config(tmp_path, {"train": {"hub": str(folder), "split": "train"}})).data.corpora[0],
                      "fr", "en")


def test_an_uncached_hub_dataset_is_one_line_saying_how_to_get_it(tmp_path):
    config = tiny_config(tmp_path, {"train": {"hub": "Helsinki-NLP/opus_books", "config": "en-es", "split": "train"}})
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "empty-cache"), "HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "seq2seq_cli", "tokenize", "-c", str(config)], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: {config}: data.train[0]: hub dataset Helsinki-NLP/opus_books (en-es, train): "
                               "it is not in the datasets cache")
    assert str(tmp_path / "empty-cache") in r.stderr and "HF_DATASETS_OFFLINE=0" in r.stderr


def moses_zip(path: Path, pairs: slice, extra: dict[str, str] | None = None) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("Bible.en-es.es", "\n".join(ES[pairs]) + "\n")
        z.writestr("Bible.en-es.en", "\n".join(EN[pairs]) + "\n")
        z.writestr("README", "a corpus\n")
        for name, text in (extra or {}).items():
            z.writestr(name, text)
    return path


def test_a_moses_zip_and_xz_text_train_a_run(tmp_path):
    corpus = moses_zip(tmp_path / "en-es.txt.zip", slice(0, 250))
    for lang, lines in (("es", ES), ("en", EN)):
        (tmp_path / f"valid.{lang}.xz").write_bytes(lzma.compress(("\n".join(lines[250:300]) + "\n").encode()))
    run, _ = train_quietly(tiny_config(tmp_path, {"train": str(corpus), "valid": str(tmp_path / "valid")}))
    record = first_record(run)
    assert record["train_pairs"] + sum(v for k, v in record.items() if k.startswith("train_dropped_")) == 250
    assert record["valid_pairs"] == 50
    pairs = read_parallel(str(corpus), "es", "en")
    assert pairs["src"] == ES[:250] and pairs["tgt"] == EN[:250]


def test_a_moses_zip_without_one_member_per_language_is_refused(tmp_path):
    two = moses_zip(tmp_path / "two.zip", slice(0, 3), {"Other.en-es.es": "uno\n"})
    with pytest.raises(UserError, match=r"2 members \(Bible\.en-es\.es, Other\.en-es\.es\) ending in \.es"):
        read_parallel(str(two), "es", "en")
    with zipfile.ZipFile(tmp_path / "one.zip", "w") as z:
        z.writestr("Bible.en-es.en", "one\n")
    with pytest.raises(UserError, match=r"no member ending in \.es \(its members: Bible\.en-es\.en\)"):
        read_parallel(str(tmp_path / "one.zip"), "es", "en")
    (tmp_path / "not.zip").write_text("hola\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"not\.zip: not a zip file"):
        read_parallel(str(tmp_path / "not.zip"), "es", "en")


def test_a_moses_zip_with_uneven_sides_or_bad_utf8_names_the_member_and_line(tmp_path):
    path = tmp_path / "u.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.es", "uno\ndos\ntres\n")
        z.writestr("x.en", "one\ntwo\n")
    with pytest.raises(UserError, match=r"u\.zip: x\.es has 3 lines but x\.en has 2"):
        read_parallel(str(path), "es", "en")
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("x.es", b"uno\nd\xf3s\n")
        z.writestr("x.en", "one\ntwo\n")
    with pytest.raises(UserError, match=r"u\.zip:x\.es:2: invalid UTF-8 at byte 1"):
        read_parallel(str(path), "es", "en")
