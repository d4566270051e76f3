"""Abbreviations end no sentence: sentencex's cuts before a lowercase word and after a title are
taken back (seq2seq_cli/documents/sentences.py), real sentence ends are still cut."""

from __future__ import annotations

import pytest

from seq2seq_cli.documents.lines import translate_sentences
from seq2seq_cli.documents.sentences import Split, Splitter, plan


def rebuilt(split: Split) -> str:
    out = split.gaps[0]
    for sentence, gap in zip(split.sentences, split.gaps[1:]):
        out += sentence + gap
    return out


@pytest.mark.parametrize("language, text, sentences", [
    # the hostile-use line: sentencex cuts after "p. m." ("m" is in no Spanish list)
    ("es", "a las 5 p. m. con el Dr. López llegó.", ["a las 5 p. m. con el Dr. López llegó."]),
    ("es", "Llegó el Dr. López. Luego se fue.", ["Llegó el Dr. López.", "Luego se fue."]),
    ("en", "at 5 p.m. with Dr. Smith. Then he left.", ["at 5 p.m. with Dr. Smith.", "Then he left."]),
    # the same English line read as Spanish: sentencex cuts after "p.m." and "Dr." there
    ("es", "at 5 p.m. with Dr. Smith. Then he left.", ["at 5 p.m. with Dr. Smith.", "Then he left."]),
    # a lowercase continuation after an abbreviation no list holds
    ("es", "Vino a las 5 p. m. y se fue.", ["Vino a las 5 p. m. y se fue."]),
    ("es", "Compró 3 lbs. de pan. Luego se fue.", ["Compró 3 lbs. de pan.", "Luego se fue."]),
    ("es", "Vino a las 5 p. m. (antes de cenar). Fin.", ["Vino a las 5 p. m. (antes de cenar).", "Fin."]),
    # after "?" and "!", a lowercase word goes on with the sentence (Spanish spelling)
    ("es", "¡Ay de nosotros! porque pecamos. Y callaron.", ["¡Ay de nosotros! porque pecamos.", "Y callaron."]),
    ("es", "¿Vienes? dijo él.", ["¿Vienes? dijo él."]),
    # a title before a capitalised name, in a language whose list lacks it, any case
    ("es", "Lo dijo Mr. Smith. Y se fue.", ["Lo dijo Mr. Smith.", "Y se fue."]),
    ("en", "She met Srta. Ruiz and Sra. Pérez. Then she left.", ["She met Srta. Ruiz and Sra. Pérez.", "Then she left."]),
    ("en", "SHE MET SRA. PÉREZ. THEN SHE LEFT.", ["SHE MET SRA. PÉREZ.", "THEN SHE LEFT."]),
    ("fr", "Il a vu Mme. Dupont. Puis il est parti.", ["Il a vu Mme. Dupont.", "Puis il est parti."]),
    # real sentence ends stay cut
    ("es", "Vino. Luego se fue.", ["Vino.", "Luego se fue."]),
    ("es", "Dijo: ¿Vienes? Sí.", ["Dijo: ¿Vienes?", "Sí."]),
    ("es", "Llegó el lunes. López se fue.", ["Llegó el lunes.", "López se fue."]),
    ("en", "He saw Dr. Smith. Then he left. Mr. Jones stayed.", ["He saw Dr. Smith.", "Then he left.", "Mr. Jones stayed."]),
    # a paragraph break stays a cut even before a lowercase word
    ("es", "Uno. Dos.\n\nluego tres.", ["Uno.", "Dos.", "luego tres."]),
])
def test_abbreviations_end_no_sentence(language, text, sentences):
    split = Splitter(language).split(text)
    assert split.sentences == sentences
    assert rebuilt(split) == text


def test_a_line_with_abbreviations_is_translated_as_one_sentence():
    line = "a las 5 p. m. con el Dr. López llegó."
    assert plan([line], Splitter("es")).splits == [None]
    seen: list[list[str]] = []

    def translate(units: list[str]) -> list[str]:
        seen.append(units)
        return [u.upper() for u in units]

    lines = [line, "Llegó el Dr. López. Luego se fue."]
    assert translate_sentences(translate, lines, Splitter("es")) == [line.upper(), "LLEGÓ EL DR. LÓPEZ. LUEGO SE FUE."]
    assert seen == [[line, "Llegó el Dr. López.", "Luego se fue."]]


def test_a_cut_taken_back_keeps_the_spans_on_the_text():
    text = "  Vino a las 5 p. m.  y se fue.   Luego  Mr. Smith llegó. "
    split = Splitter("es").split(text)
    assert split.sentences == ["Vino a las 5 p. m.  y se fue.", "Luego  Mr. Smith llegó."]
    assert [text[a:b] for a, b in split.spans()] == split.sentences
    assert split.join(["A.", "B."]) == "A.   B."
