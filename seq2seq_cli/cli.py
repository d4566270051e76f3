"""The `seq2seq` command line: a thin shell over the library functions.

Each command parses its options, loads the config, calls one library function and prints.
torch and the heavy libraries are imported inside the commands so `--help` is instant.
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from seq2seq_cli.choices import DocumentFormat, Engine, ExportFormat
from seq2seq_cli.errors import UserError


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
            sys.exit(_report_usage_error(exc))
        if standalone_mode:
            sys.exit(rv if isinstance(rv, int) else 0)
        return rv


def _report_usage_error(exc: Exception) -> int:
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
    message = " ".join(exc.format_message().split())  # type: ignore[attr-defined]
    typer.echo(f"error: {where}{message}{hint}", err=True)
    return int(getattr(exc, "exit_code", 2))


app = typer.Typer(
    cls=OneLineErrors,
    name="seq2seq",
    help="Train and run encoder-decoder Transformers for translation.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="YAML config file, e.g. configs/quickstart.yaml.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a config key: --set train.max_steps=2000 (repeatable)."),
]
ModelOpt = Annotated[Path, typer.Option("--model", "-m", help="Run directory (uses best, else last checkpoint) or a checkpoint file.")]
ModelsOpt = Annotated[list[Path], typer.Option(
    "--model", "-m", metavar="RUN", help="Run directory (uses best, else last checkpoint) or a checkpoint file; repeat for an ensemble "
                          "(the models' probabilities averaged at each step; one target vocabulary).")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto (CUDA when present), cpu or cuda.")]
TagOpt = Annotated[str | None, typer.Option(
    "--tag", help="A token put in front of each source line, as a corpus tag was in training: '<bt>', '>>fr<<'.")]
EngineOpt = Annotated[Engine, typer.Option(
    "--engine", help="auto (CTranslate2 where it is installed and can decode the run, else our own searches), torch "
    "(our own searches) or ctranslate2 (the run converted at start and decoded by CTranslate2 where the options allow).")]
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
    "shortlist": (("--shortlist/--full-vocabulary",), "Score only the target subwords the run's lexical shortlist (RUN/shortlist.tsv, written by train) gives the source's subwords, plus the commonest ones: faster steps on small models (Marian's --shortlist). Default: decode.shortlist."),
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


def load_translator(model: list[Path], device: str, decode: dict[str, object], tag: str | None, engine: Engine) -> Any:
    """The Translator of `--model` (one run, or several as an ensemble), with --tag and --engine
    (`seq2seq_cli/decode/loading.py`)."""
    from seq2seq_cli.decode.loading import load_translator as load

    return load(model, device, decode, tag, engine).translator


def user_errors(fn: Callable) -> Callable:
    """Report UserError as one line on stderr with exit code 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        except OSError as exc:  # unreadable input, a full disk, a directory where a file was expected
            where = f"{exc.filename}: " if exc.filename else ""
            typer.echo(f"error: {where}{exc.strerror or exc}", err=True)
            raise typer.Exit(1) from None

    return wrapper


def _load(config: Path, overrides: list[str] | None):
    from seq2seq_cli.config_load import load_config

    return load_config(config, overrides or [])


@app.command()
@user_errors
def tokenize(config: ConfigOpt, set_: SetOpt = None) -> None:
    """Train the SentencePiece model(s) on the training split into the run directory."""
    from seq2seq_cli.run.tokenizing import train_tokenizer

    cfg = _load(config, set_)
    for path in train_tokenizer(cfg):
        typer.echo(f"wrote {path}")


@app.command()
@user_errors
def train(
    config: ConfigOpt,
    set_: SetOpt = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the run's last checkpoint.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Start over in a run directory that holds checkpoints: removes its checkpoints, metrics, TensorBoard events and plots (keeps the tokenizer and data cache).")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    init_from: Annotated[str | None, typer.Option(
        "--init-from", metavar="RUN_OR_CHECKPOINT",
        help="Fine-tune: start from this run's weights (its best checkpoint, or the file given), with its "
             "architecture and tokenizer; fresh optimizer and schedule.")] = None,
) -> None:
    """Train a model; checkpoints, metrics.jsonl and the resolved config go to the run directory."""
    from seq2seq_cli.train.loop import train as run_training

    cfg = _load(config, set_)
    try:
        run_dir = run_training(cfg, resume=resume, progress=progress, overwrite=overwrite, init_from=init_from)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    typer.echo(str(run_dir))


@app.command()
@user_errors
def info(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML config: the model it describes, vocabulary tokenizer.vocab_size.")] = None,
    set_: SetOpt = None,
    model: Annotated[Path | None, typer.Option("--model", "-m", help="A trained run directory or checkpoint instead of --config.")] = None,
    src_len: Annotated[int, typer.Option("--src-len", min=1, help="Source tokens per sentence for the FLOP estimates.")] = 32,
    tgt_len: Annotated[int, typer.Option("--tgt-len", min=1, help="Target tokens per sentence for the FLOP estimates.")] = 32,
) -> None:
    """Parameters per part (tied parts counted once), FLOPs per token and memory of a model."""
    from seq2seq_cli.model.info import info_report, model_from_config

    if (config is None) == (model is None):
        raise UserError("give either --config FILE (the model it describes) or --model RUN (a trained model)")
    if model is not None:
        if set_:
            raise UserError("--set changes a config; it goes with --config, not --model")
        from seq2seq_cli.run.loaded import load_model

        net = load_model(model).model
    else:
        assert config is not None  # one of the two, checked above
        net = model_from_config(_load(config, set_))
    typer.echo(info_report(net, src_len, tgt_len))


@app.command()
@user_errors
@decode_options
def translate(
    model: ModelsOpt,
    input: Annotated[str, typer.Option("--input", "-i", help="Text file to translate, one sentence per line; - = stdin.")] = "-",
    output: Annotated[str, typer.Option("--output", "-o", help="Where translations go, line by line; - = stdout.")] = "-",
    nbest: Annotated[int, typer.Option("--nbest", min=1, help="Write the N best translations of each input, N consecutive lines.")] = 1,
    scores: Annotated[bool, typer.Option("--scores", help="Append a tab and the hypothesis score to each line.")] = False,
    alignment: Annotated[bool, typer.Option("--alignment", help="Append a tab and hard alignments SRC-TGT (subword positions, argmax of cross-attention).")] = False,
    attention_plots: Annotated[Path | None, typer.Option("--attention-plots", help="Write one cross-attention heatmap PNG per sentence into this directory.")] = None,
    attention_layer: Annotated[int, typer.Option("--attention-layer", help="Decoder layer for alignments and plots; -1 = last.")] = -1,
    attention_head: Annotated[int | None, typer.Option("--attention-head", min=0, help="One head for alignments and plots; default the mean over heads.")] = None,
    constraints: Annotated[Path | None, typer.Option("--constraints", help="One JSON list of target phrases per input line ([] = none): each output holds every phrase of its line (constrained beam search).")] = None,
    glossary: Annotated[Path | None, typer.Option("--glossary", help="TSV of source term TAB target term: a line containing a source term (whole words, same case) gets its target term as a constraint.")] = None,
    device: DeviceOpt = "auto",
    progress: Annotated[bool, typer.Option(help="Show a progress bar (sentences/s) for files.")] = True,
    prefix: Annotated[Path | None, typer.Option("--prefix", help="Target text each output must start with, one line per input line (an empty line for none); the search continues after it.")] = None,
    tag: TagOpt = None,
    split: SplitOpt = True,
    format: Annotated[DocumentFormat, typer.Option("--format", help="auto (by the input's name, else its content: an HTML page, an XML document; stdin is text), text (line by line), html, xml, docx or odt: a document is translated whole, its markup and formatting kept.")] = DocumentFormat.auto,
    engine: EngineOpt = Engine.torch,
    *,
    decode: dict[str, object],
) -> None:
    """Translate a file or stdin; output lines match input lines one for one (N each with --nbest)."""
    from seq2seq_cli.decode.terms import Terminology
    from seq2seq_cli.documents.lines import OutputOptions
    from seq2seq_cli.documents.sentences import Splitter
    from seq2seq_cli.documents.text import translate_file
    from seq2seq_cli.documents.translate import check_document_options, input_format, translate_document

    fmt = input_format(input, format)
    terminology = Terminology.load(constraints, glossary)  # bad files are reported before the model loads
    translator = load_translator(model, device, decode, tag, engine)
    layers = translator.model.cfg.decoder_layers
    if not -layers <= attention_layer < layers:
        raise UserError(f"--attention-layer {attention_layer}: the model has {layers} decoder layers")
    if attention_head is not None and attention_head >= translator.model.cfg.heads:
        raise UserError(f"--attention-head {attention_head}: the model has {translator.model.cfg.heads} heads")
    splitter = Splitter(translator.languages[0]) if split else None
    opts = OutputOptions(nbest, scores, alignment, attention_plots, attention_layer, attention_head, terminology, splitter)
    if fmt is not DocumentFormat.text:
        check_document_options(fmt, opts, prefix)
        translate_document(translator, input, output, fmt, splitter)
        if output != "-":
            typer.echo(f"wrote {output}", err=True)
        return
    count = translate_file(translator, input, output, opts, progress=progress, prefix=prefix)
    if output != "-":
        typer.echo(f"wrote {count} lines to {output}", err=True)


@app.command()
@user_errors
@decode_options
def serve(
    model: Annotated[list[Path], typer.Option("--model", "-m", help="Run directory (uses best, else last checkpoint) or a checkpoint file.")],
    host: Annotated[str, typer.Option("--host", help="Address to listen on; the default answers this machine only (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", min=0, max=65535, help="TCP port to listen on.")] = 5000,
    batch_wait_ms: Annotated[float, typer.Option("--batch-wait-ms", min=0, help="How long the oldest queued request waits for others to be decoded with it (only while several clients are being served).")] = 5.0,
    batching: Annotated[bool, typer.Option("--batching/--no-batching", help="Decode the requests queued together in one batch (--no-batching: one request per batch).")] = True,
    max_queue: Annotated[int, typer.Option("--max-queue", min=1, help="Requests queued or being decoded; more are answered 503 with Retry-After.")] = 256,
    max_chars: Annotated[int, typer.Option("--max-chars", min=1, help="Characters of text per request; more are answered 413.")] = 20000,
    max_lines: Annotated[int, typer.Option("--max-lines", min=1, help="Lines (sentences) per request; more are answered 413.")] = 200,
    timeout: Annotated[float, typer.Option("--timeout", min=0.001, help="Seconds a request may wait for its translation; then 504.")] = 60.0,
    api_keys: Annotated[Path | None, typer.Option("--api-keys", help="File of API keys, one per line: requests must carry one (api_key field or X-API-Key header), else 403.")] = None,
    device: DeviceOpt = "auto",
    tag: TagOpt = None,
    engine: EngineOpt = Engine.torch,
    *,
    decode: dict[str, object],
) -> None:
    """Serve a run over HTTP: a LibreTranslate-compatible API, /v1/translate with the decoding options, a web page at /."""
    try:
        from seq2seq_cli.serve.server import ServeSettings
        from seq2seq_cli.serve.server import serve as run_server
    except ImportError as exc:
        raise UserError(f"serve needs the serve extra ({exc.name} is missing): pip install 'seq2seq[serve]'") from None

    if len(model) > 1:
        given = ", ".join(str(m) for m in model)
        raise UserError(f"--model is given {len(model)} times ({given}); serve takes one model (API keys are given with --api-keys FILE)")
    settings = ServeSettings(batch_wait_ms, max_queue, max_chars, max_lines, timeout, None, batching)
    run_server(model[0], device, decode, host, port, settings, api_keys, tag, engine)


@app.command()
@user_errors
@decode_options
def evaluate(
    ref: Annotated[Path, typer.Option("--ref", "-r", help="Reference translations, one per line.")],
    model: Annotated[list[Path] | None, typer.Option("--model", "-m", metavar="RUN", help="Run directory or checkpoint to translate --src with; repeat for an ensemble.")] = None,
    src: Annotated[Path | None, typer.Option("--src", "-s", help="Source sentences to translate and score.")] = None,
    hyp: Annotated[Path | None, typer.Option("--hyp", help="Score this existing file of translations instead of translating.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Also write the translations of --src here.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one machine-readable JSON line.")] = False,
    device: DeviceOpt = "auto",
    tag: TagOpt = None,
    split: SplitOpt = True,
    engine: EngineOpt = Engine.torch,
    *,
    decode: dict[str, object],
) -> None:
    """Score translations with sacreBLEU: BLEU and chrF with their signatures."""
    from seq2seq_cli.decode.evaluate import evaluate as run_evaluation

    model = model or None  # -m not given
    if (hyp is None) == (model is None and src is None):
        raise UserError("give either --hyp FILE, or --model RUN with --src FILE (and --ref FILE in both cases)")
    if hyp is None and (model is None or src is None):
        raise UserError("--model and --src go together: translate --src with --model and score against --ref")
    translator = None
    if model is not None:
        translator = load_translator(model, device, decode, tag, engine)
    elif tag is not None:
        raise UserError(f"--tag {tag}: goes with --model and --src (it is put in front of each source line)")
    translate = None
    if translator is not None and split:
        from seq2seq_cli.documents.lines import translate_sentences
        from seq2seq_cli.documents.sentences import Splitter

        translate = functools.partial(translate_sentences, translator.translate, splitter=Splitter(translator.languages[0]))
    scores = run_evaluation(ref, src=src, hyp=hyp, translator=translator, output=output, translate=translate)
    if as_json:
        typer.echo(json.dumps(scores.as_dict()))
    else:
        typer.echo(scores.bleu_line)
        typer.echo(scores.chrf_line)


@app.command()
@user_errors
def average(
    model: Annotated[Path, typer.Option("--model", "-m", help="Run directory whose step checkpoints are averaged.")],
    last: Annotated[int, typer.Option("--last", "-n", min=1, help="How many of the newest intact step checkpoints to average.")] = 2,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Where to write, inside RUN/checkpoints; default RUN/checkpoints/average-last-N.safetensors.")] = None,
) -> None:
    """Average the weights of the last N checkpoints of a run (often a little better than the last)."""
    from seq2seq_cli.run.checkpoint import average_checkpoints

    typer.echo(f"wrote {average_checkpoints(model, last, output)}")


@app.command()
@user_errors
def export(
    output: Annotated[Path, typer.Argument(help="Directory to write the exported model into (for argos, the .argosmodel file).")],
    model: ModelOpt,
    format: Annotated[ExportFormat, typer.Option("--format", help="Target format: ctranslate2, hf (a MarianMTModel directory) or argos (an Argos Translate .argosmodel package).")] = ExportFormat.ctranslate2,
    quantization: Annotated[str | None, typer.Option("--quantization", help="CTranslate2 weight type, e.g. int8, float16; default float32.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite a non-empty output directory (or an existing .argosmodel).")] = False,
) -> None:
    """Export a trained model for another inference engine (CTranslate2, Argos Translate) or as a Hugging Face Marian model."""
    from seq2seq_cli.convert.export import export_ctranslate2

    if format is ExportFormat.hf:
        from seq2seq_cli.convert.hf import export_hf

        if quantization is not None:
            raise UserError("--quantization is for --format ctranslate2; hf exports float32 weights")
        typer.echo(f"wrote {export_hf(model, output, force)}")
        return
    if format is ExportFormat.argos:
        from seq2seq_cli.convert.argos import export_argos

        typer.echo(f"wrote {export_argos(model, output, quantization, force)}")
        return
    typer.echo(f"wrote {export_ctranslate2(model, output, quantization, force)}")


@app.command("import")
@user_errors
def import_(
    source: Annotated[Path, typer.Argument(help="A local Hugging Face Marian directory (config.json, model.safetensors, source.spm, target.spm, vocab.json).")],
    output: Annotated[Path, typer.Argument(help="Run directory to write.")],
    src_lang: Annotated[str, typer.Option("--src-lang", help="Source language suffix recorded in the run's config (data.src_lang).")] = "src",
    tgt_lang: Annotated[str, typer.Option("--tgt-lang", help="Target language suffix recorded in the run's config (data.tgt_lang).")] = "tgt",
    force: Annotated[bool, typer.Option("--force", help="Overwrite a non-empty run directory.")] = False,
) -> None:
    """Import a Hugging Face Marian (OPUS-MT) model into a run directory for translate, evaluate, export and info."""
    from seq2seq_cli.convert.hf import import_marian

    typer.echo(f"wrote {import_marian(source, output, src_lang, tgt_lang, force)}")


def main() -> None:
    app(prog_name="seq2seq")


if __name__ == "__main__":
    main()
