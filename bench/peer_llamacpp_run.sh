#!/bin/bash
# bench/peer_llamacpp_run.sh — llama.cpp's CUDA backend on the shapes `cinfer bench --like` measures (issue 5),
# on the GPU machine, after bench/peer_llamacpp_build.sh. For each shape: write a random-weight bf16 GGUF with
# bench/peer_llamacpp_gguf.py (to /dev/shm when it fits, else the disk; the largest tensors left as holes when
# neither holds it), run llama-bench on it, delete it. The 4B also gets llama-batched-bench (512-token prompts,
# 1, 8, 32, 64 sequences), and so does the 35B-A3B when time is left. Bounded: every command under `timeout -k 5`, the whole within BUDGET seconds.
# usage: OUT=dir [BUDGET=360] [WAIT=240] bash bench/peer_llamacpp_run.sh LLAMA_DIR [SHAPES...]
#   (a smoke test of the script on a CPU build: GGUF_ARGS="--layers 4 --vocab 16384" LB_ARGS="-p 32 -n 4 -r 1"
#   BB_ARGS="-c 1024 -b 256 -ub 128 -npp 64 -ntg 4 -npl 1,2")
#   SHAPES default: qwen3.5-4b qwen3.5-27b qwen3.5-35b-a3b; LLAMA_DIR holds build/bin and BUILT.
# Results: $OUT/run.txt (timeline, space, which holes), $OUT/tables.md (llama-bench / batched-bench tables),
# $OUT/err-<shape>.txt (llama.cpp's load log, tail).
set -u
OUT=${OUT:-/tmp/peer-out}
BUDGET=${BUDGET:-360}
WAIT=${WAIT:-240}
L=$1
shift
SHAPES=${*:-qwen3.5-4b qwen3.5-27b qwen3.5-35b-a3b}
mkdir -p "$OUT"
T0=$(date +%s)
# a GGUF left in /dev/shm would hold tens of GB of RAM after us
trap 'rm -f /dev/shm/peer-qwen3.5-*.gguf /tmp/peer-qwen3.5-*.gguf' EXIT
trap 'exit 143' TERM INT
LOG=$OUT/run.txt
TAB=$OUT/tables.md
: > "$TAB"
el() { echo "[$(($(date +%s) - T0)) s] $*" | tee -a "$LOG"; }
left() { echo $((BUDGET - ($(date +%s) - T0))); }
# a command's time limit: its own cap, but never past the script's budget (5 s kept for the cleanup)
lim() {
    local l
    l=$(($(left) - 5))
    [ "$l" -gt "$1" ] && l=$1
    [ "$l" -lt 1 ] && l=1
    echo $l
}
PY=""
for p in python3 /opt/torch/.venv/bin/python3 /usr/bin/python3; do
    if "$p" -c "import numpy" > /dev/null 2>&1; then
        PY=$(command -v "$p")
        break
    fi
done
GGUF_ARGS=${GGUF_ARGS:-}
LB_ARGS=${LB_ARGS:-"-p 512,4096 -n 128 -b 4096 -ub 512,4096 -r 3"}
BB_ARGS=${BB_ARGS:-"-c 41984 -b 2048 -ub 512 -npp 512 -ntg 128 -npl 1,8,32,64"}
# batched decode for the 4B, and for the 35B-A3B (the last shape) with whatever time is left
BB_SHAPES=${BB_SHAPES:-"qwen3.5-4b qwen3.5-35b-a3b"}
el "start: shapes $SHAPES, budget $BUDGET s; python $PY"
while [ ! -e "$L/BUILT" ] && [ ! -e "$L.FAILED" ] && [ $(($(date +%s) - T0)) -lt "$WAIT" ]; do sleep 2; done
if [ ! -e "$L/BUILT" ]; then
    el "llama.cpp not built after $WAIT s (see build.txt); stopping"
    exit 3
fi
el "llama.cpp built ($(cat "$L/COMMIT" 2> /dev/null))"
BIN=$L/build/bin
export LD_LIBRARY_PATH=$BIN:${LD_LIBRARY_PATH:-}
{
    df -h /dev/shm /tmp .
    free -g
    nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.max.sm,clocks.max.mem,power.limit --format=csv
} >> "$LOG" 2>&1
# caps (s) a shape: GGUF write, llama-bench
declare -A WCAP=([qwen3.5-4b]=40 [qwen3.5-27b]=110 [qwen3.5-35b-a3b]=110)
declare -A BCAP=([qwen3.5-4b]=60 [qwen3.5-27b]=120 [qwen3.5-35b-a3b]=90)
avail() { df -B1 --output=avail "$1" 2> /dev/null | tail -1; }
for S in $SHAPES; do
    if [ "$(left)" -lt 30 ]; then
        el "$S: skipped, $(left) s left"
        continue
    fi
    need=$("$PY" bench/peer_llamacpp_gguf.py --like "$S" --out /dev/null --plan $GGUF_ARGS | sed -n 's/.*tensors, \([0-9.]*\) GB.*/\1/p')
    need=$("$PY" -c "print(int(float('$need') * 1e9))")
    # /dev/shm first (RAM: the load reads it at memory speed); keep 4 GB spare on either
    best=""
    bavail=0
    for d in /dev/shm /tmp; do
        a=$(avail $d)
        a=$((${a:-0} - 4000000000))
        if [ "$a" -gt "$bavail" ]; then
            best=$d
            bavail=$a
        fi
        [ "$a" -ge "$need" ] && break
    done
    if [ -z "$best" ]; then
        el "$S: skipped, no room for a GGUF in /dev/shm or /tmp"
        continue
    fi
    F=$best/peer-$S.gguf
    extra=""
    [ "$bavail" -lt "$need" ] && extra="--max-bytes $bavail"
    el "$S: $need bytes of tensors; writing $F ($bavail bytes free there) $extra"
    timeout -k 5 "$(lim ${WCAP[$S]})" "$PY" bench/peer_llamacpp_gguf.py --like "$S" --out "$F" --threads 12 $extra $GGUF_ARGS \
        < /dev/null >> "$LOG" 2>&1
    rc=$?
    el "$S: GGUF written rc=$rc"
    if [ $rc = 0 ]; then
        echo "### $S ($(tail -3 "$LOG" | grep -o 'HOLES.*\|no holes.*'))" >> "$TAB"
        # llama.cpp's recommended settings for a full-GPU run: every layer on the GPU (-ngl 99), flash
        # attention on, weights read into VRAM without mmap (-lm none); prefill at the default ubatch 512
        # and at 4096 (a whole 4096-token prompt in one ubatch, as cinfer's 4096-token chunk); decode tg128
        # at batch 1. -r 3 repetitions after llama-bench's warmup run.
        echo "\$ llama-bench -m $F -ngl 99 -fa on -lm none $LB_ARGS -o md" >> "$TAB"
        timeout -k 5 "$(lim ${BCAP[$S]})" "$BIN/llama-bench" -m "$F" -ngl 99 -fa on -lm none $LB_ARGS -o md \
            < /dev/null >> "$TAB" 2> "$OUT/err-$S.txt"
        el "$S: llama-bench rc=$?"
        if [[ " $BB_SHAPES " == *" $S "* ]] && [ "$(left)" -gt 40 ]; then
            echo "\$ llama-batched-bench -m $F -ngl 99 -fa on -lm none $BB_ARGS" >> "$TAB"
            timeout -k 5 "$(lim 60)" "$BIN/llama-batched-bench" -m "$F" -ngl 99 -fa on -lm none $BB_ARGS \
                < /dev/null 2>> "$OUT/err-$S.txt" |
                grep -E '^\||^main|^$' >> "$TAB"
            el "$S: llama-batched-bench rc=${PIPESTATUS[0]}"
        fi
        # keep the log small: the load summary and any error
        tail -c 60000 "$OUT/err-$S.txt" > "$OUT/err-$S.tmp" && mv "$OUT/err-$S.tmp" "$OUT/err-$S.txt"
    fi
    rm -f "$F"
    el "$S: done"
done
cat "$TAB"
el "all done"
