"""Translation of files: order, empty lines, n-best, scores, alignments, plots, sampling."""

import random
from pathlib import Path
from typing import ClassVar

import pytest
from typer.testing import CliRunner

from conftest import SHIPPED
from seq2seq_cli.cli import app
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.documents.lines import OutputOptions, translate_sentences, translate_stream
from seq2seq_cli.documents.sentences import Splitter

runner = CliRunner()


@pytest.fixture(scope="module")
def run_dir(tiny_run) -> Path:
    """A tiny model trained for a few dozen steps on the shipped validation split (shared, read only)."""
    return tiny_run


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    lines = (SHIPPED / "test.es").read_text(encoding="utf-8").splitlines()[:30]
    random.Random(0).shuffle(lines)  # lengths in no particular order
    return lines


def test_output_order_equals_input_order(run_dir, sentences):
    # the whole vocabulary: a shortlist's candidates are its batch's, so a line's output may follow its batch
    tr = Translator.load(run_dir, "cpu", {"beam_size": 2, "batch_tokens": 64, "shortlist": False})
    together = tr.translate(sentences)
    alone = [tr.translate([s])[0] for s in sentences]
    assert together == alone


def test_empty_lines_stay_in_place(run_dir, sentences, tmp_path):
    lines = sentences[:6]
    lines[1:1] = [""]
    lines[4:4] = ["   "]
    src = tmp_path / "in.es"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.en"
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "-o", str(out), "--no-progress",
                            "--engine", "torch"])  # the engine of Translator.load, below
    assert r.exit_code == 0, r.output
    got = out.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(got) == len(lines)
    assert got[1] == "" and got[4] == ""
    tr = Translator.load(run_dir, "cpu")
    kept = [s for i, s in enumerate(lines) if i not in (1, 4)]
    # lines cut into sentences
    assert [g for i, g in enumerate(got) if i not in (1, 4)] == translate_sentences(tr.translate, kept, Splitter("es"))


def test_nbest_with_scores(run_dir, sentences):
    args = ["translate", "-m", str(run_dir), "--beam-size", "3", "--nbest", "3", "--scores"]
    r = runner.invoke(app, args, input="\n".join(sentences[:4]) + "\n")
    assert r.exit_code == 0, r.output
    rows = r.stdout.splitlines()
    assert len(rows) == 12
    for k in range(4):
        scores = [float(row.rsplit("\t", 1)[1]) for row in rows[3 * k : 3 * k + 3]]
        assert scores == sorted(scores, reverse=True)
    # --nbest translates lines whole, with our search (CTranslate2's n-best lists differ)
    one = runner.invoke(app, ["translate", "-m", str(run_dir), "--beam-size", "3", "--no-split", "--engine", "torch"],
                        input="\n".join(sentences[:4]) + "\n")
    assert one.stdout.splitlines() == [rows[3 * k].rsplit("\t", 1)[0] for k in range(4)]


def test_nbest_larger_than_beam_is_a_one_line_error(run_dir):
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "--beam-size", "2", "--nbest", "3"], input="hola\n")
    assert r.exit_code != 0
    assert r.stderr.strip() == "error: --nbest 3 is larger than the beam size 2; raise --beam-size"


def test_alignment_and_attention_plots(run_dir, sentences, tmp_path):
    tr = Translator.load(run_dir, "cpu", {"beam_size": 1})
    plots = tmp_path / "plots"
    opts = OutputOptions(alignment=True, attention_plots=plots)
    rows = list(translate_stream(tr, sentences[:3], opts))
    ids = tr.encode(sentences[:3])
    hyps = tr.translate_hypotheses(sentences[:3])
    for row, src_ids, h in zip(rows, ids, hyps):
        text, align = row.split("\t")
        pairs = [tuple(map(int, p.split("-"))) for p in align.split()]
        assert [j for _, j in pairs] == list(range(len(h[0].tokens)))
        assert all(0 <= i < len(src_ids) - 1 for i, _ in pairs)
    pngs = sorted(p.name for p in plots.iterdir())
    assert pngs == ["000001.png", "000002.png", "000003.png"]
    assert all((plots / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


def test_sampling_from_the_cli_is_reproducible(run_dir, sentences):
    args = ["translate", "-m", str(run_dir), "--sampling", "--top-k", "10", "--seed", "3"]
    text = "\n".join(sentences[:5]) + "\n"
    a, b = runner.invoke(app, args, input=text), runner.invoke(app, args, input=text)
    assert a.exit_code == 0, a.output
    assert a.stdout == b.stdout and len(a.stdout.splitlines()) == 5


def test_output_directory_missing_is_a_one_line_error(run_dir, tmp_path):
    out = tmp_path / "no" / "such" / "out.txt"
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-o", str(out)], input="hola\n")
    assert r.exit_code != 0
    assert r.stderr.strip() == f"error: {out}: output directory {out.parent} does not exist"
    assert not out.parent.exists()


class Recorder:
    """Stands in for a tqdm bar: records each update and whether it was closed."""

    instances: ClassVar[list["Recorder"]] = []

    def __init__(self, *args, **kwargs):
        self.updates: list[int] = []
        self.closed = False
        Recorder.instances.append(self)

    def update(self, n: int = 1) -> None:
        self.updates.append(n)

    def close(self) -> None:
        self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class CountingEncoder:
    """A SentencePiece processor that records each encode call: the number of lines of a list,
    or the line itself."""

    def __init__(self, sp):
        self.sp, self.calls = sp, []

    def __getattr__(self, name):
        return getattr(self.sp, name)

    def encode(self, lines, **kwargs):
        self.calls.append(lines if isinstance(lines, str) else len(lines))
        return self.sp.encode(lines, **kwargs)


def test_each_chunk_is_encoded_once(run_dir, sentences, monkeypatch):
    import seq2seq_cli.decode.translate as translate_module

    tr = Translator.load(run_dir, "cpu", {"beam_size": 1})
    tr.src_sp = counting = CountingEncoder(tr.src_sp)
    monkeypatch.setattr(translate_module, "FEW_LINES", 2)  # chunks of 2 lines or more: one call each
    rows = list(translate_stream(tr, sentences[:10], OutputOptions(), chunk_lines=4))
    assert len(rows) == 10
    assert counting.calls == [4, 4, 2]  # one call per chunk, each chunk once
    # fewer lines than FEW_LINES: one call per line (SentencePiece starts a pool of threads per list)
    counting.calls.clear()
    list(translate_stream(tr, sentences[:10], OutputOptions(), chunk_lines=1))
    assert counting.calls == sentences[:10]


def test_progress_advances_per_decoded_batch(run_dir, sentences):
    tr = Translator.load(run_dir, "cpu", {"beam_size": 1, "batch_tokens": 40})
    lines = sentences[:12]
    lines[3] = ""
    bar = Recorder()
    rows = list(translate_stream(tr, lines, OutputOptions(), chunk_lines=10000, progress=bar))
    assert len(rows) == 12
    assert sum(bar.updates) == 12
    assert len(bar.updates) > 3 and max(bar.updates) < 11  # many batches in one chunk, each counted as decoded


@pytest.mark.parametrize("to_stdout", [True, False])
def test_the_progress_bar_is_closed(run_dir, sentences, tmp_path, monkeypatch, to_stdout):
    import seq2seq_cli.documents.text as textfile_module

    Recorder.instances.clear()
    monkeypatch.setattr(textfile_module, "tqdm", Recorder)
    src = tmp_path / "in.es"
    src.write_text("\n".join(sentences[:3]) + "\n", encoding="utf-8")
    out = "-" if to_stdout else str(tmp_path / "out.en")
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "-o", out, "--beam-size", "1", "--no-split"])
    assert r.exit_code == 0, r.output
    (bar,) = Recorder.instances
    assert bar.closed and sum(bar.updates) == 3


def test_int8_translation_from_the_cli_and_the_run_config(run_dir, sentences, tmp_path):
    src = tmp_path / "in.es"
    src.write_text("\n".join(sentences[:8]) + "\n", encoding="utf-8")
    outs = {}
    for q in ("none", "int8"):
        outs[q] = tmp_path / f"out.{q}"
        r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "-o", str(outs[q]), "--no-progress",
                                "--quantize", q, "--device", "cpu", "--engine", "torch"])
        assert r.exit_code == 0, r.output
    assert len(outs["int8"].read_text(encoding="utf-8").splitlines()) == 8
    plain, quant = Translator.load(run_dir, "cpu"), Translator.load(run_dir, "cpu", {"quantize": "int8"})
    assert quant.decode.quantize == "int8"
    assert any(type(m).__name__ == "Int8Linear" for m in quant.model.modules())
    assert not any(type(m).__name__ == "Int8Linear" for m in plain.model.modules())
    want = translate_sentences(quant.translate, sentences[:8], Splitter("es"))
    assert outs["int8"].read_text(encoding="utf-8").splitlines() == want


def test_bf16_decoding_from_the_cli_follows_float32(run_dir, sentences, tmp_path):
    import torch

    src = tmp_path / "in.es"
    src.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    out = tmp_path / "out.en"
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "-o", str(out), "--no-progress",
                            "--precision", "bf16", "--device", "cpu", "--engine", "torch"])
    assert r.exit_code == 0, r.output
    fp32, bf16 = Translator.load(run_dir, "cpu"), Translator.load(run_dir, "cpu", {"precision": "bf16"})
    assert {p.dtype for p in fp32.model.parameters()} == {torch.float32}  # auto on CPU
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
    assert out.read_text(encoding="utf-8").splitlines() == translate_sentences(bf16.translate, sentences, Splitter("es"))
    plain, low = fp32.translate_hypotheses(sentences), bf16.translate_hypotheses(sentences)
    same = [a[0].tokens == b[0].tokens for a, b in zip(plain, low)]
    assert sum(same) >= 0.75 * len(same)  # bf16 rounding may flip near ties, not the bulk
    close = [abs(a[0].score - b[0].score) for a, b, s in zip(plain, low, same) if s]
    assert max(close) < 0.1


def test_batches_decoded_side_by_side_on_cpu_threads_equal_one_at_a_time(run_dir, sentences, monkeypatch):
    import torch

    import seq2seq_cli.decode.threads as threads_module

    tr = Translator.load(run_dir, "cpu", {"beam_size": 3, "batch_tokens": 48, "shortlist": False})  # batches of their own
    pools = []
    real_pool = threads_module.ThreadPoolExecutor

    def counting_pool(*args, **kwargs):
        pools.append(args[0])
        return real_pool(*args, **kwargs)

    monkeypatch.setattr(threads_module, "ThreadPoolExecutor", counting_pool)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        side_by_side = tr.translate_hypotheses(sentences)
        assert pools == [2] and torch.get_num_threads() == 2  # the intra-op threads are given back
        torch.set_num_threads(1)
        one_at_a_time = tr.translate_hypotheses(sentences)
        assert pools == [2]
    finally:
        torch.set_num_threads(threads)
    assert [[h.tokens for h in hs] for hs in side_by_side] == [[h.tokens for h in hs] for hs in one_at_a_time]
    assert [hs[0].score for hs in side_by_side] == pytest.approx([hs[0].score for hs in one_at_a_time], abs=1e-4)


def test_on_cpu_threads_each_decode_a_batch_of_their_own_and_a_lone_sentence_one_thread(run_dir, sentences, monkeypatch):
    """With 2 threads, 5 sentences that fit one batch are cut in two, decoded side by side with one
    thread each; a lone sentence (a request to serve, a line at stdin) decodes on one thread; the
    threads are given back and the results equal those of one thread."""
    import torch

    import seq2seq_cli.decode.search as search_module  # the translator imports its search when it decodes

    tr = Translator.load(run_dir, "cpu", {"beam_size": 4, "shortlist": False})  # batches of their own
    seen: list[tuple[int, int]] = []
    real_search = search_module.search

    def recording(model, src, *args, **kwargs):
        seen.append((src.size(0), torch.get_num_threads()))
        return real_search(model, src, *args, **kwargs)

    monkeypatch.setattr(search_module, "search", recording)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        alone = tr.translate_hypotheses(sentences[:1])
        assert seen == [(1, 1)] and torch.get_num_threads() == 2
        five = tr.translate_hypotheses(sentences[:5])
        assert sorted(seen[1:]) == [(2, 1), (3, 1)] and torch.get_num_threads() == 2
        torch.set_num_threads(1)
        one = tr.translate_hypotheses(sentences[:5])
        assert seen[3:] == [(5, 1)]
    finally:
        torch.set_num_threads(threads)
    assert [[h.tokens for h in hs] for hs in five] == [[h.tokens for h in hs] for hs in one]
    assert alone[0][0].tokens == one[0][0].tokens


def test_spread_cuts_the_largest_batch_until_each_thread_has_one():
    from seq2seq_cli.decode.threads import spread

    assert spread([[0, 1, 2, 3, 4]], 2) == [[0, 1], [2, 3, 4]]
    assert spread([[0], [1, 2, 3, 4]], 4) == [[0], [1], [2], [3, 4]]
    assert spread([[0]], 2) == [[0]]
    assert spread([[0, 1], [2, 3]], 2) == [[0, 1], [2, 3]]
    assert spread([], 2) == []


def test_blank_lines_alone_on_several_threads(run_dir):
    """A chunk of blank lines only leaves no batch to decode: nothing is decoded, whatever the threads."""
    import torch

    tr = Translator.load(run_dir, "cpu", {"beam_size": 2})
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert tr.translate(["", " "]) == ["", ""]
    finally:
        torch.set_num_threads(threads)
