"""Runs of several language pairs: corpora naming their own languages, the target's token on
the source, temperature sampling of the pairs and of the tokenizer's text, validation per
pair, and every command picking a pair (--src-lang, --tgt-lang)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pytest
import sentencepiece as spm
import yaml
from typer.testing import CliRunner

from helpers import REPO, SHIPPED, documented_errors, make_config, one_error_line, quiet, weights
from seq2seq_cli.cli import app
from seq2seq_cli.config_load import load_config
from seq2seq_cli.data.corpora import Part, pair_factors
from seq2seq_cli.data.tokenizer import keep_rates, language_shares
from seq2seq_cli.errors import UserError
from seq2seq_cli.languages import choose_pair

NY = REPO / "data" / "bible-ny-en"


def _lines(path: Path, n: int, start: int = 0) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()[start : start + n]


def _pairs(tmp: Path) -> dict[str, Path]:
    """Small es-en and ny-en corpora (train and valid prefixes) from the shipped Bibles."""
    out = {}
    for name, folder, lang in (("es", SHIPPED, "es"), ("ny", NY, "ny")):
        for split, start, n in (("train", 0, 160), ("valid", 160, 24)):
            prefix = tmp / f"{name}-{split}"
            for side in (lang, "en"):
                Path(f"{prefix}.{side}").write_text("\n".join(_lines(folder / f"valid.{side}", n, start)) + "\n",
                                                    encoding="utf-8")
            out[f"{name}-{split}"] = prefix
    return out


def _config(tmp: Path, name: str, direction: str, **train) -> Path:
    """configs/tiny.yaml on the two pairs: `direction` many-to-one (es, ny -> en) or one-to-many
    (en -> es, ny)."""
    files = _pairs(tmp)
    path = make_config(tmp, name, max_steps=12, valid_every=6, **train)
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))

    def entry(lang: str, split: str) -> dict:
        pair = {"src_lang": lang, "tgt_lang": "en"} if direction == "m2o" else {"src_lang": "en", "tgt_lang": lang}
        return {"path": str(files[f"{lang}-{split}"]), **pair}

    raw["data"]["train"] = [entry("es", "train"), entry("ny", "train")]
    raw["data"]["valid"] = [entry("es", "valid"), entry("ny", "valid")]
    raw["data"]["filters"] = {"langid": False, "cooccurrence": None}
    raw["tokenizer"]["vocab_size"] = 320
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def one_to_many(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("o2m")
    return quiet(_config(tmp, "o2m", "o2m", valid_bleu=True))


@pytest.fixture(scope="module")
def many_to_one(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("m2o")
    return quiet(_config(tmp, "m2o", "m2o"))


def test_the_pairs_and_tokens_of_a_config(tmp_path):
    o2m = load_config(_config(tmp_path, "a", "o2m")).data
    assert o2m.pairs == [("en", "es"), ("en", "ny")]
    assert o2m.targets == ["es", "ny"]
    assert [o2m.target_token(t) for t in o2m.targets] == [">>es<<", ">>ny<<"]
    m2o = load_config(_config(tmp_path, "b", "m2o")).data
    assert m2o.pairs == [("es", "en"), ("ny", "en")]
    assert m2o.target_token("en") is None  # one target: nothing to name
    one = load_config(make_config(tmp_path, "c")).data
    assert one.pairs == [("es", "en")] and one.language_tokens == []


def test_the_same_file_for_two_pairs_is_two_corpora_and_the_same_pair_twice_is_refused(tmp_path):
    path = _config(tmp_path, "a", "o2m")
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    raw["data"]["train"].append(dict(raw["data"]["train"][0]))
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    with pytest.raises(UserError, match=r"entry 2 .* repeats entry 0"):
        load_config(path)


def test_temperature_evens_out_the_pairs_and_leaves_one_pair_alone():
    big, small = Part("a", 1.0, None, 0, 9000), Part("b", 1.0, None, 9000, 1000)
    pairs = [("es", "en"), ("ny", "en")]
    assert pair_factors([big, small], pairs, 1.0) == pytest.approx([1.0, 1.0])
    factors = pair_factors([big, small], pairs, 5.0)
    drawn = [p.count * f for p, f in zip((big, small), factors)]
    assert sum(drawn) == pytest.approx(10000)  # an epoch keeps its size
    q = [0.9 ** 0.2, 0.1 ** 0.2]
    assert drawn[1] / sum(drawn) == pytest.approx(q[1] / sum(q))  # (n_p / N)^(1/T), normalised
    assert pair_factors([big, small], [("es", "en")] * 2, 5.0) == [1.0, 1.0]  # one pair: weights as given
    # two corpora of one pair share its draw in proportion to their weights
    f = pair_factors([big, Part("c", 2.0, None, 0, 1000), small], [pairs[0], pairs[0], pairs[1]], 5.0)
    assert f[0] == f[1]


def test_the_tokenizer_keeps_the_smallest_language_whole_and_samples_the_rest_to_their_shares():
    counts = {"en": 56000, "es": 28000, "ny": 7000}
    shares = language_shares(counts, 5.0)
    assert sum(shares.values()) == pytest.approx(1.0)
    rates = keep_rates(counts, 5.0)
    assert rates["ny"] == 1.0 and rates["en"] < rates["es"] < 1.0
    kept = {lang: counts[lang] * rates[lang] for lang in counts}
    assert {k: v / sum(kept.values()) for k, v in kept.items()} == pytest.approx(shares)
    assert keep_rates(counts, 1.0) == pytest.approx({"en": 1.0, "es": 1.0, "ny": 1.0})


def test_choose_pair_needs_the_target_only_where_there_are_several():
    o2m = [("en", "es"), ("en", "ny")]
    with pytest.raises(UserError, match=r"^R translates into es, ny \(en -> es, en -> ny\): give the target language "
                                         r"with --tgt-lang$"):
        choose_pair(o2m, None, None, "R")
    assert choose_pair(o2m, None, "ny", "R") == ("en", "ny")
    with pytest.raises(UserError, match=r"--tgt-lang fr: R translates into es, ny"):
        choose_pair(o2m, None, "fr", "R")
    m2o = [("es", "en"), ("ny", "en")]
    assert choose_pair(m2o, None, None, "R") == ("es/ny", "en")
    assert choose_pair(m2o, "ny", None, "R") == ("ny", "en")
    with pytest.raises(UserError, match=r"--src-lang de --tgt-lang en: R translates es -> en, ny -> en"):
        choose_pair(m2o, "de", None, "R")
    assert choose_pair([("src", "tgt")], "fr", "de", "R") == ("fr", "de")  # a run that names no language


def _first_source_ids(run: Path, label: str) -> list[int]:
    (cache,) = (run / "cache" / "encoded").glob(f"{label}-*")
    with pa.memory_map(str(cache / "pairs.arrow")) as source:
        table = pa.ipc.open_stream(source).read_all()
    return [row[0] for row in table.column("src_ids").to_pylist()]


def test_each_source_starts_with_its_targets_token(one_to_many):
    sp = spm.SentencePieceProcessor(model_file=str(one_to_many / "spm.model"))
    es, ny = sp.piece_to_id(">>es<<"), sp.piece_to_id(">>ny<<")
    assert sp.encode(">>es<<", out_type=str)[-1:] == [">>es<<"]  # one piece, never split
    assert set(_first_source_ids(one_to_many, "train.0")) == {es}
    assert set(_first_source_ids(one_to_many, "train.1")) == {ny}
    assert set(_first_source_ids(one_to_many, "valid.0")) == {es}
    assert set(_first_source_ids(one_to_many, "valid.1")) == {ny}


def test_validation_is_reported_per_pair(one_to_many):
    records = [json.loads(line) for line in (one_to_many / "metrics.jsonl").read_text().splitlines()]
    first = records[0]
    assert [c["pair"] for c in first["train_corpora"]] == ["en-es", "en-ny"]
    valid = [r for r in records if "valid_nll" in r]
    assert valid
    for r in valid:
        for pair in ("en-es", "en-ny"):
            assert math.isfinite(r[f"valid_nll/{pair}"]) and f"valid_bleu/{pair}" in r
        # the loss over both is their token-weighted mean, between the two
        lo, hi = sorted((r["valid_nll/en-es"], r["valid_nll/en-ny"]))
        assert lo <= r["valid_nll"] <= hi
        assert r["valid_bleu"] == pytest.approx((r["valid_bleu/en-es"] + r["valid_bleu/en-ny"]) / 2)
    report = json.loads((one_to_many / "data_report.json").read_text())
    assert set(report["pairs"]) == {"en-es", "en-ny"}
    assert sum(p["read"] for p in report["pairs"].values()) == report["read"]


def test_translate_refuses_a_missing_target_in_one_line_and_puts_the_token_in_front(one_to_many, tmp_path):
    src = tmp_path / "in.en"
    src.write_text("In the beginning God created the heavens and the earth.\nAnd the earth was waste.\n")
    runner = CliRunner()
    r = runner.invoke(app, ["translate", "--model", str(one_to_many), "-i", str(src), "--engine", "torch"])
    assert r.exit_code != 0
    assert one_error_line(r, "translates into es, ny", "--tgt-lang")
    outs = {}
    for tgt in ("es", "ny"):
        r = runner.invoke(app, ["translate", "--model", str(one_to_many), "-i", str(src), "--tgt-lang", tgt,
                                "--engine", "torch"])
        assert r.exit_code == 0, r.output
        assert f"(en -> {tgt}, " in r.stderr
        outs[tgt] = r.stdout
    assert len(outs["es"].splitlines()) == len(outs["ny"].splitlines()) == 2
    r = runner.invoke(app, ["info", "--model", str(one_to_many)])
    assert "language pairs: en -> es, en -> ny; the target named by the source token: es >>es<<, ny >>ny<<" in r.stdout


def test_the_token_goes_in_front_of_the_source_for_every_engine(one_to_many, tmp_path):
    """CTranslate2 (the default engine) and our search decode the same ids: the token in front."""
    pytest.importorskip("ctranslate2")
    src = tmp_path / "in.en"
    src.write_text("\n".join(_lines(SHIPPED / "valid.en", 6, 300)) + "\n")
    runner = CliRunner()
    out = {}
    for engine in ("torch", "ctranslate2"):
        r = runner.invoke(app, ["translate", "--model", str(one_to_many), "-i", str(src), "--tgt-lang", "ny",
                                "--engine", engine, "--full-vocabulary", "--beam-size", "1"])
        assert r.exit_code == 0, r.output
        out[engine] = r.stdout
    assert out["torch"] == out["ctranslate2"]


def test_the_target_token_changes_the_translation(one_to_many):
    from seq2seq_cli.decode.translate import Translator

    t = Translator.load(one_to_many, "cpu")
    lines = _lines(SHIPPED / "valid.en", 8, 300)
    es, ny = t.with_pair(None, "es"), t.with_pair(None, "ny")
    assert es.tag_ids != ny.tag_ids and len(es.tag_ids) == 1
    assert es.encode(lines)[0][0] == es.tag_ids[0]
    # the model reads the token: the same lines score otherwise under each target
    scores = [[h[0].log_prob for h in x.translate_hypotheses(lines)] for x in (es, ny)]
    assert scores[0] != scores[1]


def test_a_many_to_one_run_needs_no_flag_and_names_the_pair(many_to_one, tmp_path):
    src = tmp_path / "in.ny"
    src.write_text("\n".join(_lines(NY / "valid.ny", 4, 300)) + "\n")
    runner = CliRunner()
    r = runner.invoke(app, ["translate", "--model", str(many_to_one), "-i", str(src), "--engine", "torch"])
    assert r.exit_code == 0 and "(es/ny -> en, " in r.stderr
    named = runner.invoke(app, ["translate", "--model", str(many_to_one), "-i", str(src), "--engine", "torch",
                                "--src-lang", "ny"])
    assert named.exit_code == 0 and "(ny -> en, " in named.stderr
    assert named.stdout == r.stdout  # the source needs no token: naming it changes nothing
    ref = tmp_path / "ref.en"
    ref.write_text("\n".join(_lines(NY / "valid.en", 4, 300)) + "\n")
    r = runner.invoke(app, ["evaluate", "--model", str(many_to_one), "--src", str(src), "--ref", str(ref),
                            "--src-lang", "ny", "--tgt-lang", "en", "--engine", "torch"])
    assert r.exit_code == 0 and r.stdout.startswith("BLEU|")
    r = runner.invoke(app, ["evaluate", "--model", str(many_to_one), "--src", str(src), "--ref", str(ref),
                            "--tgt-lang", "es"])
    assert r.exit_code != 0 and one_error_line(r, "--tgt-lang es", "translates into en")
    r = runner.invoke(app, ["evaluate", "--hyp", str(ref), "--ref", str(ref), "--src-lang", "ny"])
    assert r.exit_code != 0 and one_error_line(r, "--src-lang and --tgt-lang go with --model and --src")


def test_score_takes_the_pair_and_its_token(one_to_many, tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{e}\t{s}\n" for e, s in zip(_lines(SHIPPED / "valid.en", 4), _lines(SHIPPED / "valid.es", 4))))
    runner = CliRunner()
    r = runner.invoke(app, ["score", "--model", str(one_to_many), "-i", str(pairs)])
    assert r.exit_code != 0 and one_error_line(r, "--model: ", "give the target language with --tgt-lang")
    es = runner.invoke(app, ["score", "--model", str(one_to_many), "-i", str(pairs), "--tgt-lang", "es"])
    ny = runner.invoke(app, ["score", "--model", str(one_to_many), "-i", str(pairs), "--tgt-lang", "ny"])
    assert es.exit_code == 0 and ny.exit_code == 0
    assert len(es.stdout.split()) == 4 and es.stdout != ny.stdout  # the token is in front: other scores


def test_a_one_pair_run_is_unchanged_when_its_corpus_names_the_runs_languages(tmp_path):
    """A corpus naming the run's own languages is the run of today: no token, the same batches,
    weights and report."""
    plain = make_config(tmp_path, "plain", max_steps=8)
    named = make_config(tmp_path, "named", max_steps=8)
    for path, langs in ((plain, {}), (named, {"src_lang": "es", "tgt_lang": "en"})):
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        raw["data"]["train"] = [{"path": raw["data"]["train"], **langs}]
        path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    a, b = quiet(plain), quiet(named)
    wa, wb = weights(a), weights(b)
    assert all((wa[k] == wb[k]).all() for k in wa)
    sp = spm.SentencePieceProcessor(model_file=str(b / "spm.model"))
    assert not any(sp.id_to_piece(i).startswith(">>") for i in range(sp.get_piece_size()))
    report = json.loads((b / "data_report.json").read_text())
    assert "pairs" not in report and "pair" not in report["corpora"][0]
    plain_sp = spm.SentencePieceProcessor(model_file=str(a / "spm.model"))
    assert [plain_sp.id_to_piece(i) for i in range(plain_sp.get_piece_size())] == [
        sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def test_a_valid_split_of_a_pair_the_run_does_not_learn_is_refused(tmp_path):
    path = _config(tmp_path, "a", "m2o")
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    raw["data"]["valid"][1]["src_lang"] = "fr"
    Path(f"{raw['data']['valid'][1]['path']}.fr").write_text(
        Path(f"{raw['data']['valid'][1]['path']}.ny").read_text(encoding="utf-8"), encoding="utf-8")
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    r = CliRunner().invoke(app, ["train", "--config", str(path), "--no-progress"])
    assert r.exit_code != 0
    assert one_error_line(r, "data.valid[1]", "fr -> en, a pair the run does not learn", "es -> en, ny -> en")


@pytest.mark.parametrize("text, fragments", [
    ("  src_lang: no\n", ["data.src_lang: YAML reads an unquoted no, off, yes or on as false: quote the language code"]),
    ("  train: [{path: a, tgt_lang: on}]\n", ["data.train[0].tgt_lang: YAML reads an unquoted no, off, yes or on as true"]),
])
def test_an_unquoted_language_code_that_yaml_reads_as_a_boolean_is_named(tmp_path, text, fragments):
    path = tmp_path / "c.yaml"
    body = "name: x\ndata:\n" + ("  train: a\n" if "train" not in text else "") + text
    path.write_text(body, encoding="utf-8")
    r = CliRunner().invoke(app, ["info", "--config", str(path)])
    assert one_error_line(r, *fragments)


def test_duplicates_off_unquoted_is_off(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: x\ndata:\n  train: a\n  filters:\n    duplicates: off\n", encoding="utf-8")
    assert load_config(path).data.filters.duplicates == "off"


def test_the_language_pair_refusals_are_documented_as_they_read():
    """docs/errors.md, "Language pairs": every row is a case of this module, and the messages
    `choose_pair` writes read as documented, word for word."""
    documented = documented_errors("Language pairs")
    assert set(documented) == {"pair-no-target", "pair-unknown-target", "pair-unknown-source", "pair-without-model",
                               "pair-score-reverse", "pair-language-boolean", "pair-valid-not-learned"}
    o2m, m2o = [("en", "es"), ("en", "ny")], [("es", "en"), ("ny", "en")]
    for case, (pairs, src, tgt, where) in {"pair-no-target": (o2m, None, None, "runs/en-xx"),
                                           "pair-unknown-target": (o2m, None, "fr", "runs/en-xx"),
                                           "pair-unknown-source": (m2o, "de", None, "runs/multilingual")}.items():
        with pytest.raises(UserError) as caught:
            choose_pair(pairs, src, tgt, where)
        assert f"error: {caught.value}" == documented[case]
    assert documented["pair-score-reverse"] == documented["pair-no-target"].replace("error: ", "error: --model: ")
