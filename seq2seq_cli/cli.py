"""The `seq2seq` command line: a thin shell over the library functions.

Each command parses its options, loads the config, calls one library function and prints.
torch and the heavy libraries are imported inside the commands so `--help` is instant.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from seq2seq_cli.errors import UserError

app = typer.Typer(
    help="Train and run encoder-decoder Transformers for translation.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="YAML config file, e.g. configs/quickstart.yaml.")]
SetOpt = Annotated[
    Optional[list[str]],
    typer.Option("--set", help="Override a config key: --set train.max_steps=2000 (repeatable)."),
]
ModelOpt = Annotated[Path, typer.Option("--model", "-m", help="Run directory (uses best, else last checkpoint) or a checkpoint file.")]
BeamOpt = Annotated[Optional[int], typer.Option("--beam-size", "-b", min=1, help="Beam size; 1 = greedy. Default: the run's decode.beam_size.")]
PenaltyOpt = Annotated[Optional[float], typer.Option("--length-penalty", help="Hypothesis score = log-prob / length**ALPHA. Default: decode.length_penalty.")]
LenAOpt = Annotated[Optional[float], typer.Option("--max-len-a", min=0, help="Output limit a*source_len+b: the a. Default: decode.max_len_a.")]
LenBOpt = Annotated[Optional[int], typer.Option("--max-len-b", min=0, help="Output limit a*source_len+b: the b. Default: decode.max_len_b.")]
BatchOpt = Annotated[Optional[int], typer.Option("--batch-tokens", min=1, help="Source tokens per batch (times beam). Default: decode.batch_tokens.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto (CUDA when present), cpu or cuda.")]


def user_errors(fn: Callable) -> Callable:
    """Report UserError as one line on stderr with exit code 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None

    return wrapper


def _load(config: Path, overrides: list[str] | None):
    from seq2seq_cli.config import load_config

    return load_config(config, overrides or [])


@app.command()
@user_errors
def tokenize(config: ConfigOpt, set_: SetOpt = None) -> None:
    """Train the SentencePiece model(s) on the training split into the run directory."""
    from seq2seq_cli.tokenizer import train_tokenizer

    cfg = _load(config, set_)
    for path in train_tokenizer(cfg):
        typer.echo(f"wrote {path}")


@app.command()
@user_errors
def train(
    config: ConfigOpt,
    set_: SetOpt = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the run's last checkpoint.")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Train a model; checkpoints, metrics.jsonl and the resolved config go to the run directory."""
    from seq2seq_cli.train import train as run_training

    cfg = _load(config, set_)
    try:
        run_dir = run_training(cfg, resume=resume, progress=progress)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    typer.echo(str(run_dir))


@app.command()
@user_errors
def translate(
    model: ModelOpt,
    input: Annotated[str, typer.Option("--input", "-i", help="Text file to translate, one sentence per line; - = stdin.")] = "-",
    output: Annotated[str, typer.Option("--output", "-o", help="Where translations go, line by line; - = stdout.")] = "-",
    beam_size: BeamOpt = None,
    length_penalty: PenaltyOpt = None,
    max_len_a: LenAOpt = None,
    max_len_b: LenBOpt = None,
    batch_tokens: BatchOpt = None,
    device: DeviceOpt = "auto",
    progress: Annotated[bool, typer.Option(help="Show a progress bar for files.")] = True,
) -> None:
    """Translate a file or stdin; output lines match input lines one for one."""
    from seq2seq_cli.translate import Translator, translate_file

    translator = Translator.load(
        model, device, beam_size=beam_size, length_penalty=length_penalty,
        max_len_a=max_len_a, max_len_b=max_len_b, batch_tokens=batch_tokens,
    )
    count = translate_file(translator, input, output, progress=progress)
    if output != "-":
        typer.echo(f"wrote {count} lines to {output}", err=True)


@app.command()
@user_errors
def evaluate(
    ref: Annotated[Path, typer.Option("--ref", "-r", help="Reference translations, one per line.")],
    model: Annotated[Optional[Path], typer.Option("--model", "-m", help="Run directory or checkpoint to translate --src with.")] = None,
    src: Annotated[Optional[Path], typer.Option("--src", "-s", help="Source sentences to translate and score.")] = None,
    hyp: Annotated[Optional[Path], typer.Option("--hyp", help="Score this existing file of translations instead of translating.")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Also write the translations of --src here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one machine-readable JSON line.")] = False,
    beam_size: BeamOpt = None,
    length_penalty: PenaltyOpt = None,
    max_len_a: LenAOpt = None,
    max_len_b: LenBOpt = None,
    batch_tokens: BatchOpt = None,
    device: DeviceOpt = "auto",
) -> None:
    """Score translations with sacreBLEU: BLEU and chrF with their signatures."""
    from seq2seq_cli.evaluate import evaluate as run_evaluation

    if (hyp is None) == (model is None and src is None):
        raise UserError("give either --hyp FILE, or --model RUN with --src FILE (and --ref FILE in both cases)")
    if hyp is None and (model is None or src is None):
        raise UserError("--model and --src go together: translate --src with --model and score against --ref")
    translator = None
    if model is not None:
        from seq2seq_cli.translate import Translator

        translator = Translator.load(
            model, device, beam_size=beam_size, length_penalty=length_penalty,
            max_len_a=max_len_a, max_len_b=max_len_b, batch_tokens=batch_tokens,
        )
    scores = run_evaluation(ref, src=src, hyp=hyp, translator=translator, output=output)
    if as_json:
        typer.echo(json.dumps(scores.as_dict()))
    else:
        typer.echo(scores.bleu_line)
        typer.echo(scores.chrf_line)


def main() -> None:
    app(prog_name="seq2seq")


if __name__ == "__main__":
    main()
