"""The `Translator`: a loaded run (or an ensemble) that translates sentences.

Sentences are encoded, sorted by length, cut into batches by a source-token budget and
decoded by the engine that can (CTranslate2's, where attached and the options allow) or by
our searches (beam, sampling, constrained beam search for lines with constraints), with
forced target prefixes where given (see `search`); the hypotheses come back in input order.
Rendering output lines (n-best, scores, alignments, plots) and cutting lines into sentences
belong to the documents wing (`seq2seq_cli/documents/lines.py`).

Attention-based extras (hard alignments, attention heatmaps, unknown-token replacement)
re-run the finished hypotheses through the decoder with the explicit attention path, so
search itself stays on the fast path.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seq2seq_cli.config import DecodeConfig
from seq2seq_cli.data.tokenizer import all_pieces, language_token_ids, tag_id
from seq2seq_cli.decode.deferred import Deferred, OnFirstUse
from seq2seq_cli.decode.hypotheses import NO_HYPOTHESIS, Hypothesis, max_source
from seq2seq_cli.decode.options import check_nbest, decode_settings, flag_name
from seq2seq_cli.decode.shortlisting import read_shortlist, shortlist_of, shortlisted
from seq2seq_cli.errors import UserError
from seq2seq_cli.ids import EOS, UNK
from seq2seq_cli.languages import choose_pair, run_pairs
from seq2seq_cli.layout import CONFIG

if TYPE_CHECKING:  # torch and the searches are imported when our searches first run (see `Deferred`)
    import torch
    from sentencepiece import SentencePieceProcessor
    from torch import Tensor
    from tqdm import tqdm

    from seq2seq_cli.config import ModelConfig
    from seq2seq_cli.decode.constraints import Phrases
    from seq2seq_cli.decode.engines import SearchEngine
    from seq2seq_cli.decode.steps import Decoder
    from seq2seq_cli.model.transformer import Seq2SeqTransformer

__all__ = ["Translator", "read_shortlist", "shortlisted"]
FEW_LINES = 64  # fewer lines are tokenized one by one (`Translator.encode`)


@dataclass
class Translator:
    """A loaded run: model, tokenizers and the decoding options to use. With several runs
    (`load` of a list), `model` is their `Ensemble` and the tokenizers, decoding settings and
    languages are the first run's. `model`, `listed` and `device` may be given as `Deferred`
    values (`seq2seq_cli/decode/deferred.py`): the model is loaded (and torch imported) the first
    time one of them is read (`seq2seq_cli/decode/loading.py`)."""

    if TYPE_CHECKING:
        model: Decoder
    else:  # the fields that may hold a `Deferred` value
        model: OnFirstUse = OnFirstUse()
    src_sp: SentencePieceProcessor
    tgt_sp: SentencePieceProcessor
    decode: DecodeConfig
    if TYPE_CHECKING:
        device: torch.device
    else:
        device: OnFirstUse = OnFirstUse()
    run_dir: Path | None = None  # the run directory the model was loaded from
    languages: tuple[str, str] = ("src", "tgt")  # the run's data.src_lang and data.tgt_lang
    _word_start: Tensor | None = field(default=None, repr=False)  # see `word_start`
    ensemble_runs: tuple[Path, ...] = ()  # the run directories of an ensemble's other members
    tag_ids: list[int] = field(default_factory=list)  # a tag's id, put in front of every source (`with_tag`)
    tags: tuple[str, ...] | None = None  # the corpus tags the run was trained with; None: any (an imported vocabulary)
    pairs: tuple[tuple[str, str], ...] = ()  # every (source, target) pair the run translates (`DataConfig.pairs`)
    target_tokens: dict[str, str] = field(default_factory=dict)  # target -> the source token naming it, where the run has them
    engine: SearchEngine | None = None  # another engine searching where it can (`seq2seq_cli/decode/engines.py`)
    if TYPE_CHECKING:  # with a shortlist: the model scoring only its shortlist (lines with no prefix)
        listed: Decoder | None = None
    else:
        listed: OnFirstUse = OnFirstUse(None)
    shortlist_file: Path | None = None  # the shortlist `listed` (and the engine) decode with; None: the whole vocabulary
    model_config: ModelConfig | None = field(default=None, repr=False)  # the model's config, before the model is loaded
    announce: Deferred[None] | None = field(default=None, repr=False)  # run once, before the first sentences are decoded

    @classmethod
    def load(
        cls, model_path: str | Path | Sequence[str | Path], device: str = "auto", overrides: dict[str, object] | None = None,
    ) -> Translator:
        """Load a run directory or checkpoint, or several as an ensemble (a list of two or
        more); `overrides` (DecodeConfig keys) replace the (first) run's decode settings and
        are validated like the config."""
        from seq2seq_cli.decode.ensemble import Ensemble, check_member
        from seq2seq_cli.decode.onednn import for_decoding
        from seq2seq_cli.device import decoding_dtype, pick_device
        from seq2seq_cli.run.loaded import load_run

        paths = [model_path] if isinstance(model_path, (str, Path)) else list(model_path)
        dev = pick_device(device, setting="--device")
        run = load_run(paths[0], dev)
        decode = decode_settings(run.config.decode, overrides or {}, int(run.meta["tgt_vocab"]), flag_name)
        shortlist = shortlist_of(run.layout, decode, len(paths))
        runs = [run]
        for path in paths[1:]:
            runs.append(load_run(path, dev))
            check_member(runs[-1], path, run, paths[0])
        # weights are fixed: pack them once
        models = [for_decoding(r.model.to(decoding_dtype(decode, dev)), decode.quantize) for r in runs]
        languages = (run.config.data.src_lang, run.config.data.tgt_lang)
        model: Decoder = models[0] if len(models) == 1 else Ensemble(models)
        others = tuple(r.run_dir for r in runs[1:])
        tags = None if run.config.tokenizer.vocabulary == "file" else tuple(run.config.data.tags)
        listed = None if shortlist is None else shortlisted(models[0], read_shortlist(shortlist, run.src_sp, run.tgt_sp))
        return cls(model, run.src_sp, run.tgt_sp, decode, dev, run.run_dir, languages, ensemble_runs=others, tags=tags,
                   listed=listed, shortlist_file=shortlist, model_config=model.cfg, **run_pairs(run.config.data))

    @property
    def cfg(self) -> ModelConfig:
        """The model's config (an ensemble's first member's), without loading the model."""
        if self.model_config is not None:
            return self.model_config
        return self.model.cfg

    @property
    def max_source(self) -> int:
        """The most source subwords (EOS not counted) a sentence is decoded from (`encode`)."""
        return max_source(self.cfg.max_positions)

    @property
    def attention_model(self) -> Seq2SeqTransformer:
        """The model whose cross-attention gives alignments, plots and unknown-word
        replacement: the model, or an ensemble's first member."""
        from seq2seq_cli.decode.ensemble import Ensemble

        return self.model.models[0] if isinstance(self.model, Ensemble) else self.model

    def run_dirs(self) -> list[Path]:
        """The run directories of the model (every member's, for an ensemble)."""
        return ([] if self.run_dir is None else [self.run_dir]) + list(self.ensemble_runs)

    def with_tag(self, tag: str | None) -> Translator:
        """This translator putting `tag` (one piece of the source tokenizer, e.g. '<bt>' or
        '>>fr<<') in front of every source line, as training put a corpus's tag; None: as it is."""
        if tag is None:
            return self
        ids = [tag_id(self.src_sp, tag, f"--tag {tag}")]
        if self.tags is not None and tag not in self.tags:
            config = self.run_dir / CONFIG if self.run_dir is not None else "the run's config"
            if not self.tags:
                raise UserError(f"--tag {tag}: the run was trained without tags (no corpus of data.train of {config} "
                                "has one); leave out --tag")
            raise UserError(f"--tag {tag}: the run was trained with the tags {', '.join(self.tags)} (data.train of "
                            f"{config}); give one of them")
        return self.replaced(tag_ids=ids)

    def with_pair(self, src: str | None, tgt: str | None) -> Translator:
        """This translator for the pair --src-lang and --tgt-lang pick: `choose_pair`, the token in front."""
        where = str(self.run_dir) if self.run_dir is not None else "the run"
        chosen = choose_pair(list(self.pairs) or [self.languages], src, tgt, where)
        ids = language_token_ids(self.src_sp, self.target_tokens.get(chosen[1]), chosen[1], where)
        return self.replaced(languages=chosen, tag_ids=ids + self.tag_ids)

    def with_engine(self, engine: SearchEngine | None) -> Translator:
        """This translator with `engine` searching where it can (None: our searches alone)."""
        return self.replaced(engine=engine)

    def replaced(self, **changes: Any) -> Translator:
        """A copy with `changes` (fields by name), sharing the model, loaded or not yet."""
        new = copy.copy(self)
        for name, value in changes.items():
            if name not in self.__dataclass_fields__:
                raise TypeError(f"Translator has no field {name!r}")
            setattr(new, name, value)
        return new

    def encode(self, lines: list[str], cut: list[int] | None = None) -> list[list[int]]:
        """Source ids + EOS (after the tag's id, if any), truncated to what the model's
        positions allow; the indices of the lines cut short are appended to `cut` when given."""
        limit = self.max_source
        # A list goes to SentencePiece's pool of threads, started for each call: 0.2-1 ms, more
        # than a few lines take one by one (about 10 us each).
        sp = self.src_sp
        encoded = sp.encode(lines) if len(lines) >= FEW_LINES else [sp.encode(line) for line in lines]
        if self.tag_ids:
            encoded = [self.tag_ids + s if s else s for s in encoded]
        if cut is not None:
            cut.extend(i for i, s in enumerate(encoded) if len(s) > limit)
        return [s[:limit] + [EOS] for s in encoded]

    def encode_prefixes(self, texts: list[str], where: Callable[[int], str]) -> list[list[int]]:
        """Forced prefixes as target ids, one per text (blank = none); a prefix longer than the
        model's outputs can be is a UserError naming `where(i)` (its file and line)."""
        limit = self.max_source
        prefixes = [self.tgt_sp.encode(t) if t.strip() else [] for t in texts]
        for i, p in enumerate(prefixes):
            if len(p) > limit:
                raise UserError(f"{where(i)}: the prefix has {len(p)} target pieces; the model's outputs hold at most {limit}")
        return prefixes

    def translate_hypotheses(
        self, lines: list[str], nbest: int = 1, ids: list[list[int]] | None = None, progress: tqdm | None = None,
        first_line: int = 0, prefixes: list[list[int]] | None = None, constraints: list[Phrases] | None = None,
    ) -> list[list[Hypothesis]]:
        """Decode a list of sentences -> their n-best hypotheses, in input order.

        `ids` are the lines already encoded (`encode`); `progress` advances by the sentences of
        each decoded batch (blank lines, which are not decoded, at once); `first_line` is the
        line number (from 0) of `lines[0]` in the whole input, which seeds sampling;
        `prefixes` (`encode_prefixes`, one per line) are forced at the start of the outputs
        (a blank line with a prefix gives the prefix alone); `constraints`: the target phrases
        (ids) of each line, decoded by constrained beam search (`seq2seq_cli/decode/constraints.py`);
        the lines without any decode as without."""
        import numpy as np

        from seq2seq_cli.data.batching import token_batches

        d = self.decode
        check_nbest(nbest, d, flag_name)
        if constraints is not None and any(constraints) and d.sampling:
            raise UserError("--constraints and --glossary need beam search; leave out --sampling")
        word_start = self.word_start() if constraints is not None and any(constraints) else None
        engine = self.engine if self.engine is not None and self.engine.why_not(d, nbest) is None else None
        if self.announce is not None:  # the command's first log line: which path decodes
            self.announce.get()
        if ids is None:
            ids = self.encode(lines)
        out: list[list[Hypothesis]] = [[NO_HYPOTHESIS] * nbest for _ in lines]
        todo = [i for i, line in enumerate(lines) if line.strip()]
        blank = [i for i, line in enumerate(lines) if not line.strip()]
        if blank:  # not translated: the empty output, with the model's score for it
            self._blank(blank, out, nbest, engine, prefixes)
        if progress is not None and len(todo) < len(lines):
            progress.update(len(lines) - len(todo))
        # Lines with constraints and lines without are batched apart: a batch then runs one
        # search, not both, each with its own steps.
        groups = [todo] if not constraints else [[i for i in todo if constraints[i]], [i for i in todo if not constraints[i]]]
        batches = []
        for group in groups:
            if len(group) == 1:  # a lone line (a request of one sentence): one batch, nothing to plan
                batches.append(group)
                continue
            lens = np.array([len(ids[i]) for i in group], dtype=np.int64)
            batches += [[group[j] for j in batch] for batch in token_batches(lens, lens, d.batch_tokens)]

        def decode(batch: list[int]) -> None:
            held = [i for i in batch if constraints and constraints[i]]
            rows = [i for i in batch if not (constraints and constraints[i])]
            if rows and engine:  # the engine takes the lines without a prefix; our search what it leaves
                taken = [i for i in rows if not (prefixes and prefixes[i])]
                by_engine = dict(zip(taken, engine.search([ids[i] for i in taken], d, nbest) if taken else []))
                for i, engine_hyps in by_engine.items():
                    if engine_hyps is not None:
                        out[i] = engine_hyps
                rows = [i for i in rows if by_engine.get(i) is None]
            if rows:
                self._search(rows, ids, out, nbest, first_line, prefixes)
            if held:
                assert constraints is not None
                self._search_constrained(held, ids, out, nbest, [constraints[i] for i in held], word_start)
            if progress is not None:
                progress.update(len(batch))

        if engine:  # it uses the threads itself, on each batch
            for rows in batches:
                decode(rows)
            return out
        from seq2seq_cli.decode.threads import decode_on_threads

        decode_on_threads(batches, decode, self.device)
        return out

    def _blank(self, blank: list[int], out: list[list[Hypothesis]], nbest: int, engine: SearchEngine | None,
               prefixes: list[list[int]] | None) -> None:
        """The hypotheses of the blank lines `blank`: the empty output (a line's prefix alone),
        scored by the engine where there is no prefix, else by our search."""
        from seq2seq_cli.decode.hypotheses import length_penalty

        if engine is not None and not (prefixes and any(prefixes[i] for i in blank)):
            log_prob = engine.empty_log_prob()
            for i in blank:
                out[i] = [Hypothesis([], log_prob / length_penalty(1, self.decode.length_penalty,
                                                                   self.decode.length_penalty_type), log_prob)]
                out[i] += [NO_HYPOTHESIS] * (nbest - 1)
            return
        from seq2seq_cli.data.batching import pad_batch
        from seq2seq_cli.decode.search import search

        d = self.decode
        empty = d.model_copy(update={"beam_size": 1, "sampling": False, "max_len_a": 0.0, "max_len_b": 0, "min_len": 0})
        src = pad_batch([[EOS]] * len(blank), [], []).to(self.device)
        # the prefix (or nothing) then EOS, all forced: its log-probability, EOS's included
        found = search(self.model, src, empty, 1, prefixes=[(prefixes[i] if prefixes else []) + [EOS] for i in blank])
        for i, hyps in zip(blank, found):
            out[i] = hyps + [NO_HYPOTHESIS] * (nbest - 1)

    def _search(self, rows: list[int], ids: list[list[int]], out: list[list[Hypothesis]], nbest: int, first_line: int,
                prefixes: list[list[int]] | None) -> None:
        """Our search over the lines `rows` (one batch); with a shortlist, the lines with a
        prefix apart, over the whole vocabulary (a prefix's tokens may be off the shortlist)."""
        from seq2seq_cli.data.batching import pad_batch
        from seq2seq_cli.decode.search import search

        listed = self.listed
        forced = [i for i in rows if prefixes and prefixes[i]] if listed is not None else rows
        taken = set(forced)
        free = [i for i in rows if i not in taken]
        for part, model in ((forced, self.model), (free, listed or self.model)):
            if not part:
                continue
            src = pad_batch([ids[i] for i in part], [], []).to(self.device)
            lines_of = [first_line + i for i in part]
            if prefixes:
                found = search(model, src, self.decode, nbest, lines_of, [prefixes[i] for i in part])
            else:
                found = search(model, src, self.decode, nbest, lines=lines_of)
            for i, hyps in zip(part, found):
                out[i] = hyps

    def _search_constrained(self, held: list[int], ids: list[list[int]], out: list[list[Hypothesis]], nbest: int,
                            constraints: list[Phrases], word_start: Tensor | None) -> None:
        """Constrained beam search over the lines `held` (one batch), their constraints given."""
        from seq2seq_cli.data.batching import pad_batch
        from seq2seq_cli.decode.constraints import constrained_beam_search
        from seq2seq_cli.decode.ensemble import Ensemble

        assert word_start is not None and not isinstance(self.model, Ensemble)  # refused in translate_file
        src = pad_batch([ids[i] for i in held], [], []).to(self.device)
        found = constrained_beam_search(self.model, src, self.decode, constraints, nbest, word_start)
        for i, hyps in zip(held, found):
            out[i] = hyps + [NO_HYPOTHESIS] * (nbest - len(hyps))

    def word_start(self) -> Tensor:
        """(V,) the target tokens that begin a word or hold no letter or digit (see
        `constrained_beam_search`), computed once."""
        if self._word_start is None:
            pieces = all_pieces(self.tgt_sp)
            starts = [p.startswith("\u2581") or not any(c.isalnum() for c in p) or (p.startswith("<") and p.endswith(">"))
                      for p in pieces]  # special pieces (<pad>, </s>, ...) count as word starts
            vocab = self.attention_model.tgt_embed.tokens.num_embeddings
            starts = (starts + [True] * vocab)[:vocab]
            import torch

            self._word_start = torch.tensor(starts, dtype=torch.bool, device=self.device)
        return self._word_start

    def translate(self, sentences: list[str]) -> list[str]:
        """Translate sentences (1-best) in input order."""
        return [self.tgt_sp.decode(h[0].tokens) for h in self.translate_hypotheses(sentences)]

    def cross_attention(self, src_ids: list[int], tokens: list[int], layer: int, head: int | None) -> Tensor:
        """Cross-attention of one hypothesis, teacher-forced -> (T+1, S): rows are output
        tokens then EOS, columns are source subwords then EOS."""
        import torch

        src = torch.tensor([src_ids], device=self.device)
        model = self.attention_model
        tgt_in = torch.tensor([[model.cfg.decoder_start_id] + tokens], device=self.device)
        with torch.no_grad():
            memory, src_mask, _ = model.encode(src)
            _, weights = model.decode(tgt_in, model.init_state(memory, src_mask), need_weights=True)
        w = weights[layer][0]  # (H, T+1, S)
        return (w.mean(dim=0) if head is None else w[head]).float().cpu()

    def render(self, tokens: list[int], src_line: str, attention: Tensor | None) -> str:
        """Detokenise; with replace_unk, each UNK becomes the most attended source piece."""
        if not (self.decode.replace_unk and UNK in tokens and attention is not None):
            return self.tgt_sp.decode(tokens)
        surfaces = [p.surface for p in self.src_sp.encode(src_line, return_type="proto").pieces]
        skip = len(self.tag_ids)  # the tag is not a piece of the line
        text = []
        for j, tok in enumerate(tokens):
            if tok == UNK:
                i = int(attention[j, skip : skip + len(surfaces)].argmax()) if surfaces else 0
                text.append(surfaces[i] if surfaces else "")
            else:
                text.append(self.tgt_sp.id_to_piece(tok).replace("\u2581", " "))
        return "".join(text).strip()
