"""Reading a corpus leaves none of its Arrow pages resident: the pages of the memory-mapped
files count in the process's RSS, so a tokenizer trained after reading (and checking) every
line of a large corpus would otherwise carry the whole corpus in memory (Linux only)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps is Linux's")


def resident_kib(paths: set[str]) -> int:
    """KiB of this process's resident pages of the mapped files `paths`."""
    total, current = 0, None
    with open("/proc/self/smaps", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
                current = fields[5] if len(fields) > 5 else None
            elif fields[0] == "Rss:" and current in paths:
                total += int(fields[1])
    return total


def write_corpus(folder: Path, pairs: int) -> str:
    folder.mkdir()
    for lang, word in (("es", "palabra"), ("en", "word")):
        lines = (f"{i} " + " ".join([word] * (i % 30 + 5)) + "\n" for i in range(pairs))
        (folder / f"big.{lang}").write_text("".join(lines), encoding="utf-8")
    return str(folder / "big")


@pytest.mark.parametrize("form", ["text", "tsv"])
def test_a_read_corpus_keeps_none_of_its_pages_resident(tmp_path, form):
    from seq2seq_cli.data.formats import read_parallel

    prefix = write_corpus(tmp_path / "corpus", 40_000)  # about 10 MB of Arrow
    value = prefix
    if form == "tsv":
        src, tgt = (Path(f"{prefix}.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("es", "en"))
        value = f"{prefix}.tsv"
        Path(value).write_text("".join(f"{s}\t{t}\n" for s, t in zip(src, tgt, strict=True)), encoding="utf-8")
    ds = read_parallel(value, "es", "en", tmp_path / "cache")
    files = {str(Path(f["filename"]).resolve()) for f in ds.cache_files}
    assert files and sum(Path(f).stat().st_size for f in files) > 8 << 20
    assert resident_kib(files) < 1024, resident_kib(files)
    assert len(ds) == 40_000 and ds[39_999]["tgt"].startswith("39999 word")  # still readable


def test_the_source_sides_pages_are_dropped_before_the_target_side_is_read(tmp_path, monkeypatch):
    """Of a corpus in two text files, the source side's pages go before the target side is
    loaded, so the read's peak holds one side's pages, not both."""
    from seq2seq_cli.data import formats

    loaded: list = []
    resident_at_start: list[int] = []
    load = formats._load_lines

    def spy(path, cache_dir):
        resident_at_start.append(resident_kib({str(Path(f["filename"]).resolve()) for d in loaded for f in d.cache_files}))
        loaded.append(load(path, cache_dir))
        return loaded[-1]

    monkeypatch.setattr(formats, "_load_lines", spy)
    formats.read_parallel(write_corpus(tmp_path / "corpus", 40_000), "es", "en", tmp_path / "cache")
    assert len(resident_at_start) == 2 and loaded[0].cache_files
    assert resident_at_start[1] < 512, resident_at_start


def test_training_the_tokenizer_on_a_tsv_corpus_keeps_none_of_its_pages_resident(tmp_path, monkeypatch):
    """SentencePiece reads a TSV/JSONL corpus through the dataset, batch by batch: the pages
    of each batch are dropped once it is read."""
    import sentencepiece as spm

    from seq2seq_cli.config import Config, DataConfig, FiltersConfig, TokenizerConfig, TrainConfig
    from seq2seq_cli.data import tokenizer

    prefix = write_corpus(tmp_path / "corpus", 25_000)
    src, tgt = (Path(f"{prefix}.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("es", "en"))
    tsv = tmp_path / "big.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in zip(src, tgt, strict=True)), encoding="utf-8")
    config = Config(name="t", run_dir=str(tmp_path / "run"), data=DataConfig(train=str(tsv), src_lang="es", tgt_lang="en",
                                                                              filters=FiltersConfig(enabled=False)),
                    tokenizer=TokenizerConfig(vocab_size=60, input_sentence_size=2000), train=TrainConfig(max_steps=1))
    seen: list[int] = []
    real = spm.SentencePieceTrainer.train

    def counting(**kwargs):  # what the sentences left resident, once SentencePiece has read them all
        sentences = list(kwargs.pop("sentence_iterator"))
        mapped = {line.split()[-1] for line in open("/proc/self/maps", encoding="utf-8")
                  if line.rstrip().endswith(".arrow") and str(tmp_path) in line}
        seen.append(resident_kib(mapped))
        real(sentence_iterator=iter(sentences), **kwargs)

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", counting)
    tokenizer.make_tokenizer(config)
    assert seen and max(seen) < 1024, seen


def test_the_steps_of_encoding_leave_no_pages_resident_for_the_next(tmp_path, monkeypatch):
    """Encoding reads `datasets`' Arrow files step after step (the encoded pairs, their drop
    codes, the kept pairs, their lengths); each step's pages are dropped before the next, so
    that they do not add up: none are resident when the kept pairs start being written, and
    none once the corpus is open."""
    import sentencepiece as spm

    from seq2seq_cli.config import Config, DataConfig, FiltersConfig, TokenizerConfig, TrainConfig
    from seq2seq_cli.data import encoding

    prefix = write_corpus(tmp_path / "corpus", 40_000)
    sp_prefix = tmp_path / "spm"
    spm.SentencePieceTrainer.train(input=f"{prefix}.es,{prefix}.en", model_prefix=str(sp_prefix), vocab_size=60,
                                   input_sentence_size=2000, bos_id=1, eos_id=2, pad_id=0, unk_id=3, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=f"{sp_prefix}.model")
    config = Config(name="t", run_dir=str(tmp_path / "run"), data=DataConfig(train=prefix, src_lang="es", tgt_lang="en",
                                                                              filters=FiltersConfig(enabled=False)),
                    tokenizer=TokenizerConfig(vocab_size=60), train=TrainConfig(max_steps=1))

    def mapped() -> set[str]:
        return {line.split()[-1] for line in open("/proc/self/maps", encoding="utf-8")
                if line.rstrip().endswith(".arrow") and str(tmp_path / "run") in line}

    at_write: list[int] = []
    write = encoding._write_kept

    def spy(encoded, keep, path, release):
        at_write.append(resident_kib(mapped()))
        return write(encoded, keep, path, release)

    monkeypatch.setattr(encoding, "_write_kept", spy)
    corpus = encoding.encoded_split(config, prefix, sp, sp, training=True)
    assert len(corpus) == 40_000 and at_write
    assert sum(Path(f).stat().st_size for f in mapped()) > 8 << 20
    assert at_write[0] < 1024, at_write
    assert resident_kib(mapped()) < 1024, resident_kib(mapped())


def test_a_release_never_touches_memory_mapped_where_a_file_was_mapped_before(tmp_path):
    """A mapping found once may be unmapped and its addresses reused (by the heap, for large
    allocations); DONTNEED there would wipe live memory. The mappings are looked up at every
    call: here anonymous memory put exactly where the file was survives the release."""
    import ctypes
    import mmap

    from seq2seq_cli.data.pages import PageRelease

    (tmp_path / "data").mkdir()
    path = tmp_path / "data" / "file.bin"
    path.write_bytes(b"x" * (1 << 20))
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    start = next(int(line.split("-")[0], 16) for line in open("/proc/self/maps", encoding="utf-8")
                 if line.rstrip().endswith(str(path.resolve())))
    release = PageRelease(tmp_path / "data")
    assert release.ranges == [(start, start + (1 << 20))]
    mapped.close()

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    fixed_noreplace = 0x100000
    anon = libc.mmap(start, 1 << 20, mmap.PROT_READ | mmap.PROT_WRITE,
                     mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | fixed_noreplace, -1, 0)
    if anon != start:
        pytest.skip("the kernel did not give the same addresses back")
    try:
        ctypes.memset(start, 7, 1 << 20)
        release()
        assert ctypes.string_at(start, 16) == bytes([7]) * 16 and ctypes.string_at(start + (1 << 19), 16) == bytes([7]) * 16
    finally:
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.munmap(start, 1 << 20)
