"""Data at scale: every input format gives the same pairs, bad input gives one line naming
file and line, the Arrow cache is reused and rebuilt, filters count what they drop, subword
sampling is deterministic and resumable, supplied and separate SentencePiece models."""

import gzip
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import yaml
from typer.testing import CliRunner

from conftest import REPO, SHIPPED
from helpers import assert_same, make_config, quiet
from seq2seq_cli.cli import app
from seq2seq_cli.config import Config, DataConfig, TokenizerConfig, TrainConfig
from seq2seq_cli.config_load import load_config
from seq2seq_cli.data.batching import collate
from seq2seq_cli.data.encoding import encoded_split
from seq2seq_cli.data.formats import read_parallel
from seq2seq_cli.data.tokenizer import load_tokenizers
from seq2seq_cli.errors import UserError
from seq2seq_cli.ids import BOS, EOS, PAD
from seq2seq_cli.run.tokenizing import train_tokenizer

runner = CliRunner()

ES = (SHIPPED / "valid.es").read_text(encoding="utf-8").splitlines()[:40]
EN = (SHIPPED / "valid.en").read_text(encoding="utf-8").splitlines()[:40]


def _spm(tmp: Path, name: str, model_type: str = "unigram", vocab: int = 300, **ids) -> Path:
    prefix = tmp / name
    spm.SentencePieceTrainer.train(
        input=[str(SHIPPED / "valid.es"), str(SHIPPED / "valid.en")], model_prefix=str(prefix), vocab_size=vocab,
        model_type=model_type, minloglevel=2, **({"pad_id": PAD, "unk_id": 1, "bos_id": BOS, "eos_id": EOS} | ids),
    )
    return prefix.with_suffix(".model")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("spm")
    return {"unigram": _spm(tmp, "uni"), "bpe": _spm(tmp, "bpe", "bpe"), "small": _spm(tmp, "small", vocab=200)}


def _config(tmp: Path, train: str, model: Path | None = None, **data) -> Config:
    return Config(
        name="t", run_dir=str(tmp / "run"), data=DataConfig(train=train, src_lang="es", tgt_lang="en", **data),
        tokenizer=TokenizerConfig(src_model=str(model) if model else None), train=TrainConfig(max_steps=1),
    )


def _write(path: Path, lines: list[str]) -> Path:
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def _all_formats(tmp: Path) -> dict[str, tuple[str, dict]]:
    """The same pairs in every supported layout -> {name: (data.train value, extra data keys)}."""
    _write(tmp / "plain.es", ES), _write(tmp / "plain.en", EN)
    _write(tmp / "zipped.es.gz", ES), _write(tmp / "zipped.en.gz", EN)
    tsv = [f"{s}\t{t}" for s, t in zip(ES, EN)]
    flat = [json.dumps({"es": s, "en": t, "id": i}, ensure_ascii=False) for i, (s, t) in enumerate(zip(ES, EN))]
    hf = [json.dumps({"translation": {"es": s, "en": t}}, ensure_ascii=False) for s, t in zip(ES, EN)]
    named = [json.dumps({"source": s, "target": t}) for s, t in zip(ES, EN)]
    return {
        "text": (str(tmp / "plain"), {}),
        "text.gz": (str(tmp / "zipped"), {}),
        "tsv": (str(_write(tmp / "pairs.tsv", tsv)), {}),
        "tsv.gz": (str(_write(tmp / "pairs.tsv.gz", tsv)), {}),
        "jsonl": (str(_write(tmp / "flat.jsonl", flat)), {}),
        "jsonl.gz": (str(_write(tmp / "flat.jsonl.gz", flat)), {}),
        "jsonl-hf": (str(_write(tmp / "hf.jsonl", hf)), {}),
        "jsonl-fields": (str(_write(tmp / "named.jsonl", named)), {"src_field": "source", "tgt_field": "target"}),
        "tsv-by-format": (str(_write(tmp / "pairs.txt", tsv)), {"format": "tsv"}),
    }


def test_every_format_round_trips_into_the_same_training_pairs(tmp_path, models):
    sp = spm.SentencePieceProcessor(model_file=str(models["unigram"]))
    expected_src, expected_tgt = sp.encode(ES), sp.encode(EN)
    for name, (train, extra) in _all_formats(tmp_path).items():
        raw = read_parallel(train, "es", "en", tmp_path / "hf", **extra)
        assert raw["src"] == ES and raw["tgt"] == EN, name
        corpus = encoded_split(_config(tmp_path / name, train, **extra), train, sp, sp, training=True)
        assert corpus.table.column("src_ids").to_pylist() == expected_src, name
        assert corpus.table.column("tgt_ids").to_pylist() == expected_tgt, name
        assert corpus.src_lens.tolist() == [len(s) + 1 for s in expected_src]


def _run_train(tmp: Path, model: Path, train: str, *overrides: str):
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["run_dir"] = str(tmp / "run")
    raw["data"].update({"train": train, "valid": None, "test": None})
    raw["tokenizer"]["src_model"] = str(model)
    path = tmp / "c.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    sets = [x for o in ("train.max_steps=1", *overrides) for x in ("--set", o)]
    return runner.invoke(app, ["train", "--config", str(path), "--no-progress", *sets])


def _bad_inputs(tmp: Path) -> dict[str, tuple[str, list[str], str]]:
    """name -> (data.train, overrides, expected fragment of the error line)."""
    (tmp / "utf.es").write_bytes(b"hola\nmal \xff aqui\nadios\n")
    _write(tmp / "utf.en", ["hello", "bad here", "bye"])
    _write(tmp / "count.es", ["uno", "dos", "tres"]), _write(tmp / "count.en", ["one", "two"])
    _write(tmp / "empty.es", ["uno", "dos", "tres"]), _write(tmp / "empty.en", ["one", "  ", "three"])
    _write(tmp / "cols.tsv", ["uno\tone", "dos\ttwo", "tres\tthree\textra", "cuatro\tfour"])
    _write(tmp / "short.tsv", ["uno\tone", "dos"])
    (tmp / "utf.tsv.gz").write_bytes(gzip.compress(b"uno\tone\nd\xc3os\ttwo\n"))
    _write(tmp / "notjson.jsonl", ['{"es": "uno", "en": "one"}', '{"es": "dos", "en": two}'])
    _write(tmp / "field.jsonl", ['{"es": "uno", "en": "one"}', '{"es": "dos", "en": "two"}', '{"es": "tres"}'])
    _write(tmp / "list.jsonl", ['["uno", "one"]'])
    return {
        "utf8": (str(tmp / "utf"), [], f"{tmp / 'utf.es'}:2: invalid UTF-8 at byte 4 of the line"),
        "utf8-gz": (str(tmp / "utf.tsv.gz"), [], f"{tmp / 'utf.tsv.gz'}:2: invalid UTF-8 at byte 1 of the line"),
        "counts": (str(tmp / "count"), [], f"{tmp / 'count.es'} has 3 lines but {tmp / 'count.en'} has 2"),
        "empty": (str(tmp / "empty"), ["data.on_empty=error"], f"{tmp / 'empty.en'}:2: empty target sentence"),
        "columns": (str(tmp / "cols.tsv"), [],
                    f"{tmp / 'cols.tsv'}:3: expected 2 tab-separated columns (source, target), found 3"),
        "columns-short": (str(tmp / "short.tsv"), [],
                          f"{tmp / 'short.tsv'}:2: expected 2 tab-separated columns (source, target), found 1"),
        "not-json": (str(tmp / "notjson.jsonl"), [], f"{tmp / 'notjson.jsonl'}:2: expected a JSON object, got invalid JSON"),
        "not-object": (str(tmp / "list.jsonl"), [], f"{tmp / 'list.jsonl'}:1: expected a JSON object, got list"),
        "no-field": (str(tmp / "field.jsonl"), [], f"{tmp / 'field.jsonl'}:3: expected string field(s) 'en'"),
        "missing-text": (str(tmp / "nothere"), [], f"{tmp / 'nothere.es'}: file not found"),
        "missing-tsv": (str(tmp / "nothere.tsv"), [], f"{tmp / 'nothere.tsv'}: file not found"),
    }


@pytest.mark.parametrize("case", ["utf8", "utf8-gz", "counts", "empty", "columns", "columns-short", "not-json",
                                  "not-object", "no-field", "missing-text", "missing-tsv"])
def test_bad_input_is_one_line_with_file_and_line(tmp_path, models, case):
    train, overrides, fragment = _bad_inputs(tmp_path)[case]
    result = _run_train(tmp_path, models["unigram"], train, *overrides)
    assert result.exit_code == 1, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and fragment in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_empty_lines_are_skipped_and_counted_by_default(tmp_path, models):
    _write(tmp_path / "c.es", ["uno", "", "tres", "cuatro"]), _write(tmp_path / "c.en", ["one", "two", " ", "four"])
    sp = spm.SentencePieceProcessor(model_file=str(models["unigram"]))
    corpus = encoded_split(_config(tmp_path, str(tmp_path / "c")), str(tmp_path / "c"), sp, sp, training=False)
    assert len(corpus) == 2 and corpus.dropped["empty"] == 2
    assert corpus.table.column("src").to_pylist() == ["uno", "cuatro"]


def test_cache_is_reused_and_rebuilt_when_tokenizer_or_data_change(tmp_path, models):
    train = _all_formats(tmp_path)["tsv"][0]
    config = _config(tmp_path, train)
    uni, small = (spm.SentencePieceProcessor(model_file=str(models[k])) for k in ("unigram", "small"))
    first = encoded_split(config, train, uni, uni, training=True)
    again = encoded_split(config, train, uni, uni, training=True)
    assert not first.from_cache and again.from_cache and again.cache_path == first.cache_path
    assert again.table.column("src_ids").to_pylist() == first.table.column("src_ids").to_pylist()
    other = encoded_split(config, train, small, small, training=True)
    assert not other.from_cache and other.cache_path != first.cache_path
    assert not first.cache_path.exists()  # the stale training cache is removed
    assert other.table.column("src_ids").to_pylist() == small.encode(ES)
    _write(Path(train), [f"{s}\t{t}" for s, t in zip(ES[:10], EN[:10])])
    changed = encoded_split(config, train, small, small, training=True)
    assert not changed.from_cache and len(changed) == 10
    filters = config.data.filters.model_copy(update={"duplicates": "normalized"})
    stricter = encoded_split(config.model_copy(update={"data": config.data.model_copy(update={"filters": filters})}),
                             train, small, small, training=True)
    assert not stricter.from_cache


def test_filters_count_what_they_drop_in_log_and_metrics(tmp_path, models):
    sp = spm.SentencePieceProcessor(model_file=str(models["unigram"]))
    es_all = (SHIPPED / "valid.es").read_text(encoding="utf-8").splitlines()
    en_all = (SHIPPED / "valid.en").read_text(encoding="utf-8").splitlines()
    lens = lambda s, t: (len(sp.encode(s)), len(sp.encode(t)))  # noqa: E731
    short = [(s, t) for s, t in zip(es_all, en_all) if max(lens(s, t)) <= 40 and max(lens(s, t)) < 3 * min(lens(s, t))]
    pairs = short[:20]
    long_es = " ".join(s for s, _ in pairs[:6])
    wordy_en = next(t for _, t in short if len(sp.encode(t)) >= 20)
    assert len(sp.encode(long_es)) > 60 and len(sp.encode("sí")) <= 3 and len(set(pairs)) == 20
    lines = [f"{s}\t{t}" for s, t in pairs]
    lines += [lines[0], lines[1], lines[1]]  # 3 duplicates
    lines += ["\tvacío", "solo\t"]  # 2 empty
    lines += [f"{long_es}\tshort"]  # too long (and unbalanced: counted once, as too long)
    lines += [f"sí\t{wordy_en}"]  # length ratio over 6
    path = _write(tmp_path / "f.tsv", lines)
    result = _run_train(tmp_path, models["unigram"], str(path), "data.max_src_len=60", "data.max_len_ratio=6",
                        "data.dedup=true")
    assert result.exit_code == 0, result.output
    assert "train: 20 pairs" in result.stderr
    assert "dropped 2 empty, 1 over 60/64 subwords, 1 over length ratio 6, 3 duplicates" in result.stderr
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    machine = {key: record.pop(key) for key in ("device", "precision", "cpu")}
    others = {k: record.pop(k) for k in list(record) if k.startswith("train_dropped_") and k not in (
        "train_dropped_empty", "train_dropped_too_long", "train_dropped_ratio", "train_dropped_duplicate")}
    assert record == {"step": 0, "train_pairs": 20, "train_dropped_empty": 2, "train_dropped_too_long": 1,
                      "train_dropped_ratio": 1, "train_dropped_duplicate": 3}
    assert others and set(others.values()) == {0}  # the cleaning filters drop none of these pairs
    assert machine["device"] == "cpu" and machine["precision"] in ("fp32", "bf16") and machine["cpu"]["cores"] >= 1


@pytest.mark.parametrize("kind", ["unigram", "bpe"])
def test_subword_sampling_is_deterministic_per_batch_and_keeps_the_text(tmp_path, models, kind):
    sp = spm.SentencePieceProcessor(model_file=str(models[kind]))
    train = str(_write(tmp_path / "p.tsv", [f"{s}\t{t}" for s, t in zip(ES, EN)]))
    config = _config(tmp_path, train)
    config.tokenizer.sampling, config.tokenizer.alpha = True, 0.3
    corpus = encoded_split(config, train, sp, sp, training=True)
    index = np.arange(len(corpus))
    a, b, c = (collate(corpus, index, key).src for key in ((1, 0, 0), (1, 0, 0), (1, 0, 1)))
    fixed = collate(corpus, index).src
    assert a.tolist() == b.tolist()
    assert a.tolist() != c.tolist() and a.tolist() != fixed.tolist()
    for row, fixed_row in zip(a.tolist(), fixed.tolist()):
        assert row.count(EOS) == 1
        assert sp.decode([i for i in row if i not in (PAD, EOS)]) == sp.decode([i for i in fixed_row if i not in (PAD, EOS)])


def test_exact_resume_with_subword_sampling(tmp_path):
    ref = quiet(make_config(tmp_path, "ref", max_steps=14), False, "tokenizer.sampling=true")
    cfg = make_config(tmp_path, "run", max_steps=14)
    quiet(cfg, False, "tokenizer.sampling=true", "train.max_steps=5")
    run = quiet(cfg, True, "tokenizer.sampling=true")
    assert_same(ref, run)


def test_supplied_and_separate_models(tmp_path, models):
    config = _config(tmp_path, str(SHIPPED / "valid"))
    separate = config.model_copy(update={"tokenizer": TokenizerConfig(joint=False, src_model=str(models["unigram"]),
                                                                      tgt_model=str(models["bpe"]))})
    paths = train_tokenizer(separate)
    assert [p.name for p in paths] == ["spm.src.model", "spm.tgt.model"]
    assert paths[1].read_bytes() == models["bpe"].read_bytes()
    src_sp, tgt_sp = load_tokenizers(config.run_path, joint=False)
    assert src_sp.serialized_model_proto() != tgt_sp.serialized_model_proto()
    trained = config.model_copy(update={"tokenizer": TokenizerConfig(joint=False, vocab_size=200, model_type="bpe"),
                                        "run_dir": str(tmp_path / "trained")})
    src_sp, tgt_sp = (spm.SentencePieceProcessor(model_file=str(p)) for p in train_tokenizer(trained))
    assert src_sp.get_piece_size() == tgt_sp.get_piece_size() == 200
    assert src_sp.id_to_piece(list(range(200))) != tgt_sp.id_to_piece(list(range(200)))


def test_supplied_model_is_checked(tmp_path, models):
    default_ids = _spm(tmp_path, "default", vocab=100, pad_id=-1, unk_id=0, bos_id=1, eos_id=2)
    for given, fragment in ((default_ids, "pad=-1 (expected 0)"), (tmp_path / "none.model", "SentencePiece model not found")):
        with pytest.raises(UserError, match=re.escape(fragment)):
            train_tokenizer(_config(tmp_path, str(SHIPPED / "valid"), given))
    with pytest.raises(UserError, match="set both src_model and tgt_model"):
        load_config(REPO / "configs" / "tiny.yaml", ["tokenizer.joint=false", f"tokenizer.src_model={models['bpe']}"])


def test_tokenize_reads_any_format(tmp_path):
    es = (SHIPPED / "valid.es").read_text(encoding="utf-8").splitlines()
    en = (SHIPPED / "valid.en").read_text(encoding="utf-8").splitlines()
    path = _write(tmp_path / "all.jsonl.gz", [json.dumps({"translation": {"es": s, "en": t}}) for s, t in zip(es, en)])
    config = _config(tmp_path, str(path)).model_copy(update={"tokenizer": TokenizerConfig(vocab_size=300)})
    (model,) = train_tokenizer(config)
    sp = spm.SentencePieceProcessor(model_file=str(model))
    assert sp.get_piece_size() == 300 and sp.decode(sp.encode(en[0])) == en[0]


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="needs /proc/self/maps (Linux)")
def test_cached_corpus_is_memory_mapped_and_its_pages_can_be_released(tmp_path, models):
    sp = spm.SentencePieceProcessor(model_file=str(models["unigram"]))
    train = _all_formats(tmp_path)["text"][0]
    corpus = encoded_split(_config(tmp_path, train), train, sp, sp, training=True)
    maps = Path("/proc/self/maps").read_text()
    assert str(corpus.cache_path.resolve()) in maps and corpus.release.ranges
    index = np.arange(len(corpus))[::-1]
    first = collate(corpus, index)  # releases the pages it read
    again = collate(corpus, index)
    assert (again.src.tolist(), again.tgt_in.tolist(), again.tgt_out.tolist()) == \
        (first.src.tolist(), first.tgt_in.tolist(), first.tgt_out.tolist())
    assert first.src[0, : len(sp.encode(ES[-1])) + 1].tolist() == sp.encode(ES[-1]) + [EOS]


def test_a_killed_encodings_leftovers_are_removed_and_a_live_ones_kept(tmp_path, models):
    import subprocess
    import sys

    train = _all_formats(tmp_path)["tsv"][0]
    config = _config(tmp_path, train)
    uni = spm.SentencePieceProcessor(model_file=str(models["unigram"]))
    root = config.run_path / "cache" / "encoded"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = root / f".building-{int(dead.stdout)}.train-0123.tmp"
    live = root / f".building-{os.getppid()}.train-4567.tmp"  # a process that is still running
    for d in (left, live):
        (d / "dataset").mkdir(parents=True)
        (d / "encoded.arrow").write_bytes(b"partial")
    corpus = encoded_split(config, train, uni, uni, training=True)
    assert len(corpus) and not left.exists() and live.exists()
    assert not [p for p in root.iterdir() if p.name.startswith(".building-") and p != live]  # its own build is gone too


@pytest.mark.parametrize("fmt", ["text", "tsv", "jsonl", "text.gz"])
def test_a_byte_order_mark_at_the_start_of_a_corpus_file_is_skipped(tmp_path, fmt):
    """An editor's BOM is not part of the first sentence (nor does it break the first JSON line)."""
    bom = "\ufeff"
    if fmt.startswith("text"):
        gz = fmt.endswith(".gz")
        for lang, text in (("es", "uno\ndos\n"), ("en", "one\ntwo\n")):
            data = (bom + text).encode("utf-8")
            path = tmp_path / (f"c.{lang}.gz" if gz else f"c.{lang}")
            path.write_bytes(gzip.compress(data) if gz else data)
        value = str(tmp_path / "c")
    elif fmt == "tsv":
        (tmp_path / "c.tsv").write_text(bom + "uno\tone\ndos\ttwo\n", encoding="utf-8")
        value = str(tmp_path / "c.tsv")
    else:
        lines = [json.dumps({"es": s, "en": t}) for s, t in (("uno", "one"), ("dos", "two"))]
        (tmp_path / "c.jsonl").write_text(bom + "\n".join(lines) + "\n", encoding="utf-8")
        value = str(tmp_path / "c.jsonl")
    ds = read_parallel(value, "es", "en", tmp_path / "cache")
    assert ds["src"] == ["uno", "dos"] and ds["tgt"] == ["one", "two"]
