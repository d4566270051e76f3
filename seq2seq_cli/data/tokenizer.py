"""SentencePiece subword models: train them into the run directory and load them back.

Ids are fixed for every model: pad 0, unk 1, bos 2, eos 3.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import sentencepiece as spm

from seq2seq_cli.config import Config
from seq2seq_cli.data.pages import release_dataset
from seq2seq_cli.errors import UserError
from seq2seq_cli.fileio import remove_dead_temps, sha256
from seq2seq_cli.ids import BOS, EOS, PAD, RESERVED_PIECES, UNK
from seq2seq_cli.layout import RunLayout


def model_paths(run_dir: Path, joint: bool) -> tuple[Path, Path]:
    """(source model, target model) paths inside a run directory; the same file when joint."""
    return RunLayout(run_dir).spm_models(joint)


def _check_ids(sp: spm.SentencePieceProcessor, path: Path) -> None:
    ids = {"pad": (sp.pad_id(), PAD), "unk": (sp.unk_id(), UNK), "bos": (sp.bos_id(), BOS), "eos": (sp.eos_id(), EOS)}
    wrong = [f"{name}={got} (expected {want})" for name, (got, want) in ids.items() if got != want]
    if wrong:
        raise UserError(
            f"{path}: SentencePiece model has {', '.join(wrong)}; train it with "
            "--pad_id=0 --unk_id=1 --bos_id=2 --eos_id=3"
        )


def _copy_model(given: Path, dest: Path, key: str) -> None:
    """Check a user-supplied SentencePiece model and copy it into the run directory."""
    if not given.is_file():
        raise UserError(f"{given}: SentencePiece model not found (tokenizer.{key})")
    try:
        sp = spm.SentencePieceProcessor(model_file=str(given))
    except (RuntimeError, OSError) as exc:
        raise UserError(f"{given}: not a SentencePiece model (tokenizer.{key}): {str(exc).strip().splitlines()[-1:]}") from None
    _check_ids(sp, given)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.copyfile(given, tmp)
    os.replace(tmp, dest)


def _sentences(dataset, columns: tuple[str, ...]) -> Iterator[str]:
    """The non-empty sentences of `columns`, the pages of each batch dropped once it is read
    (the RSS would otherwise grow to the whole corpus while SentencePiece samples it)."""
    for column in columns:
        for batch in dataset.select_columns([column]).iter(batch_size=10_000):
            yield from (s for s in batch[column] if s)
            release_dataset(dataset)


def language_shares(counts: dict[str, int], temperature: float) -> dict[str, float]:
    """The share of the tokenizer's sentences each language gets: proportional to
    (its sentences)^(1/temperature), as the pairs are drawn for training (1 = as many as it has)."""
    weights = {lang: n ** (1.0 / temperature) for lang, n in counts.items() if n}
    total = sum(weights.values())
    return {lang: w / total for lang, w in weights.items()}


def keep_rates(counts: dict[str, int], temperature: float) -> dict[str, float]:
    """The share of each language's sentences the tokenizer trains on so that the languages
    take `language_shares` of the text: the language furthest below its share is kept whole,
    the others sampled down to match."""
    shares = language_shares(counts, temperature)
    scale = min(counts[lang] / share for lang, share in shares.items())
    return {lang: min(1.0, scale * share / counts[lang]) for lang, share in shares.items()}


def balanced_sentences(datasets: list[Any], pairs: list[tuple[str, str]], columns: tuple[str, ...], temperature: float,
                       seed: int) -> Iterator[str]:
    """The sentences of `columns` of each corpus (`datasets`, whose languages are `pairs`),
    each language sampled at its `keep_rates` (a pure function of `seed`): a language with
    less text keeps its share of the subwords instead of being drowned by a larger one."""
    import numpy as np

    side = {"src": 0, "tgt": 1}
    counts: dict[str, int] = {}
    for dataset, pair in zip(datasets, pairs):
        for column in columns:
            lang = pair[side[column]]
            counts[lang] = counts.get(lang, 0) + sum(1 for _ in _sentences(dataset, (column,)))
    rates = keep_rates(counts, temperature)
    rng = np.random.default_rng([seed, 0x70C])
    for dataset, pair in zip(datasets, pairs):
        for column in columns:
            rate = rates.get(pair[side[column]], 0.0)
            for sentence in _sentences(dataset, (column,)):
                if rate >= 1.0 or rng.random() < rate:
                    yield sentence


def _train_one(inputs: list[Path] | Callable[[], Iterator[str]], prefix: Path, config: Config,
               symbols: list[str] | None = None) -> None:
    """Train on plain text files, or on the sentences an iterator factory yields; `symbols`
    become user-defined pieces (never split)."""
    t = config.tokenizer
    feed: dict[str, object] = {"input": [str(p) for p in inputs]} if isinstance(inputs, list) else {"sentence_iterator": inputs()}
    prefix.parent.mkdir(parents=True, exist_ok=True)
    source = ", ".join(map(str, inputs)) if isinstance(inputs, list) else ", ".join(map(str, config.data.corpora))
    if symbols:
        feed["user_defined_symbols"] = symbols
    # Train into a temporary prefix and rename, so an interrupted run never leaves half a model.
    remove_dead_temps(prefix.parent, ".spm-training.")
    with tempfile.TemporaryDirectory(dir=prefix.parent, prefix=f".spm-training.{os.getpid()}.", suffix=".tmp") as tmp:
        tmp_prefix = Path(tmp) / prefix.name
        try:
            spm.SentencePieceTrainer.train(
                **feed,  # type: ignore[arg-type]
                model_prefix=str(tmp_prefix),
                vocab_size=t.vocab_size,
                model_type=t.model_type,
                character_coverage=t.character_coverage,
                input_sentence_size=t.input_sentence_size,
                shuffle_input_sentence=True,
                pad_id=PAD,
                unk_id=UNK,
                bos_id=BOS,
                eos_id=EOS,
                num_threads=os.cpu_count() or 1,
                minloglevel=2,
            )
        except RuntimeError as exc:
            msg = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
            if "sentences_.empty()" in msg:
                raise UserError(f"{source}: no text to train the tokenizer on (every line is empty)") from None
            raise UserError(
                f"{source}: SentencePiece could not train (tokenizer.vocab_size={t.vocab_size}): {msg}"
            ) from None
        for suffix in (".model", ".vocab"):
            os.replace(f"{tmp_prefix}{suffix}", f"{prefix}{suffix}")


def make_tokenizer(config: Config) -> list[Path]:
    """Train the SentencePiece model(s) into the run directory, or copy the ones tokenizer.src_model/tgt_model
    name; return the model paths. Unguarded: `seq2seq_cli.run.tokenizing.train_tokenizer` holds the lock."""
    from seq2seq_cli.data.formats import corpus_sources, read_split

    d, t = config.data, config.tokenizer
    run_dir = config.run_path
    src_model, tgt_model = model_paths(run_dir, t.joint)
    if t.src_model is not None:
        try:
            given = spm.SentencePieceProcessor(model_file=str(t.src_model))
        except (RuntimeError, OSError):  # reported by _copy_model
            given = None
        for i, corpus in enumerate(d.corpora):  # a tag the supplied model would split is refused before the copy
            if corpus.tag and given is not None:
                tag_id(given, corpus.tag, f"{config.where('data', 'train', i, 'tag')} (tokenizer.src_model {t.src_model})")
        _copy_model(Path(t.src_model), src_model, "src_model")
        if not t.joint:
            _copy_model(Path(t.tgt_model or ""), tgt_model, "tgt_model")
        return [src_model] if t.joint else [src_model, tgt_model]
    sources = corpus_sources(config)
    # Every line is checked (UTF-8, alignment, columns, fields) before anything is trained.
    datasets = [read_split(config, corpus) for corpus in d.corpora]
    (source,) = sources if len(sources) == 1 else (None,)
    plain = source is not None and source.format == "text" and not any(f.suffix in (".gz", ".xz") for f in source.files)
    src_file, tgt_file = source.files if source is not None and plain else (None, None)

    def feed(*columns: str) -> list[Path] | Callable[[], Iterator[str]]:
        if len(d.pairs) > 1:  # several languages: each keeps its share of the subwords
            return lambda: balanced_sentences(datasets, [d.pair_of(c) for c in d.corpora], columns, d.temperature,
                                              config.train.seed)
        if src_file is not None and tgt_file is not None:  # plain
            return [{"src": src_file, "tgt": tgt_file}[c] for c in columns]
        return lambda: (s for dataset in datasets for s in _sentences(dataset, columns))

    tags = list(dict.fromkeys(d.language_tokens + d.tags))  # language tokens and corpus tags: single source pieces, never split
    if t.joint:
        _train_one(feed("src", "tgt"), src_model.with_suffix(""), config, tags)
        return [src_model]
    _train_one(feed("src"), src_model.with_suffix(""), config, tags)
    _train_one(feed("tgt"), tgt_model.with_suffix(""), config)
    return [src_model, tgt_model]


def all_pieces(sp: Any) -> list[str]:
    """Every piece of the tokenizer `sp` (a SentencePiece processor, or a vocabulary-file
    tokenizer), in id order."""
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def source_prefix(config: Config, sp: Any, index: int, entry: Any) -> list[int]:
    """The ids in front of each source of training corpus `index` (`entry`, a `CorpusConfig`):
    its target's language token in a run with several targets, then its tag."""
    d = config.data
    target = d.pair_of(entry)[1]
    ids = language_token_ids(sp, d.target_token(target), target, config.where("data", "train", index))
    if entry.tag:
        ids.append(tag_id(sp, entry.tag, config.where("data", "train", index, "tag")))
    return ids


def language_token_ids(sp: Any, token: str | None, target: str, where: str) -> list[int]:
    """[the id of `token`], the language token that names the target `target` in front of a
    source, or [] where there is none (a run of one target); UserError naming `where` where
    `token` is not one piece of `sp` (`tag_id`)."""
    return [tag_id(sp, token, f"{where}: the language token of {target}")] if token else []


def tag_id(sp: Any, tag: str, where: str) -> int:
    """The id of `tag`, which must be one piece of the tokenizer `sp` (a SentencePiece
    processor, or a vocabulary-file tokenizer) -> UserError naming `where` otherwise."""
    if tag in RESERVED_PIECES:
        piece_id, role = RESERVED_PIECES[tag]
        raise UserError(f"{where}: {tag!r} is the tokenizer's {role} piece (id {piece_id}); a tag is a piece of its own, "
                        f"not one of the reserved {', '.join(RESERVED_PIECES)}")
    vocab = getattr(sp, "vocab", None)
    if isinstance(vocab, dict):  # ids from a vocabulary file (an imported Marian model)
        if tag in vocab:
            return int(vocab[tag])
        raise UserError(f"{where}: tag {tag!r} is not in the model's vocabulary, so it would not be one token; "
                        "use a token the vocabulary has (e.g. >>fra<<)")
    pieces = sp.encode(tag, out_type=str)
    if pieces[:1] == ["\u2581"]:  # the word boundary SentencePiece puts in front of the text
        pieces = pieces[1:]
    piece_id = sp.piece_to_id(tag)
    if pieces == [tag] and piece_id != UNK:
        return int(piece_id)
    shown = " ".join(pieces)
    raise UserError(f"{where}: tag {tag!r} is not one piece of the tokenizer (it encodes as {shown}); "
                    "train the tokenizer with `seq2seq tokenize`, which makes every tag of data.train a "
                    "user-defined symbol, or give a SentencePiece model trained with --user_defined_symbols")


class VocabTokenizer:
    """Subwords from a SentencePiece model, ids from a vocabulary file (piece -> id), as Marian's:
    text -> pieces through the .spm model -> ids through the vocabulary, and back. The ids
    follow this tool's layout (pad 0, unk 1, eos 3); pieces not in the vocabulary are unk.
    Offers the part of SentencePieceProcessor's interface the tool uses."""

    def __init__(self, sp: spm.SentencePieceProcessor, vocab: dict[str, int]) -> None:
        self.sp = sp
        self.vocab = vocab
        self.pieces = [""] * len(vocab)
        for piece, i in vocab.items():
            self.pieces[i] = piece

    @classmethod
    def load(cls, spm_path: Path, vocab_path: Path) -> VocabTokenizer:
        for p in (spm_path, vocab_path):
            if not p.is_file():
                raise UserError(f"{p}: tokenizer file not found")
        return cls(spm.SentencePieceProcessor(model_file=str(spm_path)), read_vocab(vocab_path))

    def encode(self, text: str | list[str], return_type: str = "id") -> object:
        """Ids of a sentence (or of each sentence of a list); return_type proto gives the
        SentencePiece pieces with their surfaces, piece for piece as the ids."""
        if return_type == "proto":
            # the sentencepiece stubs do not list "immutable_proto", which the library accepts
            return self.sp.encode(text, out_type="immutable_proto")  # type: ignore[arg-type]
        if isinstance(text, str):
            return [self.vocab.get(p, UNK) for p in self.sp.encode(text, out_type=str)]
        return [[self.vocab.get(p, UNK) for p in pieces] for pieces in self.sp.encode(text, out_type=str)]

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode_pieces([self.pieces[i] for i in ids if i not in (PAD, EOS)])

    def id_to_piece(self, i: int) -> str:
        return self.pieces[i]

    def piece_to_id(self, piece: str) -> int:
        return self.vocab.get(piece, UNK)

    def get_piece_size(self) -> int:
        return len(self.pieces)


def read_vocab(path: Path) -> dict[str, int]:
    """A vocabulary file: a JSON object piece -> id with ids 0..N-1, each once."""
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not a JSON vocabulary ({exc})") from None
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
        raise UserError(f"{path}: expected a JSON object mapping each piece to an integer id")
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise UserError(f"{path}: ids must be 0..{len(vocab) - 1}, each used once")
    return vocab


def load_tokenizers(
    run_dir: Path, joint: bool, vocabulary: str = "sentencepiece"
) -> tuple[spm.SentencePieceProcessor, spm.SentencePieceProcessor]:
    """Load (source, target) processors from a run directory; the same object when joint.
    With vocabulary "file" they are `VocabTokenizer`s over source.spm/target.spm and
    vocab.json (target_vocab.json for the target when not joint)."""
    if vocabulary == "file":
        layout = RunLayout(run_dir)
        (src_spm, tgt_spm), (src_vocab, tgt_vocab) = layout.vocab_spm(), layout.vocab_files(joint)
        src_v = VocabTokenizer.load(src_spm, src_vocab)
        tgt_v = VocabTokenizer.load(tgt_spm, tgt_vocab)
        return src_v, tgt_v  # type: ignore[return-value]  # VocabTokenizer offers the SentencePieceProcessor calls the tool makes
    src_path, tgt_path = model_paths(run_dir, joint)
    for p in {src_path, tgt_path}:
        if not p.is_file():
            raise UserError(f"{p}: tokenizer model not found; run `seq2seq tokenize --config ...` first")
    src = _load_spm(src_path)
    tgt = src if joint else _load_spm(tgt_path)
    return src, tgt


def _load_spm(path: Path) -> spm.SentencePieceProcessor:
    try:
        return spm.SentencePieceProcessor(model_file=str(path))
    except (RuntimeError, OSError) as exc:
        detail = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{path}: not a SentencePiece model ({detail})") from None


TOKENIZER_SHA256 = "tokenizer_sha256"  # checkpoint metadata: {file name: sha256} of the files that decide the ids


def id_files(run_dir: Path, joint: bool, vocabulary: str) -> list[Path]:
    """The files of a run that decide which id a piece of text gets: the SentencePiece
    model(s), or source.spm/target.spm and the vocabulary file(s)."""
    if vocabulary == "file":
        layout = RunLayout(run_dir)
        return list(dict.fromkeys([*layout.vocab_spm(), *layout.vocab_files(joint)]))
    return list(dict.fromkeys(model_paths(run_dir, joint)))


def tokenizer_fingerprint(run_dir: Path, joint: bool, vocabulary: str) -> str | None:
    """The sha256 of each of the run's `id_files`, as JSON {name: sha256}, recorded in every
    checkpoint; None when a file is missing (a checkpoint saved outside a run directory)."""
    files = id_files(run_dir, joint, vocabulary)
    if not all(p.is_file() for p in files):
        return None
    return json.dumps({p.name: sha256(p) for p in files}, sort_keys=True)


def check_fingerprint(run_dir: Path, checkpoint: Path, fingerprint: str | None) -> None:
    """Refuse a tokenizer file whose sha256 is not the one `checkpoint` recorded (another
    tokenizer of the same size maps text to other ids). A checkpoint without a record (saved
    before checkpoints carried one) is not checked."""
    if not fingerprint:
        return
    try:
        recorded = json.loads(fingerprint)
    except ValueError:
        recorded = None
    if not isinstance(recorded, dict):
        raise UserError(f"{checkpoint}: its {TOKENIZER_SHA256} metadata is not a JSON object of file sha256s")
    for name, digest in sorted(recorded.items()):
        path = run_dir / str(name)
        if path.is_file() and sha256(path) != digest:
            raise UserError(
                f"{path}: tokenizer is not the one {checkpoint} was trained with (same size, but its sha256 differs "
                "from the one the checkpoint records); put back the run's own tokenizer file"
            )
