"""A sentence's output does not depend on the sentences decoded beside it: decoded alone, in a
batch of others, or beside lines with forced prefixes, with the whole vocabulary (the default) or
the run's shortlist (`--shortlist`: each sentence scores its own candidates), by our searches and
by CTranslate2."""

import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from conftest import SHIPPED
from seq2seq_cli.cli import app
from seq2seq_cli.data.shortlist import Shortlist
from seq2seq_cli.decode.loading import load_translator
from seq2seq_cli.decode.translate import Translator
from seq2seq_cli.ids import EOS, PAD, UNK

LINES = (SHIPPED / "valid.es").read_text(encoding="utf-8").splitlines()[:40]

pytestmark = pytest.mark.usefixtures("torch_threads")  # torch gets its threads back after each test


@pytest.fixture
def run_dir(small_run, tmp_path) -> Path:
    """A copy of the small run whose shortlist is cut to 3 targets per source subword and 12
    always-candidates: narrow enough that candidates taken from other sentences change outputs."""
    copy = tmp_path / "run"
    shutil.copytree(small_run, copy, ignore=shutil.ignore_patterns("ctranslate2", "cache", "tensorboard", "*.state.pt"))
    lines = (copy / "shortlist.tsv").read_text(encoding="utf-8").splitlines()[:-1]
    always = ["</s>", *[p for p in lines[0].split("\t")[1].split() if p != "</s>"][:11]]
    kept = ["\t" + " ".join(always)] + [k + "\t" + " ".join(v.split()[:3]) for k, v in (line.split("\t") for line in lines[1:])]
    (copy / "shortlist.tsv").write_text("\n".join(kept + [f"<shortlist-end:lines={len(kept)}>\t</s>"]) + "\n",
                                        encoding="utf-8")
    return copy


def test_each_sentence_of_a_batch_gets_only_its_own_candidates():
    # source 1 lists target 10, source 2 lists target 11; 20 is always a candidate
    listed = Shortlist(torch.tensor([0, 0, 1, 2]), torch.tensor([10, 11]), torch.tensor(sorted({EOS, UNK, 20})))
    vocab, allowed = listed.per_sentence(torch.tensor([[1, 1, EOS], [2, PAD, PAD]]))
    assert vocab.tolist() == sorted({EOS, UNK, 20, 10, 11})
    own = [{vocab[j].item() for j in row.nonzero().flatten().tolist()} for row in allowed]
    assert own == [{EOS, UNK, 20, 10}, {EOS, UNK, 20, 11}]


def alone_and_together(translator: Translator, lines: list[str]) -> tuple[list[str], list[str]]:
    return [translator.translate([line])[0] for line in lines], translator.translate(lines)


@pytest.mark.parametrize("shortlist", [False, True], ids=["whole-vocabulary", "shortlist"])
def test_our_search_gives_a_sentence_the_same_output_alone_and_in_a_batch(run_dir, shortlist):
    translator = Translator.load(run_dir, "cpu", {"shortlist": shortlist, "beam_size": 4})
    assert (translator.listed is not None) == shortlist
    alone, together = alone_and_together(translator, LINES)
    assert together == alone


@pytest.mark.parametrize("flags", [[], ["--shortlist"]], ids=["whole-vocabulary", "shortlist"])
def test_the_default_engine_gives_a_sentence_the_same_output_alone_and_in_a_batch(run_dir, tmp_path, flags):
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed")
    src, out = tmp_path / "in.es", tmp_path / "out.en"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    r = CliRunner().invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "-o", str(out), "--no-split",
                                 "--no-progress", *flags])
    assert r.exit_code == 0, r.output
    together = out.read_text(encoding="utf-8").splitlines()
    r = CliRunner().invoke(app, ["translate", "-m", str(run_dir), "--no-split", "--no-progress", *flags],
                           input=LINES[0] + "\n")  # one line alone, as a whole command
    assert r.exit_code == 0 and r.stdout == together[0] + "\n", r.output
    choice = load_translator([run_dir], "cpu", {"shortlist": bool(flags)})  # the same engine and settings, in process
    assert choice.translator.engine is not None
    assert [choice.translator.translate([line])[0] for line in LINES] == together


@pytest.mark.parametrize("engine", ["torch", "auto"])
def test_a_prefix_file_leaves_the_lines_without_a_prefix_as_they_were(run_dir, tmp_path, engine):
    if engine == "auto":
        pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed")
    lines = LINES
    src = tmp_path / "in.es"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def translate(*flags: str) -> list[str]:
        out = tmp_path / "out.en"
        r = CliRunner().invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "-o", str(out), "--no-split",
                                     "--no-progress", "--shortlist", "--engine", engine, *flags])
        assert r.exit_code == 0, r.output
        return out.read_text(encoding="utf-8").splitlines()

    plain = translate()
    empty = tmp_path / "empty.en"
    empty.write_text("\n" * len(lines), encoding="utf-8")
    assert translate("--prefix", str(empty)) == plain
    some = tmp_path / "some.en"
    some.write_text("".join("And God\n" if i % 3 == 0 else "\n" for i in range(len(lines))), encoding="utf-8")
    prefixed = translate("--prefix", str(some))
    assert all(prefixed[i].startswith("And God") for i in range(0, len(lines), 3))
    assert [p for i, p in enumerate(prefixed) if i % 3] == [p for i, p in enumerate(plain) if i % 3]
