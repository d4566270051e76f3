"""The bad inputs of corpora by name, Moses zips, score files and `seq2seq score`: each one
line on stderr naming the file (and line) or the config key and what was expected, with its
exit code. Every case id here has a row in docs/errors.md."""

from __future__ import annotations

import os
import random
import re
import zipfile
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from helpers import REPO, SHIPPED, train_shipped_tiny
from seq2seq_cli.cli import app

runner = CliRunner()
ES = (SHIPPED / "valid.es").read_text(encoding="utf-8").splitlines()[:150]
EN = (SHIPPED / "valid.en").read_text(encoding="utf-8").splitlines()[:150]


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """A workspace: a corpus as TSV, as a Hub folder and as a Moses zip, and a tiny run."""
    tmp = tmp_path_factory.mktemp("data-errors")
    (tmp / "pairs.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in zip(ES, EN)), encoding="utf-8")
    (tmp / "hub" / "data").mkdir(parents=True)
    for split in ("train", "validation"):
        table = pa.table({"translation": [{"es": s, "en": t} for s, t in zip(ES, EN)]})
        pq.write_table(table, tmp / "hub" / "data" / f"{split}-00000-of-00001.parquet")
    with zipfile.ZipFile(tmp / "en-es.txt.zip", "w") as z:
        z.writestr("Bible.en-es.en", "\n".join(EN) + "\n")
        z.writestr("README", "\n")
    with zipfile.ZipFile(tmp / "uneven.zip", "w") as z:
        z.writestr("Bible.en-es.es", "\n".join(ES) + "\n")
        z.writestr("Bible.en-es.en", "\n".join(EN[:-1]) + "\n")
    hostile_zips(tmp)
    (tmp / "three.tsv").write_text("uno\tone\ndos\ttwo\textra\n", encoding="utf-8")
    (tmp / "blank.es").write_text("".join(f"{s}\n" for s in ES[:5]), encoding="utf-8")
    (tmp / "blank.en").write_text("\n \n\n\n\n", encoding="utf-8")  # every target blank
    train_shipped_tiny(tmp, "run", max_steps=2)
    return tmp


def moses_zip(path: Path, es: str, en: str, method: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", method) as z:
        z.writestr("Bible.en-es.es", es)
        z.writestr("Bible.en-es.en", en)
    return path


def patch_headers(path: Path, flag: int = 0, method: int | None = None) -> None:
    """Set a general-purpose flag bit (1: encrypted) or the compression method in every local
    and central header of the zip at `path`, as a zip made by another tool has them."""
    data = bytearray(path.read_bytes())
    for signature, flag_at, method_at in ((b"PK\x03\x04", 6, 8), (b"PK\x01\x02", 8, 10)):
        at = data.find(signature)
        while at >= 0:
            old = int.from_bytes(data[at + flag_at:at + flag_at + 2], "little")
            data[at + flag_at:at + flag_at + 2] = (old | flag).to_bytes(2, "little")
            if method is not None:
                data[at + method_at:at + method_at + 2] = method.to_bytes(2, "little")
            at = data.find(signature, at + 4)
    path.write_bytes(bytes(data))


def hostile_zips(tmp: Path) -> None:
    """Moses zips that are damaged (a bad CRC), encrypted, packed with Deflate64, a zip bomb (one
    line of 64 MiB in 65 KB) and one holding a line of 2 MiB of text."""
    text_es, text_en = "\n".join(ES) + "\n", "\n".join(EN) + "\n"
    crc = moses_zip(tmp / "crc.zip", text_es, text_en, zipfile.ZIP_STORED)
    data = bytearray(crc.read_bytes())
    data[data.find(ES[3].encode())] ^= 0x20  # one letter of line 4 changed: the CRC no longer matches
    crc.write_bytes(bytes(data))
    patch_headers(moses_zip(tmp / "locked.zip", text_es, text_en), flag=0x1)
    patch_headers(moses_zip(tmp / "deflate64.zip", text_es, text_en), method=9)
    moses_zip(tmp / "bomb.zip", "a" * (64 << 20) + "\n", "b\n")
    letters = "".join(random.Random(0).choices("abcdefghijklmnopqrstuvwxyz ", k=2 << 20))  # packs 1.6 times
    moses_zip(tmp / "longline.zip", "\n".join(ES[:3]) + "\n" + letters + "\n", "\n".join(EN[:4]) + "\n")


@pytest.fixture(autouse=True)
def own_cache(ws, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", ws / "hf-cache")


def config(ws: Path, name: str, **data) -> Path:
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["run_dir"] = str(ws / f"run-{name}")
    raw["data"].update({"train": str(ws / "pairs.tsv"), "valid": None, "test": None, **data})
    path = ws / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


def scores(ws: Path, name: str, text: str) -> str:
    (ws / name).write_text(text, encoding="utf-8")
    return str(ws / name)


Case = tuple[Callable[[Path], list], list[str], int]
CASES: dict[str, Case] = {
    "hub-not-cached": (
        lambda ws: ["tokenize", "-c", config(ws, "nocache", train={"hub": "Helsinki-NLP/opus_books", "config": "en-es",
                                                                   "split": "train"})],
        ["nocache.yaml: data.train[0]: hub dataset Helsinki-NLP/opus_books (en-es, train): it is not in the datasets "
         "cache (", "HF_DATASETS_OFFLINE=0 HF_HUB_OFFLINE=0", "or set HF_DATASETS_CACHE"], 1),
    "hub-no-split": (
        lambda ws: ["tokenize", "-c", config(ws, "nosplit", train={"hub": str(ws / "hub"), "split": "dev"})],
        ["(dev): no split 'dev' (it has train, validation)"], 1),
    "hub-split-missing": (
        lambda ws: ["tokenize", "-c", config(ws, "splitless", valid={"hub": str(ws / "hub")})],
        ["data.valid: a Hub dataset needs its split (e.g. split: train, or validation)"], 1),
    "hub-no-column": (
        lambda ws: ["tokenize", "-c", config(ws, "nocolumn", train={"hub": str(ws / "hub"), "split": "train",
                                                                    "src_column": "es", "tgt_column": "en"})],
        ["(train): no column 'es', 'en' (its columns: translation)"], 1),
    "hub-languages": (
        lambda ws: ["tokenize", "-c", config(ws, "hublangs", train={"hub": str(ws / "hub"), "split": "train"},
                                             src_lang="fr")],
        ["(train): its translation column has no 'fr' (it has es, en); data.src_lang and data.tgt_lang name its languages"],
        1),
    "data-path-and-hub": (
        lambda ws: ["tokenize", "-c", config(ws, "both", valid={"path": str(ws / "pairs.tsv"), "hub": "x/y"})],
        ["data.valid: give either path (a file or prefix) or hub (a Hub dataset), not both"], 1),
    "hub-local-revision": (
        lambda ws: ["tokenize", "-c", config(ws, "hubrev", train={"hub": str(ws / "hub"), "split": "train",
                                                                  "revision": "main"})],
        ["data.train[0]: hub dataset ", "revision 'main' means nothing for a local folder, which is read as it is on disk"],
        1),
    "data-corpus-duplicate-hub": (
        lambda ws: ["tokenize", "-c", config(ws, "duphub", train=[{"hub": str(ws / "hub"), "split": "train"},
                                                                  {"hub": f"{ws / 'hub'}/", "split": "train"}])],
        ["data.train: entry 1 (", "repeats entry 0: give each corpus once (raise its weight to use it more)"], 1),
    "data-corpus-duplicate-relative": (
        lambda ws: ["tokenize", "-c", config(ws, "duprel", train=[{"path": os.path.relpath(ws / "pairs.tsv")},
                                                                  {"path": str(ws / "pairs.tsv")}])],
        ["data.train: entry 1 (", "repeats entry 0: give each corpus once"], 1),
    "data-valid-emptied": (
        lambda ws: ["tokenize", "-c", config(ws, "blankvalid", valid=str(ws / "blank"))],
        ["blankvalid.yaml:", "data.valid: ", "blank: no validation pairs left: each of its 5 pairs has an empty source or "
         "target; give a validation split with text on both sides, or leave data.valid out"], 1),
    "moses-member": (
        lambda ws: ["tokenize", "-c", config(ws, "member", train=str(ws / "en-es.txt.zip"))],
        ["en-es.txt.zip: no member ending in .es (its members: Bible.en-es.en, README); expected one file per language"], 1),
    "moses-uneven": (
        lambda ws: ["tokenize", "-c", config(ws, "uneven", train=str(ws / "uneven.zip"))],
        ["uneven.zip: Bible.en-es.es has 150 lines but Bible.en-es.en has 149; source and target files must be aligned"], 1),
    "moses-damaged": (
        lambda ws: ["tokenize", "-c", config(ws, "crc", train=str(ws / "crc.zip"))],
        ["crc.zip: Bible.en-es.es: damaged (Bad CRC-32 for file 'Bible.en-es.es'); download the zip again"], 1),
    "moses-encrypted": (
        lambda ws: ["tokenize", "-c", config(ws, "locked", train=str(ws / "locked.zip"))],
        ["locked.zip: Bible.en-es.es: encrypted (the zip has a password); unzip it with its password and give the "
         "two text files"], 1),
    "moses-method": (
        lambda ws: ["tokenize", "-c", config(ws, "deflate64", train=str(ws / "deflate64.zip"))],
        ["deflate64.zip: Bible.en-es.es: packed with Deflate64, which Python's zipfile cannot unpack (it reads stored, "
         "deflate, bzip2, lzma); unzip it with another tool (7z x)"], 1),
    "moses-zip-bomb": (
        lambda ws: ["tokenize", "-c", config(ws, "bomb", train=str(ws / "bomb.zip"))],
        ["bomb.zip: Bible.en-es.es: refused: it unpacks to 67108865 bytes from ", " (more than 200 times; text packs 3 "
         "to 5 times: a zip bomb?)"], 1),
    "moses-line-too-long": (
        lambda ws: ["tokenize", "-c", config(ws, "longline", train=str(ws / "longline.zip"))],
        ["longline.zip:Bible.en-es.es:4: line longer than 1048576 bytes (1 MiB), the most a line may hold; expected "
         "one sentence a line"], 1),
    "hub-folder-missing": (
        lambda ws: ["tokenize", "-c", config(ws, "hubtypo", train={"hub": str(ws / "hbu"), "split": "train"})],
        ["data.train[0]: hub dataset ", "hbu (train): folder ", "hbu does not exist (a local folder laid out as on the "
         "Hub was expected; a name of the Hub is NAME or OWNER/NAME); fix the path"], 1),
    "scores-count": (
        lambda ws: ["tokenize", "-c", config(ws, "fewscores", train=[{"path": str(ws / "pairs.tsv"), "drop_lowest": 0.1,
                                                                      "scores": scores(ws, "few.txt", "-1.5\n-2\n")}])],
        ["few.txt has 2 scores but ", "pairs.tsv has 150 pairs; score that corpus (seq2seq score --model RUN ...)"], 1),
    "scores-not-number": (
        lambda ws: ["tokenize", "-c", config(ws, "badscore", train=[{"path": str(ws / "pairs.tsv"), "drop_lowest": 0.1,
                                                                     "scores": scores(ws, "bad.txt", "-1.5\nnan\n")}])],
        ["bad.txt:2: expected a number (one score per pair, as seq2seq score writes), got 'nan'"], 1),
    "scores-drop-without-file": (
        lambda ws: ["tokenize", "-c", config(ws, "noscores", train=[{"path": str(ws / "pairs.tsv"), "drop_lowest": 0.1}])],
        ["data.train[0]: drop_lowest needs scores: a file of one score per pair (seq2seq score)"], 1),
    "filters-bad-threshold": (
        lambda ws: ["tokenize", "-c", config(ws, "ratio"), "--set", "data.filters.length_ratio=1.5"],
        ["--set data.filters.length_ratio: Input should be less than 1 (got 1.5)"], 1),
    "score-columns": (
        lambda ws: ["score", "-m", ws / "run", "-i", ws / "three.tsv", "--device", "cpu"],
        ["three.tsv:2: expected 2 tab-separated columns (source, target), found 3"], 1),
    "score-no-pairs": (
        lambda ws: ["score", "-m", ws / "run", "--src", ws / "pairs.tsv", "--device", "cpu"],
        ["give the pairs as --input PAIRS.tsv (source<TAB>target a line), or as --src FILE and --tgt FILE"], 1),
    "score-reverse-direction": (
        lambda ws: ["score", "-m", ws / "run", "--reverse-model", ws / "run", "-i", ws / "pairs.tsv", "--device", "cpu"],
        ["translates es->en; the dual score needs en->es, the reverse of --model"], 1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_with_its_exit_code(ws, case, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    make_args, fragments, code = CASES[case]
    result = runner.invoke(app, [str(a) for a in make_args(ws)])
    assert result.exit_code == code, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("reusing ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_every_case_has_a_row_in_the_errors_page():
    table = (REPO / "docs" / "errors.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `([a-z0-9-]+)` \|", table, flags=re.MULTILINE))
    assert set(CASES) <= documented
