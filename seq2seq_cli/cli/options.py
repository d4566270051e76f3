"""What the commands of `seq2seq` share: one-line reports of bad flags (exit code 2) and of
user errors (exit code 1), the option types, and the decoding flags of translate, evaluate and
serve, one per `DecodeConfig` field."""

from __future__ import annotations

import functools
import inspect
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from seq2seq_cli.choices import Engine
from seq2seq_cli.errors import UserError
from seq2seq_cli.stdio import silence_stdout, stdout_reader_gone


class OneLineErrors(TyperGroup):
    """Bad flags (unknown option, beam size 0, missing --model ...) reported as one line on
    stderr, `error: seq2seq CMD: what was wrong (see 'seq2seq CMD --help')`, exit code 2."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,  # type: ignore[override]
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False, **extra)
        except Exception as exc:  # the command-line parser's own exception types (Click's, or Typer's copy)
            if not standalone_mode or not (hasattr(exc, "format_message") or type(exc).__name__ == "Abort"):
                raise
            sys.exit(report_usage_error(exc))
        if standalone_mode:
            sys.exit(rv if isinstance(rv, int) else 0)
        return rv


def report_usage_error(exc: Exception) -> int:
    """Print a parser error as one line (help, for a bare command) -> the exit code."""
    ctx = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
        typer.echo(ctx.get_help())
        return 0
    if type(exc).__name__ == "Abort":
        typer.echo("error: aborted", err=True)
        return 1
    where = f"{ctx.command_path}: " if ctx is not None else ""
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    message = " ".join(exc.format_message().replace("Value error, ", "").split())  # type: ignore[attr-defined]
    typer.echo(f"error: {where}{message}{hint}", err=True)
    return int(getattr(exc, "exit_code", 2))


ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="YAML config file, e.g. configs/quickstart.yaml.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a config key: --set train.max_steps=2000 (repeatable)."),
]
ModelOpt = Annotated[Path, typer.Option("--model", "-m", help="Run directory (uses best, else last checkpoint) or a checkpoint file.")]
ModelsOpt = Annotated[list[Path], typer.Option(
    "--model", "-m", metavar="RUN", help="Run directory (uses best, else last checkpoint) or a checkpoint file; repeat for an ensemble "
                          "(the models' probabilities averaged at each step; one target vocabulary).")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto (CUDA when present), cpu, cuda or cuda:N.")]
TagOpt = Annotated[str | None, typer.Option(
    "--tag", help="A token put in front of each source line, as a corpus tag was in training: '<bt>', '>>fr<<'.")]
SrcLangOpt = Annotated[str | None, typer.Option(
    "--src-lang", help="The source language, of the run's pairs (`seq2seq info --model RUN` lists them); needed only "
    "to name it: the model reads any of its sources.")]
TgtLangOpt = Annotated[str | None, typer.Option(
    "--tgt-lang", help="The target language, of the run's pairs; needed where the run translates into several "
    "(its language token goes in front of each source).")]
EngineOpt = Annotated[Engine, typer.Option(
    "--engine", help="auto (CTranslate2 where it is installed and can decode the run and the options, else our own "
    "searches; the first log line says which), torch (our own searches) or ctranslate2 (CTranslate2 where the options "
    "allow, else an error). CTranslate2 decodes the run converted once into RUN/ctranslate2/.")]
SplitOpt = Annotated[bool, typer.Option(
    "--split/--no-split", help="Cut each line into sentences and join their translations with the line's spacing "
    "(not with --nbest, --scores, --alignment, --attention-plots, nor on a line with constraints or a prefix).")]

# The decoding flags of translate and evaluate, one per DecodeConfig field (in its order): the
# flag names and help are given here; the type and the lower bound come from the field.
# A flag not given (None) leaves the run's own decode.* setting.
DECODE_FLAGS: dict[str, tuple[tuple[str, ...], str]] = {
    "beam_size": (("--beam-size", "-b"), "Beam size; 1 = greedy. Default: the run's decode.beam_size."),
    "constraint_beam_size": (("--constraint-beam-size",), "Beam of the lines with --constraints or glossary terms (dynamic beam allocation shares it among banks). Default: 1.5 times the beam size, rounded up."),
    "length_penalty": (("--length-penalty",), "Alpha of the length penalty. Default: decode.length_penalty."),
    "length_penalty_type": (("--length-penalty-type",), "average: log P / len**alpha (fairseq, HF, CTranslate2); gnmt: log P / ((5+len)/6)**alpha (OpenNMT, JoeyNMT)."),
    "max_len_a": (("--max-len-a",), "Output limit a*source_len+b: the a. Default: decode.max_len_a."),
    "max_len_b": (("--max-len-b",), "Output limit a*source_len+b: the b. Default: decode.max_len_b."),
    "min_len": (("--min-len",), "No end of sentence before this many output tokens."),
    "no_repeat_ngram_size": (("--no-repeat-ngram-size",), "Never repeat an n-gram of this size; 0 = off."),
    "ban_unk": (("--ban-unk/--allow-unk",), "Never produce the unknown token."),
    "replace_unk": (("--replace-unk/--keep-unk",), "Replace unknown output tokens by the most attended source piece."),
    "sampling": (("--sampling/--search",), "Sample outputs (temperature, top-k, top-p) instead of searching."),
    "temperature": (("--temperature",), "Sampling temperature."),
    "top_k": (("--top-k",), "Sample among the k most likely tokens; 0 = all."),
    "top_p": (("--top-p",), "Sample from the smallest set of tokens with this much probability."),
    "seed": (("--seed",), "Seed for sampling: the same seed gives the same outputs."),
    "batch_tokens": (("--batch-tokens",), "Source tokens per batch, as CTranslate2 counts them (each sentence decodes beam-size rows). Default: decode.batch_tokens."),
    "precision": (("--precision",), "auto, fp32, bf16 or fp16: the weights and activations of decoding (auto: bf16 on CUDA, fp32 on CPU; fp16 on CUDA only). Default: decode.precision."),
    "quantize": (("--quantize",), "none, or int8: linear layers in int8 (CPU only), faster at a small cost in quality. Default: decode.quantize."),
    "shortlist": (("--shortlist/--full-vocabulary",), "Score only the target subwords the run's lexical shortlist (RUN/shortlist.tsv, written by train) gives each sentence's own source subwords, plus the commonest ones: faster steps for a lone sentence on a small model (Marian's --shortlist); --shortlist on a run without one is an error. Default: decode.shortlist, where null (the default) is the whole vocabulary."),
}


def decode_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give `command` one option per DecodeConfig field (DECODE_FLAGS) in place of its last
    parameter, `decode`, which receives the flags given, by DecodeConfig key."""
    from seq2seq_cli.config import DecodeConfig

    fields = DecodeConfig.model_fields
    if list(fields) != list(DECODE_FLAGS):
        raise TypeError(f"DECODE_FLAGS names {list(DECODE_FLAGS)}, DecodeConfig has {list(fields)}")
    signature = inspect.signature(command, eval_str=True)
    *params, last = signature.parameters.values()
    if last.name != "decode":
        raise TypeError(f"{command.__name__}: the last parameter must be `decode`")
    for name, field in fields.items():
        decls, help_text = DECODE_FLAGS[name]
        kind = field.annotation if field.annotation in (bool, int, float) else str
        if field.annotation == bool | None:  # a switch whose default (None) is the run's own
            kind = bool
        low = next((m.ge for m in field.metadata if hasattr(m, "ge")), None)
        option = typer.Option(*decls, min=low, help=help_text)
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=Annotated[kind | None, option]))

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        given = {name: kwargs.pop(name) for name in fields}
        command(**kwargs, decode={k: v for k, v in given.items() if v is not None})

    params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params]
    wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


def user_errors(fn: Callable) -> Callable:
    """Report UserError as one line on stderr with exit code 1, never a traceback; a reader of
    stdout that went away (`| head`) ends the command quietly with exit code 141."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        except OSError as exc:  # unreadable input, a full disk, a directory where a file was expected
            if isinstance(exc, BrokenPipeError) and stdout_reader_gone():
                # the reader of stdout is gone (`seq2seq ... | head`): stop quietly, as cat or grep
                # do, with the status of a process ended by SIGPIPE
                silence_stdout()
                raise typer.Exit(128 + signal.SIGPIPE) from None
            where = f"{exc.filename}: " if exc.filename else ""
            typer.echo(f"error: {where}{exc.strerror or exc}", err=True)
            raise typer.Exit(1) from None

    return wrapper
