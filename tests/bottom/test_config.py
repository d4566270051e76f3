from pathlib import Path

import pytest
import yaml

from seq2seq_cli.config_load import load_config
from seq2seq_cli.errors import UserError

REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text, encoding="utf-8")
    return p


BASE = """name: t
data:
  train: x/train
model:
  d_model: 64
  heads: 4
train:
  max_steps: 10
"""


@pytest.mark.parametrize("name", ["quickstart.yaml", "bible-es-en.yaml", "tiny.yaml"])
def test_shipped_configs_load_and_comment_every_key(name):
    path = REPO / "configs" / name
    cfg = load_config(path)
    assert cfg.name
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        is_section = line.rstrip().endswith(":")
        if line.strip() and not line.lstrip().startswith("#") and not is_section:
            assert "#" in line, f"{name}:{number} has no comment: {line!r}"


def test_unknown_key_names_file_line_and_valid_keys(tmp_path):
    p = _write(tmp_path, BASE.replace("  heads: 4\n", "  heads: 4\n  dmodel: 3\n"))
    with pytest.raises(UserError) as err:
        load_config(p)
    msg = str(err.value)
    assert "\n" not in msg
    assert f"{p}:7" in msg and "unknown key 'model.dmodel'" in msg
    assert "d_model" in msg and "ffn_size" in msg


def test_wrong_type_names_key_path_and_line(tmp_path):
    p = _write(tmp_path, BASE.replace("d_model: 64", "d_model: wide"))
    with pytest.raises(UserError, match=rf"{p}:5: model.d_model: .*integer.*'wide'"):
        load_config(p)


def test_heads_must_divide_d_model(tmp_path):
    p = _write(tmp_path, BASE.replace("heads: 4", "heads: 5"))
    with pytest.raises(UserError, match=r"model: d_model \(64\) must be divisible by heads \(5\)"):
        load_config(p)
    cfg = load_config(p, ["model.q_k_size=8", "model.v_size=16"])
    assert (cfg.model.head_q_k_size, cfg.model.head_v_size) == (8, 16)


def test_set_overrides_any_key_with_yaml_types(tmp_path):
    p = _write(tmp_path, BASE)
    cfg = load_config(p, ["train.max_steps=2000", "model.norm=pre", "train.lr=1e-3", "train.max_minutes=1.5"])
    assert cfg.train.max_steps == 2000 and cfg.model.norm == "pre"
    assert cfg.train.lr == pytest.approx(1e-3) and cfg.train.max_minutes == 1.5
    assert cfg.run_path == Path("runs/t")


def test_set_unknown_key_and_bad_syntax(tmp_path):
    p = _write(tmp_path, BASE)
    with pytest.raises(UserError, match=r"unknown key 'train.max_stepz'"):
        load_config(p, ["train.max_stepz=3"])
    with pytest.raises(UserError, match=r"--set 'train.max_steps': expected KEY.PATH=VALUE"):
        load_config(p, ["train.max_steps"])


def test_missing_file_missing_key_and_invalid_yaml(tmp_path):
    with pytest.raises(UserError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(UserError, match="missing required key 'data.train'"):
        load_config(_write(tmp_path, BASE.replace("  train: x/train\n", "  src_lang: es\n")))
    with pytest.raises(UserError, match=r"c.yaml:4: invalid YAML: expected ',' or ']'"):
        load_config(_write(tmp_path, "name: t\ndata:\n  train: [unclosed\nmodel: {}\n"))


def test_impossible_lengths_are_refused(tmp_path):
    p = _write(tmp_path, BASE)
    with pytest.raises(UserError, match="exceeds model.max_positions"):
        load_config(p, ["data.max_src_len=2000"])
    with pytest.raises(UserError, match="at least one of max_steps"):
        load_config(p, ["train.max_steps=null"])


def test_resolved_config_round_trips(tmp_path):
    from seq2seq_cli.config_load import dump_config

    cfg = load_config(_write(tmp_path, BASE), ["model.norm=pre"])
    again = load_config(_write(tmp_path, dump_config(cfg)))
    assert again == cfg
    assert yaml.safe_load(dump_config(cfg))["model"]["norm"] == "pre"


@pytest.mark.parametrize(("override", "expected"), [
    ("train.max_steps=yes", "--set train.max_steps: expected an integer, not true or false (got True)"),
    ("train.lr=true", "--set train.lr: expected a number, not true or false (got True)"),
    ("model.d_model=no", "--set model.d_model: expected an integer, not true or false (got False)"),
    ("train.betas=[true,0.98]", "--set train.betas: expected a number, not true or false (got [True, 0.98])"),
    ("train.max_minutes=on", "--set train.max_minutes: expected a number, not true or false (got True)"),
])
def test_a_boolean_is_refused_where_a_number_is_expected(tmp_path, override, expected):
    with pytest.raises(UserError) as err:
        load_config(_write(tmp_path, BASE), [override])
    assert str(err.value) == expected


def test_a_boolean_in_the_file_is_refused_with_its_line(tmp_path):
    with pytest.raises(UserError) as err:
        load_config(_write(tmp_path, BASE.replace("max_steps: 10", "max_steps: yes")))
    assert str(err.value) == f"{tmp_path / 'c.yaml'}:8: train.max_steps: expected an integer, not true or false (got True)"
    assert load_config(_write(tmp_path, BASE + "  tensorboard: no\n")).train.tensorboard is False  # booleans stay booleans


@pytest.mark.parametrize(("override", "expected"), [
    ("train.betas=[1.5,0.98]", "--set train.betas: each Adam beta must be at least 0 and below 1 (got [1.5, 0.98])"),
    ("train.betas=[0.9,-0.1]", "--set train.betas: each Adam beta must be at least 0 and below 1 (got [0.9, -0.1])"),
    ("train.seed=-1", "--set train.seed: Input should be greater than or equal to 0 (got -1)"),
    ("train.seed=12345678901234567890123",
     "--set train.seed: Input should be less than or equal to 4294967295 (got 12345678901234567890123)"),
])
def test_adam_betas_and_seed_out_of_range_are_one_line(tmp_path, override, expected):
    with pytest.raises(UserError) as err:
        load_config(_write(tmp_path, BASE), [override])
    assert str(err.value) == expected
    assert load_config(_write(tmp_path, BASE), ["train.seed=4294967295", "train.betas=[0.0,0.999]"]).train.seed == 2**32 - 1
