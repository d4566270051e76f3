#!/usr/bin/env bash
# Downloads into .whl/ (repository root) the wheels that `seq2seq_cli` imports and that the GPU
# machine lacks, for CPython 3.12 on x86-64 Linux; run it where there is network, before
# `bench/gpu.sh`, which installs them with `pip install --no-index --no-deps --target`.
#
# The GPU machine has torch, transformers 5.17 (huggingface_hub < 2), typer, sacrebleu,
# sentencepiece, safetensors, tqdm, pyyaml, matplotlib, tensorboard, pyarrow, numpy, pytest and
# hypothesis. Missing: pydantic (config), datasets (reading corpora), py3langid (the language
# filter of the training corpora), sentencex (cutting lines into sentences) and what those need
# beyond the machine's own packages (it has pandas, requests, xxhash, fsspec, huggingface_hub
# and pyarrow): only those, since /tmp/site comes first on PYTHONPATH and would shadow the
# machine's versions. Versions: pydantic as in the development environment; datasets 5.0.x
# because it accepts huggingface_hub 1.x, the range transformers 5.17 requires (datasets 5.2
# needs huggingface_hub >= 1.31).
#
#   bash bench/gpu_wheels.sh                 # -> .whl/*.whl
#   PY_VERSION=3.11 WHEELS=/tmp/w bash bench/gpu_wheels.sh   # the same set for another Python
set -euo pipefail
cd "$(dirname "$0")/.."

PY_VERSION=${PY_VERSION:-3.12}
WHEELS=${WHEELS:-.whl}
PYTHON=${PYTHON:-python3}

PACKAGES=(
    # config
    pydantic==2.14.3
    pydantic-core==2.50.4
    annotated-types==0.8.0
    typing-inspection==0.4.5
    typing-extensions==4.16.0     # pydantic-core 2.50 needs >= 4.16
    # reading corpora (pandas, requests, xxhash, fsspec, huggingface_hub, pyarrow: on the machine)
    datasets==5.0.1
    dill==0.4.1
    multiprocess==0.70.19
    # the language filter of the training corpora (data.filters.langid) and the sentence cutter of
    # translate and evaluate; numpy is on the machine
    py3langid==0.4.0
    sentencex==1.0.32
)

mkdir -p "$WHEELS"
for spec in "${PACKAGES[@]}"; do
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: \
        --python-version "$PY_VERSION" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$WHEELS" "$spec"
done
ls -l "$WHEELS"
du -sh "$WHEELS"
