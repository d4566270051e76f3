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

The archive is written beside OUT and renamed over it only when complete; an existing OUT is
replaced only with `--force`.
"""

from __future__ import annotations

import json
import tempfile
import zipfile
from pathlib import Path

from seq2seq_cli.convert.export import check_quantization, convert_ctranslate2, run_vocabularies
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import atomic_write
from seq2seq_cli.languages import language_name
from seq2seq_cli.layout import RunLayout
from seq2seq_cli.run.checkpoint import resolve_checkpoint
from seq2seq_cli.run.loaded import load_run

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

Install it with `argospm install {file}` or `argostranslate.package.install_from_path`.
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
    """Write a run (or checkpoint) as an Argos Translate package at `out`; returns it."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise UserError("Argos export needs the ctranslate2 package: pip install 'seq2seq[ctranslate2]'") from None
    check_quantization(quantization)
    out = Path(out)
    run_dir, ckpt = resolve_checkpoint(model_path)
    check_output_file(out, force, run_dir, ckpt)
    run = load_run(model_path, "cpu")
    tok = run.config.tokenizer
    if tok.vocabulary != "sentencepiece":
        raise UserError(f"{run_dir}: cannot be exported for Argos: it tokenizes with SentencePiece models alone, "
                        f"and this run uses tokenizer.vocabulary: {tok.vocabulary}")
    sp_model = run.src_sp.serialized_model_proto()
    if sp_model != run.tgt_sp.serialized_model_proto():
        raise UserError(f"{run_dir}: cannot be exported for Argos: a package holds one SentencePiece model for both "
                        "languages, and this run's source and target tokenizers differ (tokenizer.joint: false)")
    from_code, to_code = run.config.data.src_lang, run.config.data.tgt_lang
    name = package_name(from_code, to_code)
    src_vocab, tgt_vocab = run_vocabularies(run)
    with tempfile.TemporaryDirectory(prefix="seq2seq-argos-") as stage:
        root = Path(stage) / name
        root.mkdir()
        convert_ctranslate2(run.model, src_vocab, tgt_vocab, root / "model", quantization)
        (root / "sentencepiece.model").write_bytes(sp_model)
        (root / "metadata.json").write_text(json.dumps(metadata(from_code, to_code), indent=2) + "\n", encoding="utf-8")
        write_sentence_splitter(root / "spacy")
        readme = README.format(from_name=language_name(from_code), to_name=language_name(to_code), file=out.name)
        (root / "README.md").write_text(readme, encoding="utf-8")

        def write(tmp: str) -> None:
            with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
                for path in sorted(root.rglob("*")):
                    zf.write(path, path.relative_to(stage).as_posix())

        atomic_write(out, write)
    return out
