"""`--engine ctranslate2`: CTranslate2 decodes the run's weights with our search's settings,
so a translator with the engine attached answers as our search does (up to ties of float32
rounding), outputs that reach their limit included, and leaves to our search what CTranslate2
would do differently: forced prefixes, sampling, the gnmt penalty. The converted model is written into
the run (RUN/ctranslate2/NAME-SHA/) and nowhere else (tests/decode/test_defaults.py: once, atomically)."""

import re
import tempfile
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from conftest import SHIPPED
from helpers import documented_errors, sequence_log_prob
from seq2seq_cli.cli import app
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.fileio import sha256
from seq2seq_cli.layout import RunLayout

ctranslate2 = pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install 'seq2seq[ctranslate2]')")
from seq2seq_cli.decode.ctranslate2_engine import with_ctranslate2  # noqa: E402

pytestmark = pytest.mark.usefixtures("torch_threads")  # torch gets its threads back after each test


@pytest.fixture(scope="module")
def run_dir(small_run) -> Path:
    """A small model trained enough (150 updates) to give sentences of words (shared, read only)."""
    return small_run


LINES = (SHIPPED / "test.es").read_text(encoding="utf-8").splitlines()[:30]


class Counting:
    """A CTranslate2 translator that counts the sentences given to it."""

    def __init__(self, inner) -> None:
        self.inner, self.sentences = inner, 0

    def translate_batch(self, source, **kwargs):
        self.sentences += len(source)
        return self.inner.translate_batch(source, **kwargs)


def pair(run_dir: Path, settings: dict) -> tuple[Translator, Translator, Counting]:
    """(our search's translator, the same with the engine attached, its counting CTranslate2), over
    the whole vocabulary: a shortlist's candidates follow the batches, which the engine cuts its
    own way (tests/test_shortlist.py races the two with the shortlist)."""
    ours = Translator.load(run_dir, "cpu", {"shortlist": False, **settings})
    with_engine = with_ctranslate2(ours, run_dir)
    counting = Counting(with_engine.engine.translator)
    with_engine.engine.translator = counting
    return ours, with_engine, counting


def assert_same(ours, theirs, tr: Translator, lines: list[str]) -> None:
    """The same n-best lists, scores to 1e-3; where the outputs differ (at most 2 sentences),
    both hypotheses score the same under our model (a tie broken the other way)."""
    differ = 0
    for line, o, t in zip(lines, ours, theirs):
        for a, b in zip(o, t):
            if a.tokens == b.tokens:
                assert b.score == pytest.approx(a.score, rel=2e-3, abs=1e-3)
                assert b.log_prob == pytest.approx(a.log_prob, rel=2e-3, abs=2e-2)
                continue
            differ += 1
            src = torch.tensor(tr.encode([line])[0])
            with torch.no_grad():
                mine = sequence_log_prob(tr.model, src, a.tokens, a.eos) / (len(a.tokens) + a.eos)
                other = sequence_log_prob(tr.model, src, b.tokens, b.eos) / (len(b.tokens) + b.eos)
            assert abs(mine - other) < 1e-3, (line, a.tokens, b.tokens)
    assert differ <= 2


@pytest.mark.parametrize("settings", [
    {"beam_size": 4, "length_penalty": 1.0},
    {"beam_size": 1},
    {"beam_size": 3, "length_penalty": 0.6},
])
def test_the_engine_answers_as_our_search(run_dir, settings):
    ours, with_engine, counting = pair(run_dir, settings)
    want = ours.translate_hypotheses(LINES)
    got = with_engine.translate_hypotheses(LINES)
    assert counting.sentences == len(LINES)  # CTranslate2 decoded every sentence
    assert_same(want, got, ours, LINES)


def test_several_sentences_are_split_among_one_thread_workers_and_a_lone_one_is_not(run_dir):
    """With 2 threads the engine decodes a batch as 2 batches side by side (one thread each)
    and a lone sentence on both threads; the answers are still our search's."""
    ours = Translator.load(run_dir, "cpu", {"beam_size": 4, "shortlist": False})  # see `pair`
    with_engine = with_ctranslate2(ours, run_dir, threads=2)
    engine = with_engine.engine
    assert engine.workers == 2 and engine.batches.num_translators == 2 and engine.translator.num_translators == 1
    calls: list[tuple[str, int, int]] = []

    class Recording:
        def __init__(self, inner, name) -> None:
            self.inner, self.name = inner, name

        def translate_batch(self, source, **kwargs):
            calls.append((self.name, len(source), kwargs["max_batch_size"]))
            return self.inner.translate_batch(source, **kwargs)

    engine.translator, engine.batches = Recording(engine.translator, "lone"), Recording(engine.batches, "several")
    assert_same(ours.translate_hypotheses(LINES), with_engine.translate_hypotheses(LINES), ours, LINES)
    assert {name for name, _, _ in calls} == {"several"} and sum(n for _, n, _ in calls) == len(LINES)
    assert all(split == (n + 1) // 2 for _, n, split in calls)  # each batch cut in two
    calls.clear()
    assert with_engine.translate(LINES[:1]) == ours.translate(LINES[:1])
    assert calls == [("lone", 1, 0)]


@pytest.mark.parametrize("shortlist", [False, True])
def test_the_engine_on_one_thread_calls_one_worker_at_a_time_and_answers_the_same(run_dir, shortlist):
    """`one_thread` (a server decoding another run beside it): every call on the one-thread
    translator, each waited for before the next, a sentence a call with the shortlist; the
    answers are the full engine's."""
    ours = Translator.load(run_dir, "cpu", {"beam_size": 4, "shortlist": shortlist})
    full = with_ctranslate2(ours, run_dir, threads=2)
    one = full.with_engine(full.engine.one_thread())
    assert one.engine.translator is full.engine.batches and one.engine.batches is None
    calls: list[tuple[int, int, bool]] = []

    class Recording:
        num_translators = 2

        def __init__(self, inner) -> None:
            self.inner = inner

        def translate_batch(self, source, **kwargs):
            calls.append((len(source), kwargs["max_batch_size"], kwargs["asynchronous"]))
            return self.inner.translate_batch(source, **kwargs)

    one.engine.translator = Recording(one.engine.translator)
    got = one.translate_hypotheses(LINES)
    assert [[h.tokens for h in hs] for hs in got] == [[h.tokens for h in hs] for hs in full.translate_hypotheses(LINES)]
    assert not any(wait for _, _, wait in calls)  # each call returned its results before the next
    assert sum(n for n, _, _ in calls) == len(LINES)
    assert all(n == 1 for n, _, _ in calls) if shortlist else all(split == 0 for _, split, _ in calls)
    assert full.engine.one_thread() is not None and with_ctranslate2(ours, run_dir, threads=1).engine.one_thread() is None


def test_outputs_that_reach_their_limit_end_there_as_our_search_ends_them(run_dir):
    """Every output reaches the limit of 3 tokens: CTranslate2 decodes them all, each ends with
    a 4th token and no EOS, and they are our search's, scores included."""
    settings = {"beam_size": 4, "max_len_a": 0.0, "max_len_b": 3}
    ours, with_engine, counting = pair(run_dir, settings)
    found = with_engine.engine.search(with_engine.encode(LINES[:5]), with_engine.decode, 1)
    assert counting.sentences == 5 and all(h is not None and len(h[0].tokens) == 4 for h in found)
    want = ours.translate_hypotheses(LINES[:5])
    assert [h[0].tokens for h in found] == [h[0].tokens for h in want]
    for line, h in zip(LINES[:5], found):
        assert h is not None
        src = torch.tensor(ours.encode([line])[0])
        with torch.no_grad():
            assert h[0].log_prob == pytest.approx(sequence_log_prob(ours.model, src, h[0].tokens, eos=False), abs=2e-2)
    assert [h[0].tokens for h in with_engine.translate_hypotheses(LINES[:5])] == [h[0].tokens for h in want]
    assert counting.sentences == 10  # the second time too: nothing left to our search


def test_a_batch_s_longest_limit_does_not_lengthen_a_short_sentence_s_output(run_dir):
    # a short sentence and a long one share a batch: CTranslate2 decodes each with its own
    # limit, so the short one's output keeps to its own, as our search's does
    settings = {"beam_size": 2, "max_len_a": 0.5, "max_len_b": 1}
    ours, with_engine, counting = pair(run_dir, settings)
    lines = ["Dios.", " ".join(LINES[:3])]
    got = with_engine.translate_hypotheses(lines)
    limits = [int(0.5 * len(ids) + 1) for ids in with_engine.encode(lines)]
    assert all(len(h[0].tokens) <= n + 1 for h, n in zip(got, limits))
    assert [h[0].tokens for h in got] == [h[0].tokens for h in ours.translate_hypotheses(lines)]
    assert counting.sentences == 2


@pytest.mark.parametrize("settings,nbest", [
    ({"sampling": True, "seed": 3}, 1), ({"length_penalty_type": "gnmt"}, 1), ({"no_repeat_ngram_size": 2}, 1),
    ({"ban_unk": True}, 1), ({"beam_size": 3, "min_len": 4}, 1), ({"beam_size": 4, "min_len": 12}, 1),
    ({"beam_size": 4}, 3),
])
def test_options_the_engine_does_otherwise_go_to_our_search(run_dir, settings, nbest):
    ours, with_engine, counting = pair(run_dir, settings)
    assert with_engine.engine.why_not(with_engine.decode, nbest) is not None
    got = with_engine.translate_hypotheses(LINES[:6], nbest)
    assert counting.sentences == 0
    want = ours.translate_hypotheses(LINES[:6], nbest)
    assert [[h.tokens for h in hyps] for hyps in got] == [[h.tokens for h in hyps] for hyps in want]


def test_a_forced_prefix_goes_to_our_search(run_dir):
    ours, with_engine, counting = pair(run_dir, {"beam_size": 3})
    prefix = with_engine.tgt_sp.encode("And God")
    got = with_engine.translate_hypotheses(LINES[:3], prefixes=[prefix, [], []])
    assert got[0][0].tokens[: len(prefix)] == prefix
    assert counting.sentences == 2  # the two lines without a prefix
    want = ours.translate_hypotheses(LINES[:3], prefixes=[prefix, [], []])
    assert [h[0].tokens for h in got] == [h[0].tokens for h in want]


def test_loading_the_engine_writes_its_model_into_the_run_alone(run_dir, tmp_path, monkeypatch):
    def outside(root: Path) -> list[Path]:
        return sorted(p.relative_to(root) for p in root.rglob("*") if "ctranslate2" not in p.relative_to(root).parts)

    before = outside(run_dir)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with_ctranslate2(Translator.load(run_dir, "cpu", {}), run_dir)
    assert list(tmp_path.iterdir()) == []
    assert outside(run_dir) == before
    layout = RunLayout(run_dir)
    assert [p.name for p in layout.ctranslate2.iterdir()] == [layout.converted("best", sha256(layout.best)).name]


def test_translate_with_the_engine_writes_our_search_s_translations(run_dir, tmp_path):
    src = tmp_path / "in.es"
    src.write_text("\n".join(LINES[:8] + ["", LINES[8]]) + "\n", encoding="utf-8")
    outputs = {}
    for engine in ("torch", "ctranslate2"):
        out = tmp_path / f"{engine}.en"
        r = CliRunner().invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "-o", str(out), "--engine", engine,
                                     "--beam-size", "3", "--no-progress", "--full-vocabulary"])  # see `pair`
        assert r.exit_code == 0, r.output
        outputs[engine] = out.read_text(encoding="utf-8").splitlines()
    assert len(outputs["ctranslate2"]) == 10 and outputs["ctranslate2"][8] == ""
    assert sum(a != b for a, b in zip(outputs["torch"], outputs["ctranslate2"])) <= 2


# The rows of docs/errors.md, section "Engines", each checked below.
ENGINE_CASES = {"engine-unknown": ["--engine", "onnx"], "engine-ensemble": ["--engine", "ctranslate2"],
                "engine-compute-type": ["--engine", "ctranslate2", "--precision", "bf16"],
                "engine-missing": ["--engine", "ctranslate2"]}


def test_engine_errors_are_documented():
    assert set(documented_errors("Engines")) == set(ENGINE_CASES)


@pytest.mark.parametrize("case", sorted(ENGINE_CASES))
def test_engine_errors_are_one_line(run_dir, case, monkeypatch):
    models = ["-m", str(run_dir)] * (2 if case == "engine-ensemble" else 1)
    if case == "engine-missing":
        monkeypatch.setitem(__import__("sys").modules, "ctranslate2", None)  # import ctranslate2 fails
    r = CliRunner().invoke(app, ["translate", *models, "-i", "-", *ENGINE_CASES[case]], input="Hola.\n")
    assert r.exit_code == (2 if case == "engine-unknown" else 1)  # a bad choice is a bad flag
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1
    documented = documented_errors("Engines")[case]
    if case == "engine-compute-type":  # the types CTranslate2 lists are this CPU's (int16 where it has it)
        types = re.compile(r"computes in [a-z0-9_]+(?:, [a-z0-9_]+)*, not")
        assert types.search(r.output)
        assert types.sub("computes in ..., not", r.output.strip()) == types.sub("computes in ..., not", documented)
    else:
        assert r.output.strip() == documented
