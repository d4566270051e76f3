"""A document's sentences translated with each output word aligned to the source subwords it
attends to most (what places the markup of `markup.py`, `docx.py` and `odt.py` around words).

A sentence longer than the model's positions is not cut short: it is translated in pieces cut
between words, each as long as the model takes, and the pieces' translations are joined into
the sentence's (`Aligned.pieces` says how many, for the warning the caller gives).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

from seq2seq_cli.documents.placing import Aligned

if TYPE_CHECKING:
    from seq2seq_cli.decode.translate import Translator

WORD = re.compile(r"\S+")


def aligned(translator: Translator, sentence: str, tokens: list[int], links: list[int]) -> Aligned:
    """One translated sentence as words with their aligned source subwords; `links`: for each
    output token, the source piece (of the sentence, a tag not counted) it attends to most."""
    sp = translator.src_sp
    raw = sentence.encode("utf-8")
    sources = []
    for piece in sp.encode(sentence, return_type="proto").pieces:
        start = len(raw[: piece.begin].decode("utf-8", errors="ignore"))
        end = len(raw[: piece.end].decode("utf-8", errors="ignore"))
        surface = sentence[start:end]
        sources.append((start + len(surface) - len(surface.lstrip()), end))
    groups: list[list[int]] = []  # token positions of each word
    for j, tok in enumerate(tokens):
        if not groups or translator.tgt_sp.id_to_piece(tok).startswith("\u2581"):
            groups.append([])
        groups[-1].append(j)
    words = [translator.tgt_sp.decode([tokens[j] for j in g]) for g in groups]
    kept = [(w, [links[j] for j in g if j < len(links)]) for w, g in zip(words, groups) if w]
    return Aligned([w for w, _ in kept], [ls for _, ls in kept], sources)


def pieces(translator: Translator, sentence: str) -> list[tuple[int, str]]:
    """The sentence as (character offset, text) pieces, each within the model's source
    positions where its words allow (a single word longer than that is a piece of its own):
    the sentence whole when it fits, else cut between words into pieces of about equal length."""
    limit = translator.max_source - len(translator.tag_ids)
    words = list(WORD.finditer(sentence))
    if len(words) < 2 or len(translator.src_sp.encode(sentence)) <= limit:
        return [(0, sentence)]
    counts = [len(ids) for ids in translator.src_sp.encode([w.group() for w in words])]
    total = sum(counts)
    target = math.ceil(total / math.ceil(total / max(1, limit)))
    out: list[tuple[int, str]] = []
    start = size = 0
    for k, count in enumerate(counts):
        if size and size + count > target:
            end = words[k - 1].end()
            out.append((words[start].start(), sentence[words[start].start():end]))
            start, size = k, 0
        size += count
    out.append((words[start].start(), sentence[words[start].start():words[-1].end()]))
    return out


def _join(parts: list[tuple[int, Aligned]]) -> Aligned:
    """The translations of a sentence's pieces (offset, aligned) as the sentence's."""
    words: list[str] = []
    links: list[list[int]] = []
    sources: list[tuple[int, int]] = []
    for offset, a in parts:
        base = len(sources)
        words += a.words
        links += [[base + i for i in ls] for ls in a.links]
        sources += [(offset + s, offset + e) for s, e in a.sources]
    return Aligned(words, links, sources, len(parts))


def translate_aligned(translator: Translator, sentences: list[str]) -> list[Aligned]:
    """Translate sentences (1-best) and align each output token to a source piece by the last
    decoder layer's cross-attention (mean over heads); a sentence too long for the model is
    translated in `pieces`."""
    if not sentences:
        return []
    cut = [pieces(translator, s) for s in sentences]
    flat = [text for parts in cut for _, text in parts]
    ids = translator.encode(flat)
    done = []
    skip = len(translator.tag_ids)
    for sentence, src, hyps in zip(flat, ids, translator.translate_hypotheses(flat, 1, ids)):
        tokens = hyps[0].tokens
        links: list[int] = []
        if tokens and len(src) - 1 > skip:
            attention = translator.cross_attention(src, tokens, -1, None)
            links = attention[: len(tokens), skip : len(src) - 1].argmax(dim=1).tolist()
        done.append(aligned(translator, sentence, tokens, links))
    out, k = [], 0
    for parts in cut:
        mine = done[k : k + len(parts)]
        k += len(parts)
        out.append(mine[0] if len(parts) == 1 else _join([(offset, a) for (offset, _), a in zip(parts, mine)]))
    return out
