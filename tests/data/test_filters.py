"""The cleaning filters (`data/filters.py`): each rejects its kind of noise and keeps real
pairs, the first filter to reject a pair drops it, thresholds are settings and one setting
turns them all off; the data report of `seq2seq tokenize` counts what each dropped."""

from __future__ import annotations

import gzip
import json

import pytest
import yaml
from typer.testing import CliRunner

from helpers import REPO, SHIPPED
from seq2seq_cli.cli import app
from seq2seq_cli.config import DataConfig, FiltersConfig
from seq2seq_cli.data.filters import Drop, Filters, check_pair, normalized, numbers_differ, training_filters

ES = (SHIPPED / "valid.es").read_text(encoding="utf-8").splitlines()
EN = (SHIPPED / "valid.en").read_text(encoding="utf-8").splitlines()
runner = CliRunner()

CLEAN = ("Y dijo Dios: Sea la luz, y fué la luz.", "God said, “Let there be light,” and there was light.")
LONG_ES = " ".join(["palabra"] * 151)
# noise of each kind, and the filter that drops it with the default settings
NOISE = [
    (("Y dijo Dios:\x07 Sea la luz.", CLEAN[1]), "control"),
    (("Y dijo <b>Dios</b>: Sea la luz.", CLEAN[1]), "control"),
    ((CLEAN[0], CLEAN[0]), "same"),
    ((LONG_ES, LONG_ES.replace("palabra", "word")), "long_words"),
    (("Luz.", "God said, let there be light, and there was light, and God saw the light."), "length_ratio"),
    (("En el año 1909 vivían 30 personas.", "In the year 1911 there lived 31 people."), "numbers"),
    (("Visite www.biblia.es para leer más.", "Visit www.bible.com to read more."), "urls"),
    (("Escriba a info@biblia.es hoy mismo.", "Write to help@bible.org today."), "urls"),
    ((CLEAN[1], CLEAN[0]), "langid"),  # swapped sides
    ((CLEAN[0], "Et Dieu dit : Que la lumière soit ! Et la lumière fut."), "langid"),  # another language
]


def defaults(**filters) -> Filters:
    return training_filters(DataConfig(train="x", src_lang="es", tgt_lang="en", filters=FiltersConfig(**filters)))


def check(pair: tuple[str, str], f: Filters) -> str:
    return check_pair(pair[0], pair[1], 10, 10, f).key


@pytest.mark.parametrize("pair,expected", NOISE)
def test_each_default_filter_drops_its_noise(pair, expected):
    assert check(pair, defaults()) == expected


def test_real_pairs_pass_the_default_filters():
    f = defaults()
    kept = [check(p, f) == "kept" for p in zip(ES, EN)]
    assert sum(kept) >= 0.98 * len(kept)
    assert check(CLEAN, f) == "kept"
    assert check(("Tiene 12 hijos y 3 hijas.", "He has 12 sons and 3 daughters."), f) == "kept"  # the same numbers
    assert check(("Vea www.biblia.es para leer la palabra de Dios cada día.", "See www.biblia.es to read the word of God "
                  "every day."), f) == "kept"  # the same URL


def test_the_first_filter_that_rejects_a_pair_drops_it():
    copy = (CLEAN[1], CLEAN[1])  # the same text, and Spanish in neither side: `same` comes first
    assert check(copy, defaults()) == "same"
    assert check(copy, defaults(same=False)) == "langid"
    assert check(copy, defaults(same=False, langid=False)) == "kept"


def test_off_filters_and_settable_thresholds():
    off = defaults(enabled=False)
    assert all(check(pair, off) == "kept" for pair, _ in NOISE)
    assert check_pair("", "x", 0, 1, off) is Drop.EMPTY  # an empty side is never a pair
    assert not any(off.langs) and off.dedup == "off"
    assert DataConfig(train="x", filters=False).filters.enabled is False  # `filters: off` in YAML
    eight = defaults(max_words=8, langid=False)
    assert check(CLEAN, eight) == "long_words" and check(("Sea la luz.", "Let there be light."), eight) == "kept"
    assert check(("Luz.", "Let there be light now."), defaults(length_ratio=0.3, langid=False)) == "kept"
    letters = defaults(min_alpha=0.5)
    assert check(("-- | -- | 2 | 2 --", "-- | -- | 2 | 2 --"), defaults(same=False, langid=False, min_alpha=0.5)) == "alpha"
    assert check(CLEAN, letters) == "kept"
    repeats = defaults(max_repeats=3)
    assert check(("sí sí sí sí sí, dijo.", "yes yes yes yes yes, he said."), repeats) == "repeats"
    assert check(("Santo, santo, santo es el Señor.", "Holy, holy, holy is the Lord."), repeats) == "kept"


def test_numbers_are_compared_as_opuscleaner_does():
    assert not numbers_differ("Capítulo 007, versículo 3.", "Chapter 7, verse 3.")  # leading zeros aside
    assert not numbers_differ("1.000 personas", "1,000 people")  # separators aside
    assert numbers_differ("Año 1909.", "Year 1910.")
    assert not numbers_differ("Sin números.", "No numbers.")


def test_normalised_duplicates_ignore_case_punctuation_and_spaces():
    assert normalized("¡Hola,  MUNDO!") == normalized("hola mundo") == "holamundo"


def _noisy_corpus(tmp_path):
    """120 real pairs of the shipped corpus, then the noise of NOISE and 3 repeats of real pairs
    (2 exact, 1 differing in case and punctuation)."""
    pairs = list(zip(ES[:120], EN[:120]))
    pairs += [pair for pair, _ in NOISE]
    pairs += [pairs[0], pairs[1], (pairs[2][0].upper(), pairs[2][1].rstrip(".!?") + " !")]
    path = tmp_path / "noisy.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path, pairs


def _config(tmp_path, train, **data) -> str:
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["run_dir"] = str(tmp_path / "run")
    raw["data"].update({"train": train, "valid": str(SHIPPED / "valid"), "test": None, "max_src_len": 200,
                        "max_tgt_len": 200, **data})
    raw["model"]["max_positions"] = 256
    raw["train"].update({"max_steps": 2, "valid_every": 2})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return str(path)


def test_tokenize_reports_what_each_filter_dropped(tmp_path):
    corpus, pairs = _noisy_corpus(tmp_path)
    config = _config(tmp_path, str(corpus), filters={"duplicates": "normalized"})
    r = runner.invoke(app, ["tokenize", "-c", config])
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "run" / "data_report.json").read_text(encoding="utf-8"))
    assert report["read"] == len(pairs) == report["kept"] + sum(report["dropped"].values())
    expected = {key: sum(1 for _, k in NOISE if k == key) for _, key in NOISE}
    real_drops = report["dropped"]["langid"] - expected["langid"]  # a real verse the identifier doubts
    assert 0 <= real_drops <= 2
    assert {k: v for k, v in report["dropped"].items() if v and k not in ("langid", "duplicate")} == {
        k: v for k, v in expected.items() if k != "langid"}
    assert report["dropped"]["duplicate"] == 3
    lines = r.stdout.splitlines()
    assert any(line.split()[:1] == ["read"] and line.split()[1] == str(len(pairs)) for line in lines)
    assert any(line.split()[:1] == ["numbers"] and line.split()[-2:] == ["1", f"{100 / len(pairs):.2f}%"] for line in lines)
    assert any(line.strip().startswith("source (read)") for line in lines)
    p = report["lengths"]["read"]["source"]
    assert 0 < p["p50"] <= p["p90"] <= p["p99"] <= p["max"]
    assert (tmp_path / "run" / "data_report.png").stat().st_size > 1000
    with gzip.open(tmp_path / "run" / "dropped.tsv.gz", "rt", encoding="utf-8") as f:
        header, *rows = f.read().splitlines()
    assert header == "corpus\tpair\tfilter\tsource\ttarget"
    assert len(rows) == report["read"] - report["kept"]
    by_pair = {int(row.split("\t")[1]): row.split("\t") for row in rows}
    for i, (pair, key) in enumerate(NOISE, start=121):
        assert by_pair[i][2] == key and by_pair[i][3] == " ".join(pair[0].split()) and by_pair[i][4] == pair[1]
    assert {number for number, row in by_pair.items() if row[2] == "duplicate"} == {131, 132, 133}


def test_info_shows_the_data_report_of_a_trained_run(tmp_path):
    corpus, _ = _noisy_corpus(tmp_path)
    config = _config(tmp_path, str(corpus))
    assert runner.invoke(app, ["train", "-c", config, "--no-progress"]).exit_code == 0
    report = json.loads((tmp_path / "run" / "data_report.json").read_text(encoding="utf-8"))  # train made the tokenizer
    r = runner.invoke(app, ["info", "--model", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    kept = [line.split() for line in r.stdout.splitlines() if line.startswith("kept ")]
    assert "training data" in r.stdout and kept[0][1] == f"{report['kept']:,}"


def test_a_score_file_drops_the_lowest_share(tmp_path):
    corpus, pairs = _noisy_corpus(tmp_path)
    scores = tmp_path / "scores.txt"
    scores.write_text("".join(f"{-i % 17 / 10}\n" for i in range(len(pairs))), encoding="utf-8")
    entry = {"path": str(corpus), "scores": str(scores), "drop_lowest": 0.25}
    config = _config(tmp_path, [entry], filters=False)
    assert runner.invoke(app, ["tokenize", "-c", config]).exit_code == 0
    report = json.loads((tmp_path / "run" / "data_report.json").read_text(encoding="utf-8"))
    values = [-i % 17 / 10 for i in range(len(pairs))]
    lowest = sorted(range(len(values)), key=lambda i: values[i])[: int(0.25 * len(values))]
    assert report["dropped"]["score"] == len(lowest) and "score" in report["filters"]["on"]
    with gzip.open(tmp_path / "run" / "dropped.tsv.gz", "rt", encoding="utf-8") as f:
        dropped = {int(line.split("\t")[1]) - 1 for line in f.read().splitlines()[1:] if line.split("\t")[2] == "score"}
    assert dropped == set(lowest)
    scores.write_text("1\n2\n", encoding="utf-8")
    r = runner.invoke(app, ["tokenize", "-c", config])
    assert r.exit_code == 1 and f"{scores} has 2 scores but {corpus} has {len(pairs)} pairs" in r.stderr
    scores.write_text("1\nnope\n", encoding="utf-8")
    r = runner.invoke(app, ["tokenize", "-c", config])
    assert r.exit_code == 1 and f"{scores}:2: expected a number" in r.stderr


def test_drop_codes_keep_their_numbers():
    assert Drop.DUPLICATE == 4 and Drop.LANGID.key == "langid"
