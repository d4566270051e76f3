#!/usr/bin/env bash
# Lint (ruff: pycodestyle, pyflakes, import order, bugbear, pyupgrade) and type-check (mypy)
# with the settings in pyproject.toml. Uses .venv (see scripts/install.sh) unless PYTHON is set.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -m ruff check seq2seq_cli tests bench
"$PY" -m mypy
