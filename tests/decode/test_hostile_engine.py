"""A run's shortlist that is not whole (empty, cut to its first line, cut in half, a blank
line, no end of sentence among the always-candidates) is refused in one line naming the file
and line before any engine loads it: CTranslate2 crashed on such a file (exit 139) and our
search translated with it into empty or wrong outputs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import REPO, train_shipped_tiny
from seq2seq_cli.cli import app
from seq2seq_cli.data import shortlist as sl
from seq2seq_cli.errors import UserError

PIECES = ["<pad>", "<unk>", "<s>", "</s>"] + [f"p{i}" for i in range(4, 23)]
IDS = {p: i for i, p in enumerate(PIECES)}
WHOLE = "\t</s> <unk> p4\np5\tp6 p7\np8\tp9\n<shortlist-end:lines=3>\t</s>\n"
AGAIN = "; delete it and seq2seq train --resume writes it again"
# The rows of docs/errors.md, section "Damaged, hostile and cut-short input", about shortlists:
# {case: (how the whole file is changed, the message after the file's name)}
CASES = {
    "shortlist-file-empty": (lambda text: "", f": the shortlist is empty{AGAIN}"),
    "shortlist-file-first-line": (lambda text: text.splitlines(keepends=True)[0],
                                  f": cut short: no end line (<shortlist-end:lines=N>) after its 1 lines (or written "
                                  f"before shortlists had one){AGAIN}"),
    "shortlist-file-cut-mid-line": (lambda text: text[: len(text) // 2],
                                    f", line 3: cut short (the last line has no newline){AGAIN}"),
    "shortlist-file-end-count": (lambda text: text.replace("p8\tp9\n", ""),
                                 f", line 3: the end line says 3 lines come before it, but 2 do{AGAIN}"),
    "shortlist-file-blank-line": (lambda text: text.replace("p5", "\np5"),
                                  ", line 2: a blank line (CTranslate2 reads it as no always-candidates)"),
    "shortlist-file-no-eos": (lambda text: text.replace("\t</s> <unk>", "\t<unk>", 1),
                              ", line 1: expected the always-candidates first (a tab, then target subwords, the end of "
                              "sentence among them)"),
    "shortlist-file-no-targets": (lambda text: text.replace("p5\tp6 p7", "p5\t"),
                                  ", line 2: 'p5' has no target subwords after its tab"),
}


def test_a_whole_shortlist_is_read_and_its_end_line_written(tmp_path):
    path = tmp_path / "shortlist.tsv"
    path.write_text(WHOLE, encoding="utf-8")
    listed = sl.read(path, IDS, IDS)
    assert listed.candidates(sl.torch.tensor([5])).tolist() == [1, 3, 4, 6, 7]
    sl.write(listed, tmp_path / "again.tsv", PIECES, PIECES)
    lines = (tmp_path / "again.tsv").read_text(encoding="utf-8").splitlines()
    assert lines[-1] == f"<shortlist-end:lines={len(lines) - 1}>\t</s>"
    assert sl.read(tmp_path / "again.tsv", IDS, IDS).candidates(sl.torch.tensor([8])).tolist() == [1, 3, 4, 9]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_shortlist_that_is_not_whole_is_one_line_naming_file_and_line(tmp_path, case):
    change, says = CASES[case]
    path = tmp_path / "shortlist.tsv"
    path.write_text(change(WHOLE), encoding="utf-8")
    with pytest.raises(UserError) as err:
        sl.read(path, IDS, IDS)
    assert str(err.value) == f"{path}{says}"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return train_shipped_tiny(tmp_path_factory.mktemp("hostile-engine"), max_steps=2)


def copy_run(run_dir: Path, tmp: Path, shortlist: str) -> Path:
    run = tmp / "runs" / "x"
    run.mkdir(parents=True)
    for item in run_dir.iterdir():
        if item.name != "shortlist.tsv":
            (run / item.name).symlink_to(item)
    (run / "shortlist.tsv").write_text(shortlist, encoding="utf-8")
    return run


@pytest.mark.parametrize("cut", ["empty", "first-line", "half"])
def test_a_cut_shortlist_is_refused_before_either_engine_loads_it(run_dir, tmp_path, cut):
    text = (run_dir / "shortlist.tsv").read_text(encoding="utf-8")
    assert re.fullmatch(r"<shortlist-end:lines=\d+>\t</s>", text.splitlines()[-1])  # train writes the end line
    lines = text.splitlines(keepends=True)
    kept = {"empty": 0, "first-line": 1, "half": len(lines) // 2}[cut]
    run = copy_run(run_dir, tmp_path, "".join(lines[:kept]))
    path = run / "shortlist.tsv"
    says = (f"error: {path}: the shortlist is empty{AGAIN}" if not kept else
            f"error: {path}: cut short: no end line (<shortlist-end:lines=N>) after its {kept} lines (or written before "
            f"shortlists had one){AGAIN}")
    r = CliRunner().invoke(app, ["translate", "-m", str(run), "-i", "-", "--shortlist", "--engine", "torch"], input="Hola.\n")
    assert r.exit_code == 1 and r.output.strip() == says, r.output
    pytest.importorskip("ctranslate2")
    done = subprocess.run([sys.executable, "-m", "seq2seq_cli", "translate", "-m", str(run), "-i", "-", "--shortlist",
                           "--engine", "ctranslate2", "--device", "cpu"], input="Hola.\n", capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert done.returncode == 1, done.stderr  # CTranslate2 given an empty file: exit 139, a crash
    assert done.stderr.strip().splitlines() == [says]


def test_every_shortlist_case_is_documented():
    text = (REPO / "docs" / "errors.md").read_text(encoding="utf-8")
    section = text.split("## Damaged, hostile and cut-short input", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| (shortlist-file-[a-z0-9-]+) \| .* \| 1 \| `error: runs/x/shortlist.tsv([^`]+)` \|$",
                           section, re.MULTILINE))
    assert rows == {case: says for case, (_, says) in CASES.items()}
