"""Documents written back as they were read, their text aside: an XHTML page with an XHTML 1.0
doctype, HTML pages that leave out their doctype or the tags of <html>, <head> and <body>, an
.odt whose content.xml declares an entity in its doctype."""

from __future__ import annotations

import io
import zipfile

import pytest
from lxml import etree

import hostile_files as hf
from seq2seq_cli.choices import DocumentFormat
from seq2seq_cli.documents import markup, odt
from seq2seq_cli.documents.sentences import Splitter
from seq2seq_cli.documents.translate import translate_bytes

ES = Splitter("es")


@pytest.fixture(autouse=True)
def capitals(monkeypatch):
    """Documents "translated" into their own words in capitals, each aligned to itself."""
    for module in (markup, odt):
        monkeypatch.setattr(module, "translate_aligned", lambda translator, sentences: [hf.upper(s) for s in sentences])


def page(text: str, name: str = "p.html") -> str:
    return translate_bytes(None, name, text.encode(), DocumentFormat.html, ES).decode()  # type: ignore[arg-type]


STRICT = ('<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Strict//EN" '
          '"http://www.w3.org/TR/xhtml1/DTD/xhtml1-strict.dtd">')


@pytest.mark.parametrize("doctype", [STRICT, STRICT.replace("Strict", "Transitional").replace("strict", "transitional")])
def test_xhtml_with_an_xhtml_doctype_is_written_as_it_was(doctype):
    source = (f'<?xml version="1.0" encoding="utf-8"?>\n{doctype}\n<html xmlns="http://www.w3.org/1999/xhtml" '
              'xml:lang="es"><head><title>Hola</title></head><body><p>Hola <br/>mundo.</p></body></html>\n')
    out = page(source, "x.xhtml")
    assert out == source.replace("Hola", "HOLA").replace("mundo", "MUNDO")
    etree.fromstring(out.encode())  # well-formed: xmlns once


@pytest.mark.parametrize("source", [
    '<head><title>Hola</title><meta name="description" content="Un sitio."></head><body class="x"><p>Hola mundo.</p></body>\n',
    '<body class="x" id="b"><p>Hola mundo.</p></body>\n',
    '<html><head><title>Hola</title></head><body><p>Hola.</p></body></html>\n',
    '<html lang="es"><p>Hola.</p></html>',
    '<!-- una nota -->\n<html><body><p>Hola.</p></body></html>\n',
    '<!doctype html>\n<html><body><p>Hola.</p></body></html>\n',
    '<!DOCTYPE html PUBLIC "-//W3C//DTD HTML 4.01//EN" "http://www.w3.org/TR/html4/strict.dtd">\n'
    '<html><body><p>Hola.</p></body></html>\n',
])
def test_a_page_keeps_its_tags_and_doctype_or_its_lack_of_them(source):
    """A page without a doctype gains none; <html>, <head> and <body> are written where the
    page wrote them (with their attributes) and nowhere else; the head's title and
    description are translated."""
    out = page(source)
    expected = source
    for word in ("Hola", "Un sitio", "mundo"):
        expected = expected.replace(word, word.upper())
    assert out == expected


def test_an_odt_whose_doctype_declares_an_entity_keeps_it_declared():
    content = ('<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE office:document-content [<!ENTITY co "La Casa">]>\n'
               '<office:document-content xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
               'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0"><office:body><office:text>'
               '<text:p>Hola &co; mundo.</text:p></office:text></office:body></office:document-content>')
    data = hf.zipped({"mimetype": hf.ODT_MIMETYPE, "content.xml": content})
    out = translate_bytes(None, "e.odt", data, DocumentFormat.odt, ES)  # type: ignore[arg-type]
    written = zipfile.ZipFile(io.BytesIO(out)).read("content.xml")
    assert b'<!DOCTYPE office:document-content [<!ENTITY co "La Casa">]>' in written
    etree.fromstring(written, etree.XMLParser(resolve_entities=False))  # raises if &co; were undeclared
    assert b"<text:p>HOLA &co; MUNDO.</text:p>" in written
