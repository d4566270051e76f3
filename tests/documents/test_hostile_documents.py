"""Documents that fight back, on the command line and through `serve`: zips whose directory
lies, damaged and encrypted ones, pages nested deeper than lxml reads, a page that is a
doctype alone, XHTML and Latin-1 XML with their declarations, a sentence longer than the
model, and the text Word keeps outside a paragraph's own runs. Every refusal is one line
naming the file (`error: ...` and exit 1; 400 and {"error": ...}), listed in docs/errors.md."""

from __future__ import annotations

import io
import re
import tracemalloc
import zipfile
from pathlib import Path

import pytest
from lxml import etree
from typer.testing import CliRunner

import hostile_files as hf
from helpers import REPO, SHIPPED, train_shipped_tiny
from seq2seq_cli.choices import DocumentFormat
from seq2seq_cli.cli import app
from seq2seq_cli.decode.steps import max_source_subwords
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.documents import aligning, docx, markup, odt
from seq2seq_cli.documents.detect import check_document
from seq2seq_cli.documents.markup import MarkupDocument
from seq2seq_cli.documents.placing import Aligned
from seq2seq_cli.documents.sentences import Splitter
from seq2seq_cli.documents.translate import translate_bytes
from seq2seq_cli.errors import UserError

runner = CliRunner()
ES = Splitter("es")
W = "{" + hf.W_NS + "}"
BIG = 256 << 20  # bytes of zeros an entry inflates to: past the 200 MiB an archive may unpack to


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return train_shipped_tiny(tmp_path_factory.mktemp("hostile-documents"), max_steps=2)


@pytest.fixture(scope="module")
def client(run_dir):
    from fastapi.testclient import TestClient

    from seq2seq_cli.serve.app import ServeSettings, create_app

    app_ = create_app(Translator.load(run_dir, "cpu", {"beam_size": 2}), ServeSettings(max_chars=100000))
    with TestClient(app_) as c:
        yield c


@pytest.fixture
def capitals(monkeypatch):
    """Documents "translated" into their own words in capitals, each aligned to itself."""
    for module in (markup, docx, odt):
        monkeypatch.setattr(module, "translate_aligned", lambda translator, sentences: [hf.upper(s) for s in sentences])


def odt_lying() -> bytes:
    return hf.odt_lying(BIG)


def docx_lying() -> bytes:
    return hf.docx_lying(BIG)


def no_content_types() -> bytes:
    source = zipfile.ZipFile(io.BytesIO(hf.word_document()))
    return hf.zipped({n: source.read(n) for n in source.namelist() if n != "[Content_Types].xml"})


def docx_changed(changes: dict[str, bytes | None]) -> bytes:
    """hf.word_document() with the parts in `changes` replaced (None: taken out)."""
    source = zipfile.ZipFile(io.BytesIO(hf.word_document()))
    parts: dict[str, str | bytes] = {n: source.read(n) for n in source.namelist() if changes.get(n, b"") is not None}
    parts.update({n: data for n, data in changes.items() if data is not None})
    return hf.zipped(parts)


LATIN1_PAGE = "<!DOCTYPE html>\n<html><body><p>Mañana</p></body></html>\n".encode("latin-1")
ENCRYPTED = "encrypted (password-protected); save it without a password and try again"
# The rows of docs/errors.md, section "Damaged, hostile and cut-short input", about files:
# {case: (file name, its bytes, the message)}
DAMAGED = {
    "document-sizes-lie": ("lies.odt", odt_lying,
                           "lies.odt: not a readable .odt file (damaged: content.xml: Bad CRC-32 for file 'content.xml')"),
    "document-docx-sizes-lie": ("lies.docx", docx_lying, "lies.docx: not a readable .docx file (damaged: "
                                "word/document.xml: Bad CRC-32 for file 'word/document.xml')"),
    "document-no-content-types": ("bare.docx", no_content_types,
                                  "bare.docx: not a .docx file (the archive holds no [Content_Types].xml)"),
    "document-docx-crc": ("crc.docx", lambda: hf.corrupted(hf.word_document(), "word/document.xml"),
                          "crc.docx: not a readable .docx file (damaged: word/document.xml: "),
    "document-odt-crc": ("crc.odt", lambda: hf.corrupted(hf.odt_document("Hola mundo. " * 40), "content.xml"),
                         "crc.odt: not a readable .odt file (damaged: content.xml: "),
    "document-odt-password": ("zipped.odt", lambda: hf.encrypted_flag(hf.odt_document()), f"zipped.odt: {ENCRYPTED}"),
    "document-odt-encrypted": ("sealed.odt", lambda: hf.odt_document(manifest="<manifest:encryption-data/>"),
                               f"sealed.odt: {ENCRYPTED}"),
    "document-docx-encrypted": ("sealed.docx", lambda: hf.OLE_MAGIC + bytes(4000), f"sealed.docx: {ENCRYPTED}"),
    "document-too-deep": ("deep.html", lambda: nested("div", 3000).encode(),
                          "deep.html: refused: elements nested more than 400 levels deep; flatten the document"),
    "document-unknown-encoding": ("k.xml", lambda: b'<?xml version="1.0" encoding="klingon"?><a>x</a>',
                                  "k.xml: its XML declaration names the encoding klingon, which is not known"),
    "document-wrong-encoding": ("w.xml", lambda: '<?xml version="1.0" encoding="ascii"?><a>año</a>'.encode(),
                                "w.xml: not ascii text, as its XML declaration says (invalid byte at 42)"),
    "document-docx-not-xml": ("tag.docx", lambda: docx_changed({"word/document.xml": f'<w:document xmlns:w="{hf.W_NS}">'
                                                                 "<w:body><w:p></w:body></w:document>".encode()}),
                              "tag.docx: not a readable .docx file (word/document.xml is not well-formed XML: Opening and "
                              "ending tag mismatch: p line 1 and body, line 1, column "),
    "document-docx-missing-part": ("gone.docx", lambda: docx_changed({"word/header1.xml": None}),
                                   "gone.docx: not a readable .docx file (damaged: its relationships name "
                                   "word/header1.xml, which it does not hold)"),
    "document-docx-no-content-type": ("types.docx", lambda: docx_changed({"[Content_Types].xml": (
        b'<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"/>')}),
        "types.docx: not a readable .docx file (damaged: [Content_Types].xml gives no content type for word/document.xml)"),
    "document-docx-no-body": ("hdr.docx", lambda: docx_changed({"word/document.xml": f'<w:hdr xmlns:w="{hf.W_NS}"/>'.encode()}),
                              "hdr.docx: not a readable .docx file (word/document.xml holds no document body)"),
    "document-html-latin1": ("latin1.html", lambda: LATIN1_PAGE,
                             "latin1.html: not UTF-8 text (invalid byte at 33); convert it to UTF-8 (iconv -f latin1 "
                             "-t utf-8 "),
}


def nested(tag: str, depth: int, text: str = "Hola mundo.") -> str:
    return f"<!DOCTYPE html>\n<html><body>{f'<{tag}>' * depth}{text}{f'</{tag}>' * depth}</body></html>\n"


def fmt_of(name: str) -> DocumentFormat:
    return {".odt": DocumentFormat.odt, ".docx": DocumentFormat.docx, ".html": DocumentFormat.html}.get(
        Path(name).suffix, DocumentFormat.xml)


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_a_damaged_or_hostile_file_is_one_line_on_the_command_line_and_400_from_the_server(run_dir, client, tmp_path, case):
    name, build, message = DAMAGED[case]
    data = build()
    with pytest.raises(UserError) as err:
        check_document(name, data, fmt_of(name))
        translate_bytes(None, name, data, fmt_of(name), ES)  # type: ignore[arg-type]  # refused before translating
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    src = tmp_path / name
    src.write_bytes(data)
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "-o", str(tmp_path / ("out" + src.suffix))])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert r.output.strip().startswith("error: " + message.replace(name, str(src), 1))
    assert len(r.output.strip().splitlines()) == 1
    if src.suffix in (".odt", ".docx", ".html"):
        answer = client.post("/translate_file", files={"file": (name, data)}, data={"source": "es", "target": "en"})
        assert answer.status_code == 400 and answer.json()["error"].startswith(message), answer.json()


@pytest.mark.parametrize("build, fmt", [(odt_lying, DocumentFormat.odt), (docx_lying, DocumentFormat.docx)])
def test_a_zip_that_lies_about_its_sizes_is_never_inflated(build, fmt):
    """Its entry says 1,000 bytes and inflates to 256 MiB: read through a stream counting what
    it inflates, no more than a chunk past the claim is ever held."""
    data = build()
    tracemalloc.start()
    try:
        with pytest.raises(UserError, match="damaged"):
            translate_bytes(None, f"x.{fmt.value}", data, fmt, ES)  # type: ignore[arg-type]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * len(data) + (4 << 20), f"{peak} bytes held reading a {len(data)}-byte file"


def test_every_part_of_a_docx_is_translated_where_it_stands(capitals):
    out = zipfile.ZipFile(io.BytesIO(translate_bytes(None, "w.docx", hf.word_document(), DocumentFormat.docx, ES)))  # type: ignore[arg-type]
    source = zipfile.ZipFile(io.BytesIO(hf.word_document()))
    parts = [n for n in source.namelist() if n.startswith("word/") and n.endswith(".xml") and "_rels" not in n]
    assert len(parts) == 8  # the body, 3 headers, 2 footers, footnotes, comments
    for part in parts:
        before, after = etree.fromstring(source.read(part)), etree.fromstring(out.read(part))
        paragraphs = list(zip(before.iter(W + "p"), after.iter(W + "p"), strict=True))
        for p, q in paragraphs:  # a field's result is Word's: kept as it was
            text = "".join(t.text if any(a.tag == W + "fldSimple" for a in t.iterancestors()) else t.text.upper()
                           for t in p.iter(W + "t"))
            assert "".join(t.text for t in q.iter(W + "t")) == text, part
            assert [t.text for t in q.iter(W + "delText")] == [t.text for t in p.iter(W + "delText")]  # deleted: kept
    body = etree.fromstring(out.read("word/document.xml"))
    for container, words in (("hyperlink", "EL SITIO"), ("ins", "UNA COSA"), ("smartTag", "MADRID"),
                             ("fldSimple", "título largo"), ("sdt", "CAJA")):
        inside = [el for el in body.iter(W + container) if el.getparent().tag == W + "p"]
        assert ["".join(t.text for t in el.iter(W + "t")) for el in inside] == [words], container


@pytest.mark.parametrize("tag", ["span", "div"])
def test_a_page_nested_300_deep_is_translated_and_3000_deep_refused(capitals, tag):
    out = translate_bytes(None, "p.html", nested(tag, 300).encode(), DocumentFormat.html, ES).decode()  # type: ignore[arg-type]
    assert "HOLA MUNDO." in out and out.count(f"<{tag}>") == 300
    with pytest.raises(UserError, match="^p.html: refused: elements nested more than 400 levels deep"):
        translate_bytes(None, "p.html", nested(tag, 3000).encode(), DocumentFormat.html, ES)  # type: ignore[arg-type]


@pytest.mark.parametrize("page", ["<!DOCTYPE html>", "<!DOCTYPE html>\n", "<!-- only a comment -->"])
def test_a_page_without_an_element_comes_back_as_it_is(run_dir, client, tmp_path, page):
    src, out = tmp_path / "empty.html", tmp_path / "empty.en.html"
    src.write_text(page, encoding="utf-8")
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_text(encoding="utf-8") == page
    answer = client.post("/translate", json={"q": page, "source": "es", "target": "en", "format": "html"})
    assert answer.status_code == 200 and answer.json()["translatedText"] == page
    assert download(client, "empty.html", page.encode()) == page.encode()


XHTML = ('<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html>\n<html xmlns="http://www.w3.org/1999/xhtml"><head>'
         '<meta charset="utf-8"/><title>Hola</title></head><body><p>Hola <br/>mundo.</p></body></html>\n')


def test_xhtml_with_its_declaration_is_translated_and_stays_xml(run_dir, client, tmp_path, capitals):
    out = translate_bytes(None, "x.xhtml", XHTML.encode(), DocumentFormat.html, ES).decode()  # type: ignore[arg-type]
    assert out.startswith('<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html>\n')
    root = etree.fromstring(out.encode())  # well-formed
    assert "".join(root.find("{http://www.w3.org/1999/xhtml}body").itertext()) == "HOLA MUNDO."


def test_xhtml_goes_through_the_command_line_and_both_routes(run_dir, client, tmp_path):
    src, out = tmp_path / "x.xhtml", tmp_path / "x.en.xhtml"
    src.write_text(XHTML, encoding="utf-8")
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_text(encoding="utf-8").startswith('<?xml version="1.0" encoding="utf-8"?>')
    answer = client.post("/translate", json={"q": XHTML, "source": "es", "target": "en", "format": "html"})
    assert answer.status_code == 200 and answer.json()["translatedText"].startswith('<?xml version="1.0"')
    assert download(client, "x.html", XHTML.encode()).startswith(b'<?xml version="1.0"')


def test_latin1_xml_is_read_and_written_in_latin1(monkeypatch):
    def with_euro(_, sentences):
        return [Aligned([*a.words, "€"], [*a.links, [0]], a.sources) for a in map(hf.upper, sentences)]

    monkeypatch.setattr(markup, "translate_aligned", with_euro)
    declaration = '<?xml version="1.0" encoding="ISO-8859-1"?>\n'
    data = (declaration + "<doc><p>El año pasó.</p></doc>\n").encode("iso-8859-1")
    check_document("l.xml", data, DocumentFormat.xml)
    out = translate_bytes(None, "l.xml", data, DocumentFormat.xml, ES)  # type: ignore[arg-type]
    assert out.startswith(declaration.encode()) and "AÑO".encode("iso-8859-1") in out and b"&#8364;" in out
    assert etree.fromstring(out).find("p").text == "EL AÑO PASÓ. €"  # what an XML reader finds there


def test_a_sentence_longer_than_the_model_is_translated_in_pieces_with_a_warning(run_dir, tmp_path, monkeypatch):
    translator = Translator.load(run_dir, "cpu", {"beam_size": 1})
    limit = max_source_subwords(translator.model)
    words = re.sub(r"[^\w\s]", "", " ".join((SHIPPED / "test.es").read_text(encoding="utf-8").split())).split()
    sentence = " ".join((words * 3)[:3000])
    pieces = aligning.pieces(translator, sentence)
    assert len(pieces) > 1
    assert " ".join(text for _, text in pieces) == sentence
    assert all(sentence[at : at + len(text)] == text and len(translator.src_sp.encode(text)) <= limit for at, text in pieces)
    decoded: list[str] = []
    real = Translator.translate_hypotheses

    def spy(self, lines, *args, **kwargs):
        decoded.extend(lines)
        return real(self, lines, *args, **kwargs)

    monkeypatch.setattr(Translator, "translate_hypotheses", spy)
    src, out = tmp_path / "long.html", tmp_path / "long.en.html"
    src.write_text(f"<!DOCTYPE html>\n<html><body><p>{sentence}</p><p>Hola mundo.</p></body></html>\n", encoding="utf-8")
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "-o", str(out), "--beam-size", "1"])
    assert r.exit_code == 0, r.output
    assert f"warning: {src}: 1 sentence(s) longer than the model's {limit} source subwords were translated in pieces" in r.output
    assert decoded == [text for _, text in pieces] + ["Hola mundo."]  # every word went to the model


def test_an_untranslated_element_keeps_its_spaces(capitals):
    page = '<p>Las flores se secaron y <span translate="no">Marca Registrada</span> vacía.</p>'
    doc = MarkupDocument(page, "html", ES)
    out = doc.render([hf.upper(s) for s in doc.sentences])
    assert out == '<p>LAS FLORES SE SECARON Y <span translate="no">Marca Registrada</span> VACÍA.</p>'
    reverse = [Aligned(a.words[::-1], a.links[::-1], a.sources) for a in map(hf.upper, doc.sentences)]
    again = MarkupDocument(page, "html", ES)
    out = again.render(reverse)
    assert not re.search(r"[\w.]<span|</span>[\w.]", out), out


def test_a_pages_title_and_description_are_translated():
    page = ('<!DOCTYPE html>\n<html><head><title>El jardín</title><meta name="description" content="Un  sitio. Otra frase.">'
            '<meta property="og:title" content="Flores"><meta name="keywords" content="uno, dos"></head>'
            '<body><p>Hola.</p></body></html>')
    doc = MarkupDocument(page, "html", ES)
    assert doc.sentences == ["El jardín", "Hola.", "Un sitio.", "Otra frase.", "Flores"]
    from lxml import html

    root = html.document_fromstring(doc.render([hf.upper(s) for s in doc.sentences]))
    assert root.findtext("head/title") == "EL JARDÍN"
    assert [m.get("content") for m in root.iter("meta")] == ["UN SITIO. OTRA FRASE.", "FLORES", "uno, dos"]


@pytest.mark.parametrize("language, text, sentences", [
    ("es", "El 2.º también. Y otro.", ["El 2.º también.", "Y otro."]),
    ("es", "La 3.ª vez llegó el 1.er día. Fin.", ["La 3.ª vez llegó el 1.er día.", "Fin."]),
    ("pt", "O 2.º lugar e a 3.ª posição. Fim.", ["O 2.º lugar e a 3.ª posição.", "Fim."]),
    ("es", "Capítulo 2. El otro.", ["Capítulo 2.", "El otro."]),
])
def test_an_ordinal_ends_no_sentence(language, text, sentences):
    assert Splitter(language).split(text).sentences == sentences


@pytest.mark.parametrize("suffix", [".docx", ".odt", ".html", ".txt"])
def test_a_missing_output_directory_is_refused_for_every_format(run_dir, tmp_path, suffix):
    src = tmp_path / f"in{suffix}"
    src.write_bytes({".docx": hf.word_document(), ".odt": hf.odt_document()}.get(suffix, b"<p>Hola.</p>\n"))
    out = tmp_path / "nodir" / "sub" / f"x{suffix}"
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "-o", str(out)])
    assert r.exit_code == 1 and r.output.strip() == f"error: {out}: output directory {out.parent} does not exist"
    assert not (tmp_path / "nodir").exists()


@pytest.mark.parametrize("name, text, newlines", [
    ("crlf.txt", "Hola mundo.\r\nY dijo Dios: Sea la luz.\r\n\r\nAdiós.\r\n", 4),  # LF written, as translate writes
    ("last.txt", "Hola mundo.\n\nY dijo Dios: Sea la luz.", 3),  # the last line ended, as translate ends it
])
def test_translate_file_gives_the_bytes_translate_writes(run_dir, client, tmp_path, name, text, newlines):
    src, out = tmp_path / name, tmp_path / f"{name}.en"
    src.write_bytes(text.encode())
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "-o", str(out), "--beam-size", "2",
                            "--engine", "torch", "--full-vocabulary"])  # the served translator's path
    assert r.exit_code == 0, r.output
    served = download(client, name, text.encode())
    assert served == out.read_bytes() and b"\r" not in served
    assert served.endswith(b"\n") and served.count(b"\n") == newlines


def download(client, name: str, data: bytes) -> bytes:
    answer = client.post("/translate_file", files={"file": (name, data)}, data={"source": "es", "target": "en"})
    assert answer.status_code == 200, answer.json()
    got = client.get(answer.json()["translatedFileUrl"].removeprefix("http://testserver"))
    assert got.status_code == 200
    return got.content


def test_every_damaged_file_is_documented():
    text = (REPO / "docs" / "errors.md").read_text(encoding="utf-8")
    section = text.split("## Damaged, hostile and cut-short input", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| (document-[a-z0-9-]+) \| .* \| `error: ([^`]+)` \|$", section, re.MULTILINE))
    assert set(rows) == set(DAMAGED)
    for case, (_, _, message) in DAMAGED.items():
        assert rows[case].startswith(message.split(" (damaged: ")[0]), case


LOL = "".join(f'<!ENTITY lol{i} "{(f"&lol{i - 1};" if i > 1 else "lol") * 10}">' for i in range(1, 10))
HOSTILE_MARKUP = {
    "external entity": '<?xml version="1.0"?><!DOCTYPE d [<!ENTITY x SYSTEM "file://{secret}">]><d><p>Hola &x; mundo.</p></d>',
    "xinclude": '<?xml version="1.0"?><d xmlns:xi="http://www.w3.org/2001/XInclude"><p>Hola.</p>'
                '<xi:include href="{secret}" parse="text"/></d>',
    "billion laughs": f'<?xml version="1.0"?><!DOCTYPE d [{LOL}]><d><p>a &lol9; b</p></d>',
}


@pytest.mark.parametrize("fmt", [DocumentFormat.xml, DocumentFormat.html])
@pytest.mark.parametrize("case", sorted(HOSTILE_MARKUP))
def test_entities_and_includes_are_never_resolved(capitals, tmp_path, fmt, case):
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRETO", encoding="utf-8")
    data = HOSTILE_MARKUP[case].replace("{secret}", str(secret)).encode()
    try:
        out = translate_bytes(None, "x", data, fmt, ES)  # type: ignore[arg-type]
    except UserError as exc:  # libxml2's limit on entity amplification: one line
        assert "\n" not in str(exc) and case == "billion laughs"
        return
    assert b"SECRETO" not in out and len(out) < 4 * len(data)


def test_an_entry_named_outside_the_archive_is_never_written_there(capitals, tmp_path):
    inside = tmp_path / "a" / "b"
    inside.mkdir(parents=True)
    source = zipfile.ZipFile(io.BytesIO(hf.odt_document()))
    parts: dict[str, str | bytes] = {n: source.read(n) for n in source.namelist()}
    parts["../../escaped.txt"] = b"x"
    out = translate_bytes(None, "slip.odt", hf.zipped(parts), DocumentFormat.odt, ES)  # type: ignore[arg-type]
    assert "../../escaped.txt" in zipfile.ZipFile(io.BytesIO(out)).namelist()  # kept as an entry, never extracted
    assert not any(p.name == "escaped.txt" for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("doctype_name", ["d", "other"])
def test_an_internal_subset_stays_so_the_entities_the_text_names_stay_declared(capitals, doctype_name):
    """lxml writes the subset back only where the doctype names the root element; the output
    must stay well-formed either way, its entity unexpanded."""
    data = (f'<?xml version="1.0"?>\n<!DOCTYPE {doctype_name} [<!ENTITY co "La Casa ]x">]>\n'
            '<d><p>Hola &co; mundo.</p></d>\n').encode()
    out = translate_bytes(None, "x", data, DocumentFormat.xml, ES)  # type: ignore[arg-type]
    assert out.decode().count("<!DOCTYPE") == 1 and '<!ENTITY co "La Casa ]x">' in out.decode()
    tree = etree.fromstring(out, etree.XMLParser(resolve_entities=False))  # raises if &co; were undeclared
    assert "&co;" in etree.tostring(tree, encoding="unicode")


HTTP_EQUIV = '<meta http-equiv="Content-Type" content="text/html; charset=Windows-1252">'


@pytest.mark.parametrize("meta, encoding", [('<meta charset="latin1">', "cp1252"), (HTTP_EQUIV, "cp1252"),
                                            ('<meta charset="ISO-8859-15">', "iso8859-15"),
                                            ('<meta charset="utf-16">', "utf-8")])  # a page read as ASCII is not UTF-16
def test_an_html_page_is_read_in_the_charset_its_meta_names_and_written_back_in_it(capitals, meta, encoding):
    page = f"<html><head>{meta}</head><body><p>Mañana es día de fiesta.</p></body></html>"
    out = translate_bytes(None, "page.html", page.encode(encoding), DocumentFormat.html, ES)  # type: ignore[arg-type]
    assert "<p>MAÑANA ES DÍA DE FIESTA.</p>" in out.decode(encoding) and meta.lower() in out.decode(encoding).lower()


def test_an_unknown_meta_charset_is_one_line_naming_it():
    page = b'<html><head><meta charset="klingon"></head><body><p>x</p></body></html>'
    with pytest.raises(UserError, match=r"^page.html: its <meta> names the charset klingon, which is not known$"):
        check_document("page.html", page, DocumentFormat.html)


@pytest.mark.parametrize("name, fmt, hint", [
    ("l.html", DocumentFormat.html, ' or name its encoding in the page (<meta charset="windows-1252"> for Latin-1)'),
    ("l.xml", DocumentFormat.xml, ' or name its encoding in an XML declaration (<?xml version="1.0" encoding="ISO-8859-1"?>)'),
    ("l.txt", DocumentFormat.text, "")])
def test_a_latin1_document_is_told_how_to_be_read(name, fmt, hint):
    """Latin-1 text with nothing naming its encoding: the line says how to convert it, and for
    a page or an XML document where to name its encoding instead."""
    data = "<doc><p>Mañana</p></doc>".encode("latin-1")
    with pytest.raises(UserError) as err:
        check_document(name, data, fmt)
    suffix = name.rsplit(".", 1)[1]
    assert str(err.value) == (f"{name}: not UTF-8 text (invalid byte at 10); convert it to UTF-8 "
                              f"(iconv -f latin1 -t utf-8 {name} > utf8.{suffix}){hint}")


def test_a_utf16_document_is_named_by_its_byte_order_mark():
    with pytest.raises(UserError, match=r"^u\.html: not UTF-8 text \(invalid byte at 0\); the file starts with the "
                                        r"byte-order mark of UTF-16: save it as UTF-8$"):
        check_document("u.html", "<p>Hola</p>".encode("utf-16"), DocumentFormat.html)


@pytest.mark.parametrize("label", ["hex", "utf-7", "unicode-escape", "idna", "cp037"])
@pytest.mark.parametrize("where", ["meta", "declaration"])
def test_a_codec_no_page_is_stored_in_is_refused_as_not_known(label, where):
    """Python knows these codecs, a browser reads no page in them: UTF-7 would turn +ADw-script+AD4- into a tag."""
    head = f'<meta charset="{label}">' if where == "meta" else ""
    page = f'<html><head>{head}</head><body><p>Hola.</p>+ADw-script+AD4-</body></html>'
    if where == "declaration":
        page = f'<?xml version="1.0" encoding="{label}"?>\n' + page
    said = "its <meta> names the charset" if where == "meta" else "its XML declaration names the encoding"
    with pytest.raises(UserError, match=rf"^page\.html: {said} {label}, which is not known$"):
        check_document("page.html", page.encode("ascii"), DocumentFormat.html)


@pytest.mark.parametrize("lead", ["\x01", "\x1b", "\ufffe"])
def test_a_control_character_before_the_first_tag_is_one_line(capitals, lead):
    with pytest.raises(UserError, match=rf"^x: the text before its first tag holds U\+{ord(lead):04X}, a character HTML "
                                        r"cannot hold; remove it$"):
        translate_bytes(None, "x", f"{lead}hola <b>mundo</b>".encode(), DocumentFormat.html, ES)  # type: ignore[arg-type]
