"""The catalogue of bad input: each case gives one line on stderr naming what is wrong, the
documented exit code, no traceback, and leaves nothing half-written.

Every case id here has a row in docs/errors.md (checked below), so the table users read and
the behaviour tested are the same list.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from conftest import REPO, SHIPPED
from seq2seq_cli.cli import app
from seq2seq_cli.config_load import load_config
from seq2seq_cli.train.loop import train

runner = CliRunner()


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """A workspace: a tiny trained run, a tiny config and corpus files to break."""
    tmp = tmp_path_factory.mktemp("errors")
    corpus = tmp / "corpus"
    corpus.mkdir()
    for lang in ("es", "en"):
        lines = (SHIPPED / f"valid.{lang}").read_text(encoding="utf-8").splitlines()[:200]
        (corpus / f"train.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["run_dir"] = str(tmp / "run")
    raw["data"]["train"] = raw["data"]["valid"] = str(corpus / "train")
    raw["train"]["max_steps"] = 4
    (tmp / "tiny.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    train(load_config(tmp / "tiny.yaml"), progress=False, log=lambda _: None)
    (tmp / "in.txt").write_text("hola\nadiós\n", encoding="utf-8")
    (tmp / "hyp.txt").write_text("hello\n", encoding="utf-8")
    (tmp / "ref.txt").write_text("hello\ngoodbye\n", encoding="utf-8")
    return tmp


def config_with(ws: Path, name: str, edit: Callable[[dict], None] | None = None, text: str | None = None) -> Path:
    """A copy of the workspace config, edited as a dict (or replaced by raw text)."""
    path = ws / f"{name}.yaml"
    if text is None:
        raw = yaml.safe_load((ws / "tiny.yaml").read_text(encoding="utf-8"))
        raw["run_dir"] = str(ws / f"run-{name}")
        if edit:
            edit(raw)
        text = yaml.safe_dump(raw, sort_keys=False)
    path.write_text(text, encoding="utf-8")
    return path


def corpus_with(ws: Path, name: str, src: bytes, tgt: bytes) -> Path:
    """A config whose training split is the given source and target bytes."""
    (ws / f"{name}.es").write_bytes(src)
    (ws / f"{name}.en").write_bytes(tgt)

    def edit(raw: dict) -> None:
        raw["data"]["train"] = raw["data"]["valid"] = str(ws / name)

    return config_with(ws, name, edit)


def pairs_file(ws: Path, name: str, lines: list[str], **data: object) -> Path:
    """A config whose training split is one TSV or JSONL file with these lines."""
    (ws / name).write_text("\n".join(lines) + "\n", encoding="utf-8")

    def edit(raw: dict) -> None:
        raw["data"].update(train=str(ws / name), valid=str(ws / name), **data)

    return config_with(ws, name.replace(".", "-"), edit)


def corpora_config(ws: Path, name: str, second: dict) -> Path:
    """A config whose data.train lists two corpora: the workspace corpus, and a TSV copy of
    it with the keys `second` gives."""
    tsv = ws / "corpus" / "train.tsv"
    es, en = ((ws / "corpus" / f"train.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("es", "en"))
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in zip(es, en)), encoding="utf-8")

    def edit(raw: dict) -> None:
        raw["data"]["train"] = [{"path": str(ws / "corpus" / "train")}, {"path": str(tsv), "weight": 0.5, **second}]

    return config_with(ws, name, edit)


def damaged_run(ws: Path) -> Path:
    run = ws / "damaged-run"
    if not run.exists():
        shutil.copytree(ws / "run", run)
        weights = run / "checkpoints" / "best.safetensors"
        data = weights.read_bytes()
        weights.unlink()  # best may be a hard link to a step checkpoint: damage only this name
        weights.write_bytes(data[: len(data) // 2])
    return run


_held_locks: list = []


def locked_run(ws: Path) -> Path:
    """A config whose run directory another holder has locked (an open file with the flock,
    as another process's would be), with the holder's record in it."""
    import fcntl
    import json

    cfg = config_with(ws, "locked")
    run = ws / "run-locked"
    run.mkdir(exist_ok=True)
    f = open(run / ".lock", "a+", encoding="utf-8")  # noqa: SIM115 (held open: it keeps the lock)
    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    f.write(json.dumps({"pid": 4242, "command": "seq2seq train", "since": 0}) + "\n")
    f.flush()
    _held_locks.append(f)
    return cfg


def file_as_run_dir(ws: Path) -> Path:
    (ws / "plainfile").write_text("x\n", encoding="utf-8")
    return config_with(ws, "fileasrun", lambda r: r.update(run_dir=str(ws / "plainfile")))


def empty_pair(ws: Path, name: str) -> Path:
    for lang in ("es", "en"):
        (ws / f"{name}.{lang}").write_bytes(b"")
    return ws / name


def zero_byte(config: Path, data: Path) -> Path:
    """`config`, after emptying the data file it reads."""
    data.write_bytes(b"")
    return config


def other_vocabulary_run(ws: Path) -> Path:
    """A run of 200 pieces beside the workspace's of 300, trained two updates."""
    run = ws / "run-vocab200"
    if not (run / "checkpoints" / "best.safetensors").is_file():
        def edit(raw: dict) -> None:
            raw["tokenizer"]["vocab_size"] = 200
            raw["train"].update(max_steps=2, valid_every=2)
        train(load_config(config_with(ws, "vocab200", edit)), progress=False, log=lambda _: None)
    return run


def text_file(ws: Path, name: str, text: str) -> Path:
    path = ws / name
    path.write_text(text, encoding="utf-8")
    return path


def empty_file(ws: Path, name: str) -> Path:
    (ws / name).write_bytes(b"")
    return ws / name


def run_variant(ws: Path, name: str, change: Callable[[Path], None]) -> Path:
    """A copy of the trained run, changed once."""
    run = ws / name
    if not run.exists():
        shutil.copytree(ws / "run", run)
        change(run)
    return run


def other_tokenizer(run: Path) -> None:
    import sentencepiece as spm

    (run / "spm.model").unlink()
    spm.SentencePieceTrainer.train(input=str(run.parent / "corpus" / "train.en"), model_prefix=str(run / "spm"),
                                   vocab_size=200, pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2)


def same_size_tokenizer(run: Path) -> None:
    """Another SentencePiece model of the run's size (BPE on the same text): the sizes match."""
    import sentencepiece as spm

    (run / "spm.model").unlink()
    corpus = run.parent / "corpus"
    spm.SentencePieceTrainer.train(input=[str(corpus / "train.es"), str(corpus / "train.en")], model_prefix=str(run / "spm"),
                                   model_type="bpe", vocab_size=300, pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2)


def unverifiable_weights(broken: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def change(run: Path) -> None:
        weights = run / "checkpoints" / "best.safetensors"
        data = weights.read_bytes()
        weights.unlink()
        (run / "checkpoints" / "best.json").unlink()
        weights.write_bytes(broken(data))

    return change


def nan_weights(data: bytes) -> bytes:
    """The first float32 tensor's values overwritten with NaN: header and sizes intact."""
    import json
    import struct

    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    name = next(k for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32")
    begin, end = header[name]["data_offsets"]
    nan = struct.pack("<f", float("nan")) * ((end - begin) // 4)
    return data[:8 + n + begin] + nan + data[8 + n + end:]


def nan_weights_with_manifest(run: Path) -> None:
    """NaN weights that their manifest vouches for (as an import of a damaged model writes them):
    the sha256 matches, the values are not numbers."""
    import json

    from seq2seq_cli.fileio import sha256

    weights, manifest = run / "checkpoints" / "best.safetensors", run / "checkpoints" / "best.json"
    data = nan_weights(weights.read_bytes())
    weights.unlink()  # a hard link shared with a step checkpoint: write a file of its own
    weights.write_bytes(data)
    record = json.loads(manifest.read_text(encoding="utf-8"))
    record["sha256"]["weights"] = sha256(weights)
    manifest.unlink()
    manifest.write_text(json.dumps(record), encoding="utf-8")


def not_a_file(ws: Path, kind: str) -> Path:
    """A config whose second corpus path is a directory, a FIFO or a link to /dev/zero."""
    path = ws / f"odd-{kind}.tsv"
    if not path.exists() and not path.is_symlink():
        if kind == "directory":
            path.mkdir()
        elif kind == "fifo":
            os.mkfifo(path)
        else:
            path.symlink_to("/dev/zero")
    return corpora_config(ws, f"corpus{kind}", {"path": str(path)})


def tagged_run(ws: Path) -> Path:
    """A run trained (two updates) on two corpora, the second tagged <bt>."""
    run = ws / "run-tagged"
    if not (run / "checkpoints" / "best.safetensors").is_file():
        def edit(raw: dict) -> None:
            raw["train"].update(max_steps=2, valid_every=2)
        cfg = corpora_config(ws, "tagged", {"tag": "<bt>"})
        raw = yaml.safe_load(cfg.read_text(encoding="utf-8"))
        edit(raw)
        cfg.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
        train(load_config(cfg), progress=False, log=lambda _: None)
    return run


def one_piece_not_a_tag(run: Path) -> str:
    """A piece of the run's tokenizer that encodes as itself (so could be a tag) but is not its tag."""
    import sentencepiece as spm

    from seq2seq_cli.data.tokenizer import tag_id

    sp = spm.SentencePieceProcessor(model_file=str(run / "spm.model"))
    for i in range(4, sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        if piece != "<bt>" and "\u2581" not in piece:
            try:
                tag_id(sp, piece, "test")
            except Exception:  # noqa: BLE001 (split: not a candidate)
                continue
            return piece
    raise AssertionError("no piece encodes as itself")


# id -> (arguments, given the workspace; fragments of the error line; exit code)
CASES: dict[str, tuple[Callable[[Path], list], list[str], int]] = {
    # configuration
    "config-missing": (lambda ws: ["train", "-c", ws / "nope.yaml"], ["nope.yaml: config file not found"], 1),
    "config-invalid-yaml": (
        lambda ws: ["train", "-c", config_with(ws, "badyaml", text="name: x\ndata: [unclosed\n")],
        ["badyaml.yaml:", "invalid YAML"], 1),
    "config-unknown-key": (
        lambda ws: ["train", "-c", config_with(ws, "unknown", lambda r: r["model"].update(d_modle=64))],
        ["unknown.yaml:", "unknown key 'model.d_modle'", "valid keys here:", "d_model"], 1),
    "config-wrong-type": (
        lambda ws: ["train", "-c", config_with(ws, "wrongtype", lambda r: r["train"].update(lr="fast"))],
        ["wrongtype.yaml:", "train.lr:", "'fast'"], 1),
    "config-bad-value": (
        lambda ws: ["train", "-c", config_with(ws, "badvalue", lambda r: r["model"].update(d_model=30, heads=4))],
        ["badvalue.yaml:", "d_model (30) must be divisible by heads (4)"], 1),
    "config-duplicate-key": (
        lambda ws: ["train", "-c", config_with(ws, "dupkey", text="name: x\nmodel:\n  d_model: 32\ndata: {}\nmodel:\n  heads: 2\n")],
        ["dupkey.yaml:5: invalid YAML: duplicate key 'model' (first on line 2"], 1),
    "config-vocab-size-differs": (
        lambda ws: ["train", "-c", ws / "tiny.yaml", "--resume", "--set", "tokenizer.vocab_size=500"],
        ["spm.model: the run's tokenizer has 300 pieces but tokenizer.vocab_size is 500"], 1),
    "config-missing-key": (
        lambda ws: ["train", "-c", config_with(ws, "nodata", lambda r: r.pop("data"))],
        ["nodata.yaml", "missing required key 'data'"], 1),
    "config-bool-for-number": (
        lambda ws: ["train", "-c", ws / "tiny.yaml", "--set", "train.max_steps=yes"],
        ["--set train.max_steps: expected an integer, not true or false (got True)"], 1),
    "config-adam-betas": (
        lambda ws: ["train", "-c", ws / "tiny.yaml", "--set", "train.betas=[1.5,0.98]"],
        ["--set train.betas: each Adam beta must be at least 0 and below 1 (got [1.5, 0.98])"], 1),
    "config-seed-range": (
        lambda ws: ["train", "-c", ws / "tiny.yaml", "--set", "train.seed=-1"],
        ["--set train.seed: Input should be greater than or equal to 0 (got -1)"], 1),
    "override-syntax": (lambda ws: ["train", "-c", ws / "tiny.yaml", "--set", "train.lr"], ["expected KEY.PATH=VALUE"], 1),
    "override-unknown-key": (
        lambda ws: ["train", "-c", ws / "tiny.yaml", "--set", "train.learning_rate=1"],
        ["--set train.learning_rate: unknown key", "valid keys here:"], 1),
    # data
    "data-missing-file": (
        lambda ws: ["train", "-c", config_with(ws, "nofile", lambda r: r["data"].update(train=str(ws / "absent")))],
        ["absent.es: file not found"], 1),
    "data-line-count": (
        lambda ws: ["train", "-c", corpus_with(ws, "uneven", b"a\nb\nc\n", b"a\nb\n")],
        ["uneven.es has 3 lines but", "uneven.en has 2"], 1),
    "data-invalid-utf8": (
        lambda ws: ["train", "-c", corpus_with(ws, "latin1", b"uno\nni\xf1o\n", b"one\nchild\n")],
        ["latin1.es:2: invalid UTF-8 at byte 2"], 1),
    "data-empty-line": (
        lambda ws: ["train", "-c", corpus_with(ws, "blank", b"uno\ndos\n", b"one\n\n"), "--set", "data.on_empty=error"],
        ["blank.en:2: empty target sentence"], 1),
    "data-empty-file": (
        lambda ws: ["train", "-c", corpus_with(ws, "zerobyte", b"", b"")], ["zerobyte.es: empty file"], 1),
    "data-empty-valid": (
        lambda ws: ["train", "-c", config_with(ws, "zerovalid", lambda r: r["data"].update(valid=str(empty_pair(ws, "zerobytev"))))],
        ["zerobytev.es: empty file"], 1),
    "data-empty-tsv": (lambda ws: ["train", "-c", zero_byte(pairs_file(ws, "zero.tsv", []), ws / "zero.tsv")],
                       ["zero.tsv: empty file"], 1),
    "data-all-lines-empty": (
        lambda ws: ["tokenize", "-c", corpus_with(ws, "allblank", b"\n\n", b"\n\n")],
        ["no text to train the tokenizer on (every line is empty)"], 1),
    "data-tsv-columns": (
        lambda ws: ["train", "-c", pairs_file(ws, "pairs.tsv", ["uno\tone", "dos\ttwo\textra"])],
        ["pairs.tsv:2: expected 2 tab-separated columns (source, target), found 3"], 1),
    "data-jsonl-invalid": (
        lambda ws: ["train", "-c", pairs_file(ws, "bad.jsonl", ['{"es": "uno", "en": "one"}', '{"es": "dos", "en": two}'])],
        ["bad.jsonl:2: expected a JSON object, got invalid JSON"], 1),
    "data-jsonl-field": (
        lambda ws: ["train", "-c", pairs_file(ws, "field.jsonl", ['{"es": "uno", "en": "one"}', '{"es": "dos"}'])],
        ["field.jsonl:2: expected string field(s) 'en'"], 1),
    "data-tmx-invalid": (
        lambda ws: ["train", "-c", pairs_file(ws, "bad.tmx", ['<tmx version="1.4"><body>', '<tu><tuv xml:lang="es"><seg>a & b</seg>',
                                                              '</tuv></tu></body></tmx>'])],
        ["bad.tmx:2: not well-formed XML (not well-formed (invalid token), column 32); expected a TMX document"], 1),
    "data-tmx-language": (
        lambda ws: ["train", "-c", pairs_file(ws, "de.tmx", ['<tmx version="1.4"><body>',
                                                             '<tu><tuv xml:lang="es"><seg>uno</seg></tuv>',
                                                             '<tuv xml:lang="de"><seg>eins</seg></tuv></tu></body></tmx>'])],
        ["de.tmx:2: translation unit without a variant in en (its languages: es, de;"], 1),
    # several training corpora
    "data-corpus-unknown-key": (
        lambda ws: ["train", "-c", corpora_config(ws, "corpuskey", {"wieght": 2})],
        ["corpuskey.yaml:", "unknown key 'data.train[1].wieght'; valid keys here: path, hub, config, split, revision, src_column, "
         "tgt_column, src_lang, tgt_lang, weight, tag, scores, drop_lowest"], 1),
    "data-corpus-weight": (
        lambda ws: ["train", "-c", corpora_config(ws, "corpusweight", {"weight": 0})],
        ["corpusweight.yaml:", "data.train[1].weight: Input should be greater than 0 (got 0)"], 1),
    "data-corpus-missing-file": (
        lambda ws: ["train", "-c", corpora_config(ws, "corpusfile", {"path": str(ws / "absent.tsv")})],
        ["corpusfile.yaml:", ": data.train[1]: ", "absent.tsv: file not found (expected a tsv file"], 1),
    "data-corpus-duplicate": (
        lambda ws: ["train", "-c", corpora_config(ws, "corpusdup", {"path": str(ws / "corpus" / "train")})],
        ["corpusdup.yaml:", "data.train: entry 1 (", "repeats entry 0: give each corpus once"], 1),
    "data-corpus-tag-split": (
        lambda ws: ["tokenize", "-c", corpora_config(ws, "corpustag", {"tag": "<bt>"}),
                    "--set", f"tokenizer.src_model={ws / 'run' / 'spm.model'}"],
        ["corpustag.yaml:", "data.train[1].tag (tokenizer.src_model", "tag '<bt>' is not one piece of the tokenizer"], 1),
    "data-jsonl-surrogate": (
        lambda ws: ["tokenize", "-c", pairs_file(ws, "surrogate.jsonl", ['{"es": "uno", "en": "one"}',
                                                                         '{"es": "dos", "en": "two \\ud800"}'])],
        ["surrogate.jsonl:2: field 'en' holds a lone surrogate (\\ud800), which is no character; "
         "expected text that UTF-8 can encode"], 1),
    "data-corpus-directory": (
        lambda ws: ["train", "-c", not_a_file(ws, "directory")],
        ["corpusdirectory.yaml:", "data.train[1]: ", "odd-directory.tsv: is a directory (expected a tsv file"], 1),
    "data-corpus-not-regular": (
        lambda ws: ["train", "-c", not_a_file(ws, "fifo")],
        ["corpusfifo.yaml:", "odd-fifo.tsv: not a regular file (a FIFO) (expected a tsv file"], 1),
    "data-corpus-device-link": (
        lambda ws: ["train", "-c", not_a_file(ws, "device")],
        ["corpusdevice.yaml:", "odd-device.tsv: not a regular file (a link to /dev/zero, a character device) (expected"], 1),
    "data-corpus-tag-reserved": (
        lambda ws: ["train", "-c", corpora_config(ws, "corpustagreserved", {"tag": "</s>"})],
        ["corpustagreserved.yaml:", "data.train[1].tag: '</s>' is the tokenizer's end-of-sentence piece"], 1),
    # run directory
    "run-exists": (lambda ws: ["train", "-c", ws / "tiny.yaml"],
                   ["holds the checkpoints of an earlier run", "--resume", "--overwrite"], 1),
    "run-resume-overwrite": (lambda ws: ["train", "-c", ws / "tiny.yaml", "--resume", "--overwrite"],
                             ["--resume and --overwrite exclude each other"], 1),
    "run-locked": (lambda ws: ["train", "-c", locked_run(ws)],
                   ["run-locked: run directory is in use by pid 4242 (seq2seq train, since"], 1),
    "run-dir-is-file": (lambda ws: ["train", "-c", file_as_run_dir(ws)], ["plainfile: run_dir is a file"], 1),
    "tokenize-trained-run": (lambda ws: ["tokenize", "-c", ws / "tiny.yaml"],
                             ["holds checkpoints trained with its tokenizer", "another run_dir"], 1),
    "export-onto-run": (lambda ws: ["export", ws / "run", "-m", ws / "run", "--force"],
                        ["holds the model being exported"], 1),
    "export-quantization": (lambda ws: ["export", ws / "ct2-bogus", "-m", ws / "run", "--quantization", "bogus"],
                            ["--quantization 'bogus': expected one of int8"], 1),
    # model directory
    "model-missing": (lambda ws: ["translate", "-m", ws / "no-run"], ["no-run: model not found"], 1),
    "model-not-a-run": (lambda ws: ["translate", "-m", ws / "corpus"], ["corpus: no checkpoints/best.safetensors"], 1),
    "model-corrupted": (
        lambda ws: ["translate", "-m", damaged_run(ws) / "checkpoints" / "best.safetensors"],
        ["best.safetensors", "sha256"], 1),
    "model-other-tokenizer": (
        lambda ws: ["translate", "-m", run_variant(ws, "run-othertok", other_tokenizer)],
        ["spm.model: source tokenizer has 200 pieces but", "best.safetensors was trained with 300"], 1),
    "model-foreign-tokenizer": (
        lambda ws: ["translate", "-m", run_variant(ws, "run-foreigntok", same_size_tokenizer)],
        ["run-foreigntok/spm.model: tokenizer is not the one", "best.safetensors was trained with", "sha256 differs"], 1),
    "model-tokenizer-garbage": (
        lambda ws: ["translate", "-m", run_variant(ws, "run-garbagetok", lambda r: (r / "spm.model").write_bytes(b"garbage"))],
        ["spm.model: not a SentencePiece model"], 1),
    "model-unverified-truncated": (
        lambda ws: ["translate", "-m", run_variant(ws, "run-nomanifest-cut", unverifiable_weights(lambda d: d[:-100]))],
        ["best.safetensors: not a readable checkpoint (truncated or padded"], 1),
    "model-unverified-nan": (
        lambda ws: ["translate", "-m", run_variant(ws, "run-nomanifest-nan", unverifiable_weights(nan_weights))],
        ["best.safetensors: weights are damaged", "NaN or infinite"], 1),
    "model-nan": (
        lambda ws: ["translate", "-m", run_variant(ws, "run-nan", nan_weights_with_manifest)],
        ["best.safetensors: weights are damaged", "NaN or infinite"], 1),
    # translate and evaluate files
    "input-missing": (lambda ws: ["translate", "-m", ws / "run", "-i", ws / "none.txt"], ["none.txt: input file not found"], 1),
    "input-unreadable": (lambda ws: ["translate", "-m", ws / "run", "-i", ws / "corpus"], ["corpus: cannot read"], 1),
    "output-dir-missing": (
        lambda ws: ["translate", "-m", ws / "run", "-i", ws / "in.txt", "-o", ws / "nodir" / "out.txt"],
        ["out.txt: output directory", "does not exist"], 1),
    "output-is-input": (lambda ws: ["translate", "-m", ws / "run", "-i", ws / "in.txt", "-o", ws / "in.txt"],
                        ["in.txt: is the input file"], 1),
    "output-is-directory": (lambda ws: ["translate", "-m", ws / "run", "-i", ws / "in.txt", "-o", ws / "corpus"],
                            ["corpus: is a directory, expected a file name"], 1),
    "evaluate-line-count": (
        lambda ws: ["evaluate", "--hyp", ws / "hyp.txt", "--ref", ws / "ref.txt"],
        ["hyp.txt has 1 lines but", "ref.txt has 2"], 1),
    "evaluate-empty": (
        lambda ws: ["evaluate", "--hyp", empty_file(ws, "e-hyp.txt"), "--ref", empty_file(ws, "e-ref.txt")],
        ["e-ref.txt: empty file (expected one reference per line"], 1),
    "evaluate-empty-src": (
        lambda ws: ["evaluate", "-m", ws / "run", "--src", empty_file(ws, "e-src.txt"), "--ref", empty_file(ws, "e-ref.txt")],
        ["e-ref.txt: empty file"], 1),
    "evaluate-output-is-input": (
        lambda ws: ["evaluate", "-m", ws / "run", "--src", ws / "in.txt", "--ref", ws / "ref.txt", "-o", ws / "ref.txt"],
        ["ref.txt: is the --ref file", "write the translations to another file"], 1),
    "output-in-run": (lambda ws: ["translate", "-m", ws / "run", "-o", ws / "run" / "spm.model"],
                      ["spm.model: belongs to the model's run", "(spm.model); write the translation to another file"], 1),
    "average-managed-name": (lambda ws: ["average", "-m", ws / "run", "-o", ws / "run" / "checkpoints" / "best.safetensors"],
                             ["best.safetensors is a checkpoint the run manages (best, last, step-N)"], 1),
    "average-not-safetensors": (lambda ws: ["average", "-m", ws / "run", "-o", ws / "run" / "checkpoints" / "mine.json"],
                                ["mine.json: an averaged checkpoint is a NAME.safetensors file"], 1),
    "flag-temperature-tiny": (lambda ws: ["translate", "-m", ws / "run", "--sampling", "--temperature", "1e-45"],
                              ["'--temperature'", "greater than or equal to 0.001"], 2),
    "flag-temperature-infinite": (lambda ws: ["translate", "-m", ws / "run", "--sampling", "--temperature", "inf"],
                                  ["--temperature inf: Input should be a finite number"], 1),
    "flag-max-len-b-huge": (lambda ws: ["translate", "-m", ws / "run", "--max-len-b", "100000000000000000000"],
                            ["--max-len-b 100000000000000000000: Input should be less than or equal to 1000000"], 1),
    "flag-max-len-a-huge": (lambda ws: ["translate", "-m", ws / "run", "--max-len-a", "1e30"],
                            ["--max-len-a 1e+30: Input should be less than or equal to 1000"], 1),
    "flag-length-penalty-huge": (lambda ws: ["translate", "-m", ws / "run", "--length-penalty", "-1e308"],
                                 ["'--length-penalty'", "greater than or equal to -10"], 2),
    "flag-beam-over-vocabulary": (lambda ws: ["translate", "-m", ws / "run", "--beam-size", "400"],
                                  ["--beam-size 400: larger than the target vocabulary (300 tokens)"], 1),
    "flag-constraint-beam-over-vocabulary": (lambda ws: ["translate", "-m", ws / "run", "--constraint-beam-size", "400"],
                                             ["--constraint-beam-size 400: larger than the target vocabulary (300 tokens)"], 1),
    "evaluate-hyp-output": (lambda ws: ["evaluate", "--hyp", ws / "hyp.txt", "--ref", ws / "ref.txt", "-o", ws / "x.txt"],
                            ["-o", "x.txt: --output writes the translations of --src; with --hyp", "nothing to translate"], 1),
    "attention-plots-file": (lambda ws: ["translate", "-m", ws / "run", "--attention-plots", ws / "in.txt"],
                             ["in.txt: --attention-plots names a directory to write one PNG per sentence into"], 1),
    "flag-device": (lambda ws: ["translate", "-m", ws / "run", "--device", "tpu"], ["--device 'tpu': expected auto, cpu, cuda or cuda:N"], 1),
    "flag-decode-choice": (lambda ws: ["translate", "-m", ws / "run", "--length-penalty-type", "bogus"],
                           ["--length-penalty-type 'bogus': Input should be 'average' or 'gnmt'"], 1),
    "flag-decode-range": (lambda ws: ["translate", "-m", ws / "run", "--top-p", "2"],
                          ["--top-p 2.0: Input should be less than or equal to 1"], 1),
    "flag-quantize": (lambda ws: ["translate", "-m", ws / "run", "--quantize", "int4"],
                      ["--quantize 'int4': Input should be 'none' or 'int8'"], 1),
    "flag-device-missing-gpu": (lambda ws: ["translate", "-m", ws / "run", "--device", "cuda:7"],
                                ["--device cuda:7 but "], 1),
    "flag-precision-fp16-cpu": (lambda ws: ["translate", "-m", ws / "run", "--device", "cpu", "--precision", "fp16"],
                                ["--precision fp16: fp16 decoding runs on CUDA only; use bf16 or fp32 on this device"], 1),
    "flag-precision-int8": (lambda ws: ["translate", "-m", ws / "run", "--quantize", "int8", "--precision", "bf16"],
                            ["--quantize int8 decodes with fp32 activations; leave out --precision bf16"], 1),
    "evaluate-arguments": (lambda ws: ["evaluate", "--ref", ws / "ref.txt"], ["give either --hyp FILE, or --model RUN"], 1),
    "ensemble-vocabulary": (lambda ws: ["translate", "-m", ws / "run", "-m", other_vocabulary_run(ws)],
                            ["run-vocab200: its target vocabulary differs from that of", "(200 pieces, 300 in",
                             "an ensemble's models need the same target vocabulary"], 1),
    "prefix-missing": (lambda ws: ["translate", "-m", ws / "run", "-i", ws / "in.txt", "--prefix", ws / "none.txt"],
                       ["none.txt: prefix file not found (expected one line of target text per input line)"], 1),
    "prefix-line-count": (
        lambda ws: ["translate", "-m", ws / "run", "-i", ws / "in.txt", "--prefix", text_file(ws, "p1.txt", "The\n")],
        ["p1.txt has 1 lines but the input", "in.txt has 2; give one prefix per input line (an empty line for none)"], 1),
    "prefix-too-long": (
        lambda ws: ["translate", "-m", ws / "run", "-i", ws / "in.txt", "--prefix",
                    text_file(ws, "long.txt", "\n" + "the house " * 300 + "\n")],
        ["long.txt:2: the prefix has", "target pieces; the model's outputs hold at most"], 1),
    # flags
    "flag-beam-zero": (lambda ws: ["translate", "-m", ws / "run", "--beam-size", "0"],
                       ["seq2seq translate:", "'--beam-size'", "greater than or equal to 1"], 2),
    "flag-negative-length": (lambda ws: ["translate", "-m", ws / "run", "--max-len-b", "-3"],
                             ["'--max-len-b'", "greater than or equal to 0"], 2),
    "flag-nbest-over-beam": (lambda ws: ["translate", "-m", ws / "run", "--beam-size", "2", "--nbest", "3"],
                             ["--nbest 3 is larger than the beam size 2"], 1),
    "flag-unknown": (lambda ws: ["translate", "-m", ws / "run", "--beem", "4"], ["No such option: --beem"], 2),
    "flag-tag-split": (lambda ws: ["translate", "-m", ws / "run", "--tag", "<bt>"],
                       ["--tag <bt>: tag '<bt>' is not one piece of the tokenizer (it encodes as"], 1),
    "flag-tag-unknown": (lambda ws: ["translate", "-m", tagged_run(ws), "--tag", one_piece_not_a_tag(tagged_run(ws))],
                         ["--tag ", ": the run was trained with the tags <bt> (data.train of", "config.yaml); give one of them"], 1),
    "flag-tag-untagged-run": (lambda ws: ["translate", "-m", ws / "run", "--tag", one_piece_not_a_tag(ws / "run")],
                              ["--tag ", ": the run was trained without tags (no corpus of data.train of",
                               "has one); leave out --tag"], 1),
    "flag-missing-required": (lambda ws: ["translate"], ["Missing option '--model'"], 2),
    # documents
    "format-unknown": (lambda ws: ["translate", "-m", ws / "run", "--format", "pdf"],
                       ["Invalid value for '--format': 'pdf' is not one of 'auto', 'text', 'html', 'xml', 'docx', 'odt'"], 2),
    "format-line-option": (lambda ws: ["translate", "-m", ws / "run", "--format", "html", "--alignment"],
                           ["--alignment works line by line; an HTML document is translated whole (leave it out)"], 1),
    "format-xml-broken": (lambda ws: ["translate", "-m", ws / "run", "-i", text_file(ws, "bad.xml", "<a>\n<b></a>\n"), "--format", "xml"],
                          ["bad.xml:2: not well-formed XML (Opening and ending tag mismatch: b line 2 and a"], 1),
}


# Cases found by `train` once it has read the data: its log lines come first, the error last.
LOGGED_CASES: dict[str, tuple[Callable[[Path], list], list[str], int]] = {
    "data-corpus-weight-no-pair": (
        lambda ws: ["train", "-c", corpora_config(ws, "corpuslight", {"weight": 1e-9})],
        ["corpuslight.yaml:", "data.train[1].weight: weight 1e-09 draws no pair of the 114 kept in an epoch",
         "give a weight of at least 0.0044"], 1),
    "data-corpus-weight-memory": (
        lambda ws: ["train", "-c", corpora_config(ws, "corpusheavy", {"weight": 1e9})],
        ["corpusheavy.yaml:", "data.train[1].weight: weight 1e+09 draws 114,000,000,000 pairs per epoch",
         "GiB free; lower the weight"], 1),
}


@pytest.mark.parametrize("case", sorted(LOGGED_CASES))
def test_bad_input_found_in_training_ends_its_log_with_one_line(ws, case):
    make_args, fragments, code = LOGGED_CASES[case]
    result = runner.invoke(app, [str(a) for a in make_args(ws)])
    assert result.exit_code == code, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: ") and not any(line.startswith("error: ") for line in lines[:-1]), result.stderr
    assert result.stdout == "" and "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[-1], lines[-1]


_read_only: list[Path] = []


def read_only(path: Path) -> Path:
    """`path` (made a directory if need be) with its write permission taken away; given back
    after the case."""
    path.mkdir(exist_ok=True)
    path.chmod(0o555)
    _read_only.append(path)
    return path


def read_only_run(ws: Path) -> Path:
    """A config whose run directory holds a tokenizer and is read-only."""
    from seq2seq_cli.run.tokenizing import train_tokenizer

    cfg = config_with(ws, "rorun")
    train_tokenizer(load_config(cfg))
    read_only(ws / "run-rorun")
    return cfg


def read_only_cache(ws: Path) -> Path:
    """A config whose run holds a tokenizer and a read-only data cache directory."""
    from seq2seq_cli.run.tokenizing import train_tokenizer

    cfg = config_with(ws, "rocache")
    train_tokenizer(load_config(cfg))
    read_only(ws / "run-rocache" / "cache")
    return cfg


def under_read_only(ws: Path) -> Path:
    """A config whose run directory would be created inside a read-only directory."""
    read_only(ws / "ro-parent")
    return config_with(ws, "roparent", lambda r: r.update(run_dir=str(ws / "ro-parent" / "run")))


# Cases about file permissions, run as a separate `seq2seq` process bound by them: root's
# power to write anywhere is dropped with setpriv (see `bound_by_permissions`).
PROCESS_CASES: dict[str, tuple[Callable[[Path], list], list[str], int]] = {
    "run-dir-read-only": (lambda ws: ["train", "-c", read_only_run(ws)],
                          ["run-rorun: run directory is not writable", "another run_dir"], 1),
    "run-dir-read-only-tokenize": (
        lambda ws: ["tokenize", "-c", config_with(ws, "rotok", lambda r: r.update(run_dir=str(read_only(ws / "ro-empty"))))],
        ["ro-empty: run directory is not writable"], 1),
    "run-cache-read-only": (lambda ws: ["train", "-c", read_only_cache(ws)],
                            ["run-rocache/cache: directory of the run is not writable", "another run_dir"], 1),
    "run-dir-cannot-create": (lambda ws: ["tokenize", "-c", under_read_only(ws)],
                              ["ro-parent/run: run directory cannot be created (Permission denied in", "writable place"], 1),
}


def bound_by_permissions() -> list[str]:
    """The prefix that runs a command bound by file permissions: none for a user other than
    root; for root, setpriv without the capabilities that override them (skip when unavailable)."""
    if os.geteuid() != 0:
        return []
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]
    if shutil.which("setpriv") is None or subprocess.run([*drop, "true"], capture_output=True).returncode != 0:
        pytest.skip("running as root, and setpriv cannot drop the capabilities that override file permissions")
    return drop


@pytest.mark.parametrize("case", sorted(PROCESS_CASES))
def test_permission_problem_is_one_line_with_its_exit_code(ws, case):
    prefix = bound_by_permissions()
    make_args, fragments, code = PROCESS_CASES[case]
    try:
        args = [str(a) for a in make_args(ws)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        result = subprocess.run([*prefix, sys.executable, "-m", "seq2seq_cli", *args], capture_output=True, text=True,
                                env=env, cwd=ws, timeout=300)
    finally:
        while _read_only:
            _read_only.pop().chmod(0o755)
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_with_its_exit_code(ws, case):
    make_args, fragments, code = CASES[case]
    result = runner.invoke(app, [str(a) for a in make_args(ws)], input="hola\n")
    assert result.exit_code == code, (result.exit_code, result.output)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.stdout == "" and "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("tag", ["</s>", "<pad>", "<s>", "<unk>"])
def test_a_tag_cannot_take_a_control_or_reserved_piece(ws, tag):
    """Each piece the tokenizer reserves is refused as a tag, in one line naming the config key,
    before a tokenizer is trained with it."""
    cfg = corpora_config(ws, "reservedtag", {"tag": tag})
    result = runner.invoke(app, ["tokenize", "-c", str(cfg)])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {cfg}:") and "Traceback" not in result.output
    assert f"data.train[1].tag: {tag!r} is the tokenizer's " in lines[0]
    assert not (ws / "run-reservedtag" / "spm.model").exists()


def test_every_case_is_documented():
    table = (REPO / "docs" / "errors.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `([a-z0-9-]+)` \|", table, flags=re.MULTILINE))
    # the cases of corpora by name, Moses zips and scores are checked by tests/data/test_data_errors.py (read, not imported)
    data_cases = set(re.findall(r'^    "([a-z0-9-]+)": \(', (REPO / "tests" / "data" / "test_data_errors.py").read_text(encoding="utf-8"),
                                flags=re.MULTILINE))
    assert documented == set(CASES) | set(PROCESS_CASES) | set(LOGGED_CASES) | data_cases
    assert len(CASES) >= 15


def test_failed_translation_leaves_an_existing_output_untouched(ws, monkeypatch):
    """Interrupted after the first chunk's lines went to the output: the old file stays whole."""
    import seq2seq_cli.decode.search as search_module
    import seq2seq_cli.documents.text as textfile_module

    out = ws / "keep.txt"
    out.write_text("earlier results\n", encoding="utf-8")
    src = ws / "six.txt"
    src.write_text("uno\ndos\ntres\ncuatro\ncinco\nseis\n", encoding="utf-8")
    real_search = search_module.search
    calls = []
    written = []

    def search_then_interrupt(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:  # the second chunk: the first one's lines have gone to the output
            written.extend(ws.glob(".keep.txt.*.tmp"))
            raise KeyboardInterrupt
        return real_search(*args, **kwargs)

    monkeypatch.setattr(textfile_module, "CHUNK_LINES", 3)
    monkeypatch.setattr(search_module, "search", search_then_interrupt)
    args = ["translate", "-m", str(ws / "run"), "-i", str(src), "-o", str(out), "--batch-tokens", "100000", "--no-progress",
            "--engine", "torch"]  # our search, which the test interrupts
    result = runner.invoke(app, args)
    assert result.exit_code != 0 and len(calls) == 2
    assert len(written) == 1  # the first chunk's lines were being written when it stopped
    assert out.read_text(encoding="utf-8") == "earlier results\n"
    assert [p.name for p in ws.iterdir() if p.name.startswith(("keep.txt", ".keep.txt"))] == ["keep.txt"]  # no temp file left
