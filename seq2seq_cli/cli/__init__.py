"""The `seq2seq` command line: a thin shell over the library functions.

Each command parses its options, loads the config, calls one library function and prints.
torch and the heavy libraries are imported inside the commands so `--help` is instant.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from seq2seq_cli.choices import DocumentFormat, Engine, ExportFormat
from seq2seq_cli.cli.options import (
    ConfigOpt,
    DeviceOpt,
    EngineOpt,
    ModelOpt,
    ModelsOpt,
    OneLineErrors,
    SetOpt,
    SplitOpt,
    SrcLangOpt,
    TagOpt,
    TgtLangOpt,
    decode_options,
    user_errors,
)
from seq2seq_cli.cli.streams import check_streams, need_documents_extra, run_guarded, score_inputs
from seq2seq_cli.errors import UserError

app = typer.Typer(
    cls=OneLineErrors,
    name="seq2seq",
    help="Train and run encoder-decoder Transformers for translation.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def load_translator(model: list[Path], device: str, decode: dict[str, object], tag: str | None, engine: Engine,
                    nbest: int = 1, per_line: str | None = None, src_lang: str | None = None,
                    tgt_lang: str | None = None) -> Any:
    """The Translator of `--model` (one run, or several as an ensemble), with --tag and --engine
    (`seq2seq_cli/decode/loading.py`); the path it takes goes to stderr as the first log line."""
    from tqdm import tqdm

    from seq2seq_cli.decode.deferred import Deferred
    from seq2seq_cli.decode.loading import load_translator as load

    choice = load(model, device, decode, tag, engine, nbest, per_line, src_lang, tgt_lang)
    line = f"translating with {', '.join(str(m) for m in model)} ({choice.describe()})"
    # said when the first sentences are decoded: input refused before that is still a one-line error;
    # tqdm.write puts it above a progress bar already drawn
    return choice.translator.replaced(announce=Deferred(lambda: tqdm.write(line, file=sys.stderr)))


def _load(config: Path, overrides: list[str] | None):
    from seq2seq_cli.config_load import load_config

    return load_config(config, overrides or [])


@app.command()
@user_errors
def tokenize(config: ConfigOpt, set_: SetOpt = None) -> None:
    """Train the SentencePiece model(s) on the training split into the run directory, filter the training pairs and report what the data looks like (RUN/data_report.json, .png, RUN/dropped.tsv.gz)."""
    from seq2seq_cli.data.report import read_data_report, report_table
    from seq2seq_cli.layout import RunLayout
    from seq2seq_cli.run.tokenizing import train_tokenizer

    cfg = _load(config, set_)
    for path in train_tokenizer(cfg, log=lambda line: typer.echo(line, err=True)):
        typer.echo(f"wrote {path}")
    report = read_data_report(cfg.run_path)
    if report is not None:
        typer.echo(report_table(report))
        layout = RunLayout(cfg.run_path)
        typer.echo(f"wrote {layout.data_report}, {layout.data_plot}, {layout.dropped}")


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
def distill(
    config: ConfigOpt,
    set_: SetOpt = None,
    teacher: Annotated[str | None, typer.Option("--teacher", metavar="RUN", help="The teacher run (else the config's distill.teacher).")] = None,
    progress: Annotated[bool, typer.Option(help="Show progress bars.")] = True,
    report: Annotated[bool, typer.Option(help="End with the table of teacher against student on data.test.")] = True,
) -> None:
    """Train a student on a teacher's translations: the teacher translates the config's training sources (resumable), the student trains on them, a table compares the two."""
    from seq2seq_cli.train.distill import distill as run_distillation

    cfg = _load(config, [*(set_ or []), *([f"distill.teacher={teacher}"] if teacher else [])])
    try:
        done = run_distillation(cfg, progress=progress, log=lambda line: typer.echo(line, err=True), report=report)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if done.report is not None:
        typer.echo(done.report)
    typer.echo(str(done.run))


@app.command()
@user_errors
def info(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML config: the model it describes, vocabulary tokenizer.vocab_size.")] = None,
    set_: SetOpt = None,
    model: Annotated[Path | None, typer.Option("--model", "-m", help="A trained run directory or checkpoint instead of --config.")] = None,
    src_len: Annotated[int, typer.Option("--src-len", min=1, help="Source tokens per sentence for the FLOP estimates.")] = 32,
    tgt_len: Annotated[int, typer.Option("--tgt-len", min=1, help="Target tokens per sentence for the FLOP estimates.")] = 32,
) -> None:
    """Parameters per part (tied parts counted once), FLOPs per token and memory of a model; with --model, the run's data report."""
    from seq2seq_cli.model.info import info_report, model_from_config

    if (config is None) == (model is None):
        raise UserError("give either --config FILE (the model it describes) or --model RUN (a trained model)")
    if model is not None:
        if set_:
            raise UserError("--set changes a config; it goes with --config, not --model")
        from seq2seq_cli.data.report import read_data_report
        from seq2seq_cli.run.loaded import load_model

        loaded = load_model(model)
        net, report, data = loaded.model, read_data_report(loaded.run_dir), loaded.config.data
    else:
        assert config is not None  # one of the two, checked above
        cfg = _load(config, set_)
        net, report, data = model_from_config(cfg), None, cfg.data
    typer.echo(info_report(net, src_len, tgt_len))
    from seq2seq_cli.languages import pairs_line

    typer.echo(pairs_line(data))
    if report is not None:
        from seq2seq_cli.data.report import report_table

        typer.echo("")
        typer.echo(report_table(report))


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
    src_lang: SrcLangOpt = None,
    tgt_lang: TgtLangOpt = None,
    split: SplitOpt = True,
    format: Annotated[DocumentFormat, typer.Option("--format", help="auto (by the input's name, else its content: an HTML page, an XML document; stdin is text), text (line by line), html, xml, docx or odt: a document is translated whole, its markup and formatting kept.")] = DocumentFormat.auto,
    engine: EngineOpt = Engine.auto,
    *,
    decode: dict[str, object],
) -> None:
    """Translate a file or stdin; output lines match input lines one for one (N each with --nbest)."""
    from seq2seq_cli.decode.terms import Terminology
    from seq2seq_cli.documents.lines import OutputOptions
    from seq2seq_cli.documents.sentences import Splitter
    from seq2seq_cli.documents.text import translate_file
    from seq2seq_cli.documents.translate import check_document_options, input_format, translate_document

    check_streams(input, output)
    fmt = input_format(input, format)
    if fmt is DocumentFormat.docx:
        need_documents_extra("docx", "translating a .docx")
    terminology = Terminology.load(constraints, glossary)  # bad files are reported before the model loads
    per_line = ("forced prefixes decode with our searches" if prefix is not None else
                "constraints and glossary terms decode with our searches" if terminology is not None else None)
    translator = load_translator(model, device, decode, tag, engine, nbest, per_line, src_lang, tgt_lang)
    layers = translator.cfg.decoder_layers
    if not -layers <= attention_layer < layers:
        raise UserError(f"--attention-layer {attention_layer}: the model has {layers} decoder layers")
    if attention_head is not None and attention_head >= translator.cfg.heads:
        raise UserError(f"--attention-head {attention_head}: the model has {translator.cfg.heads} heads")
    splitter = Splitter(translator.languages[0]) if split else None
    opts = OutputOptions(nbest, scores, alignment, attention_plots, attention_layer, attention_head, terminology, splitter)
    if fmt is not DocumentFormat.text:
        check_document_options(fmt, opts, prefix)
        try:
            translate_document(translator, input, output, fmt, splitter)
        except ImportError as exc:
            raise UserError(f"translating {input} needs the documents extra ({exc.name} is missing): "
                            "pip install 'seq2seq[documents]'") from None
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
    model: Annotated[list[Path], typer.Option("--model", "-m", help="Run directory (uses best, else last checkpoint), a checkpoint file, or a folder of runs; repeat to serve several (a pair two runs offer goes to the first named).")],
    host: Annotated[str, typer.Option("--host", help="Address to listen on; the default answers this machine only (0.0.0.0: every interface).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", "-p", min=0, max=65535, help="TCP port to listen on.")] = 5000,
    batch_wait_ms: Annotated[float, typer.Option("--batch-wait-ms", min=0, help="How long the oldest queued request waits for others to be decoded with it (only while several clients are being served).")] = 5.0,
    batching: Annotated[bool, typer.Option("--batching/--no-batching", help="Decode the requests queued together in one batch (--no-batching: one request per batch).")] = True,
    max_queue: Annotated[int, typer.Option("--max-queue", min=1, help="Requests queued or being decoded; more are answered 503 with Retry-After.")] = 256,
    max_chars: Annotated[int, typer.Option("--max-chars", min=1, help="Characters of text per request; more are answered 413.")] = 20000,
    max_lines: Annotated[int, typer.Option("--max-lines", min=1, help="Lines (sentences) per request; more are answered 413.")] = 200,
    timeout: Annotated[float, typer.Option("--timeout", min=0.001, help="Seconds a request may wait for its translation; then 504.")] = 60.0,
    api_keys: Annotated[Path | None, typer.Option("--api-keys", help="File of API keys, one per line: requests must carry one (api_key field or X-API-Key header), else 403.")] = None,
    max_loaded: Annotated[int | None, typer.Option("--max-loaded", min=1, help="Runs loaded at once: each loaded on first use, the least recently used unloaded (default: all, at start).")] = None,
    device: DeviceOpt = "auto",
    tag: TagOpt = None,
    engine: EngineOpt = Engine.auto,
    *,
    decode: dict[str, object],
) -> None:
    """Serve runs over HTTP: a LibreTranslate-compatible API (each pair of each run, others through a pivot), /v1/translate with the decoding options, a web page at /."""
    try:
        from seq2seq_cli.serve.server import ServeSettings
        from seq2seq_cli.serve.server import serve as run_server
    except ImportError as exc:
        raise UserError(f"serve needs the serve extra ({exc.name} is missing): pip install 'seq2seq[serve]'") from None

    settings = ServeSettings(batch_wait_ms, max_queue, max_chars, max_lines, timeout, None, batching, max_loaded)
    run_server(model, device, decode, host, port, settings, api_keys, tag, engine)


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
    src_lang: SrcLangOpt = None,
    tgt_lang: TgtLangOpt = None,
    split: SplitOpt = True,
    engine: EngineOpt = Engine.auto,
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
        translator = load_translator(model, device, decode, tag, engine, src_lang=src_lang, tgt_lang=tgt_lang)
    elif tag is not None:
        raise UserError(f"--tag {tag}: goes with --model and --src (it is put in front of each source line)")
    elif src_lang is not None or tgt_lang is not None:
        raise UserError("--src-lang and --tgt-lang go with --model and --src (they pick the run's language pair)")
    translate = None
    if translator is not None and split:
        from seq2seq_cli.documents.lines import translate_sentences
        from seq2seq_cli.documents.sentences import Splitter

        translate = functools.partial(translate_sentences, translator.translate, splitter=Splitter(translator.languages[0]))
    scores = run_evaluation(ref, src=src, hyp=hyp, translator=translator, output=output, translate=translate,
                            split=translate is not None)
    if scores.split is not None:
        typer.echo("source lines cut into sentences, their translations joined back (--no-split: one line, one sentence)"
                   if scores.split else "each source line translated as one sentence (--no-split)", err=True)
    if as_json:
        typer.echo(json.dumps(scores.as_dict()))
    else:
        typer.echo(scores.bleu_line)
        typer.echo(scores.chrf_line)


@app.command()
@user_errors
def score(
    model: Annotated[Path, typer.Option("--model", "-m", metavar="RUN", help="Run (or checkpoint) of the source->target direction whose log-probabilities score the pairs.")],
    reverse_model: Annotated[Path | None, typer.Option("--reverse-model", metavar="RUN", help="A run of the other direction (target->source): each pair gets the dual conditional cross-entropy score of the two.")] = None,
    input: Annotated[Path | None, typer.Option("--input", "-i", help="The pairs, source<TAB>target a line; - = stdin.")] = None,
    src: Annotated[Path | None, typer.Option("--src", "-s", help="The sources, one a line (with --tgt, instead of --input).")] = None,
    tgt: Annotated[Path | None, typer.Option("--tgt", "-t", help="The targets, aligned with --src.")] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="Where the scores go, one a line in input order; - = stdout.")] = "-",
    batch_tokens: Annotated[int, typer.Option("--batch-tokens", min=1, help="Source or target tokens per batch, padding included.")] = 4096,
    device: DeviceOpt = "auto",
    src_lang: SrcLangOpt = None,
    tgt_lang: TgtLangOpt = None,
) -> None:
    """Score pairs with a trained model: each target's mean log-probability given its source (higher is better), or with --reverse-model the dual score; for data.train[].scores."""
    from seq2seq_cli.data.scoring import read_pairs, score_pairs
    from seq2seq_cli.device import pick_device
    from seq2seq_cli.fileio import terminate_as_interrupt
    from seq2seq_cli.run.loaded import load_run

    pairs, inputs = score_inputs(input, src, tgt, output, read_pairs)  # the files are checked before a model loads
    where = pick_device(device, setting="--device")
    runs = [load_run(m, where) for m in (model, reverse_model) if m is not None]
    with terminate_as_interrupt():  # SIGTERM removes the temporary file of -o, as Ctrl-C does
        count = score_pairs(runs, where, pairs, output, batch_tokens, inputs, src_lang, tgt_lang)
    if output != "-":
        typer.echo(f"wrote {count} scores to {output}", err=True)


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
    output: Annotated[Path, typer.Argument(help="Directory to write the exported model into (for argos, the .argosmodel file; a run of several language pairs: a directory, one package per pair).")],
    model: ModelOpt,
    format: Annotated[ExportFormat, typer.Option("--format", help="Target format: ctranslate2, hf (a MarianMTModel directory) or argos (an Argos Translate .argosmodel package).")] = ExportFormat.ctranslate2,
    quantization: Annotated[str | None, typer.Option("--quantization", help="CTranslate2 weight type, e.g. int8, float16; default float32.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite a non-empty output directory (or an existing .argosmodel).")] = False,
) -> None:
    """Export a trained model for another inference engine (CTranslate2, Argos Translate) or as a Hugging Face Marian model."""
    from seq2seq_cli.convert.exporting import export_run
    from seq2seq_cli.languages import pairs_line
    from seq2seq_cli.run.loaded import run_config

    for path in export_run(model, output, format, quantization, force):
        typer.echo(f"wrote {path}")
    if len((data := run_config(model).data).pairs) > 1 or data.language_tokens:  # the pairs and their tokens
        typer.echo(pairs_line(data))


@app.command("import")
@user_errors
def import_(
    source: Annotated[Path, typer.Argument(help="A local Hugging Face Marian directory (config.json, model.safetensors, source.spm, target.spm, vocab.json).")],
    output: Annotated[Path, typer.Argument(help="Run directory to write.")],
    src_lang: Annotated[str, typer.Option("--src-lang", help="Source language suffix recorded in the run's config (data.src_lang).")] = "src",
    tgt_lang: Annotated[str | None, typer.Option("--tgt-lang", help="Target language suffix recorded in the run's config (data.tgt_lang); default tgt. A multi-target model (>>xx<< tokens in its vocabulary) keeps its targets as data.target_tokens: one of them, the first by default.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite a non-empty run directory.")] = False,
) -> None:
    """Import a Hugging Face Marian (OPUS-MT) model into a run directory for translate, evaluate, export and info."""
    from seq2seq_cli.convert.hf_import import import_marian

    typer.echo(f"wrote {import_marian(source, output, src_lang, tgt_lang, force)}")


def main() -> None:
    run_guarded(app)

if __name__ == "__main__":
    main()
