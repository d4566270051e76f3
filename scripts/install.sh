#!/usr/bin/env bash
# Create .venv (if missing) and install seq2seq into it (CTranslate2 included) with the extras in EXTRAS (default dev).
# CPU PyTorch is installed first (TORCH_SPEC, default torch==2.13.0) so that the unpinned
# `torch` requirement does not pull a multi-GB CUDA build onto a machine without a GPU.
# On a GPU machine, install the CUDA build of torch you want first, or set TORCH_SPEC.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q --disable-pip-version-check "${TORCH_SPEC:-torch==2.13.0}"
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[${EXTRAS:-dev}]"
.venv/bin/python -c "import seq2seq_cli, torch, sentencepiece, datasets, sacrebleu, ctranslate2"
