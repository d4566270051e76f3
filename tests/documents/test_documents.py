"""Documents: lines split into sentences and joined back, markup carried through translation."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lxml import etree
from typer.testing import CliRunner

from helpers import REPO, SHIPPED, headless_chromium
from seq2seq_cli.cli import app
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.documents.lines import OutputOptions, translate_sentences, translate_stream
from seq2seq_cli.documents.markup import MarkupDocument
from seq2seq_cli.documents.placing import Aligned
from seq2seq_cli.documents.sentences import Splitter, plan

runner = CliRunner()
ES = Splitter("es")


@pytest.fixture(scope="module")
def run_dir(tiny_run) -> Path:
    """A tiny model trained for a few dozen steps on the shipped validation split (shared, read only)."""
    return tiny_run


@pytest.fixture(scope="module")
def paragraphs() -> list[str]:
    verses = (SHIPPED / "test.es").read_text(encoding="utf-8").splitlines()[:12]
    return [" ".join(verses[0:3]), verses[3], "", "  ".join(verses[4:8]) + "  ", verses[8], " ".join(verses[9:12])]


# ---------------------------------------------------------------------------------- splitting


def test_a_paragraph_is_cut_into_its_sentences_with_its_spacing():
    text = "  Hola, Sr. Pérez.  ¿Qué tal?\tBien. "
    split = ES.split(text)
    assert split.sentences == ["Hola, Sr. Pérez.", "¿Qué tal?", "Bien."]
    assert split.gaps == ["  ", "  ", "\t", " "]
    assert split.join(["A.", "B?", "C."]) == "A.  B?\tC."
    assert [text[a:b] for a, b in split.spans()] == split.sentences


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["Hola.", "¿Qué?", "Sr. Pérez", "¡Sí!", "y", " ", "  ", "\t", "a.b", "...", "\u00a0"]),
                max_size=12))
def test_split_and_join_give_the_text_back(parts):
    text = "".join(parts)
    split = ES.split(text)
    rebuilt = split.gaps[0] + "".join(s + g for s, g in zip(split.sentences, split.gaps[1:]))
    assert rebuilt == text
    assert all(s == s.strip() and s for s in split.sentences)
    assert split.join(split.sentences) == text.strip()


def test_a_plan_keeps_one_output_line_per_line():
    lines = ["Uno. Dos.", "", "Tres.", "Cuatro. Cinco. Seis.", "Siete. Ocho."]
    p = plan(lines, ES, keep_whole=[False, False, False, False, True])
    assert p.units == ["Uno.", "Dos.", "", "Tres.", "Cuatro.", "Cinco.", "Seis.", "Siete. Ocho."]
    assert p.owners == [0, 0, 1, 2, 3, 3, 3, 4]
    assert p.join([u.upper() for u in p.units]) == ["UNO. DOS.", "", "TRES.", "CUATRO. CINCO. SEIS.", "SIETE. OCHO."]


def test_no_split_gives_the_line_by_line_output(run_dir, paragraphs, tmp_path):
    src = tmp_path / "in.es"
    src.write_text("\n".join(paragraphs) + "\n", encoding="utf-8")
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "--no-split", "--no-progress",
                            "--engine", "torch"])  # the engine of Translator.load
    assert r.exit_code == 0, r.output
    tr = Translator.load(run_dir, "cpu")
    assert r.stdout.split("\n")[:-1] == tr.translate(paragraphs)
    assert list(translate_stream(tr, paragraphs, OutputOptions())) == tr.translate(paragraphs)


def test_split_translates_each_sentence_and_joins_them_back(run_dir, paragraphs, tmp_path):
    src = tmp_path / "in.es"
    src.write_text("\n".join(paragraphs) + "\n", encoding="utf-8")
    # our search over the whole vocabulary: a shortlist's candidates are the batch's, and the
    # sentences of the file are batched otherwise than those of one line
    flags = ["--engine", "torch", "--full-vocabulary"]
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "--no-progress", *flags])
    assert r.exit_code == 0, r.output
    got = r.stdout.split("\n")[:-1]
    assert len(got) == len(paragraphs) and got[2] == ""
    tr = Translator.load(run_dir, "cpu", {"shortlist": False})
    for line, out in zip(paragraphs, got):
        split = ES.split(line)
        assert out == (split.join(tr.translate(split.sentences)) if line.strip() else "")
    assert "  " in got[3]  # the line's own spacing between its sentences
    # the same through evaluate, whose -o writes the joined translations
    ref = tmp_path / "ref.en"
    ref.write_text("\n".join(["x"] * len(paragraphs)) + "\n", encoding="utf-8")
    hyp = tmp_path / "hyp.en"
    r = runner.invoke(app, ["evaluate", "-m", str(run_dir), "-s", str(src), "-r", str(ref), "-o", str(hyp), *flags])
    assert r.exit_code == 0, r.output
    assert hyp.read_text(encoding="utf-8").split("\n")[:-1] == got


def test_line_options_decode_lines_whole(run_dir, paragraphs):
    tr = Translator.load(run_dir, "cpu")
    whole = [row.split("\t")[0] for row in translate_stream(tr, paragraphs, OutputOptions(scores=True, splitter=ES))]
    assert whole == tr.translate(paragraphs)
    assert not OutputOptions(nbest=2, splitter=ES).splits() and OutputOptions(splitter=ES).splits()


# ---------------------------------------------------------------------------------- markup


def identity(sentence: str, reverse: bool = False) -> Aligned:
    """A 'translation' that gives back the sentence's words (reversed: in reverse order), each
    aligned to itself."""
    spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", sentence)]
    order = list(range(len(spans)))[:: -1 if reverse else 1]
    return Aligned([sentence[spans[i][0] : spans[i][1]] for i in order], [[i] for i in order], spans)


def translate_with(text: str, fmt: str = "html", reverse: bool = False, splitter: Splitter = ES) -> str:
    doc = MarkupDocument(text, fmt, splitter)
    return doc.render([identity(s, reverse) for s in doc.sentences])


def test_tags_stay_around_the_words_they_enclosed():
    page = ('<p>En el <b>principio</b> creó <a href="x?a=1&amp;b=2" title="t">Dios los <i>cielos</i></a> y la tierra. '
            'Y la tierra <br>estaba <span class="v">vacía</span> y sola.</p>')
    assert translate_with(page) == page
    assert translate_with("<p>uno<br>dos</p>") == "<p>uno <br>dos</p>"  # a line break parts words
    # between two sentences, a tag goes before the words of the one after it
    assert translate_with("<p>Supercalifragilístico.<br>A b c d e f.</p>") == "<p>Supercalifragilístico. <br>A b c d e f.</p>"


def test_tags_follow_their_words_when_the_order_changes():
    out = translate_with("<p>uno <b>dos</b> <i>tres cuatro</i> cinco</p>", reverse=True)
    assert out == "<p>cinco <i>cuatro tres</i> <b>dos</b> uno</p>"


def test_scripts_styles_code_comments_and_attributes_are_untouched():
    page = ("<!DOCTYPE html>\n<html><head><title>t</title><style>p{}</style></head><body>"
            '<script>var s = "<b>x</b>";</script><p title="no tocar">Hola <code>ls -l</code> y <!-- c --> adiós.</p>'
            '<p translate="no">No traducir.</p><pre>  a   b </pre></body></html>')
    doc = MarkupDocument(page, "html", ES)
    assert doc.sentences == ["t", "Hola y adiós."]  # the page's title is shown to its readers: translated
    out = doc.render([Aligned(["T"], [[0]], [(0, 1)]),
                      Aligned(["HELLO", "AND", "BYE."], [[0], [1], [2]], [(0, 4), (5, 6), (7, 13)])])
    assert '<script>var s = "<b>x</b>";</script>' in out and "<title>T</title><style>p{}</style>" in out
    assert '<p title="no tocar">HELLO <code>ls -l</code> AND <!-- c --> BYE.</p>' in out  # the spaces around them kept
    assert '<p translate="no">No traducir.</p>' in out and "<pre>  a   b </pre>" in out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["", "b", "i", "a", "span", "br"]),
                          st.sampled_from(["Hola", "Sr. Pérez.", "mundo", "y", "¿Qué?"])), min_size=1, max_size=10),
       st.booleans(), st.randoms(use_true_random=False))
def test_every_tag_is_kept_and_the_output_is_well_formed(words, reverse, rnd):
    parts = []
    for tag, word in words:
        if tag == "br":
            parts.append(f"{word}<br/>")
        elif tag:
            parts.append(f"<{tag}>{word}</{tag}>")
        else:
            parts.append(word)
    page = "<div><p>" + " ".join(parts) + "</p></div>"
    out = translate_with(page, "xml", reverse)
    tree = etree.fromstring(out)  # well-formed
    source = etree.fromstring(page)
    assert sorted(e.tag for e in tree.iter()) == sorted(e.tag for e in source.iter())
    # a shuffled translation (words aligned anywhere) still keeps every tag, well-formed
    doc = MarkupDocument(page, "xml", ES)
    scrambled = []
    for s in doc.sentences:
        a = identity(s)
        a.links = [[rnd.randrange(len(a.sources))] for _ in a.words]
        scrambled.append(a)
    again = etree.fromstring(doc.render(scrambled))
    assert sorted(e.tag for e in again.iter()) == sorted(e.tag for e in source.iter())


def test_xml_mixed_content_is_inline_and_other_elements_are_blocks():
    xml = '<?xml version="1.0" encoding="UTF-8"?>\n<doc><title>Uno dos</title><para>tres <em x="1">cuatro</em> cinco</para></doc>'
    doc = MarkupDocument(xml, "xml", ES)
    assert doc.sentences == ["Uno dos", "tres cuatro cinco"]
    assert translate_with(xml, "xml") == xml


def test_html_translated_by_the_model_keeps_its_tags(run_dir, tmp_path):
    page = tmp_path / "page.html"
    verses = (SHIPPED / "test.es").read_text(encoding="utf-8").splitlines()[:3]
    body = f'<p>{verses[0]} <b>{verses[1].split()[0]}</b> <a href="v.html">{verses[1]}</a></p><p><i>{verses[2]}</i></p>'
    page.write_text(f"<!DOCTYPE html>\n<html><body>{body}</body></html>\n", encoding="utf-8")
    out = tmp_path / "page.en.html"
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(page), "-o", str(out), "--format", "html"])
    assert r.exit_code == 0, r.output
    html = out.read_text(encoding="utf-8")
    tree = etree.fromstring(html.split("\n", 1)[1])
    assert [e.tag for e in tree.iter()] == ["html", "body", "p", "b", "a", "p", "i"]
    assert tree.find(".//a").get("href") == "v.html"


def test_line_options_are_refused_with_a_document_format(run_dir, tmp_path):
    page = tmp_path / "p.html"
    page.write_text("<p>Hola</p>", encoding="utf-8")
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(page), "--format", "html", "--scores"])
    assert r.exit_code == 1
    assert "--scores works line by line; an HTML document is translated whole" in r.output


# ---------------------------------------------------------------------------------- files


def make_docx(path: Path | None = None) -> bytes:
    import io

    import docx

    document = docx.Document()
    p = document.add_paragraph("En el principio creó ")
    p.add_run("Dios").bold = True
    p.add_run(" los cielos y la ")
    p.add_run("tierra").italic = True
    p.add_run(" y el mar. Y la tierra estaba vacía.")
    document.add_table(rows=1, cols=1).cell(0, 0).text = "Hola mundo."
    buffer = io.BytesIO()
    document.save(buffer)
    if path is not None:
        path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


def fake_aligned(monkeypatch, reverse: bool = False) -> None:
    """docx translation by `identity` instead of the model, so that run placement is checked exactly."""
    from seq2seq_cli.documents import docx as docx_module

    monkeypatch.setattr(docx_module, "translate_aligned", lambda translator, sentences: [identity(s, reverse) for s in sentences])


def test_docx_runs_keep_their_formatting_on_their_words(monkeypatch):
    import io

    import docx

    from seq2seq_cli.documents.docx import translate_docx

    fake_aligned(monkeypatch)
    out = docx.Document(io.BytesIO(translate_docx(None, make_docx(), ES)))  # type: ignore[arg-type]
    runs = [(r.text, r.bold, r.italic) for r in out.paragraphs[0].runs]
    assert runs == [("En el principio creó ", None, None), ("Dios", True, None), (" los cielos y la ", None, None),
                    ("tierra", None, True), (" y el mar. Y la tierra estaba vacía.", None, None)]
    assert out.tables[0].cell(0, 0).text == "Hola mundo."
    fake_aligned(monkeypatch, reverse=True)
    out = docx.Document(io.BytesIO(translate_docx(None, make_docx(), ES)))  # type: ignore[arg-type]
    runs = out.paragraphs[0].runs
    assert [r.text for r in runs if r.bold] == ["Dios"] and [r.text for r in runs if r.italic] == ["tierra"]
    source = "En el principio creó Dios los cielos y la tierra y el mar. Y la tierra estaba vacía."
    assert out.paragraphs[0].text == " ".join(" ".join(s.split()[::-1]) for s in ES.split(source).sentences)


ODT_SOURCE = ["Capítulo uno",  # the heading
              "En el principio creó Dios los cielos y la tierra. Y la tierra estaba desordenada y vacía.",
              "Hola mundo.",  # the table cell
              "Y dijo Dios: Sea la luz.",  # the list item
              "Cabecera de la página."]  # the header (styles.xml)


def make_odt(path: Path | None = None) -> bytes:
    """An .odt made with odfpy: a heading, a paragraph with a bold span, a space element and a
    tab, a table cell, a list item and a page header."""
    import io

    from odf.opendocument import OpenDocumentText
    from odf.style import Header, MasterPage, PageLayout, Style, TextProperties
    from odf.table import Table, TableCell, TableColumn, TableRow
    from odf.text import H, List, ListItem, P, S, Span, Tab

    document = OpenDocumentText()
    bold = Style(name="T1", family="text")
    bold.addElement(TextProperties(fontweight="bold"))
    document.automaticstyles.addElement(bold)
    layout = PageLayout(name="pm1")
    document.automaticstyles.addElement(layout)
    page = MasterPage(name="Standard", pagelayoutname=layout)
    header = Header()
    header.addElement(P(text=ODT_SOURCE[4]))
    page.addElement(header)
    document.masterstyles.addElement(page)
    document.text.addElement(H(outlinelevel=1, text=ODT_SOURCE[0]))
    p = P(text="En el principio creó ")
    p.addElement(Span(stylename=bold, text="Dios"))
    p.addText(" los cielos y la tierra.")
    p.addElement(S(c=2))
    p.addText("Y la tierra")
    p.addElement(Tab())
    p.addText("estaba desordenada y vacía.")
    document.text.addElement(p)
    table, row, cell = Table(name="T"), TableRow(), TableCell()
    cell.addElement(P(text=ODT_SOURCE[2]))
    row.addElement(cell)
    table.addElement(TableColumn())
    table.addElement(row)
    document.text.addElement(table)
    items, item = List(), ListItem()
    item.addElement(P(text=ODT_SOURCE[3]))
    items.addElement(item)
    document.text.addElement(items)
    buffer = io.BytesIO()
    document.save(buffer)
    if path is not None:
        path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


def odt_shape(data: bytes) -> tuple[list[str], list[str], list[str]]:
    """An .odt read with odfpy: the tags of the body's elements in document order, each text
    paragraph's text (header last) and the texts of its bold spans."""
    import io
    import zipfile

    from odf import teletype
    from odf.opendocument import load
    from odf.text import H, P, Span

    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        first = archive.infolist()[0]
        assert first.filename == "mimetype" and first.compress_type == zipfile.ZIP_STORED
        assert archive.read("mimetype") == b"application/vnd.oasis.opendocument.text"
        assert "META-INF/manifest.xml" in archive.namelist()
    document = load(io.BytesIO(data))

    def tags(element) -> list[str]:
        return [t for child in element.childNodes if child.nodeType == child.ELEMENT_NODE
                for t in [child.tagName, *tags(child)]]

    texts = [teletype.extractText(p) for p in document.text.getElementsByType(H) + document.text.getElementsByType(P)]
    texts += [teletype.extractText(p) for p in document.masterstyles.getElementsByType(P)]
    bold = [teletype.extractText(s) for s in document.text.getElementsByType(Span) if s.getAttribute("stylename") == "T1"]
    return tags(document.text), texts, bold


def fake_odt_aligned(monkeypatch, reverse: bool = False) -> None:
    from seq2seq_cli.documents import odt

    monkeypatch.setattr(odt, "translate_aligned", lambda translator, sentences: [identity(s, reverse) for s in sentences])


def test_odt_spans_stay_around_their_words(monkeypatch):
    from seq2seq_cli.documents.odt import translate_odt

    source = make_odt()
    fake_odt_aligned(monkeypatch)
    out = translate_odt(None, source, ES)  # type: ignore[arg-type]
    assert odt_shape(out) == odt_shape(source)
    tags, texts, bold = odt_shape(source)
    assert "text:span" in tags and "text:s" in tags and "text:tab" in tags and "table:table-cell" in tags
    assert texts[1] == "En el principio creó Dios los cielos y la tierra.  Y la tierra\testaba desordenada y vacía."
    assert bold == ["Dios"]
    fake_odt_aligned(monkeypatch, reverse=True)
    tags_out, texts_out, bold_out = odt_shape(translate_odt(None, source, ES))  # type: ignore[arg-type]
    assert tags_out == tags and bold_out == ["Dios"]
    assert texts_out[0] == "uno Capítulo" and texts_out[2] == "mundo. Hola" and texts_out[-1] == "página. la de Cabecera"
    assert texts_out[1].split()[:7] == "tierra. la y cielos los Dios creó".split()


def test_an_odt_translated_by_the_model_keeps_its_structure(run_dir):
    from seq2seq_cli.choices import DocumentFormat
    from seq2seq_cli.documents.translate import text_chars, translate_bytes

    tr = Translator.load(run_dir, "cpu", {"no_repeat_ngram_size": 1})  # the tiny run repeats one piece; this makes words
    source = make_odt()
    out = translate_bytes(tr, "doc.odt", source, DocumentFormat.odt, ES)
    tags, texts, bold = odt_shape(out)
    assert tags == odt_shape(source)[0] and all(t.strip() for t in texts)
    assert len(bold) == 1 and bold[0].strip()  # the bold span holds output words
    for i in (0, 2, 3, 4):  # the paragraphs without breaks: the model's translation of their sentences
        split = ES.split(ODT_SOURCE[i])
        assert texts[i] == split.join(tr.translate(split.sentences)), i
    flat = texts[1].replace("\t", " ").split()
    split = ES.split(" ".join(odt_shape(source)[1][1].split()))
    assert flat == split.join(tr.translate(split.sentences)).split()
    assert text_chars(DocumentFormat.odt, source) == sum(len(" ".join(t.split())) for t in odt_shape(source)[1])


BAD_FILES = {
    "not-a-docx": ("a.docx", b"plain text, not a zip", "a.docx: not a .docx file (a .docx is a zip archive; this is not one)"),
    "zip-not-docx": ("b.docx", "zip", "b.docx: not a .docx file (the archive holds no word/document.xml)"),
    "zip-bomb": ("c.docx", "bomb", "c.docx: refused: it unpacks to 314572800 bytes from"),
    "empty": ("d.txt", b"", "d.txt: the file is empty (0 bytes)"),
    "extension": ("e.pdf", b"%PDF-1.4", "e.pdf: .pdf is not supported; send .txt, .html, .htm, .docx or .odt"),
    "not-utf8": ("f.txt", b"\xff\xfe h", "f.txt: not UTF-8 text (invalid byte at 0)"),
    "not-an-odt": ("g.odt", b"plain text, not a zip", "g.odt: not an .odt file (an .odt is a zip archive; this is not one)"),
    "zip-not-odt": ("h.odt", "zip", "h.odt: not an .odt file (the archive holds no content.xml)"),
    "odt-mimetype": ("i.odt", "spreadsheet", "i.odt: not an .odt file (its mimetype is "
                     "application/vnd.oasis.opendocument.spreadsheet, not application/vnd.oasis.opendocument.text)"),
    "odt-zip-bomb": ("j.odt", "bomb", "j.odt: refused: it unpacks to 314572800 bytes from"),
    "odt-empty": ("k.odt", b"", "k.odt: the file is empty (0 bytes)"),
    "odt-not-xml": ("l.odt", "broken", "l.odt: not a readable .odt file (content.xml: "),
}


def bad_file(kind: str) -> tuple[str, bytes, str]:
    import io
    import zipfile

    name, data, message = BAD_FILES[kind]
    if isinstance(data, str):
        buffer = io.BytesIO()
        main = "content.xml" if name.endswith(".odt") else "word/document.xml"
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            if data == "bomb":
                archive.writestr(main, b"\0" * (300 << 20))
            elif data == "spreadsheet":
                archive.writestr("mimetype", "application/vnd.oasis.opendocument.spreadsheet")
                archive.writestr(main, b"<office:document-content/>")
            elif data == "broken":
                archive.writestr("mimetype", "application/vnd.oasis.opendocument.text")
                archive.writestr(main, b"<office:document-content><text:p>")
            else:
                archive.writestr("other.txt", b"x")
        data = buffer.getvalue()
    return name, data, message


@pytest.fixture(scope="module")
def client(run_dir):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from seq2seq_cli.serve.app import ServeSettings, create_app

    app = create_app(Translator.load(run_dir, "cpu", {"beam_size": 2}), ServeSettings(max_chars=3000))
    with TestClient(app) as c:
        yield c, app


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_a_bad_file_gets_one_clear_4xx(client, kind):
    c, app = client
    name, data, message = bad_file(kind)
    r = c.post("/translate_file", files={"file": (name, data)}, data={"source": "es", "target": "en"})
    assert r.status_code == 400 and r.json()["error"].startswith(message), r.json()
    assert list(app.state.files.folder.iterdir()) == []


def test_an_odt_is_translated_through_translate_file(client, run_dir):
    import io

    from odf.opendocument import OpenDocumentText
    from odf.text import P

    c, app = client
    r = c.post("/translate_file", files={"file": ("doc.odt", make_odt())}, data={"source": "es", "target": "en"})
    assert r.status_code == 200, r.json()
    url = r.json()["translatedFileUrl"]
    assert re.fullmatch(r"http://testserver/download_file/[0-9a-f]{32}\.odt", url)  # an id of the server's own
    got = c.get(url.removeprefix("http://testserver"))
    assert got.status_code == 200 and got.headers["content-type"] == "application/vnd.oasis.opendocument.text"
    tags, texts, _ = odt_shape(got.content)
    assert tags == odt_shape(make_odt())[0]
    tr = Translator.load(run_dir, "cpu", {"beam_size": 2})
    assert texts[2] == translate_sentences(tr.translate, [ODT_SOURCE[2]], ES)[0]  # the table cell: one sentence
    big = OpenDocumentText()
    big.text.addElement(P(text="hola " * 700))
    buffer = io.BytesIO()
    big.save(buffer)
    r = c.post("/translate_file", files={"file": ("big.odt", buffer.getvalue())}, data={"source": "es", "target": "en"})
    assert r.status_code == 413 and r.json()["error"] == "file too large: 3499 characters of text, the limit is 3000"
    assert list(app.state.files.folder.iterdir()) == []


def test_a_file_is_translated_on_the_decoding_thread_never_beside_a_batch(client, monkeypatch):
    """A file's translation takes its turn in the batcher's queue and runs on its thread, so no
    batch of /translate decodes while it does."""
    import threading

    import seq2seq_cli.serve.files as serve_documents

    c, _ = client
    seen: list[str] = []
    real = serve_documents.translate_bytes

    def recording(*args, **kwargs):
        seen.append(threading.current_thread().name)  # the batcher's decoding threads decode batches too
        return real(*args, **kwargs)

    monkeypatch.setattr(serve_documents, "translate_bytes", recording)
    text = "Y dijo Dios: Sea la luz.\nY fue la luz."
    r = c.post("/translate_file", files={"file": ("t.txt", text.encode())}, data={"source": "es", "target": "en"})
    assert r.status_code == 200, r.json()
    assert len(seen) == 1 and seen[0].startswith("seq2seq-decoder-")
    assert c.get(r.json()["translatedFileUrl"].removeprefix("http://testserver")).status_code == 200  # taken: none left


def test_files_are_translated_downloaded_once_and_the_folder_emptied(client, run_dir, tmp_path):
    import io

    import docx

    c, app = client
    folder = app.state.files.folder
    r = c.post("/translate_file", files={"file": ("doc.docx", make_docx())}, data={"source": "es", "target": "en"})
    assert r.status_code == 200, r.json()
    url = r.json()["translatedFileUrl"]
    assert re.fullmatch(r"http://testserver/download_file/[0-9a-f]{32}\.docx", url)
    assert len(list(folder.iterdir())) == 1
    got = c.get(url.removeprefix("http://testserver"))
    assert got.status_code == 200 and "doc.docx" in got.headers["content-disposition"]
    out = docx.Document(io.BytesIO(got.content))
    assert len(out.paragraphs) == 1 and len(out.tables) == 1  # the runs' placement: the test above
    assert list(folder.iterdir()) == []  # downloaded once, then removed
    assert c.get(url.removeprefix("http://testserver")).status_code == 404
    text = "Hola mundo. Adiós.\n\nUno.\n"
    r = c.post("/translate_file", files={"file": ("t.txt", text.encode())}, data={"source": "es", "target": "en"})
    got = c.get(r.json()["translatedFileUrl"].removeprefix("http://testserver")).text
    tr = Translator.load(run_dir, "cpu", {"beam_size": 2})
    assert got.split("\n") == translate_sentences(tr.translate, text.split("\n"), ES)
    r = c.post("/translate_file", files={"file": ("big.txt", b"hola " * 700)}, data={"source": "es", "target": "en"})
    assert r.status_code == 413 and r.json()["error"] == "file too large: 3500 characters of text, the limit is 3000"
    r = c.post("/translate_file", files={"file": ("t.txt", b"hola")}, data={"source": "fr", "target": "en"})
    assert r.status_code == 400 and "fr is not supported as the source language" in r.json()["error"]
    assert c.get("/download_file/..%2F..%2Fetc%2Fpasswd").status_code == 404
    app.state.files.close()
    assert not folder.exists()


def test_translate_a_docx_on_the_command_line(run_dir, tmp_path):
    import docx

    src, out = tmp_path / "doc.docx", tmp_path / "doc.en.docx"
    make_docx(src)
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "-o", str(out)])
    assert r.exit_code == 0, r.output
    document = docx.Document(str(out))
    assert len(document.paragraphs) == 1 and len(document.tables) == 1
    (tmp_path / "bad.docx").write_bytes(b"nope")
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(tmp_path / "bad.docx"), "-o", str(out)])
    assert r.exit_code == 1 and "bad.docx: not a .docx file" in r.output


def test_translate_an_odt_on_the_command_line(run_dir, tmp_path):
    src, out = tmp_path / "doc.odt", tmp_path / "doc.en.odt"
    make_odt(src)
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert odt_shape(out.read_bytes())[0] == odt_shape(src.read_bytes())[0]
    (tmp_path / "bad.odt").write_bytes(b"nope")
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(tmp_path / "bad.odt"), "-o", str(out)])
    assert r.exit_code == 1 and "bad.odt: not an .odt file (an .odt is a zip archive; this is not one)" in r.output
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "--scores"])
    assert r.exit_code == 1 and "--scores works line by line; an .odt document is translated whole" in r.output


def test_every_bad_file_is_documented():
    text = (REPO / "docs" / "errors.md").read_text(encoding="utf-8")
    section = text.split("### Files (`POST /translate_file`)", 1)[1].split("\n## ", 1)[0]
    ids = set(re.findall(r"^\| (file-[a-z0-9-]+) \|", section, re.MULTILINE))
    assert ids == {f"file-{kind}" for kind in BAD_FILES} | {"file-too-large", "file-gone"}


def test_a_browser_loads_a_translated_page(run_dir, tmp_path):
    verses = (SHIPPED / "test.es").read_text(encoding="utf-8").splitlines()[:2]
    page = tmp_path / "page.html"
    page.write_text(f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>t</title></head><body>'
                    f'<p id="p">{verses[0]} <b>{verses[1].split()[0]}</b> <a href="#x">{verses[1]}</a></p></body></html>\n',
                    encoding="utf-8")
    out = tmp_path / "page.en.html"
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(page), "-o", str(out), "--format", "html"])
    assert r.exit_code == 0, r.output
    browser = headless_chromium()
    try:
        browser.get(out.as_uri())
        tags = browser.execute_script("return Array.from(document.querySelectorAll('#p *')).map(e => e.tagName).sort()")
        assert tags == ["A", "B"]
        assert browser.execute_script("return document.querySelector('#p a').getAttribute('href')") == "#x"
    finally:
        browser.quit()


@pytest.fixture(scope="module")
def served(run_dir):
    """A server of the module's run at beam 2, its own (the `client` fixture's store is closed by a test)."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from seq2seq_cli.serve.app import ServeSettings, create_app

    with TestClient(create_app(Translator.load(run_dir, "cpu", {"beam_size": 2}), ServeSettings())) as c:
        yield c


def test_translate_and_translate_file_give_one_page_the_same_output(served, run_dir, tmp_path):
    """One detection and one HTML path: `translate -i page.html` (no --format) writes what
    /translate_file answers for the same page."""
    c = served
    page = ("<!DOCTYPE html>\n<html><head><title>Génesis</title></head><body>\n<h1>El principio</h1>\n"
            "<p>En el principio creó Dios los cielos y la tierra. <b>Y la tierra</b> estaba desordenada.</p>\n"
            "</body></html>\n")
    src, out = tmp_path / "page.html", tmp_path / "page.en.html"
    src.write_text(page, encoding="utf-8")
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "--engine", "torch", "--beam-size", "2", "-i", str(src),
                            "-o", str(out), "--device", "cpu"])
    assert r.exit_code == 0, r.output
    served = c.post("/translate_file", files={"file": ("page.html", page.encode())}, data={"source": "es", "target": "en"})
    assert served.status_code == 200, served.json()
    got = c.get(served.json()["translatedFileUrl"].removeprefix("http://testserver"))
    assert got.content == out.read_bytes()
    assert "<b>" in got.text and "El principio" not in got.text  # translated as HTML, not as lines of text
    named = tmp_path / "page.txt"  # a page whatever its name says: detected by its content
    named.write_text(page, encoding="utf-8")
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "--engine", "torch", "--beam-size", "2", "-i", str(named),
                            "-o", str(tmp_path / "named.out"), "--device", "cpu"])
    assert r.exit_code == 0 and (tmp_path / "named.out").read_bytes() == out.read_bytes()


@pytest.mark.parametrize("flags, fields", [
    (["--beam-size", "5000"], {"beam_size": 5000}),
    (["--nbest", "3", "--beam-size", "2"], {"nbest": 3, "beam_size": 2}),
    (["--min-len", "30", "--max-len-a", "0", "--max-len-b", "5"], {"min_len": 30, "max_len_a": 0, "max_len_b": 5}),
])
def test_the_command_line_and_the_server_refuse_a_bad_value_with_the_same_line(served, run_dir, flags, fields):
    """The decoding rules live in one place: the same bad value gets the same message, each
    naming the option as its user gives it (a flag, a field)."""
    c = served
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "--engine", "torch", "--device", "cpu", *flags], input="hola\n")
    assert r.exit_code == 1 and r.stderr.startswith("error: ")
    cli_line = r.stderr.strip().removeprefix("error: ")
    served = c.post("/v1/translate", json={"q": "hola", **fields})
    assert served.status_code == 400
    as_fields = re.sub(r"--([a-z-]+)", lambda m: m.group(1).replace("-", "_"), cli_line)
    assert served.json()["error"] == as_fields
