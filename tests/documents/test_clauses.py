"""A sentence longer than the splitter's limit is cut into its clauses after ';' and ':'."""

from __future__ import annotations

from seq2seq_cli.documents.sentences import MIN_CLAUSE_WORDS, Splitter

LONG = ("Y dijo Dios: Haya expansión en medio de las aguas, y separe las aguas de las aguas; e hizo Dios la "
        "expansión, y separó las aguas que estaban debajo de la expansión: de las aguas que estaban sobre la expansión.")


def test_a_long_sentence_is_cut_after_its_semicolons_and_colons():
    split = Splitter("es", clause_words=10).split(LONG + "  Y fue así.")
    assert split.sentences == [
        "Y dijo Dios: Haya expansión en medio de las aguas, y separe las aguas de las aguas;",
        "e hizo Dios la expansión, y separó las aguas que estaban debajo de la expansión:",
        "de las aguas que estaban sobre la expansión.", "Y fue así."]
    assert split.gaps == ["", " ", " ", "  ", ""]
    assert split.join(split.sentences) == LONG + "  Y fue así."  # the text's own spacing between the pieces


def test_short_sentences_and_short_clauses_are_not_cut():
    assert Splitter("es", clause_words=200).split(LONG).sentences == [LONG]
    assert Splitter("es", clause_words=None).split(LONG).sentences == [LONG]
    assert Splitter("es", whole=True, clause_words=10).split(LONG).sentences == [LONG]
    head = Splitter("es", clause_words=10).split(LONG).sentences[0]
    assert head.startswith("Y dijo Dios: Haya")  # 'Y dijo Dios:' holds fewer than MIN_CLAUSE_WORDS words: kept on
    assert len("Y dijo Dios:".split()) < MIN_CLAUSE_WORDS
