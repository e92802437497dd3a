#!/bin/bash
# Train the default model on the GPU machine: run from the repository root with $OUT set.
#
#   OUT=/some/dir bash tools/train/run_on_device.sh
#
# 1. prepare_data.py on this machine's stdlib + site-packages (shared by both passes);
# 2. a SMOKE pass of the whole pipeline (tiny model, 6 steps, a --resume to 10 steps, export, reload,
#    evaluation on a few windows, fixtures) — any failure stops here with a non-zero exit;
# 3. the real pass: tokenizer + ids, training to a time budget, export, evaluation, fixtures.
# Everything must end within TOTAL_SECONDS (540) of the start: training gets
# min(TRAIN_SECONDS, what is left minus RESERVE_SECONDS for export/eval/packing).
# $OUT receives log.txt and results.tgz.part0..3 (one tar.gz of models/default,
# tests/fixtures/default_model and train/, split into <= 15 MiB parts; `cat results.tgz.part* | tar xz`).
set -o pipefail
START=$(date +%s)
OUT=${OUT:-/tmp/train-out}
WORK=${WORK:-/tmp/train-work}
TOTAL=${TOTAL_SECONDS:-540}
TRAIN_SECONDS=${TRAIN_SECONDS:-330}
RESERVE=${RESERVE_SECONDS:-95}
SEED=${SEED:-1234}
mkdir -p "$OUT"
rm -rf "$WORK"
mkdir -p "$WORK"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
exec > >(tee -a "$OUT/log.txt") 2>&1

T=tools/train
elapsed() { echo $(( $(date +%s) - START )); }

pack() {  # $1: results root
    if [ -d "$1" ]; then
        tar czf "$WORK/results.tgz" -C "$1" . && split -b 15M -d -a 1 "$WORK/results.tgz" "$OUT/results.tgz.part"
        ls -l "$OUT"
        n=$(ls "$OUT"/results.tgz.part* 2>/dev/null | wc -l)
        if [ "$n" -gt 4 ]; then echo "WARNING: $n parts (more than 4)"; fi
    fi
}

run() {  # run a step; on failure pack what exists and stop
    local name=$1
    shift
    echo "=== [$(elapsed) s] $name: $*"
    "$@"
    local rc=$?
    echo "=== [$(elapsed) s] $name: exit $rc"
    if [ $rc -ne 0 ]; then
        echo "FAILED at step $name (exit $rc)"
        pack "$WORK/real/res"
        sleep 1
        exit 1
    fi
}

python3 -c "import sys, transformers, torch, tokenizers, safetensors, numpy; print('python', sys.version.split()[0], 'transformers', transformers.__version__, 'torch', torch.__version__, 'tokenizers', tokenizers.__version__, 'safetensors', safetensors.__version__, 'numpy', numpy.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0)); import sysconfig; print(sysconfig.get_paths())"
nproc; nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv 2>/dev/null

run prepare_data python3 $T/prepare_data.py --out "$WORK/data" --seed "$SEED" --workers 16

# ---- smoke pass ----
S=$WORK/smoke
run smoke_tokenize python3 $T/tokenize_data.py --data "$WORK/data" --out "$S/tok" --vocab 1024 \
    --tok-corpus-mb 1 --max-code-mb 2 --max-chat 500 --check 20 --seed "$SEED"
run smoke_train python3 $T/train.py --tok "$S/tok" --work "$S/work" --preset tiny --seconds 60 --max-steps 6 \
    --ckpt-every 0 --log-every 0 --seed "$SEED"
run smoke_resume python3 $T/train.py --tok "$S/tok" --work "$S/work" --preset tiny --seconds 60 --max-steps 10 \
    --ckpt-every 0 --log-every 0 --seed "$SEED" --resume
python3 -c "import json,sys; s=json.load(open('$S/work/train_state.json')); print('smoke steps', s['step']); sys.exit(0 if s['step'] == 10 else 1)" \
    || { echo "FAILED: resume did not continue to step 10"; exit 1; }
run smoke_export_eval python3 $T/export_eval.py --work "$S/work" --tok "$S/tok" --data "$WORK/data" \
    --root "$S/res" --preset tiny --ctx 256 --max-eval-tokens 1500 --chat-eval 2
echo "=== smoke pass OK at $(elapsed) s"

# ---- real pass ----
R=$WORK/real
run tokenize python3 $T/tokenize_data.py --data "$WORK/data" --out "$R/tok" --vocab 8192 --tok-corpus-mb 16 \
    --max-code-mb 300 --chat-frac 0.3 --seed "$SEED"
DEADLINE=$(( START + TOTAL - RESERVE ))
echo "=== training: budget min($TRAIN_SECONDS, $(( DEADLINE - $(date +%s) ))) s"
run train python3 $T/train.py --tok "$R/tok" --work "$R/work" --preset real --seconds "$TRAIN_SECONDS" \
    --deadline "$DEADLINE" --seed "$SEED"
run export_eval python3 $T/export_eval.py --work "$R/work" --tok "$R/tok" --data "$WORK/data" \
    --root "$R/res" --preset real --ctx 512 --deadline $(( START + TOTAL - 15 ))
cp "$R/work/train_state.json" "$R/res/train/" 2>/dev/null
du -sh "$R/res"/* "$R/res/models/default"/* 2>/dev/null
pack "$R/res"
echo "=== done in $(elapsed) s"
sleep 1
exit 0
