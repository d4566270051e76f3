#!/usr/bin/env bash
# Import, export and fine-tuning on the shipped Spanish->English Bible corpus, on CPU.
#
#   bash bench/finetune_demo.sh RUN_DIR        # RUN_DIR: a trained run of configs/quickstart.yaml
#
# (a) RUN_DIR -> `export --format hf` -> `import`; both runs translate the test split (beam 4)
#     and the outputs must be identical.
# (b) A Hugging Face Marian directory stands in for an OPUS-MT checkpoint (nothing is
#     downloaded): the HF export of a quickstart model trained on the first half of the train
#     split for BASE_MINUTES, or MARIAN=DIR, a local directory saved by
#     MarianMTModel/MarianTokenizer.save_pretrained. It is imported, scored on the valid split,
#     fine-tuned on the whole train split for MINUTES with `train --init-from`, and scored again.
#
# Environment: OUT (runs/finetune-demo), MINUTES (5), BASE_MINUTES (5), MARIAN (unset),
# PYTHON (.venv/bin/python when present, else python).
set -euo pipefail
RUN=$(realpath "${1:?usage: bash bench/finetune_demo.sh RUN_DIR (a trained run of configs/quickstart.yaml)}")
MARIAN=${MARIAN:+$(realpath "$MARIAN")}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-runs/finetune-demo}
MINUTES=${MINUTES:-5}
BASE_MINUTES=${BASE_MINUTES:-5}
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python)}
DATA=data/bible-es-en
seq2seq() { PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m seq2seq_cli "$@"; }
valid_bleu() {  # valid BLEU and chrF of a run, beam 4
  seq2seq evaluate --model "$1" --src "$DATA/valid.es" --ref "$DATA/valid.en" --beam-size 4 --json |
    "$PYTHON" -c 'import json, sys; s = json.load(sys.stdin); print("BLEU %.2f, chrF %.2f" % (s["bleu"], s["chrf"]))'
}
[ -f "$RUN/checkpoints/best.safetensors" ] || { echo "error: $RUN: no checkpoints/best.safetensors" >&2; exit 2; }
mkdir -p "$OUT"

echo "== (a) $RUN -> export --format hf -> import: translations of $DATA/test.es"
seq2seq export "$OUT/hf" --model "$RUN" --format hf --force
seq2seq import "$OUT/hf" "$OUT/imported" --src-lang es --tgt-lang en --force
seq2seq translate --model "$RUN" -i "$DATA/test.es" -o "$OUT/test.original.en" --beam-size 4 --no-progress
seq2seq translate --model "$OUT/imported" -i "$DATA/test.es" -o "$OUT/test.imported.en" --beam-size 4 --no-progress
same=$(awk 'NR == FNR { line[FNR] = $0; next } line[FNR] == $0 { n++ } END { print n + 0 }' \
  "$OUT/test.original.en" "$OUT/test.imported.en")
total=$(wc -l < "$OUT/test.original.en")
if diff "$OUT/test.original.en" "$OUT/test.imported.en" > "$OUT/test.diff"; then
  echo "round trip: $same of $total test translations identical"
else
  echo "round trip: only $same of $total test translations identical (see $OUT/test.diff)" >&2
  exit 1
fi

echo "== (b) fine-tuning an imported Marian directory"
if [ -z "$MARIAN" ]; then  # the stand-in: a quickstart model that saw half the train split
  half=$(($(wc -l < "$DATA/train.es") / 2))
  head -n "$half" "$DATA/train.es" > "$OUT/half.es"
  head -n "$half" "$DATA/train.en" > "$OUT/half.en"
  seq2seq train --config configs/quickstart.yaml --overwrite --no-progress --set name=base \
    --set run_dir="$OUT/base" --set data.train="$OUT/half" --set train.max_minutes="$BASE_MINUTES" \
    --set train.tensorboard=false --set train.plot=false
  seq2seq export "$OUT/base-hf" --model "$OUT/base" --format hf --force
  MARIAN=$OUT/base-hf
fi
seq2seq import "$MARIAN" "$OUT/base-imported" --src-lang es --tgt-lang en --force
before=$(valid_bleu "$OUT/base-imported")
cat > "$OUT/finetune.yaml" <<YAML
# the architecture and tokenizer come from --init-from; data, train and decode are set here
name: finetuned
run_dir: $OUT/finetuned
data: {src_lang: es, tgt_lang: en, train: $DATA/train, valid: $DATA/valid, max_src_len: 128, max_tgt_len: 128}
train: {max_minutes: $MINUTES, lr: 0.0003, warmup_steps: 100, valid_every: 500, max_tokens: 2048,
        valid_bleu: true, best_metric: bleu, tensorboard: false, plot: false}
decode: {beam_size: 4}
YAML
rm -rf "$OUT/finetuned"
seq2seq train --config "$OUT/finetune.yaml" --init-from "$OUT/base-imported" --no-progress
after=$(valid_bleu "$OUT/finetuned")
echo "round trip:   $same of $total test translations identical"
echo "valid before: $before  ($MARIAN, imported)"
echo "valid after:  $after  (fine-tuned $MINUTES min with --init-from)"
