"""Several training corpora mixed by weight, and corpus tags: each epoch holds round(weight x
pairs kept) pairs of each corpus, exactly (the tolerance is zero: the draw is counted, not
sampled at random per pair); a resumed run is bit-identical; a tag is one piece of the
tokenizer and reaches the model's input ids, in training and in translation."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter

import numpy as np
import pytest
import sentencepiece as spm
from typer.testing import CliRunner

from helpers import REPO, SHIPPED, assert_same, corpora_config, quiet
from seq2seq_cli.cli import app
from seq2seq_cli.config_load import load_config
from seq2seq_cli.data.batching import collate, epoch_batches, plan_batches
from seq2seq_cli.data.corpora import Part, drawn_per_corpus, epoch_rows
from seq2seq_cli.data.encoding import EncodedCorpus
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.train import loop as train_module
from seq2seq_cli.train.data import prepare_data
from seq2seq_cli.train.distributed import Processes

runner = CliRunner()
ES = (SHIPPED / "valid.es").read_text(encoding="utf-8").splitlines()
EN = (SHIPPED / "valid.en").read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The config and prepared data of the three corpora (tokenizer trained with the tags)."""
    tmp = tmp_path_factory.mktemp("corpora")
    config = load_config(corpora_config(tmp, "run"))
    config.run_path.mkdir(parents=True)
    messages: list[str] = []
    return config, prepare_data(config, Processes(), messages.append), messages


def test_each_epoch_holds_weight_times_pairs_of_each_corpus(prepared):
    config, data, messages = prepared
    parts = data.train.parts
    assert [p.weight for p in parts] == [2, 0.5, 1] and all(p.count > 0 for p in parts)
    assert [p.per_epoch for p in parts] == [2 * parts[0].count, int(np.floor(parts[1].count / 2 + 0.5)), parts[2].count]
    seen_b: list[np.ndarray] = []
    for epoch in range(4):
        batches = epoch_batches(data.train, config.train.max_tokens, config.train.seed, epoch)
        rows = np.concatenate(batches)
        assert drawn_per_corpus(parts, rows) == [p.per_epoch for p in parts]  # exact: zero tolerance
        counts = Counter(rows.tolist())
        a, b, c = (range(p.start, p.start + p.count) for p in parts)
        assert all(counts[r] == 2 for r in a)  # weight 2: every pair twice
        assert all(counts[r] == 1 for r in c)  # weight 1: every pair once
        assert all(counts[r] <= 1 for r in b)  # weight 0.5: half of the pairs, none twice
        seen_b.append(np.array(sorted(r for r in counts if r in b)))
    assert not np.array_equal(seen_b[0], seen_b[1])  # a different half each epoch ...
    assert len(set(seen_b[0]) | set(seen_b[1])) >= parts[1].count - 1  # ... together (about) every pair
    assert [b.tolist() for b in epoch_batches(data.train, config.train.max_tokens, config.train.seed, 3)] == \
        [b.tolist() for b in epoch_batches(data.train, config.train.max_tokens, config.train.seed, 3)]
    assert any(m.startswith("train: corpus 1 ") and "weight 0.5, tag <bt>" in m and "pairs per epoch" in m
               for m in messages)


def test_training_draws_the_weighted_share_of_each_corpus_per_epoch(tmp_path, monkeypatch):
    """The rows the training loop collates, counted per corpus and epoch."""
    path = corpora_config(tmp_path, "run", max_steps=None, max_epochs=3, valid_every=1000, max_tokens=4096)
    seen: list[tuple[int, np.ndarray]] = []
    real = train_module.collate

    def spy(corpus, index, key=None):
        if key is not None:  # a training batch (validation batches have no sampling key)
            seen.append((key[1], np.asarray(index)))
        return real(corpus, index, key)

    monkeypatch.setattr(train_module, "collate", spy)
    run = quiet(path)
    record = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    corpora_record = record["train_corpora"]
    assert [c["weight"] for c in corpora_record] == [2, 0.5, 1]
    assert all(c["read"] == c["kept"] + sum(v for k, v in c.items() if k.startswith("dropped_")) for c in corpora_record)
    parts = [Part(c["path"], c["weight"], c["tag"], 0, c["kept"]) for c in corpora_record]
    starts = np.cumsum([0] + [p.count for p in parts])[:-1]
    parts = [Part(p.path, p.weight, p.tag, int(s), p.count) for p, s in zip(parts, starts)]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    logged = {r["epoch"]: r["train_drawn"] for r in records if "train_drawn" in r}
    assert sorted(logged) == [1, 2, 3] and len([r for r in records if "train_drawn" in r]) == 3
    for epoch in range(3):
        rows = np.concatenate([index for e, index in seen if e == epoch])
        assert drawn_per_corpus(parts, rows) == [c["drawn_per_epoch"] for c in corpora_record] == logged[epoch + 1]


def test_one_corpus_of_weight_one_is_the_plain_split():
    rng = np.random.default_rng(0)
    src = [list(range(4, 4 + n)) for n in rng.integers(1, 30, 200)]
    plain = EncodedCorpus.from_lists(src, src)
    listed = EncodedCorpus.from_lists(src, src)
    listed.parts = [Part("x", 1.0, None, 0, len(src))]
    for epoch in range(3):
        assert [b.tolist() for b in epoch_batches(plain, 200, 5, epoch)] == \
            [b.tolist() for b in epoch_batches(listed, 200, 5, epoch)]
    rows = epoch_rows([Part("a", 0.25, None, 0, 10), Part("b", 3, None, 10, 4)], 1, 0)
    assert drawn_per_corpus([Part("a", 0.25, None, 0, 10), Part("b", 3, None, 10, 4)], rows) == [3, 12]


def test_batches_of_one_pair_hold_one_pair_each_and_the_same_rows_as_mixed_ones():
    rng = np.random.default_rng(1)
    src = [list(range(4, 4 + n)) for n in rng.integers(1, 30, 300)]
    tgt = [list(range(4, 4 + n)) for n in rng.integers(1, 30, 300)]
    corpus = EncodedCorpus.from_lists(src, tgt)
    corpus.parts = [Part("a", 1.0, None, 0, 100, pair="es-en"), Part("b", 2.0, None, 100, 120, pair="ny-en"),
                    Part("c", 0.5, None, 220, 80, pair="es-en")]
    pair_of = np.array(["es-en"] * 100 + ["ny-en"] * 120 + ["es-en"] * 80)
    for epoch in range(3):
        mixed, one = epoch_batches(corpus, 200, 5, epoch), epoch_batches(corpus, 200, 5, epoch, one_pair=True)
        assert sorted(np.concatenate(list(one)).tolist()) == sorted(np.concatenate(list(mixed)).tolist())
        assert all(len(set(pair_of[b])) == 1 for b in one)
        assert any(len(set(pair_of[b])) == 2 for b in mixed)  # what `one` changes
        longest = np.maximum(corpus.src_lens, corpus.tgt_lens)
        assert all(len(b) * longest[b].max() <= 200 for b in one if len(b) > 1)
        firsts = [pair_of[b[0]] for b in one]  # the pairs' batches are shuffled together, not one pair's then the other's
        assert sum(x != y for x, y in zip(firsts, firsts[1:])) > 1
        again = epoch_batches(corpus, 200, 5, epoch, one_pair=True)  # a pure function of (seed, epoch)
        assert [b.tolist() for b in again] == [b.tolist() for b in one]
    alone = EncodedCorpus.from_lists(src, tgt)  # one pair: `one` changes nothing
    alone.parts = [Part("a", 1.0, None, 0, 300, pair="es-en")]
    assert [b.tolist() for b in epoch_batches(alone, 200, 5, 0, one_pair=True)] == \
        [b.tolist() for b in epoch_batches(alone, 200, 5, 0)]


@pytest.mark.parametrize("one_pair", [False, True])
def test_a_pair_drawn_several_times_an_epoch_goes_into_a_different_batch_each_time(one_pair):
    """Weights (or a temperature) above 1 draw a pair several times an epoch; sorted by length
    with the rest, its copies would lie side by side and fill one batch with the same pair."""
    rng = np.random.default_rng(2)
    src = [list(range(4, 4 + n)) for n in rng.integers(1, 40, 400)]
    tgt = [list(range(4, 4 + n)) for n in rng.integers(1, 40, 400)]
    corpus = EncodedCorpus.from_lists(src, tgt)
    corpus.parts = [Part("a", 1.0, None, 0, 300, pair="es-en"), Part("b", 3.4, None, 300, 100, pair="ny-en")]
    for epoch in range(3):
        batches = list(epoch_batches(corpus, 300, 5, epoch, one_pair=one_pair))
        assert all(len(set(b.tolist())) == len(b) for b in batches)  # no batch holds a row twice
        counts = Counter(np.concatenate(batches).tolist())
        assert all(counts[r] == 1 for r in range(300))  # the draw is unchanged: weight 1 once ...
        assert sorted(counts[r] for r in range(300, 400)) == [3] * 60 + [4] * 40  # ... 3.4: 340 of 100
        assert [b.tolist() for b in epoch_batches(corpus, 300, 5, epoch, one_pair=one_pair)] == \
            [b.tolist() for b in batches]  # a pure function of (seed, epoch)
    together = plan_batches(corpus.src_lens, corpus.tgt_lens, 300, np.random.default_rng(0),
                            epoch_rows(corpus.parts, 5, 0))  # the epoch's rows batched as one split
    assert sum(len(b) - len(set(b.tolist())) for b in together) > len(src) // 4  # what batching them apart changes


@pytest.mark.parametrize(("stop_at", "sampling"), [(5, False), (16, True)])
def test_interrupted_and_resumed_run_on_several_corpora_is_bit_identical(tmp_path, stop_at, sampling):
    options = [f"tokenizer.sampling={str(sampling).lower()}"]
    ref = quiet(corpora_config(tmp_path / "ref", "ref"), False, *options)
    cfg = corpora_config(tmp_path / "run", "run")
    quiet(cfg, False, *options, f"train.max_steps={stop_at}")
    run = quiet(cfg, True, *options)
    assert_same(ref, run)
    drawn = [[r for r in map(json.loads, (r_ / "metrics.jsonl").read_text().splitlines()) if "train_drawn" in r]
             for r_ in (ref, run)]
    assert drawn[0] == drawn[1]  # each epoch's counts once, resumed or not
    assert len(drawn[0]) >= 2  # the runs crossed an epoch boundary, where the draw changes


def test_tags_are_single_pieces_that_reach_the_model(prepared):
    config, data, _ = prepared
    sp = data.src_sp
    ids = {}
    for tag in ("<bt>", ">>en<<"):
        pieces = sp.encode(tag, out_type=str)
        assert pieces in ([tag], ["\u2581", tag])  # never split
        ids[tag] = sp.piece_to_id(tag)
        proto = spm.sentencepiece_model_pb2.ModelProto() if hasattr(spm, "sentencepiece_model_pb2") else None
        if proto is not None:
            proto.ParseFromString(sp.serialized_model_proto())
            assert proto.pieces[ids[tag]].type == proto.pieces[ids[tag]].USER_DEFINED
    a, b, c = data.train.parts
    for part, tag in ((a, None), (b, "<bt>"), (c, ">>en<<")):
        index = np.arange(part.start, part.start + part.count)
        first = collate(data.train, index).src[:, 0].tolist()  # the model's input ids
        if tag is None:
            assert set(first).isdisjoint(ids.values())
        else:
            assert set(first) == {ids[tag]}
        sampled = collate(data.train, index, (1, 0, 0))
        assert sampled.src[:, 0].tolist() == first  # with subword sampling too, where it is on
    data.train.sampling = None


def test_translate_tag_goes_in_front_of_each_line_and_blank_lines_stay(tmp_path):
    path = corpora_config(tmp_path, "run", max_steps=4)
    run = quiet(path)
    tr = Translator.load(run, "cpu")
    tagged = tr.with_tag("<bt>")
    bt = tr.src_sp.piece_to_id("<bt>")
    assert tagged.encode(["hola", ""]) == [[bt, *tr.encode(["hola"])[0]], tr.encode([""])[0]]
    src = tmp_path / "in.es"
    lines = ["hola", "", "en el principio", "   ", "dios"]
    src.write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    for flags in (["--beam-size", "2"], ["--sampling", "--seed", "3"]):
        out = tmp_path / "out.en"
        r = runner.invoke(app, ["translate", "-m", str(run), "-i", str(src), "-o", str(out), "--no-progress",
                                "--tag", "<bt>", *flags])
        assert r.exit_code == 0, r.output
        got = out.read_text(encoding="utf-8").split("\n")[:-1]
        assert len(got) == len(lines) + 1 and got[1] == got[3] == got[5] == ""
    if importlib.util.find_spec("fastapi") is not None:  # serve --tag: the same translator behind HTTP
        from fastapi.testclient import TestClient

        from seq2seq_cli.serve.app import ServeSettings, create_app

        with TestClient(create_app(tagged, ServeSettings())) as client:
            served = client.post("/v1/translate", json={"q": "hola\nen el principio"}).json()["results"]
        assert [x["translation"] for x in served] == tagged.translate(["hola", "en el principio"])
    r = runner.invoke(app, ["translate", "-m", str(run), "--tag", "<xx>"], input="hola\n")
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.strip().startswith("error: --tag <xx>: tag '<xx>' is not one piece of the tokenizer")
    ref = tmp_path / "ref.en"
    ref.write_text("hello\n", encoding="utf-8")
    (tmp_path / "one.es").write_text("hola\n", encoding="utf-8")
    r = runner.invoke(app, ["evaluate", "-m", str(run), "--src", str(tmp_path / "one.es"), "--ref", str(ref),
                            "--tag", ">>en<<", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["bleu"] >= 0


def test_a_tag_a_supplied_model_would_split_is_refused(tmp_path):
    model = tmp_path / "plain"
    spm.SentencePieceTrainer.train(sentence_iterator=iter(ES[:300] + EN[:300]), model_prefix=str(model), vocab_size=200,
                                   pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2)
    path = corpora_config(tmp_path, "run")
    r = runner.invoke(app, ["tokenize", "-c", str(path), "--set", f"tokenizer.src_model={model}.model"])
    assert r.exit_code == 1 and r.stdout == ""
    line = r.stderr.strip()
    assert "\n" not in line and line.startswith(f"error: {path}:")
    assert "data.train[1].tag (tokenizer.src_model" in line and "tag '<bt>' is not one piece of the tokenizer" in line
    assert not (tmp_path / "run" / "spm.model").exists()  # refused before the model was copied into the run


def test_a_plain_string_train_saves_as_it_was_given(tmp_path):
    cfg = load_config(REPO / "configs" / "tiny.yaml")
    assert cfg.data.train == "data/bible-es-en/valid" and cfg.data.corpora[0].weight == 1 and cfg.data.tags == []


def test_a_tag_of_an_imported_vocabulary_is_its_id(tmp_path):
    """An imported OPUS-MT model keeps its >>fra<< tokens in vocab.json: --tag gives their id."""
    from seq2seq_cli.data.tokenizer import VocabTokenizer, tag_id
    from seq2seq_cli.errors import UserError

    spm.SentencePieceTrainer.train(sentence_iterator=iter(ES[:300]), model_prefix=str(tmp_path / "m"), vocab_size=100,
                                   minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "m.model"))
    vocab = {"<pad>": 0, "<unk>": 1, "<s>": 2, "</s>": 3, ">>fra<<": 4, ">>por<<": 5}
    vocab.update({sp.id_to_piece(i): len(vocab) for i in range(3, sp.get_piece_size()) if sp.id_to_piece(i) not in vocab})
    tok = VocabTokenizer(sp, vocab)
    assert tag_id(tok, ">>por<<", "--tag >>por<<") == 5
    with pytest.raises(UserError, match="--tag >>deu<<: tag '>>deu<<' is not in the model's vocabulary"):
        tag_id(tok, ">>deu<<", "--tag >>deu<<")


def test_a_weight_past_any_memory_is_refused_before_an_epoch_is_drawn(tmp_path):
    """Even where weight x pairs overflows a float, the epoch is counted and refused in one line."""
    from seq2seq_cli.errors import UserError
    from seq2seq_cli.train.memory import check_epoch_fits

    config = load_config(corpora_config(tmp_path, "heavy"))
    for weight in (1e9, 1e308):
        parts = [Part("a", 1.0, None, 0, 200), Part("b", weight, None, 200, 200)]
        assert parts[1].per_epoch >= 2 * 10**11
        with pytest.raises(UserError, match=r"data\.train\[1\]\.weight: weight 1e\+[0-9]+ draws [0-9,]+ pairs per epoch"):
            check_epoch_fits(config, parts)
