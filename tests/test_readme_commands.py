"""The docs and the CLI cannot drift apart: every `seq2seq ...` line in a code block of the README
and of docs/*.md parses against the CLI (options, their values, the number of arguments), the
README's command list names every command, and its quick-start block is what
scripts/quickstart.sh runs. (CI also runs the script itself.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer

from seq2seq_cli.cli import app

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
PAGES = {"README.md": README} | {f"docs/{p.name}": p.read_text(encoding="utf-8") for p in sorted((REPO / "docs").glob("*.md"))}


def code_blocks(text: str) -> list[str]:
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)


def quick_start_block() -> str:
    section = README.split("## Quick start", 1)[1]
    return next(b for b in code_blocks(section) if "seq2seq tokenize" in b)


def command_list_block() -> str:
    return code_blocks(README)[0]


def as_written(line: str) -> list[str]:
    """A documented line as a user would type it: its comment dropped, optional `[...]` parts left
    out, the first of `a|b` alternatives taken, what follows a shell operator (`&`, `>`) left out;
    '-' (stdin) kept."""
    line = line.split(" #", 1)[0]
    line = re.sub(r"\[[^\]]*\]", "", line)
    words = []
    for word in shlex.split(line):
        if word in ("|", "&", "&&", ";", ">", ">>"):  # `--config X | --model Y`: the first form; `serve ... &`
            break
        words.append(word if word == "-" or "|" not in word else word.split("|", 1)[0])
    return words


# typer carries its own click: its errors share typer's base class, UsageError is BadParameter's parent
UsageError = typer.BadParameter.__mro__[1]


def parse(words: list[str]) -> typer.Context:
    """Parse one command line against the CLI without running it -> the subcommand's context
    (click raises UsageError/BadParameter on an unknown option, a bad value or a missing argument)."""
    assert words[0] == "seq2seq", words
    group = typer.main.get_command(app)
    ctx = group.make_context("seq2seq", words[1:], resilient_parsing=False)
    name, command, rest = group.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
    assert command is not None, words
    return command.make_context(name or "", rest, parent=ctx)


def seq2seq_lines(block: str) -> list[str]:
    lines = re.sub(r"\\\n\s*", " ", block).splitlines()  # a command continued with a backslash is one line
    return [line.strip() for line in lines if line.strip().startswith("seq2seq ")] + [
        "seq2seq " + line.split("| seq2seq ", 1)[1].strip() for line in lines if "| seq2seq " in line]


def documented_lines() -> list[tuple[str, str]]:
    """(page, line) for every `seq2seq ...` line in a code block of the README and of docs/*.md."""
    return [(page, line) for page, text in PAGES.items() for block in code_blocks(text) for line in seq2seq_lines(block)]


@pytest.mark.parametrize(("page", "line"), documented_lines())
def test_each_documented_command_parses(page, line):
    ctx = parse(as_written(line))
    assert ctx.command.name == as_written(line)[1], page


def test_the_command_list_and_the_quick_start_are_checked():
    checked = {line for _, line in documented_lines()}
    assert set(seq2seq_lines(command_list_block())) <= checked and set(seq2seq_lines(quick_start_block())) <= checked


def test_the_check_catches_a_drifted_command():
    for line in ("seq2seq translate --model runs/x --beam 5", "seq2seq evalute --hyp a --ref b",
                 "seq2seq export --model runs/x --format hf", "seq2seq average --model runs/x --last five"):
        with pytest.raises(UsageError):
            parse(as_written(line))


def test_the_readme_lists_every_command():
    group = typer.main.get_command(app)
    listed = {as_written(line)[1] for line in seq2seq_lines(command_list_block())}
    assert listed == set(group.commands), set(group.commands) ^ listed  # type: ignore[attr-defined]


def test_the_quick_start_block_is_what_the_script_runs():
    script = (REPO / "scripts" / "quickstart.sh").read_text(encoding="utf-8")
    ran = [line.replace('"$CONFIG"', "configs/quickstart.yaml").replace('"$RUN"', "runs/quickstart")
               .replace('"$RUN', "runs/quickstart").replace('.en"', ".en")
               .replace(' ${SET[@]+"${SET[@]}"}', "")
           for line in script.splitlines() if "seq2seq " in line and not line.startswith("#")]
    written = [line.split("   #", 1)[0].rstrip() for line in quick_start_block().splitlines() if "seq2seq " in line]
    assert [re.sub(r"\s+", " ", x) for x in ran] == [re.sub(r"\s+", " ", x) for x in written]


def test_the_readme_average_command_works_on_a_run_of_the_shipped_configs(short_run, tmp_path):
    """`seq2seq average ... --last N` as the README shows it: N step checkpoints are kept by every
    shipped config, and the command averages a run trained as the quick start's short CI run
    (two validations) when given that run."""
    import shutil

    import yaml
    from typer.testing import CliRunner

    (line,) = [line for line in command_list_block().splitlines() if line.startswith("seq2seq average")]
    words = as_written(line)
    last = int(parse(words).params["last"])
    for config in sorted((REPO / "configs").glob("*.yaml")):
        keep = yaml.safe_load(config.read_text(encoding="utf-8"))["train"]["keep_last"]
        assert last <= keep, f"{config.name} keeps {keep} step checkpoints; the README averages {last}"
    run = Path(shutil.copytree(short_run, tmp_path / "run"))  # 4 updates, as CI's quick start: two saves
    words[words.index("--model") + 1] = str(run)
    result = CliRunner().invoke(app, words[1:])
    assert result.exit_code == 0, result.output
    assert (run / "checkpoints" / f"average-last-{last}.safetensors").is_file()
