"""The lexical shortlist (`--shortlist`): built from the training pairs by the Dice score, written
in CTranslate2's vocabulary-map format and read back, and decoding that scores only its
candidates: with every id listed the search is unchanged, with fewer it produces only them,
CTranslate2 with the run's shortlist as its vocabulary map answers as our search does, and a
run without one is refused in one line."""

import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from conftest import SHIPPED, random_sources, tiny_model
from helpers import documented_errors
from seq2seq_cli.cli import app
from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.data import shortlist as sl
from seq2seq_cli.decode.onednn import for_decoding
from seq2seq_cli.decode.search import beam_search, greedy_search
from seq2seq_cli.decode.translate import Translator, shortlisted
from seq2seq_cli.errors import UserError
from seq2seq_cli.ids import EOS, UNK

PIECES = ["<pad>", "<unk>", "<s>", "</s>"] + [f"p{i}" for i in range(4, 23)]
IDS = {p: i for i, p in enumerate(PIECES)}


def test_build_ranks_targets_by_dice_and_lists_the_commonest_always():
    # source 10 comes with target 20 in all 4 pairs, with 21 in 2 of them; 21 is also in 4 other pairs
    pairs = [([10], [20, 21]), ([10], [20, 21]), ([10], [20]), ([10], [20])] + [([11], [21])] * 4
    built = sl.build(pairs, 23, 23, best=1, frequent=1)
    # Dice(10, 20) = 2*4/(4+4) = 1; Dice(10, 21) = 2*2/(4+6) = 0.4; Dice(11, 21) = 2*4/(4+6) = 0.8
    assert built.candidates(torch.tensor([10])).tolist() == sorted({UNK, EOS, 21, 20})  # 21: the commonest target
    listed = sl.build(pairs, 23, 23, best=1, frequent=0)
    assert listed.candidates(torch.tensor([10])).tolist() == [UNK, EOS, 20]
    assert listed.candidates(torch.tensor([11])).tolist() == [UNK, EOS, 21]
    assert listed.candidates(torch.tensor([[10, 11], [12, 0]])).tolist() == [UNK, EOS, 20, 21]
    both = sl.build(pairs, 23, 23, best=2, frequent=0)
    order = both.targets[both.offsets[10]:both.offsets[11]].tolist()
    assert order == [20, 21]  # best first


def test_build_counts_pairs_in_chunks_as_in_one(monkeypatch):
    g = torch.Generator().manual_seed(0)
    pairs = [(torch.randint(4, 23, (5,), generator=g).tolist(), torch.randint(4, 23, (6,), generator=g).tolist())
             for _ in range(60)]
    whole = sl.build(pairs, 23, 23, best=3, frequent=2)
    monkeypatch.setattr(sl, "CHUNK", 7)
    chunked = sl.build(pairs, 23, 23, best=3, frequent=2)
    assert torch.equal(whole.offsets, chunked.offsets) and torch.equal(whole.always, chunked.always)
    for s in range(23):
        assert set(whole.targets[whole.offsets[s]:whole.offsets[s + 1]].tolist()) == set(
            chunked.targets[chunked.offsets[s]:chunked.offsets[s + 1]].tolist())


def test_write_then_read_gives_the_same_candidates(tmp_path):
    g = torch.Generator().manual_seed(1)
    pairs = [(torch.randint(4, 23, (4,), generator=g).tolist(), torch.randint(4, 23, (4,), generator=g).tolist())
             for _ in range(40)]
    built = sl.build(pairs, 23, 23, best=4, frequent=3)
    sl.write(built, tmp_path / "shortlist.tsv", PIECES, PIECES)
    first = (tmp_path / "shortlist.tsv").read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("\t")  # the always-candidates: CTranslate2's empty key
    back = sl.read(tmp_path / "shortlist.tsv", IDS, IDS)
    for s in range(4, 23):
        assert back.candidates(torch.tensor([s])).tolist() == built.candidates(torch.tensor([s])).tolist()


@pytest.mark.parametrize("text, where, says", [
    ("\tp5\np7 p8\n", "line 2", "expected a source subword, a tab and target subwords"),
    ("\tp5\np7\tp8 nope\n", "line 2", "'nope' is not in the run's target vocabulary"),
    ("\tp5\n\nzz\tp8\n", "line 3", "'zz' is not in the run's source vocabulary"),
])
def test_a_bad_shortlist_file_is_one_line_naming_file_and_line(tmp_path, text, where, says):
    path = tmp_path / "shortlist.tsv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(UserError) as err:
        sl.read(path, IDS, IDS)
    assert str(err.value) == f"{path}, {where}: {says}"


def _listing(ids: list[int]) -> sl.Shortlist:
    """A shortlist giving every source id the target ids `ids` (EOS and UNK always)."""
    offsets = torch.arange(24, dtype=torch.int64) * len(ids)
    return sl.Shortlist(offsets, torch.tensor(ids * 23, dtype=torch.int64), torch.tensor([UNK, EOS]))


def opts(beam: int) -> DecodeConfig:
    return DecodeConfig(beam_size=beam, max_len_a=1.5, max_len_b=4)


@pytest.mark.parametrize("packed", [False, True])
def test_a_shortlist_of_every_id_changes_nothing(packed):
    model = tiny_model(seed=2)
    model = for_decoding(model) if packed else model
    listed = shortlisted(model, _listing(list(range(23))))
    src = random_sources(6)
    for full, short in ((greedy_search(model, src, opts(1)), greedy_search(listed, src, opts(1))),
                        (beam_search(model, src, opts(3), nbest=2), beam_search(listed, src, opts(3), nbest=2))):
        for a, b in zip(full, short):
            for x, y in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b]):
                assert x.tokens == y.tokens
                assert math.isclose(x.score, y.score, rel_tol=1e-5, abs_tol=1e-5)


def test_a_shortlist_limits_outputs_to_its_candidates_and_renormalises():
    model = tiny_model(seed=4)
    allowed = [5, 9, 14]
    listed = shortlisted(model, _listing(allowed))
    src = random_sources(8)
    hyps = greedy_search(listed, src, DecodeConfig(beam_size=1, max_len_a=2.0, max_len_b=6))
    assert all(set(h.tokens) <= set(allowed) for h in hyps)
    assert any(h.tokens for h in hyps)
    # the log-probability of the first greedy token is a softmax over the candidates alone
    first = src[:1]
    memory, mask, _ = model.encode(first)
    state = model.init_state(memory, mask)
    h, _ = model.decode(torch.full((1, 1), model.cfg.decoder_start_id), state, incremental=True)
    logits = model.logits(h[:, -1])[0]
    cand = torch.tensor(sorted([UNK, EOS] + allowed))
    sub = torch.log_softmax(logits[cand], dim=-1)
    one = greedy_search(listed, first, DecodeConfig(beam_size=1, max_len_a=0.0, max_len_b=0))[0]
    token = one.tokens[0] if one.tokens else EOS  # EOS, or one token ended at the limit
    assert len(one.tokens) <= 1 and one.eos == (not one.tokens)
    assert math.isclose(one.log_prob, sub[cand.tolist().index(token)].item(), rel_tol=1e-4, abs_tol=1e-4)


@pytest.fixture(scope="module")
def run_dir(tiny_run) -> Path:
    """A tiny model trained for a few dozen steps on the shipped validation split (shared, read only)."""
    return tiny_run


def test_train_writes_the_runs_shortlist(run_dir):
    path = run_dir / "shortlist.tsv"
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("\t") and "</s>" in lines[0].split()
    translator = Translator.load(run_dir, "cpu", {"shortlist": True})
    src_ids = {translator.src_sp.id_to_piece(i): i for i in range(translator.src_sp.get_piece_size())}
    key, _, targets = lines[1].partition("\t")
    assert key in src_ids and 0 < len(targets.split()) <= sl.BEST


def test_translate_with_shortlist_and_a_prefix_off_it(run_dir, tmp_path):
    src = tmp_path / "in.es"
    src.write_text("\n".join((SHIPPED / "test.es").read_text(encoding="utf-8").splitlines()[:5]) + "\n", encoding="utf-8")
    runner = CliRunner()
    out = tmp_path / "out.en"
    result = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "-o", str(out), "--shortlist"])
    assert result.exit_code == 0, result.output
    assert len(out.read_text(encoding="utf-8").splitlines()) == 5
    # a prefix token the shortlist does not list is still produced: lines with prefixes search the whole vocabulary
    translator = Translator.load(run_dir, "cpu", {"shortlist": True})
    listed = translator.listed
    ids = translator.encode(["Dios"])
    cand = set(listed.candidates(torch.tensor(ids))[0].tolist())
    off = next(i for i in range(4, translator.tgt_sp.get_piece_size()) if i not in cand)
    hyps = translator.translate_hypotheses(["Dios"], ids=ids, prefixes=[[off]])
    assert hyps[0][0].tokens[0] == off


# The rows of docs/errors.md, section "Shortlists": {case: the run's shortlist.tsv (None: none)}
SHORTLIST_CASES = {"shortlist-missing": None, "shortlist-ensemble": "keep",
                   "shortlist-no-tab": "\t</s>\n▁the ▁of\n", "shortlist-unknown-target": "\t</s>\n▁de\t▁of zzz\n",
                   "shortlist-unknown-source": "\t</s>\nzzz\t▁of\n"}


def test_shortlist_errors_are_documented():
    assert set(documented_errors("Shortlists")) == set(SHORTLIST_CASES)


@pytest.mark.parametrize("case", sorted(SHORTLIST_CASES))
def test_shortlist_errors_are_one_line(run_dir, tmp_path, case):
    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    for item in run_dir.iterdir():  # the run, its shortlist replaced
        if item.name != "shortlist.tsv":
            (run / item.name).symlink_to(item)
    content = SHORTLIST_CASES[case]
    if content == "keep":
        (run / "shortlist.tsv").symlink_to(run_dir / "shortlist.tsv")
    elif content is not None:
        (run / "shortlist.tsv").write_text(content, encoding="utf-8")
    models = ["-m", str(run)] * (2 if case == "shortlist-ensemble" else 1)
    r = CliRunner().invoke(app, ["translate", *models, "-i", "-", "--shortlist"], input="Hola.\n")
    assert r.exit_code == 1
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1
    assert r.output.strip().replace(str(run), "runs/x") == documented_errors("Shortlists")[case]


def test_ctranslate2_with_the_shortlist_answers_as_our_search(run_dir):
    pytest.importorskip("ctranslate2")
    from seq2seq_cli.decode.ctranslate2_engine import with_ctranslate2

    threads = torch.get_num_threads()
    try:
        ours = Translator.load(run_dir, "cpu", {"shortlist": True, "beam_size": 4})
        engine = with_ctranslate2(ours, run_dir)
        assert engine.engine.use_vmap
        decoded = []
        inner = engine.engine.translator

        class Counting:
            def translate_batch(self, source, **kwargs):
                assert kwargs["use_vmap"] is True
                decoded.extend(source)
                return inner.translate_batch(source, **kwargs)

        engine.engine.translator = Counting()
        lines = (SHIPPED / "test.es").read_text(encoding="utf-8").splitlines()[:20]
        assert engine.translate(lines) == ours.translate(lines)
        assert len(decoded) == 20  # every line went to CTranslate2
    finally:
        torch.set_num_threads(threads)


def test_export_ships_the_shortlist_as_ctranslate2s_vocabulary_map(run_dir, tmp_path):
    pytest.importorskip("ctranslate2")
    from seq2seq_cli.convert.export import export_ctranslate2

    out = export_ctranslate2(run_dir, tmp_path / "ct2")
    assert (out / "vmap.txt").read_bytes() == (run_dir / "shortlist.tsv").read_bytes()
