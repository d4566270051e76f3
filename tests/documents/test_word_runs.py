"""A .docx whose runs are cut as Word and spell-checkers cut them: a word per run, tracked
insertions, smart tags and hyperlinks of one word, Word's page-break marker, soft line breaks
and tabs inside a run, fields. Every source word is replaced by the translation (placed in the
runs, a run given no word taken out), a field's result is kept as Word wrote it, and text left
untranslated is named in one warning."""

from __future__ import annotations

import io
import logging
import re
import zipfile

import pytest
from lxml import etree

from seq2seq_cli.choices import DocumentFormat
from seq2seq_cli.documents import docx as docx_module
from seq2seq_cli.documents.placing import Aligned
from seq2seq_cli.documents.sentences import Splitter
from seq2seq_cli.documents.translate import translate_bytes

pytest.importorskip("docx")

ES = Splitter("es")
W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
W = "{" + W_NS + "}"
R_NS = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
DROPPED = frozenset(["los", "de", "el", "la", "y"])  # Spanish words the fake translation gives no word for


def r(text: str, props: str = "") -> str:
    return f'<w:r>{f"<w:rPr>{props}</w:rPr>" if props else ""}<w:t xml:space="preserve">{text}</w:t></w:r>'


def word(*paragraphs: str) -> bytes:
    """A .docx (python-docx's template) whose body holds `paragraphs` (the inside of each w:p)."""
    import docx

    buffer = io.BytesIO()
    docx.Document().save(buffer)
    source = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    body = "".join(f"<w:p>{p}</w:p>" for p in paragraphs)
    parts = {n: source.read(n) for n in source.namelist()}
    parts["word/document.xml"] = (f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n<w:document '
                                  f'xmlns:w="{W_NS}" xmlns:r="{R_NS}"><w:body>{body}</w:body></w:document>').encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in parts.items():
            archive.writestr(name, data)
    return out.getvalue()


def dropping(sentence: str) -> Aligned:
    """Each word in capitals, aligned to itself, except DROPPED ones, which give no word; a
    word in capitals in the source is aligned to the word before it as much as to itself."""
    found = list(re.finditer(r"\S+", sentence))
    kept = [i for i, m in enumerate(found) if m.group().lower().strip(".,") not in DROPPED]
    return Aligned([found[i].group().upper() for i in kept],
                   [[i - 1, i] if found[i].group().isupper() and i else [i] for i in kept],
                   [(m.start(), m.end()) for m in found])


@pytest.fixture
def drop(monkeypatch):
    monkeypatch.setattr(docx_module, "translate_aligned", lambda translator, sentences: [dropping(s) for s in sentences])


def translated(data: bytes) -> list[etree._Element]:
    out = translate_bytes(None, "w.docx", data, DocumentFormat.docx, ES)  # type: ignore[arg-type]
    body = etree.fromstring(zipfile.ZipFile(io.BytesIO(out)).read("word/document.xml"))
    return list(body.iter(W + "p"))


def text(paragraph: etree._Element) -> str:
    return "".join(t.text or "" for t in paragraph.iter(W + "t"))


def expected(source: str) -> str:
    return " ".join(w.upper() for w in source.split() if w.lower().strip(".,") not in DROPPED)


BEATITUDE = "Bienaventurados los pobres en espíritu. Porque de ellos es el reino de los cielos."


def test_a_run_per_word_keeps_no_source_word(drop):
    """Spell-checking and formatting cut a paragraph into a run per word: the runs the
    translation gives no word are taken out, the others hold their words, formatting kept."""
    runs = "".join(r(w + " ", "<w:b/>" if i % 2 else "") for i, w in enumerate(BEATITUDE.split()))
    [p] = translated(word(runs))
    assert text(p).strip() == expected(BEATITUDE)
    bold = [t.text.strip() for t in p.iter(W + "t") if t.getparent().find(f"{W}rPr/{W}b") is not None]
    assert bold == [w.upper() for w in BEATITUDE.split()[1::2] if w.lower() not in DROPPED]  # EN PORQUE ES REINO CIELOS.


def test_insertions_smart_tags_and_one_word_hyperlinks_keep_no_source_word(drop):
    ins = '<w:ins w:id="1" w:author="a" w:date="2024-01-01T00:00:00Z">{}</w:ins>'
    paragraph = (r("Y vio ") + ins.format(r("los") + r(" cielos")) + r(" y ")
                 + '<w:smartTag w:uri="u" w:element="place">' + r("el") + "</w:smartTag>"
                 + r(" libro ") + f'<w:hyperlink r:id="rId9">{r("Génesis")}</w:hyperlink>' + r(" y ")
                 + f'<w:hyperlink r:id="rId9">{r("la")}</w:hyperlink>' + r(" tierra de ")
                 + f'<w:hyperlink r:id="rId9">{r("NOD")}</w:hyperlink>' + r("."))
    [p] = translated(word(paragraph))
    source = "Y vio los cielos y el libro Génesis y la tierra de NOD."
    assert " ".join(text(p).split()) == expected(source)  # "VIO CIELOS LIBRO GÉNESIS TIERRA NOD."
    # a link holds the words aligned to it (NOD, aligned as much to "de" before it); one whose
    # word gave none is left empty, no word taken from a run it is the only word of
    assert [text(h) for h in p.iter(W + "hyperlink")] == ["GÉNESIS", "", "NOD."]
    assert [text(i).strip() for i in p.iter(W + "ins")] == ["CIELOS"]


def test_a_run_with_the_page_break_marker_is_translated(drop):
    """Word writes w:lastRenderedPageBreak near the top of most pages, inside a run of text."""
    [p] = translated(word('<w:r><w:rPr><w:i/></w:rPr><w:lastRenderedPageBreak/>'
                          '<w:t xml:space="preserve">Hola mundo cruel. </w:t></w:r>' + r("Adiós amigo.")))
    assert " ".join(text(p).split()) == "HOLA MUNDO CRUEL. ADIÓS AMIGO."
    assert len(list(p.iter(W + "lastRenderedPageBreak"))) == 1
    assert [t.text.strip() for t in p.iter(W + "t") if t.getparent().find(f"{W}rPr/{W}i") is not None] == ["HOLA MUNDO CRUEL."]


@pytest.mark.parametrize("inside, tag", [("<w:br/>", "br"), ("<w:tab/>", "tab"), ('<w:br w:type="page"/>', "br")])
def test_a_break_inside_a_run_parts_the_translated_words(drop, inside, tag):
    [p] = translated(word(f'<w:r><w:rPr><w:b/></w:rPr><w:t>Primera línea</w:t>{inside}<w:t>segunda línea.</w:t></w:r>'))
    content = [(el.tag.removeprefix(W), el.text) for el in p.iter(W + "t", W + tag)]
    assert content == [("t", "PRIMERA LÍNEA"), (tag, None), ("t", "SEGUNDA LÍNEA.")]
    assert all(run.find(f"{W}rPr/{W}b") is not None for run in p.iter(W + "r"))  # each part keeps the formatting


def test_a_fields_result_is_kept_as_word_wrote_it(monkeypatch):
    """'Página 5 de 10': PAGE's result is Word's ("5"); a word the model aligned to it goes
    into the text beside it, never into the field."""

    def aligned(sentence: str) -> Aligned:
        found = list(re.finditer(r"\S+", sentence))
        assert [m.group() for m in found] == ["Página", "de", "10."]  # the field is not the model's
        return Aligned(["PAGE", "OF", "10."], [[0], [1], [2]], [(m.start(), m.end()) for m in found])

    monkeypatch.setattr(docx_module, "translate_aligned", lambda translator, sentences: [aligned(s) for s in sentences])
    field = ('<w:r><w:fldChar w:fldCharType="begin"/></w:r><w:r><w:instrText xml:space="preserve"> PAGE '
             '</w:instrText></w:r><w:r><w:fldChar w:fldCharType="separate"/></w:r><w:r><w:t>5</w:t></w:r>'
             '<w:r><w:fldChar w:fldCharType="end"/></w:r>')
    [p] = translated(word(r("Página ") + field + r(" de 10.")))
    assert text(p) == "PAGE 5 OF 10."
    runs = list(p.iter(W + "r"))
    source = etree.fromstring(f'<w:p xmlns:w="{W_NS}" xmlns:r="{R_NS}">{field}</w:p>')
    assert [etree.tostring(run) for run in runs[1:6]] == [etree.tostring(run) for run in source.iter(W + "r")]


def test_text_left_untranslated_is_one_warning(drop, caplog):
    toc = ('<w:r><w:fldChar w:fldCharType="begin"/></w:r><w:r><w:instrText> TOC \\o "1-3" </w:instrText></w:r>'
           '<w:r><w:fldChar w:fldCharType="separate"/></w:r>')
    document = word(toc + r("Introducción al libro"), r("Capítulo primero") + '<w:r><w:fldChar w:fldCharType="end"/></w:r>',
                    r("Nombre:") + "<w:r><w:tab/></w:r>" + r("Juan."))
    with caplog.at_level(logging.WARNING, logger="seq2seq.documents"):
        paragraphs = translated(document)
    assert [text(p) for p in paragraphs] == ["Introducción al libro", "Capítulo primero", "NOMBRE:JUAN."]
    assert [rec.getMessage() for rec in caplog.records] == [
        'warning: w.docx: 2 paragraph(s) keep text untranslated (fields\' results, which Word writes again when '
        'it updates fields), the first: "Introducción al libro"']
