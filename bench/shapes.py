"""What the benchmarks share: the model-shape flags and the same shapes as HF Marian and as ours."""

from __future__ import annotations

import argparse

import torch

from seq2seq_cli.config import ModelConfig
from seq2seq_cli.model.transformer import Seq2SeqTransformer, build_model


def add_shape_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--threads", type=int, default=2)


def our_model(args: argparse.Namespace, dropout: float) -> Seq2SeqTransformer:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=args.d_model, heads=args.heads, ffn_size=args.ffn, encoder_layers=args.layers,
                      decoder_layers=args.layers, dropout=dropout, max_positions=512)
    return build_model(cfg, args.vocab, args.vocab, True)


def hf_marian(args: argparse.Namespace, dropout: float):
    """HF MarianMTModel with our shapes: post-norm, ReLU, scaled tied embeddings."""
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(0)
    return MarianMTModel(MarianConfig(
        vocab_size=args.vocab, decoder_vocab_size=args.vocab, d_model=args.d_model, encoder_layers=args.layers,
        decoder_layers=args.layers, encoder_attention_heads=args.heads, decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.ffn, decoder_ffn_dim=args.ffn, max_position_embeddings=512, pad_token_id=0,
        eos_token_id=3, bos_token_id=2, decoder_start_token_id=2, activation_function="relu", scale_embedding=True,
        share_encoder_decoder_embeddings=True, dropout=dropout,
    ))


def shape_config(args: argparse.Namespace) -> ModelConfig:
    """The ModelConfig of the shape flags (dropout aside): what `our_model` builds."""
    return ModelConfig(d_model=args.d_model, heads=args.heads, ffn_size=args.ffn, encoder_layers=args.layers,
                       decoder_layers=args.layers, max_positions=512)
