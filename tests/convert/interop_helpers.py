"""What the tests of the converters share: the Marian directories they import (a random
`MarianMTModel` saved by transformers, with a SentencePiece model trained here) and the
environment argostranslate runs in."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from conftest import SHIPPED

# The start of a script argostranslate runs in, in a fresh interpreter: every network connection is
# refused and recorded in `attempts` (to show that a package installs and translates offline),
# spaCy's sentence model is not fetched, and a missing argostranslate prints {"skip": why}.
ARGOS_OFFLINE = r"""
import json, socket, sys
attempts = []
def refuse(*args, **kwargs):
    attempts.append(repr(args[1:2]))
    raise OSError("network use refused by the test")
socket.socket.connect = refuse
socket.getaddrinfo = refuse
try:
    import argostranslate.networking
    argostranslate.networking.cache_spacy = lambda: None
    import argostranslate.package
    import argostranslate.settings
    import argostranslate.translate
except ImportError as exc:
    print(json.dumps({"skip": f"argostranslate cannot be imported ({type(exc).__name__}: {exc})"}))
    sys.exit(0)
"""


def shipped_lines() -> list[str]:
    """600 short lines (8 words at most) of the shipped validation split, Spanish then English."""
    return [" ".join(line.split()[:8]) for lang in ("es", "en")
            for line in (SHIPPED / f"valid.{lang}").read_text(encoding="utf-8").splitlines()[:300]]


def marian_spm(tmp: Path) -> Path:
    """A SentencePiece model of `shipped_lines` in Marian's id layout (eos 0, unk 1, no bos/pad), in `tmp`."""
    import sentencepiece as spm

    (tmp / "text.txt").write_text("\n".join(shipped_lines()) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(tmp / "text.txt"), model_prefix=str(tmp / "sp"), vocab_size=120, minloglevel=2,
        eos_id=0, unk_id=1, bos_id=-1, pad_id=-1,
    )
    return tmp / "sp.model"


def marian_dir(root: Path, spm_model: Path, shared: bool, activation: str, languages: tuple[str, ...] = ()) -> Path:
    """save_pretrained of a small random MarianMTModel and its MarianTokenizer; `languages`: the
    targets of a multi-target model, whose tokens (>>es<< ...) come after eos and unk in the
    vocabulary, as in OPUS-MT's."""
    import sentencepiece as spm
    import transformers

    out = root / "-".join(["marian", str(shared), activation, *languages])
    out.mkdir()
    sp = spm.SentencePieceProcessor(model_file=str(spm_model))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    pieces = pieces[:2] + [f">>{lang}<<" for lang in languages] + pieces[2:] + ["<pad>"]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    V = len(vocab)
    for name in ("source.spm", "target.spm"):
        shutil.copyfile(spm_model, out / name)
    (out / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    config = transformers.MarianConfig(
        vocab_size=V, decoder_vocab_size=V, d_model=16, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
        max_position_embeddings=64, activation_function=activation, scale_embedding=True,
        pad_token_id=V - 1, decoder_start_token_id=V - 1, eos_token_id=0, forced_eos_token_id=0,
        share_encoder_decoder_embeddings=shared,
    )
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():  # weights large enough for outputs to depend on them; positions stay Marian's table
        for name, p in model.named_parameters():  # (and with languages the LayerNorms the identity: random ones give
            if "embed_positions" not in name and not (languages and "layer_norm" in name):  # every source one output)
                p.normal_(0.0, 0.4)
        model.final_logits_bias.normal_()
    model.save_pretrained(out)
    transformers.MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json")).save_pretrained(out)
    return out


def argos_env(tmp_path: Path) -> dict[str, str]:
    """The environment of an argostranslate process: its HOME, XDG directories and packages in
    `tmp_path`, sentences split by the package's spaCy pipeline, float32 on one CPU thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ARGOS_", "XDG_"))}
    home = tmp_path / "home"
    env.update(HOME=str(home), XDG_DATA_HOME=str(home / "data"), XDG_CONFIG_HOME=str(home / "config"),
               XDG_CACHE_HOME=str(home / "cache"), ARGOS_PACKAGES_DIR=str(tmp_path / "argos-packages"),
               ARGOS_CHUNK_TYPE="SPACY", ARGOS_DEVICE_TYPE="cpu", ARGOS_INTRA_THREADS="1",
               # its default, auto, lets CTranslate2 compute in int8 on a CPU that has it; ours is float32
               ARGOS_COMPUTE_TYPE="float32")
    return env


def ending_as_ours(hf):
    """`hf` (a MarianMTModel) generating as this project's search ends an output that reaches
    its limit: with the token of that step, no EOS (as CTranslate2 does). OPUS-MT's
    configuration forces EOS there instead (`forced_eos_token_id`); everywhere else the two agree."""
    hf.generation_config.forced_eos_token_id = None
    return hf
