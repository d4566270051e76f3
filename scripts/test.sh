#!/usr/bin/env bash
# Install (with the dev extra) and run the test suite on CPU.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install.sh
.venv/bin/python -m pytest -q "$@"
