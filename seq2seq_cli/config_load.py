"""Loading the configuration: YAML files (a repeated key refused), `--set KEY=VALUE` overrides,
validation against the schema (`config.py`) with every problem described in one line naming
the file and line (or the `--set` flag), saving a run's resolved config, and a fine-tuned run's
config inherited from the run it starts from."""

from __future__ import annotations

import os
import typing
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from seq2seq_cli.config import ARCHITECTURE_KEYS, SPLIT_TAGS, VOCABULARY_KEYS, Config, dotted_key
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import atomic_write_text, check_utf8
from seq2seq_cli.layout import run_of_config


def inherit_architecture(config: Config, init: Config, source: str) -> Config:
    """The config of a run that starts from the weights of a run configured as `init`: its
    model and tokenizer sections are `init`'s, with the free keys the user set (dropout,
    subword sampling, ...) applied over them. A key the user set that contradicts the
    architecture or vocabulary of `init` is refused, named; data, train and decode are the
    user's."""
    diffs = []
    sections = {"model": (config.model, init.model, ARCHITECTURE_KEYS),
                "tokenizer": (config.tokenizer, init.tokenizer, VOCABULARY_KEYS)}
    merged: dict[str, dict[str, Any]] = {}
    for name, (mine, theirs, fixed) in sections.items():
        given = mine.model_fields_set if name in config.model_fields_set else set()
        for key in sorted(given & set(fixed)):
            if getattr(mine, key) != getattr(theirs, key):
                diffs.append(f"{name}.{key} is {getattr(mine, key)!r} in the config, {getattr(theirs, key)!r} in {source}")
        merged[name] = {**theirs.model_dump(mode="json"), **{k: v for k, v in mine.model_dump(mode="json").items()
                                                           if k in given and k not in fixed}}
    if diffs:
        raise UserError(f"--init-from {source}: the config contradicts the run it starts from: {'; '.join(diffs)} "
                        "(remove these keys: the architecture and vocabulary come from that run)")
    return validate_config({**config.model_dump(mode="json"), **merged}, f"config with --init-from {source}")


def _key_lines(text: str) -> dict[tuple[str, ...], int]:
    """Map each key path of a YAML mapping to its 1-based line number."""
    lines: dict[tuple[str, ...], int] = {}

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                sub = (*path, str(key.value))
                lines[sub] = key.start_mark.line + 1
                walk(value, sub)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                sub = (*path, str(index))
                lines[sub] = item.start_mark.line + 1
                walk(item, sub)

    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return lines
    if root is not None:
        walk(root, ())
    return lines


def _section_of(model: type[BaseModel], loc: tuple[str, ...]) -> type[BaseModel]:
    """The section (model class) that holds the last key of `loc`."""
    section: Any = model
    for part in loc[:-1]:
        if part.isdigit():
            continue
        annotation = section.model_fields[part].annotation
        found = [a for a in _flatten(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        section = found[0] if found else annotation
    return section


def _flatten(annotation: Any) -> list[Any]:
    """The types inside an annotation (unions, lists and Annotated unwrapped)."""
    args = typing.get_args(annotation)
    if not args:
        return [annotation]
    if typing.get_origin(annotation) is Annotated:
        return _flatten(args[0])
    return [t for a in args for t in _flatten(a)]


def _describe(
    err: ErrorDetails, source: str, lines: dict[tuple[str, ...], int], model: type[BaseModel],
    overridden: set[tuple[str, ...]] = frozenset(),  # type: ignore[assignment]
) -> str:
    # the unions of data.train, valid and test put their member's tag in the location: data.train.corpora.1.weight
    loc = tuple(str(p) for i, p in enumerate(err["loc"])
                if not (i and err["loc"][i - 1] in ("train", "valid", "test") and p in SPLIT_TAGS))
    key = dotted_key(loc)
    known = next((loc[:n] for n in range(len(loc), 1, -1) if loc[:n] in lines), loc)  # nearest key with a line
    where = f"{source}:{lines[known]}" if known in lines else source
    given = next((o for o in overridden if loc[: len(o)] == o and o != loc), None)
    if loc in overridden:
        where = f"--set {key}"
    elif given is not None:  # a key inside a value given by --set, e.g. --set data.train=[...]
        where = f"--set {dotted_key(given)}"
    if err["type"] == "extra_forbidden":
        valid = ", ".join(_section_of(model, loc).model_fields)
        return f"{where}: unknown key '{key}'; valid keys here: {valid}"
    if err["type"] == "missing":
        return f"{where}: missing required key '{key}'"
    msg = err["msg"].removeprefix("Value error, ")
    named = where if loc in overridden else f"{where}: {key}"  # `--set KEY` names the key already
    if key and (isinstance(err.get("input"), dict) or loc == ("data", "train")):  # a check across keys, or corpora
        return f"{named}: {msg}"
    if key:
        return f"{named}: {msg} (got {err.get('input')!r})"
    return f"{where}: {msg}"


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split `a.b.c=value` into (['a','b','c'], parsed value); the value is read as YAML."""
    if "=" not in text:
        raise UserError(f"--set {text!r}: expected KEY.PATH=VALUE, e.g. train.max_steps=2000")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise UserError(f"--set {text!r}: expected KEY.PATH=VALUE with a dotted key, e.g. model.d_model=256")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return parts, value


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key repeated in one mapping (YAML would keep the last
    silently: a repeated `model:` section would drop everything the first one set)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None,
                    f"duplicate key {key!r} (first on line {seen[key].start_mark.line + 1}; "
                    "a repeated key would replace the first silently)",
                    key_node.start_mark,
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config, apply `--set` overrides and validate; raise UserError with file:line on problems.
    The config.yaml of a run directory trains that directory, whatever run_dir it records
    (unless `--set run_dir=...` says otherwise): a copied run is a run of its own."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: config file not found")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        check_utf8(path)  # names the line and byte of the first invalid UTF-8, and the encoding a BOM shows
        raise UserError(f"{path}: not UTF-8 text; save the config as UTF-8") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read the config ({exc.strerror or exc})") from None
    try:
        raw = yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"{where}: invalid YAML: {problem}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UserError(f"{path}: expected a mapping of sections (name, data, model, ...) at the top level")
    lines = _key_lines(text)
    overridden: set[tuple[str, ...]] = set()
    for item in overrides:
        parts, value = parse_override(item)
        node = raw
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise UserError(f"--set {item!r}: '{part}' is not a section")
            node = child
        node[parts[-1]] = value
        overridden.add(tuple(parts))
    run = run_of_config(path)
    if run is not None and ("run_dir",) not in overridden:
        raw["run_dir"] = str(run)  # a run is where its config.yaml is: a copied run trains the copy
    kept = {k: v for k, v in lines.items() if not any(k[: len(o)] == o for o in overridden)}
    return validate_config(raw, str(path), kept, overridden)


def validate_config(
    raw: dict[str, Any], source: str, lines: dict[tuple[str, ...], int] | None = None,
    overridden: set[tuple[str, ...]] | None = None,
) -> Config:
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        msgs = [_describe(e, source, lines or {}, Config, overridden or set()) for e in exc.errors()]
        raise UserError("; ".join(msgs)) from None
    config._origin, config._lines = source, dict(lines or {})
    return config


def dump_config(config: Config) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def _absolute(path: str) -> str:
    return os.path.abspath(path) if path else path


def _absolute_split(split: Any) -> Any:
    """A split (a path, or a `SplitConfig`) with its path made absolute; a Hub dataset named by
    a local folder too (a name on the Hub stays as it is)."""
    if isinstance(split, str):
        return _absolute(split)
    if split.path is not None:
        return split.model_copy(update={"path": _absolute(split.path)})
    if split.hub and os.path.isdir(split.hub):
        return split.model_copy(update={"hub": _absolute(split.hub)})
    return split


def with_absolute_paths(config: Config) -> Config:
    """`config` with its data files (data.train, each corpus and its scores, valid, test) and
    given tokenizer models made absolute, against the current directory, where they are read."""
    d, t = config.data, config.tokenizer
    train = ([_absolute_split(c).model_copy(update={"scores": c.scores and _absolute(c.scores)}) for c in d.train]
             if isinstance(d.train, list) else _absolute(d.train))
    data = d.model_copy(update={"train": train, **{k: [_absolute_split(x) for x in v] if isinstance(v, list)
                                                   else _absolute_split(v) for k in ("valid", "test") if (v := getattr(d, k))}})
    tokenizer = t.model_copy(update={k: _absolute(v) for k in ("src_model", "tgt_model") if (v := getattr(t, k))})
    return config.model_copy(update={"data": data, "tokenizer": tokenizer})


def save_config(config: Config, path: Path) -> None:
    """Write the config into its run directory (as config.yaml), recording `run_dir: null`: read
    back, the run is the directory the file is in (`load_config`), wherever the run was copied.
    Its data paths are saved absolute (`with_absolute_paths`), so the file trains the run from
    any directory (`train --config RUN/config.yaml --resume`)."""
    atomic_write_text(path, dump_config(with_absolute_paths(config).model_copy(update={"run_dir": None})))
