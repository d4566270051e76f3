#!/usr/bin/env bash
# Import, export and fine-tuning on the shipped Spanish->English Bible corpus, on CPU:
#   1. the quickstart model (trained first when runs/quickstart has no checkpoint) is exported
#      as a Hugging Face Marian directory and imported back; both runs translate the test
#      split, and the two outputs must be identical;
#   2. the imported run (or, with MARIAN=DIR, a local OPUS-MT directory such as one written by
#      MarianMTModel/MarianTokenizer.save_pretrained for opus-mt-es-en) is fine-tuned for
#      MINUTES minutes with `train --init-from`; valid BLEU before and after is printed.
# Needs transformers for nothing: export and import are this package's own code.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$PWD/.venv/bin:$PATH"
OUT=${OUT:-runs/finetune-demo}
MINUTES=${MINUTES:-5}
MARIAN=${MARIAN:-}
DATA=data/bible-es-en
mkdir -p "$OUT"
set -x

# 1. quickstart model -> export hf -> import: identical translations of the test split
[ -f runs/quickstart/checkpoints/best.safetensors ] || seq2seq train --config configs/quickstart.yaml
seq2seq export "$OUT/hf" --model runs/quickstart --format hf --force
seq2seq import "$OUT/hf" "$OUT/imported" --src-lang es --tgt-lang en --force
seq2seq translate --model runs/quickstart -i "$DATA/test.es" -o "$OUT/test.quickstart.en"
seq2seq translate --model "$OUT/imported" -i "$DATA/test.es" -o "$OUT/test.imported.en"
cmp "$OUT/test.quickstart.en" "$OUT/test.imported.en"
echo "export hf -> import: $(wc -l < "$OUT/test.imported.en") test translations identical"

# 2. fine-tune an imported model for a few minutes; valid BLEU before and after
INIT="$OUT/imported"
if [ -n "$MARIAN" ]; then
  seq2seq import "$MARIAN" "$OUT/opus-mt" --src-lang es --tgt-lang en --force
  INIT="$OUT/opus-mt"
fi
cat > "$OUT/finetune.yaml" <<YAML
# the architecture and tokenizer come from --init-from; data, train and decode are set here
name: finetuned
run_dir: $OUT/finetuned
data: {src_lang: es, tgt_lang: en, train: $DATA/train, valid: $DATA/valid, max_src_len: 128, max_tgt_len: 128}
train: {max_minutes: $MINUTES, lr: 0.0003, warmup_steps: 100, valid_every: 200, max_tokens: 4096,
        valid_bleu: true, best_metric: bleu, tensorboard: false, plot: false}
decode: {beam_size: 4}
YAML
seq2seq evaluate --model "$INIT" --src "$DATA/valid.es" --ref "$DATA/valid.en" --json > "$OUT/valid.before.json"
rm -rf "$OUT/finetuned"
seq2seq train --config "$OUT/finetune.yaml" --init-from "$INIT"
seq2seq evaluate --model "$OUT/finetuned" --src "$DATA/valid.es" --ref "$DATA/valid.en" --json > "$OUT/valid.after.json"
set +x
echo "valid before: $(cat "$OUT/valid.before.json")"
echo "valid after:  $(cat "$OUT/valid.after.json")"
