"""Export a trained run to other inference engines.

CTranslate2 (`pip install 'seq2seq[ctranslate2]'`): the weights are mapped onto its
Transformer specification (post- or pre-norm, the feed-forward activation, the embedding
scale of `model.scale_embedding`, our positional table exported as-is, tied output
projection and a fixed logits bias where the model has one), with the run's pieces as
vocabulary in id order.
The exported model expects SentencePiece pieces as input tokens; CTranslate2 appends the
end-of-sentence token itself and starts decoding from the model's start token (`<s>`, or
`<pad>` for a model imported from Marian), as our search does. A run's shortlist
(RUN/shortlist.tsv) goes with it as `vmap.txt`, CTranslate2's vocabulary map
(`translate_batch(..., use_vmap=True)`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from seq2seq_cli.convert.output import check_output_dir, replacing_output
from seq2seq_cli.data.tokenizer import all_pieces
from seq2seq_cli.errors import UserError
from seq2seq_cli.layout import RunLayout
from seq2seq_cli.run.checkpoint import resolve_checkpoint
from seq2seq_cli.run.loaded import LoadedRun, RunFiles, load_run

if TYPE_CHECKING:  # the converter reads a loaded model; importing it needs no torch (the CTranslate2 engine's start)
    from seq2seq_cli.model.attention import MultiHeadAttention
    from seq2seq_cli.model.transformer import Seq2SeqTransformer

VMAP = "vmap.txt"  # CTranslate2's vocabulary map in a model directory


def _linear(spec, layer) -> None:
    spec.weight = layer.weight.detach().float().numpy()
    if layer.bias is not None:
        spec.bias = layer.bias.detach().float().numpy()


def _norm(spec, norm) -> None:
    spec.gamma = norm.weight.detach().float().numpy()
    spec.beta = norm.bias.detach().float().numpy()


def _attention(spec, attn: MultiHeadAttention, self_attention: bool) -> None:
    from ctranslate2.converters.utils import fuse_linear
    from ctranslate2.specs import common_spec

    if self_attention:
        parts = [common_spec.LinearSpec() for _ in range(3)]
        for part, layer in zip(parts, (attn.w_q, attn.w_k, attn.w_v)):
            _linear(part, layer)
        fuse_linear(spec.linear[0], parts)
    else:
        _linear(spec.linear[0], attn.w_q)
        parts = [common_spec.LinearSpec() for _ in range(2)]
        for part, layer in zip(parts, (attn.w_k, attn.w_v)):
            _linear(part, layer)
        fuse_linear(spec.linear[1], parts)
    _linear(spec.linear[-1], attn.w_o)


def _inputs(spec, embed) -> None:
    table = embed.positions.weight if embed.learned else embed.table
    if embed.types is not None:  # every token is type 0: a constant added at every position
        table = table + embed.types.weight[0]
    spec.position_encodings.encodings = table.detach().float().numpy()
    emb = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    emb.weight = embed.tokens.weight.detach().float().numpy()
    spec.scale_embeddings = embed.scale if embed.scale != 1.0 else False  # model.scale_embedding: sqrt(d_model), or none


def ctranslate2_spec(model: Seq2SeqTransformer, src_vocab: list[str], tgt_vocab: list[str]):
    """Build a CTranslate2 TransformerSpec holding the model's weights."""
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.cfg
    if cfg.head_q_k_size != cfg.head_v_size or cfg.head_q_k_size * cfg.heads != cfg.d_model:
        raise UserError("CTranslate2 export needs q_k_size = v_size = d_model / heads")
    pre = cfg.norm == "pre"
    activation = {"relu": common_spec.Activation.RELU, "swish": common_spec.Activation.SWISH,
                  "gelu": common_spec.Activation.GELU}[cfg.activation]  # GELU: the exact (erf) form, as F.gelu
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers), cfg.heads, pre_norm=pre, activation=activation
    )
    enc, dec = spec.encoder, spec.decoder
    _inputs(enc, model.src_embed)
    _inputs(dec, model.tgt_embed)
    for layer_spec, enc_layer in zip(enc.layer, model.encoder_layers()):
        _attention(layer_spec.self_attention, enc_layer.self_attn, True)
        _norm(layer_spec.self_attention.layer_norm, enc_layer.attn_block.norm)
        _linear(layer_spec.ffn.linear_0, enc_layer.ffn.w_1)
        _linear(layer_spec.ffn.linear_1, enc_layer.ffn.w_2)
        _norm(layer_spec.ffn.layer_norm, enc_layer.ffn_block.norm)
    for layer_spec, layer in zip(dec.layer, model.decoder_layers()):
        _attention(layer_spec.self_attention, layer.self_attn, True)
        _norm(layer_spec.self_attention.layer_norm, layer.self_block.norm)
        _attention(layer_spec.attention, layer.cross_attn, False)
        _norm(layer_spec.attention.layer_norm, layer.cross_block.norm)
        _linear(layer_spec.ffn.linear_0, layer.ffn.w_1)
        _linear(layer_spec.ffn.linear_1, layer.ffn.w_2)
        _norm(layer_spec.ffn.layer_norm, layer.ffn_block.norm)
    if pre:
        _norm(enc.layer_norm, model.encoder_norm)
        _norm(dec.layer_norm, model.decoder_norm)
    dec.projection.weight = (
        model.tgt_embed.tokens.weight if model.output is None else model.output.weight
    ).detach().float().numpy()
    if model.logits_bias is not None:
        dec.projection.bias = model.logits_bias.detach().float().numpy()
    spec.register_source_vocabulary(src_vocab)
    spec.register_target_vocabulary(tgt_vocab)
    spec.config.add_source_eos = True
    spec.config.decoder_start_token = tgt_vocab[cfg.decoder_start_id]
    return spec


def check_quantization(quantization: str | None) -> None:
    """A CTranslate2 weight type, checked before anything is converted."""
    from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES

    if quantization is not None and quantization not in ACCEPTED_MODEL_TYPES:
        raise UserError(f"--quantization {quantization!r}: expected one of {', '.join(ACCEPTED_MODEL_TYPES)}")


def export_ctranslate2(model_path: str | Path, output_dir: Path, quantization: str | None = None, force: bool = False) -> Path:
    """Convert a run (or checkpoint) into a CTranslate2 model directory; returns it."""
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise UserError("CTranslate2 export needs the ctranslate2 package: pip install 'seq2seq[ctranslate2]'") from None
    check_quantization(quantization)
    run_dir, ckpt = resolve_checkpoint(model_path)
    check_output_dir(output_dir, force, [ckpt, run_dir], "exported")
    run = load_run(model_path, "cpu")
    src_vocab, tgt_vocab = run_vocabularies(run)
    shortlist = RunLayout(run.run_dir).shortlist
    with replacing_output(output_dir) as out:  # the old directory stays until the new one is complete
        convert_ctranslate2(run.model, src_vocab, tgt_vocab, out, quantization)
        if shortlist.is_file():  # the run's shortlist, as the vocabulary map `use_vmap=True` reads
            shutil.copyfile(shortlist, out / VMAP)
    return output_dir


def name_target(model_dir: Path, token: str) -> None:
    """Make the CTranslate2 model in `model_dir` put `token` (a multilingual run's `>>es<<`) in
    front of every source itself: its vocabulary's start token becomes `token`, added to each
    source (config.json's `bos_token` and `add_source_bos`; decoding still starts from the
    model's `decoder_start_token`). A model of one target of a run with several."""
    import json

    path = model_dir / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("decoder_start_token") in (None, ""):  # it would fall back to bos_token
        raise UserError(f"{model_dir}: a CTranslate2 model without its decoder_start_token cannot name a target")
    config.update(bos_token=token, add_source_bos=True)
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def run_vocabularies(run: LoadedRun | RunFiles) -> tuple[list[str], list[str]]:
    """The run's source and target pieces in id order: the vocabularies of its CTranslate2 model."""
    return all_pieces(run.src_sp), all_pieces(run.tgt_sp)


def convert_ctranslate2(
    model: Seq2SeqTransformer, src_vocab: list[str], tgt_vocab: list[str], output_dir: Path, quantization: str | None = None
) -> Path:
    """Write a model (with the given vocabularies) as a CTranslate2 model directory."""
    from ctranslate2.converters import Converter

    class _ModelConverter(Converter):
        def _load(self):
            return ctranslate2_spec(model, src_vocab, tgt_vocab)

    _ModelConverter().convert(str(output_dir), quantization=quantization, force=True)
    return output_dir
