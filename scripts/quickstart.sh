#!/usr/bin/env bash
# The main job on the shipped Spanish->English Bible corpus, on CPU:
# install, then tokenize -> train -> evaluate (test BLEU) -> translate.
# CONFIG picks another config (default configs/quickstart.yaml; the run goes to runs/NAME as the
# config says); QUICKSTART_SET adds --set overrides to tokenize and train, e.g. the short run CI makes:
#   QUICKSTART_SET="--set train.max_steps=30 --set train.valid_every=15" bash scripts/quickstart.sh
# Run again, it starts over: the earlier quick start's checkpoints, metrics, TensorBoard events and
# plots are removed first (what `train --overwrite` removes), then it tokenizes and trains afresh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install.sh
export PATH="$PWD/.venv/bin:$PATH"
CONFIG=${CONFIG:-configs/quickstart.yaml}
read -r -a SET <<< "${QUICKSTART_SET:-}"
RUN=$(python -c "import sys; from seq2seq_cli.config_load import load_config; print(load_config(sys.argv[1], sys.argv[2:]).run_path)" \
  "$CONFIG" $(printf '%s\n' ${SET[@]+"${SET[@]}"} | grep -v '^--set$' || true))
python - "$RUN" <<'PY'
import sys
from pathlib import Path

from seq2seq_cli.errors import UserError
from seq2seq_cli.run import runlock

run = Path(sys.argv[1])
try:
    if runlock.has_checkpoints(run):
        with runlock.hold(run, "quickstart.sh"):
            removed = runlock.clear_run(run)
        print(f"quickstart: {run} holds an earlier run; starting over (as train --overwrite does): removed "
              + ", ".join(str(p) for p in removed), flush=True)
    else:
        print(f"quickstart: a new run in {run}", flush=True)
except UserError as exc:
    sys.exit(f"error: {exc}")
PY
set -x
seq2seq tokenize --config "$CONFIG" ${SET[@]+"${SET[@]}"}
seq2seq train --config "$CONFIG" ${SET[@]+"${SET[@]}"}
seq2seq evaluate --model "$RUN" --src data/bible-es-en/test.es --ref data/bible-es-en/test.en -o "$RUN/test.hyp.en"
head -n 3 data/bible-es-en/test.es | seq2seq translate --model "$RUN"
