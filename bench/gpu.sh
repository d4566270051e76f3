#!/usr/bin/env bash
# The GPU measurements, stage by stage; each stage fits in a few minutes on one H100 and
# writes OUT_DIR/STAGE.log (what ran and what it printed) and OUT_DIR/STAGE.json (figures and
# the stage's status), plus at most a few more files.
#
#   bash bench/gpu.sh STAGE [OUT_DIR]     STAGE: check speed recipe curve decode all quick
#   SMOKE=1 bash bench/gpu.sh STAGE       the same plumbing on a CPU with tiny settings
#
# `quick` is the whole check in one command of QUICK_BUDGET_S seconds (540: it fits a 10-minute
# call): check (without torch.compile's test), eager speed, the recipe for the time left, the
# test BLEU of its best checkpoint, then decoding against HF on that model. It writes 8 files: quick.log (every stage's log),
# check.json, speed.json, recipe.json, metrics.jsonl, evaluate.json, decode.json and quick.json
# (the figures side by side).
#
# OUT_DIR defaults to $OUT, else bench-gpu-out. `recipe` leaves its run in $RUN (default
# runs/gpu-bible-es-en, ignored by git) for `curve` and `decode`; when the machine was given
# back in between, `curve` says so and `decode` trains a short stand-in run first.
# Wheels in .whl/ (bench/gpu_wheels.sh) are installed into /tmp/site first.
#
# Settings (environment): PYTHON (default python3; in smoke mode /work/main/.venv/bin/python
# when present), RUN, MINUTES (6.5), VALID_EVERY (1300), RECIPE_SET (more --set overrides),
# CURVE_DEADLINE_S (seconds after the stage began to stop scoring checkpoints), DECODE_PRECISION
# (bf16), DECODE_REPEAT (4), SPEED_EAGER_TIMEOUT_S (120) and
# SPEED_TIMEOUT_S (210 per compiled run), SPEED_STEPS (20),
# CUDA_TESTS (tests/test_cuda.py), STANDIN_MINUTES (2), RECIPE_CURVE (1: recipe runs curve too).
set -u

STAGE=${1:-}
OUT_DIR=${2:-${OUT:-bench-gpu-out}}
SMOKE=${SMOKE:-0}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
mkdir -p "$OUT_DIR"
STAGE_START=$(date +%s)

if [ "$SMOKE" = 1 ]; then
    DEFAULT_PYTHON=python3
    [ -x /work/main/.venv/bin/python ] && DEFAULT_PYTHON=/work/main/.venv/bin/python
    PYTHON=${PYTHON:-$DEFAULT_PYTHON}
    DEVICE=cpu
    RUN=${RUN:-runs/gpu-smoke}
    CONFIG=configs/tiny.yaml
else
    PYTHON=${PYTHON:-python3}
    DEVICE=cuda
    RUN=${RUN:-runs/gpu-bible-es-en}
    CONFIG=configs/bible-es-en.yaml
fi
HF_DIR=$RUN-hf
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}

# ------------------------------------------------------------------------- helpers

log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT_DIR/${LOG_NAME:-$STAGE}.log"; }

# run CMD...: log the command, append its output to the log, return its exit status
run() {
    log "\$ $*"
    "$@" >>"$OUT_DIR/${LOG_NAME:-$STAGE}.log" 2>&1
    local rc=$?
    [ $rc -eq 0 ] || log "exit status $rc"
    return $rc
}

elapsed() { echo $(($(date +%s) - STAGE_START)); }

# write_json STATUS [KEY=JSONFILE ...] [--note TEXT]: OUT_DIR/STAGE.json with the stage's status,
# time, the files' JSON under their keys, and any lines the stage logged as notes
NOTES=()
note() { NOTES+=("$*"); log "note: $*"; }
write_json() {
    local status=$1; shift
    "$PYTHON" - "$OUT_DIR/$STAGE.json" "$STAGE" "$status" "$(elapsed)" "$SMOKE" "${NOTES[@]+"${NOTES[@]}"}" --files "$@" <<'EOF'
import json, sys
out, stage, status, seconds, smoke, *rest = sys.argv[1:]
split = rest.index("--files")
notes, files = rest[:split], rest[split + 1:]
record = {"stage": stage, "status": status, "seconds": int(seconds), "smoke": smoke == "1", "notes": notes}
for item in files:
    key, _, path = item.partition("=")
    try:
        with open(path, encoding="utf-8") as f:
            record[key] = json.load(f)
    except (OSError, ValueError) as exc:
        record[key] = {"missing": f"{path}: {exc}"}
with open(out, "w", encoding="utf-8") as f:
    json.dump(record, f, indent=1)
    f.write("\n")
EOF
    log "stage $STAGE: $status in $(elapsed) s -> $OUT_DIR/$STAGE.json"
}

# the wheels the machine lacks (bench/gpu_wheels.sh), once per machine
install_wheels() {
    [ "$SMOKE" = 1 ] && return 0
    if ! ls .whl/*.whl >/dev/null 2>&1; then
        log "no .whl/ here (bench/gpu_wheels.sh makes it): pydantic and datasets must already be installed"
        return 0
    fi
    if [ ! -e /tmp/site/.installed ]; then
        # a wheel is a zip archive: without pip, unpacking it is the installation these wheels need
        run "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl \
            || run "$PYTHON" -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
                /tmp/site .whl/*.whl \
            && touch /tmp/site/.installed
    fi
    export PYTHONPATH=/tmp/site:$PYTHONPATH
}

# the final model through the real command: best checkpoint (else last), beam 5 -> $TMP/evaluate.json
evaluate_best() {
    local src=data/bible-es-en/test.es ref=data/bible-es-en/test.en
    if [ "$SMOKE" = 1 ]; then
        head -n 40 $src >"$TMP/test.es"; head -n 40 $ref >"$TMP/test.en"; src=$TMP/test.es; ref=$TMP/test.en
    fi
    "$PYTHON" -m seq2seq_cli evaluate --model "$RUN" --src $src --ref $ref --beam-size 5 --device $DEVICE \
        --json >"$TMP/evaluate.json" 2>>"$OUT_DIR/${LOG_NAME:-$STAGE}.log" || { note "evaluate failed"; return 1; }
    log "evaluate --model $RUN (best, else last), beam 5: $(cat "$TMP/evaluate.json")"
}

# the run directory of `recipe`, or a note of why it is not there
have_run() {
    [ -f "$RUN/checkpoints/last.safetensors" ] && return 0
    note "no trained run in $RUN (recipe not run on this machine, or the machine was given back since)"
    return 1
}

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# ------------------------------------------------------------------------- stages

stage_check() {
    local ok=1
    if [ "$SMOKE" = 1 ]; then
        export SEQ2SEQ_TEST_GPU=cpu  # the CUDA tests, run on the CPU
    else
        run nvidia-smi || note "nvidia-smi failed"
    fi
    run "$PYTHON" -c 'import sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "CUDA", torch.version.cuda,
      "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("GPU", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability(),
          "bf16", torch.cuda.is_bf16_supported())'
    run "$PYTHON" - "$TMP/env.json" <<'EOF' || ok=0
import importlib, json, sys
import torch
env = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
       "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None, "packages": {}}
for name in ["transformers", "huggingface_hub", "datasets", "pydantic", "typer", "sacrebleu", "sentencepiece",
             "numpy", "pyarrow", "pandas"]:
    try:
        env["packages"][name] = getattr(importlib.import_module(name), "__version__", "?")
    except Exception as exc:
        env["packages"][name] = f"import failed: {exc!r}"
import seq2seq_cli.cli, seq2seq_cli.train.loop, seq2seq_cli.decode.translate, seq2seq_cli.convert.hf  # noqa: E401,F401
json.dump(env, open(sys.argv[1], "w"), indent=1)
print(json.dumps(env, indent=1))
EOF
    [ $ok = 1 ] || note "importing seq2seq_cli failed: see $STAGE.log"

    # the product on the device, end to end, in seconds: tiny config, train, translate
    local tiny=runs/gpu-check
    local precision=bf16
    [ "$SMOKE" = 1 ] && precision=fp32
    run "$PYTHON" -m seq2seq_cli train --config configs/tiny.yaml --set run_dir=$tiny --set train.device=$DEVICE \
        --set train.precision=$precision --overwrite --no-progress || { ok=0; note "tiny training on $DEVICE failed"; }
    head -n 20 data/bible-es-en/test.es >"$TMP/20.es"
    run "$PYTHON" -m seq2seq_cli translate --model $tiny -i "$TMP/20.es" -o "$TMP/20.out" --device $DEVICE \
        --no-progress || { ok=0; note "translate on $DEVICE failed"; }

    # the CUDA tests (skipped without CUDA)
    local tests=${CUDA_TESTS:-tests/test_cuda.py}
    if [ -f $tests ]; then
        # quick leaves out torch.compile's test (a minute of compiling) for the recipe's sake
        local select=()
        [ "${QUICK:-0}" = 1 ] && select=(-k "not compiled")
        run "$PYTHON" -m pytest -m cuda -q -p no:cacheprovider --junitxml="$TMP/junit.xml" "${select[@]}" $tests
        local rc=$?
        "$PYTHON" - "$TMP/junit.xml" "$TMP/tests.json" "$rc" <<'EOF'
import json, sys
import xml.etree.ElementTree as ET
counts = {"exit_status": int(sys.argv[3])}
try:
    suite = ET.parse(sys.argv[1]).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    for key in ("tests", "failures", "errors", "skipped"):
        counts[key] = int(suite.get(key, 0))
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["failed_tests"] = [f'{c.get("classname")}::{c.get("name")}' for c in suite.iter("testcase")
                              if c.find("failure") is not None or c.find("error") is not None]
except (OSError, ET.ParseError) as exc:
    counts["report"] = f"no test report: {exc}"
json.dump(counts, open(sys.argv[2], "w"), indent=1)
print(json.dumps(counts))
EOF
        [ $rc -eq 0 ] || { ok=0; note "pytest -m cuda $tests: exit status $rc"; }
    else
        note "$tests not found: no CUDA tests run"
        echo '{"not_found": "'"$tests"'"}' >"$TMP/tests.json"
    fi
    write_json "$([ $ok = 1 ] && echo ok || echo failed)" environment="$TMP/env.json" tests="$TMP/tests.json"
}

stage_speed() {
    local ok=1 shape steps timeout_s=${SPEED_TIMEOUT_S:-210}
    if [ "$SMOKE" = 1 ]; then
        shape=(--device cpu --precision bf16 --d-model 64 --layers 1 --heads 2 --ffn 128 --vocab 500 --batch 4 --len 8)
        steps=(--steps 2 --warmup 1)
    else
        shape=(--device cuda --precision bf16 --d-model 512 --layers 6 --heads 8 --ffn 2048 --vocab 32000
               --batch 256 --len 64)
        steps=(--steps ${SPEED_STEPS:-20} --warmup ${SPEED_WARMUP:-3})
    fi
    # eager: the three systems interleaved; then each compiled system next to its eager self, one
    # process each (compile time in the warm-up), so that a slow or failing compile costs only its own figure
    run timeout "${SPEED_EAGER_TIMEOUT_S:-120}" "$PYTHON" bench/train_speed.py "${shape[@]}" "${steps[@]}" --systems ours hf nn \
        --json "$TMP/eager.json" || { ok=0; note "eager run failed or timed out"; }
    for system in ${SPEED_COMPILED-ours hf}; do
        run timeout "$timeout_s" "$PYTHON" bench/train_speed.py "${shape[@]}" "${steps[@]}" --systems $system \
            --compile $system --json "$TMP/compiled-$system.json" || { ok=0; note "compiled $system failed or timed out"; }
    done
    write_json "$([ $ok = 1 ] && echo ok || echo failed)" eager="$TMP/eager.json" \
        compiled_ours="$TMP/compiled-ours.json" compiled_hf="$TMP/compiled-hf.json"
}

# train.valid_every: the training split is 28,718 pairs, 262 batches of max_tokens 4096 per
# epoch, about 7,300 tokens (source + target, what tokens_per_s counts) per update; at the
# expected 220,000 tokens/s, 6.5 minutes are about 11,750 updates, so 1,300 gives 9
# checkpoints (+ the final one); 150,000 tokens/s would give 6, 300,000 12.
stage_recipe() {
    local ok=1 sets
    if [ "$SMOKE" = 1 ]; then
        sets=(--set run_dir=$RUN --set train.max_steps=null --set train.max_minutes=${MINUTES:-0.3}
              --set train.valid_every=${VALID_EVERY:-20} --set train.keep_last=100 --set train.log_every=10)
    else
        sets=(--set run_dir=$RUN --set train.max_minutes=${MINUTES:-6.5} --set train.valid_every=${VALID_EVERY:-1300}
              --set train.keep_last=100 --set train.valid_bleu=false)
    fi
    # shellcheck disable=SC2206
    sets+=(${RECIPE_SET:-})
    # a fresh run: tokenize refuses to replace the tokenizer of a run that holds checkpoints
    [ -e "$RUN" ] && log "removing the previous $RUN and $HF_DIR" && rm -rf "$RUN" "$HF_DIR"
    run "$PYTHON" -m seq2seq_cli tokenize --config $CONFIG "${sets[@]}" || { ok=0; note "tokenize failed"; }
    [ $ok = 1 ] && { run "$PYTHON" -m seq2seq_cli train --config $CONFIG "${sets[@]}" --overwrite --no-progress \
        || { ok=0; note "train failed"; }; }
    if [ -f "$RUN/metrics.jsonl" ]; then
        cp "$RUN/metrics.jsonl" "$OUT_DIR/metrics.jsonl"
        "$PYTHON" - "$RUN/metrics.jsonl" "$TMP/recipe.json" <<'EOF'
import json, statistics, sys
recs = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8")]
train = [r for r in recs if "tokens_per_s" in r]
valid = [r for r in recs if "valid_loss" in r]
tokens, prev = 0.0, 0.0
for r in train:  # each window's tokens = its rate x its length
    tokens += r["tokens_per_s"] * (r["elapsed_s"] - prev)
    prev = r["elapsed_s"]
last = recs[-1]
out = {
    "updates": last.get("step"), "elapsed_s": last.get("elapsed_s"), "tokens": round(tokens),
    "tokens_per_s_overall": tokens / prev if prev else None,  # validations and saves included
    "tokens_per_s_median_window": statistics.median(r["tokens_per_s"] for r in train) if train else None,
    "tokens_per_s_last_window": train[-1]["tokens_per_s"] if train else None,
    "validations": [{k: r.get(k) for k in ("step", "elapsed_s", "valid_nll", "valid_bleu")} for r in valid],
}
json.dump(out, open(sys.argv[2], "w"), indent=1)
print(json.dumps(out, indent=1))
EOF
    fi
    log "run directory: $RUN (stays on this machine for curve and decode)"
    write_json "$([ $ok = 1 ] && echo ok || echo failed)" recipe="$TMP/recipe.json"
    # the curve in the same command, while the run is certainly still there
    if [ $ok = 1 ] && [ "${RECIPE_CURVE:-1}" = 1 ]; then
        STAGE=curve
        NOTES=()
        log "stage curve, in the same command (its deadline counts from the start of recipe)"
        stage_curve
    fi
}

stage_curve() {
    local ok=1 limit=() deadline=${CURVE_DEADLINE_S:-540}
    [ "$SMOKE" = 1 ] && limit=(--limit 40)
    if have_run; then
        run "$PYTHON" bench/bleu_curve.py "$RUN" --split test --beam 5 --device $DEVICE "${limit[@]}" \
            --deadline-s $((deadline - $(elapsed))) --out-json "$TMP/curve.json" --out-png "$OUT_DIR/curve.png" \
            || { ok=0; note "bleu_curve.py failed"; }
        if [ "$(elapsed)" -lt "$deadline" ]; then
            evaluate_best || ok=0
        else
            note "no time left for evaluate of the final model"
        fi
    else
        ok=0
    fi
    write_json "$([ $ok = 1 ] && echo ok || echo failed)" curve="$TMP/curve.json" evaluate="$TMP/evaluate.json"
}

stage_decode() {
    local ok=1 args=()
    if ! have_run; then
        local minutes=${STANDIN_MINUTES:-2}
        [ "$SMOKE" = 1 ] && minutes=0.1
        note "training a stand-in run of $minutes minutes for decoding (not the recipe's model)"
        MINUTES=$minutes RECIPE_CURVE=0 STAGE=decode-standin stage_recipe
        STAGE=decode
    fi
    if [ "$SMOKE" = 1 ]; then
        args=(--limit 40 --hf-dtype bf16)
    else
        args=(--hf-dtype bf16 --repeat "${DECODE_REPEAT:-4}")
    fi
    # DECODE_PRECISION= (empty) leaves the run's own decode.precision (auto: bf16 on CUDA)
    local precision=${DECODE_PRECISION-bf16}
    [ -n "$precision" ] && args+=(--precision "$precision")
    run "$PYTHON" -m seq2seq_cli export "$HF_DIR" --model "$RUN" --format hf --force || { ok=0; note "export --format hf failed"; }
    run "$PYTHON" bench/gpu_decode.py "$RUN" --hf-dir "$HF_DIR" --device $DEVICE --beam 5 --hf-batch 128 \
        "${args[@]}" --json "$TMP/decode.json" || { ok=0; note "gpu_decode.py failed (see decode.json)"; }
    write_json "$([ $ok = 1 ] && echo ok || echo failed)" decode="$TMP/decode.json"
}

# the whole check in one command: what a GPU lent for minutes can measure (see the header)
stage_quick() {
    local budget=${QUICK_BUDGET_S:-540} start reserve=${QUICK_RESERVE_S:-150} part left ok=1
    start=$(date +%s)
    [ "$SMOKE" = 1 ] && reserve=${QUICK_RESERVE_S:-60}
    export LOG_NAME=quick
    for part in check speed; do
        STAGE=$part STAGE_START=$(date +%s) NOTES=()
        log "quick: stage $part"
        if [ $part = speed ]; then SPEED_COMPILED="" stage_speed; else QUICK=1 stage_check; fi
    done
    # the recipe trains for the time left, less what evaluate and decode take after it
    left=$((budget - ($(date +%s) - start) - reserve))
    [ $left -lt 30 ] && left=30
    STAGE=recipe STAGE_START=$(date +%s) NOTES=()
    log "quick: stage recipe, $left s of training"
    MINUTES=$("$PYTHON" -c "print(round($left / 60, 2))") RECIPE_CURVE=0 stage_recipe
    STAGE=evaluate STAGE_START=$(date +%s) NOTES=()
    if have_run; then
        evaluate_best || ok=0
    else
        ok=0
    fi
    write_json "$([ $ok = 1 ] && echo ok || echo failed)" evaluate="$TMP/evaluate.json"
    STAGE=decode STAGE_START=$(date +%s) NOTES=()
    DECODE_REPEAT=${DECODE_REPEAT:-1} stage_decode
    "$PYTHON" - "$OUT_DIR" "$(($(date +%s) - start))" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
parts = {p: json.loads((out / f"{p}.json").read_text()) if (out / f"{p}.json").is_file() else {"missing": True}
         for p in ("check", "speed", "recipe", "evaluate", "decode")}
summary = {"seconds": int(sys.argv[2]), "status": {p: v.get("status") for p, v in parts.items()}, "stages": parts}
(out / "quick.json").write_text(json.dumps(summary, indent=1) + "\n")
print(json.dumps(summary["status"]))
EOF
    log "quick: done in $(($(date +%s) - start)) s -> $OUT_DIR/quick.json"
}

# ------------------------------------------------------------------------- main

case "$STAGE" in
    check | speed | recipe | curve | decode | quick)
        install_wheels
        log "stage $STAGE (smoke=$SMOKE, python=$PYTHON, device=$DEVICE, run=$RUN)"
        "stage_$STAGE"
        ;;
    all)
        install_wheels
        for STAGE in check speed recipe decode; do  # recipe runs curve too
            STAGE_START=$(date +%s)
            NOTES=()
            log "stage $STAGE (smoke=$SMOKE, python=$PYTHON, device=$DEVICE, run=$RUN)"
            CURVE_DEADLINE_S=${CURVE_DEADLINE_S:-100000} "stage_$STAGE"
        done
        ;;
    *)
        echo "usage: bash bench/gpu.sh check|speed|recipe|curve|decode|all|quick [OUT_DIR]   (SMOKE=1: tiny, on CPU)" >&2
        exit 2
        ;;
esac
