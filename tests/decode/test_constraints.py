"""translate --constraints and --glossary: every phrase in every output (beam 1 and 5, n-best,
int8 and bf16), [] decodes exactly as without constraints, and bad files are one-line errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import seq2seq_cli.decode.constraints as constraints_module
from conftest import REPO, SHIPPED, random_sources, tiny_model
from seq2seq_cli.cli import app
from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.decode.constraints import constrained_beam_search, constrained_limits
from seq2seq_cli.decode.hypotheses import length_penalty
from seq2seq_cli.decode.search import beam_search
from seq2seq_cli.decode.steps import max_lengths
from seq2seq_cli.ids import BOS, EOS

runner = CliRunner()


@pytest.fixture(scope="module")
def run_dir(tiny_run) -> Path:
    """A tiny model trained for a few dozen steps on the shipped validation split (shared, read only)."""
    return tiny_run


@pytest.fixture(scope="module")
def pairs() -> list[tuple[str, list[str]]]:
    """Test sentences with one or two words of their reference as constraints (the longest
    word, and a capitalised one after the first word where there is one)."""
    src = (SHIPPED / "test.es").read_text(encoding="utf-8").splitlines()[:10]
    ref = (SHIPPED / "test.en").read_text(encoding="utf-8").splitlines()[:10]
    out = []
    for s, r in zip(src, ref):
        words = re.findall(r"[A-Za-z]+", r)
        terms = [max(words, key=len)]
        terms += [w for w in words[1:] if w[0].isupper() and w not in terms][:1]
        out.append((s, terms))
    return out


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def translate(run_dir: Path, tmp_path: Path, sources: list[str], *args: str) -> list[str]:
    """`translate` of `sources` with `args`; outputs limited to about the source's length (the
    tiny model rarely ends a sentence by itself)."""
    src = write(tmp_path / "in.es", sources)
    limit = ["--max-len-a", "0.8", "--max-len-b", "2"]
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "--no-progress", *limit, *args])
    assert r.exit_code == 0, r.output
    return r.stdout.splitlines()


# --- the search itself, on a random model ---------------------------------------------------


def _sharpened(seed: int = 0):
    model = tiny_model(seed=seed)
    with torch.no_grad():
        model.tgt_embed.tokens.weight.mul_(4.0)
    return model


def _holds(tokens: list[int], phrase: list[int]) -> bool:
    return any(tokens[i : i + len(phrase)] == phrase for i in range(len(tokens) - len(phrase) + 1))


CONSTRAINTS = [[[5, 6]], [], [[7], [8, 9, 10]], [[11]], [[12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 4, 5, 6]], []]


@pytest.mark.parametrize("beam", [1, 3, 5])
def test_every_hypothesis_holds_every_phrase_and_empty_lists_change_nothing(beam):
    """With the constrained beam as wide as the ordinary one, a sentence without phrases is
    decoded exactly as by beam search (translate sends such lines to beam search anyway)."""
    model, src = _sharpened(1), random_sources(n=6)
    opts = DecodeConfig(beam_size=beam, constraint_beam_size=beam, max_len_a=1.5, max_len_b=4)
    held = constrained_beam_search(model, src, opts, CONSTRAINTS, nbest=beam)
    plain = beam_search(model, src, opts, nbest=beam)
    for phrases, hyps, free in zip(CONSTRAINTS, held, plain):
        assert 1 <= len(hyps) <= beam  # a phrase as long as the limit leaves one output
        for h in hyps:
            assert all(_holds(h.tokens, p) for p in phrases), (phrases, h.tokens)
        if not phrases:
            assert [h.tokens for h in hyps] == [h.tokens for h in free]
            assert [h.score for h in hyps] == pytest.approx([h.score for h in free], abs=1e-5)


def _token_log_probs(model, src_row: torch.Tensor, tokens: list[int]) -> list[float]:
    """Log-probability of each of tokens + EOS under the model (full forward, no cache)."""
    lprobs = torch.log_softmax(model(src_row[None], torch.tensor([[BOS] + tokens]))[0], dim=-1)
    target = tokens + [EOS]
    return lprobs[torch.arange(len(target)), torch.tensor(target)].tolist()


@pytest.mark.parametrize("penalty", [("average", 1.0), ("gnmt", 0.6)])
def test_a_finished_hypothesis_is_scored_with_its_constraint_tokens_outside_the_length_penalty(penalty):
    """score = (log P - forced) / lp(length - forced tokens) + forced, where forced is the
    log-probability of the tokens that met a phrase: a forced token's cost is not divided by
    the length, so adding tokens after it does not dilute it."""
    kind, alpha = penalty
    model, src = _sharpened(4), random_sources(n=4)
    phrases = [[[5], [9]], [[7]], [[11], [12]], [[6]]]
    opts = DecodeConfig(beam_size=3, max_len_a=1.5, max_len_b=4, length_penalty=alpha, length_penalty_type=kind)
    checked = 0
    for row, ps, hyps in zip(src, phrases, constrained_beam_search(model, src, opts, phrases, nbest=3)):
        for h in hyps:
            lps = _token_log_probs(model, row, h.tokens)[: len(h.tokens) + h.eos]  # EOS where it ended with one
            forced_at = [h.tokens.index(p[0]) for p in ps]  # a one-token phrase is met where it first appears
            forced = sum(lps[i] for i in forced_at)
            assert h.log_prob == pytest.approx(sum(lps), abs=1e-4)
            free = length_penalty(len(h.tokens) + h.eos - len(ps), alpha, kind)
            assert h.score == pytest.approx((sum(lps) - forced) / free + forced, abs=1e-4)
            whole = sum(lps) / length_penalty(len(h.tokens) + h.eos, alpha, kind)
            checked += h.score != pytest.approx(whole, abs=1e-3)
    assert checked  # the two scores differ on these hypotheses


def test_constrained_lines_search_one_and_a_half_times_the_beam_unless_told(monkeypatch):
    rows: list[int] = []
    step = constraints_module.step_log_probs

    def spy(model, last, *args, **kwargs):
        rows.append(last.size(0))
        return step(model, last, *args, **kwargs)

    monkeypatch.setattr(constraints_module, "step_log_probs", spy)
    model, src = _sharpened(1), random_sources(n=3)
    phrases = [[[5, 6]], [[7]], [[8]]]
    for options, width in (({"beam_size": 3}, 5), ({"beam_size": 4}, 6), ({"beam_size": 3, "constraint_beam_size": 4}, 4),
                           ({"beam_size": 1}, 2)):
        rows.clear()
        hyps = constrained_beam_search(model, src, DecodeConfig(max_len_a=1.5, max_len_b=4, **options), phrases)
        assert max(rows) == 3 * width
        assert all(len(h) == 1 for h in hyps)


def test_with_word_starts_a_phrase_ends_a_word():
    model, src = _sharpened(2), random_sources(n=6)
    word_start = torch.ones(23, dtype=torch.bool)
    word_start[13:23] = False  # tokens 13..22 continue a word
    phrases = [[[5, 6]], [[7]], [[8, 9], [10]], [[11]], [[4]], [[12, 5]]]
    opts = DecodeConfig(beam_size=4, max_len_a=1.5, max_len_b=4)
    for ps, hyps in zip(phrases, constrained_beam_search(model, src, opts, phrases, 4, word_start)):
        for h in hyps:
            t = h.tokens + [3]  # EOS ends a word
            for p in ps:
                ends = [i + len(p) for i in range(len(t) - len(p)) if t[i : i + len(p)] == p]
                assert any(word_start[t[e]] for e in ends), (p, h.tokens)


def test_a_limit_too_short_for_the_constraints_is_raised_to_fit():
    model, src = tiny_model(seed=5), random_sources(n=6)
    opts = DecodeConfig(beam_size=3, max_len_a=0.0, max_len_b=2)
    totals = torch.tensor([sum(map(len, c)) for c in CONSTRAINTS])
    limits = constrained_limits(src, model, opts, totals)
    assert limits.tolist() == torch.maximum(max_lengths(src, model, 0.0, 2), totals).tolist()
    for phrases, hyps, limit in zip(CONSTRAINTS, constrained_beam_search(model, src, opts, CONSTRAINTS, 3), limits):
        for h in hyps:
            assert len(h.tokens) <= limit + (not h.eos) and all(_holds(h.tokens, p) for p in phrases)


# --- translate --constraints / --glossary ---------------------------------------------------


@pytest.mark.parametrize("beam", ["1", "5"])
def test_every_constraint_is_in_every_output(run_dir, pairs, tmp_path, beam):
    cons = write(tmp_path / "c.jsonl", [json.dumps(t) for _, t in pairs])
    out = translate(run_dir, tmp_path, [s for s, _ in pairs], "-b", beam, "--constraints", str(cons))
    assert len(out) == len(pairs)
    missing = [(t, o) for (_, terms), o in zip(pairs, out) for t in terms if t not in o]
    assert not missing


@pytest.mark.parametrize("extra", [["--quantize", "int8"], ["--precision", "bf16"]])
def test_constraints_hold_with_int8_and_bf16(run_dir, pairs, tmp_path, extra):
    cons = write(tmp_path / "c.jsonl", [json.dumps(t) for _, t in pairs[:6]])
    out = translate(run_dir, tmp_path, [s for s, _ in pairs[:6]], "-b", "4", "--constraints", str(cons), *extra)
    assert all(t in o for (_, terms), o in zip(pairs[:6], out) for t in terms)


def test_nbest_lines_each_hold_the_constraints(run_dir, pairs, tmp_path):
    cons = write(tmp_path / "c.jsonl", [json.dumps(t) for _, t in pairs[:6]])
    out = translate(run_dir, tmp_path, [s for s, _ in pairs[:6]], "-b", "4", "--nbest", "3", "--scores",
                    "--constraints", str(cons))
    assert len(out) == 18
    for k, (_, terms) in enumerate(pairs[:6]):
        rows = out[3 * k : 3 * k + 3]
        scores = [float(row.rsplit("\t", 1)[1]) for row in rows]
        assert scores == sorted(scores, reverse=True)
        assert all(t in row.rsplit("\t", 1)[0] for row in rows for t in terms)


def test_empty_lists_give_exactly_the_unconstrained_output(run_dir, pairs, tmp_path):
    """Over the whole vocabulary: a shortlist's candidates follow the lines batched together, and
    constrained lines are batched apart from the others."""
    sources = [s for s, _ in pairs]
    whole = ("--full-vocabulary", "--engine", "torch")
    plain = translate(run_dir, tmp_path, sources, "-b", "5", "--nbest", "2", "--scores", *whole)
    none = write(tmp_path / "none.jsonl", ["[]"] * len(pairs))
    assert translate(run_dir, tmp_path, sources, "-b", "5", "--nbest", "2", "--scores", "--constraints", str(none),
                     *whole) == plain
    mixed = write(tmp_path / "mixed.jsonl", [json.dumps(t) if i % 2 else "[]" for i, (_, t) in enumerate(pairs)])
    got = translate(run_dir, tmp_path, sources, "-b", "5", "--nbest", "2", "--scores", "--constraints", str(mixed), *whole)
    for i in range(0, len(pairs), 2):
        assert got[2 * i : 2 * i + 2] == plain[2 * i : 2 * i + 2]
    plain1 = translate(run_dir, tmp_path, sources, "-b", "1", *whole)
    assert translate(run_dir, tmp_path, sources, "-b", "1", "--constraints", str(none), *whole) == plain1


def test_glossary_terms_become_constraints(run_dir, pairs, tmp_path):
    sources = [s for s, _ in pairs[:8]]
    # a source word of the first line (whole word, same case) -> a target term
    word = re.findall(r"\w+", sources[0])[-1]
    gloss = write(tmp_path / "terms.tsv", [f"{word}\tJerusalem", "nonexistentword\tBabylon"])
    out = translate(run_dir, tmp_path, sources, "-b", "3", "--glossary", str(gloss))
    for s, o in zip(sources, out):
        assert ("Jerusalem" in o) or not re.search(rf"(?<!\w){re.escape(word)}(?!\w)", s)
    assert "Jerusalem" in out[0] and not any("Babylon" in o for o in out)
    # merged with --constraints
    cons = write(tmp_path / "c.jsonl", [json.dumps(t) for _, t in pairs[:8]])
    both = translate(run_dir, tmp_path, sources, "-b", "3", "--glossary", str(gloss), "--constraints", str(cons))
    assert "Jerusalem" in both[0] and all(t in o for (_, terms), o in zip(pairs[:8], both) for t in terms)


def test_a_byte_order_mark_is_skipped_in_constraint_and_glossary_files(run_dir, pairs, tmp_path):
    """An editor's BOM in front of the first line: the first list is read, the first term matches."""
    sources = [s for s, _ in pairs[:3]]
    cons = tmp_path / "bom.jsonl"
    cons.write_text("\ufeff" + "".join(json.dumps(t) + "\n" for _, t in pairs[:3]), encoding="utf-8")
    out = translate(run_dir, tmp_path, sources, "-b", "3", "--constraints", str(cons))
    assert all(t in o for (_, terms), o in zip(pairs[:3], out) for t in terms)
    word = re.findall(r"\w+", sources[0])[-1]
    gloss = tmp_path / "bom.tsv"
    gloss.write_text(f"\ufeff{word}\tJerusalem\n", encoding="utf-8")
    out = translate(run_dir, tmp_path, sources, "-b", "3", "--glossary", str(gloss))
    assert "Jerusalem" in out[0]


def test_phrases_and_terms_in_another_unicode_normal_form_match_as_the_input(run_dir, tmp_path):
    """A glossary term written decomposed (NFD) matches the composed input and the reverse; a
    decomposed constraint comes out composed, as the input is normalised."""
    import unicodedata

    nfd = unicodedata.normalize("NFD", "Moisés")
    assert nfd != "Moisés"
    gloss = write(tmp_path / "nfd.tsv", [f"{nfd}\tJerusalem"])
    out = translate(run_dir, tmp_path, ["Moisés dijo", unicodedata.normalize("NFD", "y Moisés dijo")], "-b", "3",
                    "--glossary", str(gloss))
    assert all("Jerusalem" in o for o in out)
    composed = write(tmp_path / "nfc.tsv", ["Moisés\tJerusalem"])
    out = translate(run_dir, tmp_path, [nfd + " dijo"], "-b", "3", "--glossary", str(composed))
    assert "Jerusalem" in out[0]
    cons = write(tmp_path / "nfd.jsonl", [json.dumps([unicodedata.normalize("NFD", "Jerusalén")], ensure_ascii=False)])
    (out,) = translate(run_dir, tmp_path, ["Moisés dijo"], "-b", "3", "--constraints", str(cons))
    assert "Jerusalén" in out and unicodedata.is_normalized("NFC", out)


def test_glossary_matches_whole_words_in_the_files_case():
    from seq2seq_cli.decode.terms import Glossary

    g = Glossary(Path("g.tsv"), {"Dios": ("God", 1), "rey de Israel": ("king of Israel", 2), "rey": ("king", 3)})
    assert g.matches("el rey de Israel y Dios") == ["rey de Israel", "Dios"]
    assert g.matches("dios, Diosa, reyes") == []
    assert g.matches("rey, rey; Dios.") == ["rey", "Dios"]


# --- bad files: one line, exit 1, no traceback ------------------------------------------------


def _case(tmp: Path, name: str, text: str, flag: str = "--constraints") -> list[str]:
    path = tmp / name
    path.write_text(text, encoding="utf-8")
    return [flag, str(path)]


ERROR_CASES = {
    "constraints-invalid-json": (
        lambda t: _case(t, "c.jsonl", '[]\n["Moses"\n'),
        ["c.jsonl:2: invalid JSON (Expecting ',' delimiter: line 1 column 9 (char 8)); expected a JSON list of target phrases"]),
    "constraints-not-a-list": (
        lambda t: _case(t, "c.jsonl", '[]\n{"Moses": 1}\n'),
        ['c.jsonl:2: expected a JSON list of target phrases (strings), got {"Moses": 1}']),
    "constraints-line-count": (
        lambda t: _case(t, "c.jsonl", "[]\n"),
        ["c.jsonl has 1 lines but", "in.es has 2; expected one JSON list of target phrases per input line"]),
    "constraints-empty-phrase": (
        lambda t: _case(t, "c.jsonl", '[]\n["Moses", " "]\n'),
        ["c.jsonl:2: target phrase ' ' tokenizes to nothing; give a phrase with text in it"]),
    "constraints-unknown-characters": (
        lambda t: _case(t, "c.jsonl", '[]\n["\u4e2d\u6587"]\n'),
        ["c.jsonl:2: target phrase '\u4e2d\u6587' holds characters the target vocabulary lacks (they would become <unk>)"]),
    "constraints-too-long": (
        lambda t: _case(t, "c.jsonl", "[]\n" + json.dumps([" ".join(["the"] * 300)]) + "\n"),
        ["in.es:2: the constraints of this line have 300 target tokens, more than the model's"]),
    "constraints-empty-line": (
        lambda t: _case(t, "c.jsonl", '[]\n["Moses"]\n'),
        ["c.jsonl:2: constraints for an empty input line, which is not translated; use []"]),
    "constraints-sampling": (
        lambda t: [*_case(t, "c.jsonl", '[]\n["Moses"]\n'), "--sampling"],
        ["--constraints and --glossary need beam search; leave out --sampling"]),
    "constraints-surrogate": (
        lambda t: _case(t, "c.jsonl", '[]\n["Moses", "\\ud800"]\n'),
        ["c.jsonl:2: target phrase 2 holds a lone surrogate (\\ud800), which is no character; "
         "expected text that UTF-8 can encode"]),
    "glossary-no-tab": (
        lambda t: _case(t, "terms.tsv", "Dios\tGod\nMoisés Moses\n", "--glossary"),
        ["terms.tsv:2: expected a source term, a TAB and a target term; found no TAB"]),
    "glossary-empty-target": (
        lambda t: _case(t, "terms.tsv", "Dios\tGod\nMoisés\t\n", "--glossary"),
        ["terms.tsv:2: target phrase '' tokenizes to nothing"]),
    "glossary-duplicate": (
        lambda t: _case(t, "terms.tsv", "Dios\tGod\nDios\tLord\n", "--glossary"),
        ["terms.tsv:2: source term 'Dios' is already on line 1; give each source term once"]),
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_bad_constraint_or_glossary_file_is_one_line(run_dir, tmp_path, case):
    make, fragments = ERROR_CASES[case]
    second = "" if case == "constraints-empty-line" else "Moisés y Dios"
    src = write(tmp_path / "in.es", ["Dios dijo", second])
    out = tmp_path / "out.en"
    out.write_text("earlier\n", encoding="utf-8")
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "-o", str(out), "--no-progress",
                            *make(tmp_path)])
    assert r.exit_code == 1, r.output
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert out.read_text(encoding="utf-8") == "earlier\n"  # nothing already written is lost


def test_every_constraint_case_is_documented():
    text = (REPO / "docs" / "errors.md").read_text(encoding="utf-8")
    section = text[text.index("## Constraints and glossaries") :]
    documented = set(re.findall(r"^\| ((?:constraints|glossary)-[a-z0-9-]+) \|", section, flags=re.MULTILINE))
    assert documented == set(ERROR_CASES) | {"constraints-and-prefix", "constraints-ensemble"}


@pytest.mark.parametrize("case", ["constraints-and-prefix", "constraints-ensemble"])
def test_constraints_with_a_prefix_on_one_line_or_with_an_ensemble_are_one_line(run_dir, tmp_path, case):
    src = write(tmp_path / "in.es", ["Dios dijo", "Moisés y Dios"])
    out = tmp_path / "out.en"
    out.write_text("earlier\n", encoding="utf-8")
    extra = _case(tmp_path, "c.jsonl", '[]\n["Moses"]\n')
    if case == "constraints-and-prefix":
        extra += _case(tmp_path, "p.txt", "\nThe\n", "--prefix")
        expected = "error: " + str(src) + ":2: a line has both constraints and a prefix; give it one or the other"
    else:
        extra += ["-m", str(run_dir)]
        expected = "error: --constraints and --glossary decode with one model; give one --model (-m)"
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "-i", str(src), "-o", str(out), "--no-progress", *extra])
    assert r.exit_code == 1, r.output
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines == [expected]
    assert out.read_text(encoding="utf-8") == "earlier\n"


def test_stdin_with_more_lines_than_the_constraint_file_is_one_line(run_dir, tmp_path):
    cons = write(tmp_path / "c.jsonl", ['["Moses"]', "[]"])
    r = runner.invoke(app, ["translate", "-m", str(run_dir), "--constraints", str(cons)], input="uno\ndos\ntres\n")
    assert r.exit_code == 1, r.output
    assert r.stderr.strip() == (f"error: stdin has more lines than {cons} (2); "
                                "expected one JSON list of target phrases per input line")
