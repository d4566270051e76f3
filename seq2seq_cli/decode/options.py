"""Decoding options checked once, for the command line and the server alike.

A run's `decode` settings with the options a user gave over them (flags of `translate`,
`evaluate` and `serve`, or the fields of a request) are validated by `DecodeConfig` and then
against the model: a beam within the target vocabulary, an n-best list within the beam. Every
problem is one line naming the option as the user gave it: `name_of(key, given)` spells it
(`--beam-size` on the command line, `beam_size` in a request, `decode.beam_size (the run's
config)` for a setting the user did not give).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from pydantic import ValidationError

from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.errors import UserError

NameOf = Callable[[str, bool], str]  # (DecodeConfig key, whether the user gave it) -> how the user names it


def flag_name(key: str, given: bool) -> str:
    """How the command line names a decoding option: its flag, or the run's config key."""
    return f"--{key.replace('_', '-')}" if given else f"decode.{key} (the run's config)"


def field_name(key: str, given: bool) -> str:
    """How a request names a decoding option: its field (the server's own settings by their key too)."""
    return key


def clip(text: str, width: int = 60) -> str:
    """`text` cut to `width` characters, so that a value quoted in a message stays one short line."""
    return text if len(text) <= width else text[: width - 1] + "…"


def describe_options_error(exc: ValidationError, given: Mapping[str, object], name_of: NameOf) -> str:
    """Rejected decoding options as one line: each option as the user names it, its value and
    what is allowed."""
    problems = []
    for err in exc.errors():
        msg = clip(str(err["msg"]).removeprefix("Value error, "), 120)
        if not err["loc"]:
            problems.append(f"decoding options: {msg}")
            continue
        key = str(err["loc"][0])
        problems.append(f"{name_of(key, key in given)} {clip(repr(err['input']))}: {msg}")
    return "; ".join(problems)


def decode_settings(base: DecodeConfig, given: Mapping[str, object], vocab: int, name_of: NameOf) -> DecodeConfig:
    """`base` with the options `given` (DecodeConfig keys) over it, checked: by DecodeConfig, and
    each beam within the target vocabulary of `vocab` tokens; a UserError of one line otherwise."""
    try:
        decode = DecodeConfig(**{**base.model_dump(), **given})
    except ValidationError as exc:
        raise UserError(describe_options_error(exc, given, name_of)) from None
    if not decode.sampling and decode.beam_size > vocab:
        where = name_of("beam_size", "beam_size" in given)
        raise UserError(f"{where} {decode.beam_size}: larger than the target vocabulary ({vocab} tokens)")
    if (decode.constraint_beam_size or 0) > vocab:
        where = name_of("constraint_beam_size", "constraint_beam_size" in given)
        raise UserError(f"{where} {decode.constraint_beam_size}: larger than the target vocabulary ({vocab} tokens)")
    return decode


def check_nbest(nbest: int, decode: DecodeConfig, name_of: NameOf) -> None:
    """An n-best list of `nbest` fits the beam (sampling draws any number)."""
    if not decode.sampling and nbest > decode.beam_size:
        beam = name_of("beam_size", True)
        raise UserError(f"{name_of('nbest', True)} {nbest} is larger than the beam size {decode.beam_size}; raise {beam}")
