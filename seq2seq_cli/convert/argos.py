"""Export a run as an Argos Translate package (`seq2seq export --format argos RUN.argosmodel`).

An `.argosmodel` is a zip archive of one directory, named as Argos names its own packages
(`translate-es_en-1_0`), that `argostranslate.package.install_from_path` unpacks into its
packages directory:

    model/               the CTranslate2 model (as `export --format ctranslate2` writes it)
    sentencepiece.model  the run's SentencePiece model: Argos encodes the source and decodes the
                         target with this one model, so the run's tokenizer must be joint
    metadata.json        package_version, argos_version, from_code/from_name, to_code/to_name, type
    spacy/               a rule-based sentence splitter for Argos (below)
    README.md            what the package holds and how to use it

Argos cuts text into sentences before it translates. Its default splitter (MiniSBD) fetches a
model for the source language on first use; with `ARGOS_CHUNK_TYPE=SPACY` it uses the
package's `spacy/` pipeline instead, and then nothing is fetched: spaCy's multilingual (`xx`)
tokenizer with one rule, sentence-final punctuation cut off the word before it, to which
Argos adds spaCy's rule-based `sentencizer` (a sentence ends after . ! ? and the like).
The pipeline is written as spaCy reads it from disk (config.cfg, meta.json and the
tokenizer's rules in MessagePack), so exporting needs no spaCy.

A package holds one language pair. A run of several (`data.pairs`) is written as a directory
of packages, one per pair (`es_en.argosmodel`, `ny_en.argosmodel`), each holding the same
model. Where the run names its targets by a token in front of the source (OPUS-MT's `>>es<<`,
`data.target_token`), the package's CTranslate2 model adds its target's token to every source
itself (config.json: `bos_token` is the token, `add_source_bos` true): Argos's metadata has a
`target_prefix` (a token forced at the start of the output, NLLB's form) but nothing for the
source, and its tokenizer gives the model the SentencePiece pieces of the text alone.

The archive is written beside OUT and renamed over it only when complete; an existing OUT is
replaced only with `--force`; the directory of a run of several pairs is built beside OUT and
replaces it as a whole (`convert/output.py`).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import zipfile
from pathlib import Path

from seq2seq_cli.convert.export import check_quantization, convert_ctranslate2, name_target, run_vocabularies
from seq2seq_cli.convert.output import check_output_dir, replacing_output
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import atomic_write
from seq2seq_cli.languages import language_name, pair_text
from seq2seq_cli.layout import RunLayout
from seq2seq_cli.run.checkpoint import resolve_checkpoint
from seq2seq_cli.run.loaded import load_run, run_config

PACKAGE_VERSION = "1.0"
ARGOS_VERSION = "1.10"  # the first argostranslate that reads a spaCy pipeline from a package

# Sentence-final punctuation (and a closing quote or bracket) is cut off the end of a word, so
# that spaCy's sentencizer sees it as a token of its own.
SENTENCE_END_SUFFIX = r"""(?:[.!?\u2026\u3002\uff01\uff1f\u061f\u0964]+|["'\u00bb\u201d\u2019)\]])$"""

SPACY_CONFIG = """[nlp]
lang = "xx"
pipeline = []
disabled = []
before_creation = null
after_creation = null
after_pipeline_creation = null
batch_size = 1000

[nlp.tokenizer]
@tokenizers = "spacy.Tokenizer.v1"

[components]
"""


def _msgpack_str(text: str) -> bytes:
    data = text.encode("utf-8")
    n = len(data)
    if n < 32:
        head = bytes([0xA0 | n])
    elif n < 0x100:
        head = bytes([0xD9, n])
    elif n < 0x10000:
        head = bytes([0xDA]) + n.to_bytes(2, "big")
    else:
        head = bytes([0xDB]) + n.to_bytes(4, "big")
    return head + data


def msgpack_str_map(entries: dict[str, str]) -> bytes:
    """A MessagePack map of strings to strings (fewer than 16 entries), as spaCy's tokenizer
    file holds its rules."""
    if len(entries) >= 16:
        raise ValueError("a MessagePack fixmap holds at most 15 entries")
    return bytes([0x80 | len(entries)]) + b"".join(_msgpack_str(k) + _msgpack_str(v) for k, v in entries.items())


def write_sentence_splitter(folder: Path) -> None:
    """Write the rule-based spaCy pipeline Argos splits sentences with (see the module's text)."""
    folder.mkdir()
    (folder / "config.cfg").write_text(SPACY_CONFIG, encoding="utf-8")
    meta = {"lang": "xx", "name": "sentence_splitter", "version": "1.0.0", "description":
            "spaCy's multilingual tokenizer, sentence-final punctuation split off; Argos adds the rule-based sentencizer"}
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    (folder / "tokenizer").write_bytes(msgpack_str_map({"suffix_search": SENTENCE_END_SUFFIX}))


def package_name(from_code: str, to_code: str, version: str = PACKAGE_VERSION) -> str:
    """The package's directory, as Argos names its own: translate-es_en-1_0."""
    return f"translate-{from_code}_{to_code}-{version.replace('.', '_')}"


def metadata(from_code: str, to_code: str) -> dict[str, object]:
    return {
        "package_version": PACKAGE_VERSION,
        "argos_version": ARGOS_VERSION,
        "type": "translate",
        "from_code": from_code,
        "from_name": language_name(from_code),
        "to_code": to_code,
        "to_name": language_name(to_code),
        "links": [],
    }


README = """# {from_name} -> {to_name}

A translation model trained with seq2seq and exported with `seq2seq export --format argos`.

- `model/`: the CTranslate2 model
- `sentencepiece.model`: the SentencePiece model of both languages
- `spacy/`: a rule-based sentence splitter; set `ARGOS_CHUNK_TYPE=SPACY` to use it (then
  nothing is downloaded), otherwise Argos splits sentences with its default splitter
{note}
Install it with `argospm install {file}` or `argostranslate.package.install_from_path`.
"""


TOKEN_NOTE = """- the model translates into several languages and names this one by the token {token} in
  front of the source: the CTranslate2 model adds it to every source itself (`model/config.json`:
  `bos_token` {token}, `add_source_bos` true), so Argos needs no `target_prefix`
"""


def check_output_file(out: Path, force: bool, run_dir: Path, ckpt: Path) -> None:
    """Refuse, before anything is converted, an output that would lose data: a directory, a
    path the exported run owns (`RunLayout.owner_of`), or any existing file without --force."""
    if out.is_dir():
        raise UserError(f"{out}: is a directory, expected a file name to write")
    owner = RunLayout(run_dir).owner_of(out)
    if out.resolve() == ckpt.resolve() or owner is not None:
        raise UserError(f"{out}: is a file of the run being exported ({run_dir}); write elsewhere")
    if out.exists() and not force:
        raise UserError(f"{out}: already exists; use --force to overwrite")


def export_argos(model_path: str | Path, out: Path, quantization: str | None = None, force: bool = False) -> Path:
    """Write a run (or checkpoint) as Argos Translate packages; returns `out`: the package file of
    a run of one language pair, or the directory that receives one package per pair
    (`FROM_TO.argosmodel`, `package_file`) of a run of several."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise UserError("Argos export needs the ctranslate2 package: pip install 'seq2seq[ctranslate2]'") from None
    check_quantization(quantization)
    out = Path(out)
    run_dir, ckpt = resolve_checkpoint(model_path)
    config = run_config(model_path)
    if config.tokenizer.vocabulary != "sentencepiece":
        raise UserError(f"{run_dir}: cannot be exported for Argos: it tokenizes with SentencePiece models alone, "
                        f"and this run uses tokenizer.vocabulary: {config.tokenizer.vocabulary}")
    pairs = config.data.pairs
    if len(pairs) == 1:
        check_output_file(out, force, run_dir, ckpt)
    else:
        if out.suffix == ".argosmodel" and not out.is_dir():
            raise UserError(f"{out}: {run_dir} translates {len(pairs)} language pairs ({pair_text(pairs)}), a package "
                            "each: give a directory to write them into")
        check_output_dir(out, force, [ckpt, run_dir], "exported")
    run = load_run(model_path, "cpu")
    sp_model = run.src_sp.serialized_model_proto()
    if sp_model != run.tgt_sp.serialized_model_proto():
        raise UserError(f"{run_dir}: cannot be exported for Argos: a package holds one SentencePiece model for both "
                        "languages, and this run's source and target tokenizers differ (tokenizer.joint: false)")
    data = run.config.data
    with tempfile.TemporaryDirectory(prefix="seq2seq-argos-") as stage:
        model_dir = Path(stage) / "model"
        convert_ctranslate2(run.model, *run_vocabularies(run), model_dir, quantization)
        if len(pairs) == 1:
            write_package(out, Path(stage), model_dir, sp_model, pairs[0], data.target_token(pairs[0][1]))
            return out
        with replacing_output(out) as folder:  # the old directory stays until every package is written
            for pair in pairs:
                write_package(folder / package_file(*pair), Path(stage), model_dir, sp_model, pair, data.target_token(pair[1]))
    return out


def package_file(from_code: str, to_code: str) -> str:
    """The file name of a pair's package in the directory of a run of several pairs: es_en.argosmodel."""
    return f"{from_code}_{to_code}.argosmodel"


def write_package(out: Path, stage: Path, model_dir: Path, sp_model: bytes, pair: tuple[str, str], token: str | None) -> None:
    """The package of one language pair written at `out`, staged in `stage`: the CTranslate2 model of
    `model_dir`, which puts the target's `token` in front of every source where the run has one
    (`export.name_target`), and the other files (see the module's text)."""
    from_code, to_code = pair
    name = package_name(from_code, to_code)
    root = stage / name
    root.mkdir()
    shutil.copytree(model_dir, root / "model")
    if token is not None:
        name_target(root / "model", token)
    (root / "sentencepiece.model").write_bytes(sp_model)
    (root / "metadata.json").write_text(json.dumps(metadata(from_code, to_code), indent=2) + "\n", encoding="utf-8")
    write_sentence_splitter(root / "spacy")
    note = TOKEN_NOTE.format(token=token) if token is not None else ""
    readme = README.format(from_name=language_name(from_code), to_name=language_name(to_code), file=out.name, note=note)
    (root / "README.md").write_text(readme, encoding="utf-8")

    def write(tmp: str) -> None:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for path in sorted(root.rglob("*")):
                zf.write(path, path.relative_to(stage).as_posix())

    atomic_write(out, write)
    shutil.rmtree(root)
