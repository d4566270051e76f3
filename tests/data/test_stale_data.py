"""Corpora that change under the tool, and text the readers must not split, decompress wrongly
or leave empty: a file rewritten under its old modification time is read again, a lone CR is
text, .xz is decompressed before SentencePiece sees it, a filter changed at `train` rewrites
the data report, a validation split left empty is refused."""

from __future__ import annotations

import gzip
import json
import lzma
import os
import shutil
import zipfile
from pathlib import Path

import pytest
import sentencepiece as spm
import yaml
from typer.testing import CliRunner

from helpers import REPO, SHIPPED
from seq2seq_cli.cli import app
from seq2seq_cli.config import SplitConfig
from seq2seq_cli.data import encoding
from seq2seq_cli.data.formats import Source, read_parallel, split_source

runner = CliRunner()
ES = (SHIPPED / "valid.es").read_text(encoding="utf-8").splitlines()
EN = (SHIPPED / "valid.en").read_text(encoding="utf-8").splitlines()


def rewrite_keeping_mtime(path: Path, data: bytes) -> None:
    """Write `data` over `path` and set its old modification time back, as `cp -p` or `touch -r` do."""
    st = path.stat()
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns


class NoModel:
    """A tokenizer stand-in: the fingerprint reads only its serialized model."""

    def serialized_model_proto(self) -> bytes:
        return b"model"


@pytest.mark.parametrize("form", ["text", "tsv", "jsonl"])
def test_a_file_rewritten_under_its_old_mtime_is_read_again(tmp_path, form):
    """Same size, same mtime, other text: the reader's Arrow copy and the encoded cache's key
    both see the new bytes."""
    lines = [f"uno {i}\tone {i}" for i in range(40)]
    path = {"text": tmp_path / "c.es", "tsv": tmp_path / "c.tsv", "jsonl": tmp_path / "c.jsonl"}[form]

    def content(word: str) -> bytes:
        rows = [line.replace("uno", word) for line in lines]
        if form == "jsonl":
            return "".join(json.dumps({"es": r.split("\t")[0], "en": r.split("\t")[1]}) + "\n" for r in rows).encode()
        if form == "text":
            return "".join(r.split("\t")[0] + "\n" for r in rows).encode()
        return "".join(r + "\n" for r in rows).encode()

    path.write_bytes(content("uno"))
    if form == "text":
        (tmp_path / "c.en").write_text("".join(f"one {i}\n" for i in range(40)), encoding="utf-8")
    value = str(tmp_path / "c") if form == "text" else str(path)
    cache = tmp_path / "cache"
    source = split_source(value, "es", "en")
    before = encoding._fingerprint(source, NoModel(), NoModel(), {})
    assert read_parallel(value, "es", "en", cache)[3]["src"] == "uno 3"
    rewrite_keeping_mtime(path, content("dos"))  # the same number of bytes
    assert read_parallel(value, "es", "en", cache)[3]["src"] == "dos 3"
    assert encoding._fingerprint(split_source(value, "es", "en"), NoModel(), NoModel(), {}) != before


def test_a_moses_zip_rewritten_under_its_old_mtime_is_read_again(tmp_path):
    path = tmp_path / "en-es.txt.zip"

    def zipped(word: str) -> bytes:
        with zipfile.ZipFile(tmp_path / "z.zip", "w") as z:
            z.writestr("B.en-es.es", "".join(f"{word} {i}\n" for i in range(10)))
            z.writestr("B.en-es.en", "".join(f"one {i}\n" for i in range(10)))
        return (tmp_path / "z.zip").read_bytes()

    path.write_bytes(zipped("uno"))
    assert read_parallel(str(path), "es", "en", tmp_path / "cache")[2]["src"] == "uno 2"
    rewrite_keeping_mtime(path, zipped("dos"))
    assert read_parallel(str(path), "es", "en", tmp_path / "cache")[2]["src"] == "dos 2"


def test_a_tmx_file_rewritten_under_its_old_mtime_is_read_again(tmp_path):
    path = tmp_path / "c.tmx"

    def tmx(word: str) -> bytes:
        units = "".join(f'<tu><tuv xml:lang="es"><seg>{word} {i}</seg></tuv><tuv xml:lang="en"><seg>one {i}</seg></tuv></tu>\n'
                        for i in range(10))
        return f'<?xml version="1.0"?>\n<tmx version="1.4"><header/><body>\n{units}</body></tmx>\n'.encode()

    path.write_bytes(tmx("uno"))
    assert read_parallel(str(path), "es", "en", tmp_path / "cache")[2]["src"] == "uno 2"
    rewrite_keeping_mtime(path, tmx("dos"))
    assert read_parallel(str(path), "es", "en", tmp_path / "cache")[2]["src"] == "dos 2"


def test_a_hub_folder_rewritten_under_its_old_mtime_is_read_again(tmp_path, monkeypatch):
    """`datasets` keys its copy of a local folder on the files' modification times: a parquet
    file rewritten under its old one is read again, and the encoded cache's key changes."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    (tmp_path / "hub" / "data").mkdir(parents=True)
    path = tmp_path / "hub" / "data" / "train-00000-of-00001.parquet"

    def parquet(word: str) -> bytes:
        pq.write_table(pa.table({"translation": [{"es": f"{word} {i}", "en": f"one {i}"} for i in range(10)]}),
                       tmp_path / "t.parquet")
        return (tmp_path / "t.parquet").read_bytes()

    path.write_bytes(parquet("uno"))
    spec = SplitConfig(hub=str(tmp_path / "hub"), split="train")
    before = encoding._fingerprint(split_source(spec, "es", "en"), NoModel(), NoModel(), {})
    assert read_parallel(spec, "es", "en")[3]["src"] == "uno 3"
    rewrite_keeping_mtime(path, parquet("dos"))
    assert read_parallel(spec, "es", "en")[3]["src"] == "dos 3"
    assert encoding._fingerprint(split_source(spec, "es", "en"), NoModel(), NoModel(), {}) != before


def test_a_hub_folders_columns_are_part_of_the_encoded_caches_key(tmp_path):
    def key(src_column: str, tgt_column: str) -> str:
        spec = SplitConfig(hub=str(tmp_path), split="train", src_column=src_column, tgt_column=tgt_column)
        return encoding._fingerprint(Source("hub", (), spec, "abc"), NoModel(), NoModel(), {})

    assert key("es", "en") != key("es_clean", "en")
    assert key("es", "en") == key("es", "en")


@pytest.mark.parametrize("form", ["text", "tsv", "jsonl"])
def test_a_lone_cr_inside_a_line_is_text_not_a_line_break(tmp_path, form):
    """Two 40-line files (by `wc -l`) with a lone CR in line 6 read as 40 pairs, pair 7 still
    pair 7; CRLF line ends are line ends; a bad TSV row is named by its own line."""
    src = [f"uno {i}" for i in range(40)]
    src[5] = "uno\r5"
    tgt = [f"one {i}" for i in range(40)]
    if form == "text":
        (tmp_path / "c.es").write_bytes("".join(s + "\n" for s in src).encode())
        (tmp_path / "c.en").write_bytes("".join(t + "\r\n" for t in tgt).encode())
        value = str(tmp_path / "c")
    elif form == "tsv":
        (tmp_path / "c.tsv").write_bytes("".join(f"{s}\t{t}\n" for s, t in zip(src, tgt)).encode())
        value = str(tmp_path / "c.tsv")
    else:
        (tmp_path / "c.jsonl").write_bytes("".join(f'{{"es": "{s.replace(chr(13), "")}",\r"en": "{t}"}}\n'
                                                   for s, t in zip(src, tgt)).encode())
        value = str(tmp_path / "c.jsonl")
    for cache in (tmp_path / "cache", None):
        ds = read_parallel(value, "es", "en", cache)
        assert len(ds) == 40
        assert ds[6] == {"src": "uno 6", "tgt": "one 6"} and ds[39]["tgt"] == "one 39"
    if form == "tsv":
        rows = [f"{s}\t{t}" for s, t in zip(src, tgt)]
        rows[29] += "\textra"
        (tmp_path / "bad.tsv").write_bytes("".join(r + "\n" for r in rows).encode())
        with pytest.raises(Exception, match=r"bad.tsv:30: expected 2 tab-separated columns"):
            read_parallel(str(tmp_path / "bad.tsv"), "es", "en", tmp_path / "cache")


def config(tmp: Path, name: str, **data) -> Path:
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["run_dir"] = str(tmp / f"run-{name}")
    raw["data"].update({"train": str(SHIPPED / "valid"), "valid": None, "test": None, **data})
    raw["train"].update({"max_steps": 2, "valid_every": 2})
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def test_xz_corpora_are_decompressed_before_sentencepiece_reads_them(tmp_path):
    """The same corpus as .gz and as .xz gives the same tokenizer and the same data report."""
    for suffix, pack in ((".gz", gzip.compress), (".xz", lzma.compress)):
        for lang in ("es", "en"):
            (tmp_path / f"c{suffix}").mkdir(exist_ok=True)
            (tmp_path / f"c{suffix}" / f"train.{lang}{suffix}").write_bytes(pack((SHIPPED / f"valid.{lang}").read_bytes()))
        name = suffix.strip(".")
        result = runner.invoke(app, ["tokenize", "-c", str(config(tmp_path, name, train=str(tmp_path / f"c{suffix}" / "train")))])
        assert result.exit_code == 0, result.output
    gz, xz = tmp_path / "run-gz", tmp_path / "run-xz"
    pieces = {r: [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
              for r in (gz, xz) for sp in [spm.SentencePieceProcessor(model_file=str(r / "spm.model"))]}
    assert pieces[xz] == pieces[gz] and "\ufffd" not in "".join(pieces[xz])
    report = {r: json.loads((r / "data_report.json").read_text(encoding="utf-8")) for r in (gz, xz)}
    assert report[xz]["kept"] == report[gz]["kept"] > len(ES) / 2


def test_a_filter_changed_at_train_rewrites_the_data_report(tmp_path):
    """`train --set data.max_src_len=...` re-encodes the corpus: data_report.json,
    dropped.tsv.gz and `info` count what trains, not what `tokenize` saw."""
    cfg = config(tmp_path, "filters")
    assert runner.invoke(app, ["tokenize", "-c", str(cfg)]).exit_code == 0
    run = tmp_path / "run-filters"

    def dropped_too_long() -> int:
        return gzip.decompress((run / "dropped.tsv.gz").read_bytes()).decode().count("\ttoo_long\t")

    before = json.loads((run / "data_report.json").read_text(encoding="utf-8"))
    assert before["dropped"]["too_long"] == dropped_too_long() > 0
    result = runner.invoke(app, ["train", "-c", str(cfg), "--set", "data.max_src_len=250", "--set", "data.max_tgt_len=250"])
    assert result.exit_code == 0, result.output
    after = json.loads((run / "data_report.json").read_text(encoding="utf-8"))
    assert after["filters"]["max_src_len"] == 250 and after["read"] == before["read"]
    assert after["dropped"]["too_long"] == dropped_too_long() < before["dropped"]["too_long"]
    assert after["kept"] > before["kept"]
    info = runner.invoke(app, ["info", "-m", str(run)])
    kept = [line.split()[1] for line in info.output.splitlines() if line.startswith("kept ")]
    assert info.exit_code == 0 and kept == [f"{after['kept']:,}"], info.output


def test_a_validation_split_left_empty_is_refused_at_train(tmp_path):
    """A validation split whose every pair has a blank side trains with a loss of 0 on nothing:
    refused in one line before the first update."""
    (tmp_path / "blank.es").write_text("".join(f"{s}\n" for s in ES[:5]), encoding="utf-8")
    (tmp_path / "blank.en").write_text("\n \n\n\n\n", encoding="utf-8")
    cfg = config(tmp_path, "blankvalid")
    assert runner.invoke(app, ["tokenize", "-c", str(cfg)]).exit_code == 0
    result = runner.invoke(app, ["train", "-c", str(cfg), "--set", f"data.valid={tmp_path / 'blank'}"])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    error = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "data.valid: " in error[0], result.stderr
    assert "no validation pairs left: each of its 5 pairs has an empty source or target" in error[0]
    assert not (tmp_path / "run-blankvalid" / "checkpoints" / "best.safetensors").exists()


def test_the_encoded_cache_follows_a_rewritten_corpus_end_to_end(tmp_path):
    """`tokenize`, then the corpus rewritten as `cp -p` leaves it: `train` encodes the new text
    (it does not log 'reusing encoded')."""
    for lang in ("es", "en"):
        shutil.copy(SHIPPED / f"valid.{lang}", tmp_path / f"c.{lang}")
    cfg = config(tmp_path, "stale", train=str(tmp_path / "c"))
    assert runner.invoke(app, ["tokenize", "-c", str(cfg)]).exit_code == 0
    text = (tmp_path / "c.en").read_bytes()
    rewrite_keeping_mtime(tmp_path / "c.en", text.replace(b"God", b"Gox"))
    result = runner.invoke(app, ["train", "-c", str(cfg)])
    assert result.exit_code == 0, result.output
    assert "reusing encoded" not in result.output
