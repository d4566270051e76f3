#!/usr/bin/env bash
# The main job on the shipped Spanish->English Bible corpus, on CPU:
# install, then tokenize -> train -> evaluate (test BLEU) -> translate.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install.sh
export PATH="$PWD/.venv/bin:$PATH"
CONFIG=${CONFIG:-configs/quickstart.yaml}
RUN=runs/quickstart
set -x
seq2seq tokenize --config "$CONFIG"
seq2seq train --config "$CONFIG"
seq2seq evaluate --model "$RUN" --src data/bible-es-en/test.es --ref data/bible-es-en/test.en -o "$RUN/test.hyp.en"
head -n 3 data/bible-es-en/test.es | seq2seq translate --model "$RUN"
