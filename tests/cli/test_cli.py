"""The commands end to end through typer's CliRunner, their help, and their one-line errors."""

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from seq2seq_cli.cli import app

runner = CliRunner()


def invoke(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def _one_line_error(result, *fragments):
    assert result.exit_code != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    assert result.stderr.rstrip().endswith(errors[0])
    assert "Traceback" not in result.output + result.stderr
    for f in fragments:
        assert f in errors[0], errors[0]


def test_tokenize_train_translate_evaluate(tiny_config, corpus_dir, tmp_path):
    run = tmp_path / "run"
    r = invoke("tokenize", "--config", tiny_config)
    assert r.exit_code == 0, r.output
    assert (run / "spm.model").is_file()

    r = invoke("train", "--config", tiny_config, "--set", "train.max_steps=12", "--no-progress")
    assert r.exit_code == 0, r.output
    assert (run / "checkpoints" / "last.safetensors").is_file()
    assert (run / "checkpoints" / "best.safetensors").is_file()
    resolved = yaml.safe_load((run / "config.yaml").read_text())
    assert resolved["train"]["max_steps"] == 12
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("train_loss" in r for r in records) and any("valid_nll" in r for r in records)
    assert max(r["step"] for r in records) == 12

    src = corpus_dir / "test.es"
    lines = src.read_text().splitlines()[:5]
    lines.insert(2, "")  # an empty line stays an empty line, in place
    r = invoke("translate", "--model", run, "--beam-size", "3", input="\n".join(lines) + "\n")
    assert r.exit_code == 0, r.output
    out = r.stdout.splitlines()
    assert len(out) == len(lines) and out[2] == ""

    hyp = tmp_path / "hyp.txt"
    r = invoke("translate", "-m", run / "checkpoints" / "last.safetensors", "-i", src, "-o", hyp, "--no-progress")
    assert r.exit_code == 0, r.output
    assert len(hyp.read_text().splitlines()) == len(src.read_text().splitlines())

    r = invoke("evaluate", "--model", run, "--src", src, "--ref", corpus_dir / "test.en", "--beam-size", "1")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert "chrF2|" in r.stdout

    r = invoke("evaluate", "--hyp", hyp, "--ref", corpus_dir / "test.en", "--json")
    assert r.exit_code == 0, r.output
    scores = json.loads(r.stdout)
    assert set(scores) >= {"bleu", "chrf", "bleu_signature", "chrf_signature"}
    assert scores["sentences"] == 40


def test_resume_continues_from_last(tiny_config, tmp_path):
    run = tmp_path / "run"
    assert invoke("train", "-c", tiny_config, "--set", "train.max_steps=10", "--no-progress").exit_code == 0
    r = invoke("train", "-c", tiny_config, "--set", "train.max_steps=16", "--resume", "--no-progress")
    assert r.exit_code == 0, r.output
    assert "resumed from" in r.stderr and "at step 10" in r.stderr
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 16


def test_unknown_config_key_is_one_line_error(tiny_config):
    text = tiny_config.read_text().replace("max_steps: 20", "max_steps: 20\n  max_stepz: 5")
    tiny_config.write_text(text)
    r = invoke("train", "--config", tiny_config)
    _one_line_error(r, str(tiny_config), "unknown key 'train.max_stepz'", "max_steps")


def test_mismatched_corpus_is_one_line_error(tiny_config, corpus_dir):
    en = corpus_dir / "train.en"
    en.write_text("\n".join(en.read_text().splitlines()[:-3]) + "\n")
    r = invoke("train", "--config", tiny_config, "--no-progress")
    _one_line_error(r, f"{corpus_dir / 'train.es'} has 400 lines", f"{en} has 397")


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["train", "--config", "nope.yaml"], ["nope.yaml: config file not found"]),
        (["train", "--config", "configs/tiny.yaml", "--set", "oops"], ["expected KEY.PATH=VALUE"]),
        (["translate", "--model", "no/such/run"], ["no/such/run: model not found"]),
        (["evaluate", "--ref", "x.en"], ["give either --hyp FILE, or --model RUN with --src FILE"]),
    ],
)
def test_bad_invocations_are_one_line_errors(args, fragments, tmp_path, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    _one_line_error(invoke(*args), *fragments)


def test_translate_refuses_a_directory_that_is_not_a_run(tmp_path):
    _one_line_error(invoke("translate", "--model", tmp_path), str(tmp_path), "no checkpoints/best.safetensors")


def test_help_lists_commands_and_documents_options():
    r = invoke("--help")
    for command in ("tokenize", "train", "translate", "evaluate"):
        assert command in r.stdout
    r = invoke("translate", "--help")
    for option in ("--model", "--input", "--output", "--beam-size", "--length-penalty", "--max-len-a", "--max-len-b"):
        assert option in r.stdout


def _commands():
    import typer.main

    group = typer.main.get_command(app)
    return group, sorted(group.commands.items())  # type: ignore[attr-defined]


@pytest.mark.parametrize("width_from", ["terminal_width", "COLUMNS"])
def test_help_prints_every_option_name_whole_at_80_columns(width_from):
    _, commands = _commands()
    assert len(commands) == 11
    for name, command in commands:
        if width_from == "terminal_width":
            r = runner.invoke(app, [name, "--help"], terminal_width=80)
        else:
            r = runner.invoke(app, [name, "--help"], env={"COLUMNS": "80"})
        assert r.exit_code == 0, r.output
        assert max(len(line) for line in r.stdout.splitlines()) <= 80, r.stdout
        words = set(r.stdout.replace(",", " ").split())
        for param in command.params:
            for opt in [*param.opts, *param.secondary_opts]:
                assert opt in words, f"seq2seq {name} --help: {opt} not printed whole\n{r.stdout}"
        assert "<bool>" not in r.stdout and "BOOLEAN" not in r.stdout


def test_decoding_flags_are_decoconfigs_fields_on_both_commands():
    from seq2seq_cli.config import DecodeConfig

    _, commands = _commands()
    commands = dict(commands)
    for name in ("translate", "evaluate", "serve"):
        params = {p.name: p for p in commands[name].params}
        assert set(DecodeConfig.model_fields) <= set(params)
        assert "decode" not in params
        assert params["beam_size"].opts == ["--beam-size", "-b"]
        assert params["ban_unk"].secondary_opts == ["--allow-unk"]
        assert params["max_len_b"].min == 0 and params["batch_tokens"].min == 1 and params["top_p"].min is None
        assert all(params[f].default is None for f in DecodeConfig.model_fields)


def test_decoding_flags_reach_the_translator_by_config_key(monkeypatch, tmp_path):
    import seq2seq_cli.decode.loading as loading_module

    seen = []

    def load(models, device="auto", overrides=None, *rest):
        seen.append(overrides)
        raise SystemExit(0)

    monkeypatch.setattr(loading_module, "load_translator", load)
    r = invoke("translate", "-m", tmp_path, "-b", "3", "--top-p", "0.5", "--allow-unk", "--length-penalty-type", "gnmt")
    assert r.exit_code == 0, r.output
    r = invoke("evaluate", "-m", tmp_path, "--src", tmp_path / "s", "--ref", tmp_path / "r", "--no-repeat-ngram-size", "2")
    assert r.exit_code == 0, r.output
    assert seen == [
        {"beam_size": 3, "top_p": 0.5, "ban_unk": False, "length_penalty_type": "gnmt"},
        {"no_repeat_ngram_size": 2},
    ]


def test_train_written_to_a_file_logs_plain_lines_not_a_bar(tiny_config, tmp_path):
    """stderr that is not a terminal (CliRunner's, like CI's or nohup's) gets one plain line every
    log_every updates and no progress bar redraws; --no-progress gets neither."""
    assert invoke("tokenize", "--config", tiny_config).exit_code == 0
    r = invoke("train", "--config", tiny_config, "--set", "train.max_steps=6", "--set", "train.log_every=2",
               "--set", "train.valid_every=6")
    assert r.exit_code == 0, r.output
    steps = [line for line in r.stderr.splitlines() if line.startswith("step ") and "tok/s" in line]
    assert [line.split(":")[0] for line in steps] == ["step 2/6", "step 4/6", "step 6/6"], r.stderr
    assert all("loss " in line and "lr " in line and " min" in line for line in steps)
    assert "\r" not in r.stderr and "it/s" not in r.stderr and "step/s" not in r.stderr
    r = invoke("train", "--config", tiny_config, "--set", "train.max_steps=8", "--resume", "--no-progress")
    assert r.exit_code == 0 and "tok/s" not in r.stderr, r.stderr
