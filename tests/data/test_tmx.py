"""TMX corpora: read streaming, languages matched as TMX writes them, bad files reported with
their line, as the other formats are."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from helpers import REPO, SHIPPED
from seq2seq_cli.cli import app
from seq2seq_cli.config_load import load_config
from seq2seq_cli.data.formats import infer_format, read_parallel
from seq2seq_cli.data.tmx import lang_matches
from seq2seq_cli.errors import UserError

runner = CliRunner()

HEADER = ('<?xml version="1.0" encoding="utf-8"?>\n<tmx version="1.4">\n'
          '<header creationtool="test" srclang="es" datatype="plaintext" segtype="sentence" adminlang="en" o-tmf="x"/>\n'
          "<body>\n")
FOOTER = "</body>\n</tmx>\n"


def unit(es: str, en: str, es_code: str = "es", en_code: str = "en", attr: str = "xml:lang") -> str:
    return (f'<tu>\n  <tuv {attr}="{es_code}"><seg>{es}</seg></tuv>\n'
            f'  <tuv {attr}="{en_code}"><seg>{en}</seg></tuv>\n</tu>\n')


def write(path: Path, body: str, header: str = HEADER, footer: str = FOOTER) -> Path:
    data = (header + body + footer).encode("utf-8")
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def pairs(path: Path, src: str = "es", tgt: str = "en") -> list[tuple[str, str]]:
    ds = read_parallel(str(path), src, tgt)
    return list(zip(ds["src"], ds["tgt"]))


def test_units_are_read_in_order_with_language_codes_as_tmx_writes_them(tmp_path):
    body = (unit("uno", "one")
            + unit("dos", "two", "ES", "EN-GB")
            + unit("tres", "three", "es-ES", "en_US")
            + unit("cuatro", "four", "es", "en", attr="lang")  # TMX 1.1
            # the other order, a third language, inline codes and a line break in a segment
            + '<tu><tuv xml:lang="fr"><seg>cinq</seg></tuv><tuv xml:lang="en-us"><seg>five <bpt i="1">&lt;b&gt;</bpt>'
              'big<ept i="1">&lt;/b&gt;</ept></seg></tuv>\n<tuv xml:lang="es-mx"><seg>cinco\n<hi>grande</hi></seg></tuv></tu>\n')
    expected = [("uno", "one"), ("dos", "two"), ("tres", "three"), ("cuatro", "four"), ("cinco grande", "five big")]
    assert pairs(write(tmp_path / "c.tmx", body)) == expected
    assert pairs(write(tmp_path / "c.tmx.gz", body)) == expected
    assert pairs(write(tmp_path / "c.tmx", body), "en", "es") == [(t, s) for s, t in expected]
    assert infer_format("x/c.TMX") == infer_format("c.tmx.gz") == "tmx"
    assert lang_matches("es-ES", "es") and lang_matches("ES", "es") and lang_matches("pt-br", "pt-BR")
    assert not lang_matches("pt-PT", "pt-BR") and not lang_matches("est", "es")


def test_a_large_file_is_read_in_bounded_memory(tmp_path):
    """Each unit is cleared once read: the tree does not keep the file."""
    import tracemalloc

    path = write(tmp_path / "big.tmx", "".join(unit(f"frase {i} " * 5, f"sentence {i} " * 5) for i in range(20000)))
    from seq2seq_cli.data.tmx import tmx_units

    tracemalloc.start()
    count = sum(1 for _ in tmx_units(path, "es", "en"))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert count == 20000
    assert peak < path.stat().st_size / 4, (peak, path.stat().st_size)


@pytest.mark.parametrize(("body", "header", "expected"), [
    (unit("uno", "one") + "<tu><tuv xml:lang='es'><seg>dos</seg></tuv>\n<tuv xml:lang='en'><seg>two & three</seg></tuv></tu>\n",
     HEADER, "c.tmx:10: not well-formed XML (not well-formed (invalid token), column 30); expected a TMX document"),
    (unit("uno", "one") + unit("dos", "two", en_code="de"), HEADER,
     "c.tmx:9: translation unit without a variant in en (its languages: es, de; data.src_lang and data.tgt_lang name the two"),
    (unit("uno", "one") + "<tu>\n<tuv><seg>dos</seg></tuv>\n</tu>\n", HEADER,
     "c.tmx:9: <tuv> without xml:lang (expected the language of its segment)"),
    (unit("uno", "one"), '<?xml version="1.0"?>\n<html>\n<body>\n',
     "c.tmx:2: expected a TMX document (root element <tmx>), found <html>"),
    ("", HEADER, "c.tmx: no translation units (<tu>) found (expected a TMX document of es and en segments)"),
    (unit("uno", "one") + "<tu>\n", HEADER, "c.tmx:10: not well-formed XML (mismatched tag, column 3); expected a TMX document"),
])
def test_a_bad_file_is_one_error_naming_its_line(tmp_path, body, header, expected):
    path = write(tmp_path / "c.tmx", body, header)
    with pytest.raises(UserError) as err:
        read_parallel(str(path), "es", "en", tmp_path / "cache")
    assert str(err.value) == f"{tmp_path}/{expected}" or str(err.value).startswith(f"{tmp_path}/{expected}")


def test_invalid_utf8_and_an_empty_file_are_named_as_for_the_other_formats(tmp_path):
    path = tmp_path / "latin1.tmx"
    path.write_bytes((HEADER + unit("uno", "one") + unit("ni\xf1o", "child") + FOOTER).encode("latin-1"))
    with pytest.raises(UserError, match=r"latin1\.tmx:10: invalid UTF-8 at byte \d+ of the line"):
        read_parallel(str(path), "es", "en")
    (tmp_path / "empty.tmx").write_bytes(b"")
    with pytest.raises(UserError, match=r"empty\.tmx: empty file \(expected a TMX document\)"):
        read_parallel(str(tmp_path / "empty.tmx"), "es", "en")


def test_train_on_a_tmx_corpus_with_the_empty_pair_named_by_its_line(tmp_path):
    es = (SHIPPED / "valid.es").read_text(encoding="utf-8").splitlines()[:150]
    en = (SHIPPED / "valid.en").read_text(encoding="utf-8").splitlines()[:150]
    from xml.sax.saxutils import escape

    path = write(tmp_path / "bible.tmx", "".join(unit(escape(s), escape(t), "ES-es", "EN") for s, t in zip(es, en)))
    raw = yaml.safe_load((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    raw["run_dir"] = str(tmp_path / "run")
    raw["data"].update(train=[{"path": str(path), "weight": 1}], valid=str(path))
    raw["train"]["max_steps"] = 2
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(raw), encoding="utf-8")
    r = runner.invoke(app, ["train", "-c", str(cfg), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "150 pairs read" in r.stderr
    assert load_config(cfg).data.corpora[0].path == str(path)
    blank = write(tmp_path / "blank.tmx", unit("uno", "one") + unit("dos", ""))
    r = runner.invoke(app, ["train", "-c", str(cfg), "--set", f"data.train={blank}", "--set", f"data.valid={blank}",
                            "--set", "data.on_empty=error", "--set", f"run_dir={tmp_path / 'run2'}"])
    assert r.exit_code == 1 and r.stderr.strip() == \
        f"error: {blank}:9: empty target sentence (data.on_empty: error; set skip to drop such pairs)"
