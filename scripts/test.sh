#!/usr/bin/env bash
# Install (with the dev, ctranslate2, hf, serve and argos extras: their tests run too) and run the test suite on CPU.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
EXTRAS=dev,ctranslate2,hf,serve,argos,documents bash scripts/install.sh
.venv/bin/python -m pytest -q "$@"
