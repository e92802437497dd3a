#!/bin/bash
# bench/run_cuda.sh — on a GPU machine (the `run` tool's copy of the tree, carrying .devdeps): build with the
# CUDA backend, run the CUDA tests, then `cinfer bench --like SHAPE --device cuda` for the 4B, 35B-A3B and 27B
# shapes and the transformers peer. Every stage has its own time limit and goes on past a failure; results
# land in $OUT (log.txt: build; tests.txt; bench-*.txt; peer.txt).
# The "old" stage runs the 4B and 35B-A3B shapes again with session 9's switches turned off (session 8's
# defaults) beside the defaults of the "bench" stage (bench-old.txt). 8 files in $OUT at
# most.
# usage: OUT=dir bash bench/run_cuda.sh [STAGES]   (STAGES: any of build tests bench old peer; default all)
set -u
OUT=${OUT:-/tmp/cuda-out}
mkdir -p "$OUT"
STAGES=${1:-"build tests bench old peer"}
B=build-gpu
has() { case " $STAGES " in *" $1 "*) return 0 ;; esac; return 1; }
{
    date -u
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv
    . scripts/device-env.sh
} > "$OUT/env.txt" 2>&1
. scripts/device-env.sh > /dev/null 2>&1
# nvcc where the Makefile looks for it, else on PATH
if [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] && command -v nvcc > /dev/null; then
    export CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
fi
# the chat page is embedded with `xxd -i -n NAME FILE`; a bare machine may lack xxd: a stand-in in Python
if ! command -v xxd > /dev/null; then
    mkdir -p /tmp/xxd-bin
    cat > /tmp/xxd-bin/xxd <<'PY'
#!/usr/bin/env python3
import sys
a = sys.argv[1:]
name = a[a.index("-n") + 1]
data = open(a[-1], "rb").read()
rows = [", ".join("0x%02x" % b for b in data[i:i + 12]) for i in range(0, len(data), 12)]
print("unsigned char %s[] = {\n  %s\n};\nunsigned int %s_len = %d;" % (name, ",\n  ".join(rows), name, len(data)))
PY
    chmod +x /tmp/xxd-bin/xxd
    export PATH=/tmp/xxd-bin:$PATH
fi
rm -rf $B/gen
if has build; then
    timeout 240 make -j16 BUILD=$B CUDA=1 $B/cinfer $B/cinfer-tests > "$OUT/log.txt" 2>&1
    if [ ! -x $B/cinfer-tests ]; then
        # another compiler's warnings in files outside the CUDA work must not stop the GPU run: again without -Werror
        echo "== retry without -Werror for the C files" >> "$OUT/log.txt"
        timeout 200 make -j16 BUILD=$B CUDA=1 WARN="-Wall -Wno-unused-parameter -Wno-missing-field-initializers" \
            $B/cinfer $B/cinfer-tests >> "$OUT/log.txt" 2>&1
    fi
    grep -E "error|warning|Error" "$OUT/log.txt" | head -40
fi
if has tests; then
    # the CUDA tests (op by op, fixture parity, batch invariance, graphs), one process each so that a fault in
    # one cannot hide the others, then the plain CPU parity as a control
    : > "$OUT/tests.txt"
    # every CUDA test of the tree (names read from the sources, so new tests join by themselves); the
    # microbenches (*_speed, *_bench) are left to the bench stage's own commands
    names=$(grep -hoE "^TEST\((cuda_[a-z0-9_]+)" tests/unit/test_cuda*.c tests/parity/test_parity_cuda*.c |
        sed 's/TEST(//' | grep -vE "_speed$|_bench$" | sort -u)
    for t in $names; do
        echo "== $t" >> "$OUT/tests.txt"
        CINFER_BIN=$B/cinfer timeout 60 $B/cinfer-tests $t < /dev/null >> "$OUT/tests.txt" 2>&1 || echo "== $t: exit $?" >> "$OUT/tests.txt"
    done
    # diagnostic: the fixtures with every GEMM on f32 activations (what bf16 rounding of activations costs)
    echo "== cuda_parity with CINFER_CUDA_GEMV_MAX=1000000 (no bf16 activations)" >> "$OUT/tests.txt"
    CINFER_CUDA_GEMV_MAX=1000000 CINFER_BIN=$B/cinfer timeout 60 $B/cinfer-tests cuda_parity 2>&1 | grep -E "max|FAIL|passed" >> "$OUT/tests.txt"
    echo "== CPU parity (control)" >> "$OUT/tests.txt"
    CINFER_BIN=$B/cinfer timeout 60 $B/cinfer-tests parity_ 2>&1 | grep -E "^(ok|FAIL) +parity_|passed" >> "$OUT/tests.txt"
    grep -E "^==|FAIL|passed|skip" "$OUT/tests.txt"
fi
if has bench; then
    # limits: synth + roofline ~5 s, prefill 512/4096/32768 (27B: 33 s at 32768 on the scalar kernels), four
    # decode batches after their 512-token prompts (batch 64: 32768 prompt tokens), the two profiles; the
    # bench prints each row as it is measured, so a run cut short still keeps what it finished
    for s in qwen3.5-4b:150 qwen3.5-35b-a3b:200 qwen3.5-27b:240; do
        shape=${s%%:*} lim=${s##*:}
        echo "== $(date -u +%H:%M:%S) $B/cinfer bench --like $shape --device cuda" | tee "$OUT/bench-$shape.txt"
        timeout $lim $B/cinfer bench --like $shape --device cuda 2>&1 | grep -v "cinfer synth: writing" | tee -a "$OUT/bench-$shape.txt"
    done
    # where decode logits go: pinned and pageable host memory (how the first figures were taken), beside the
    # default rows above (greedy ids chosen on the device, the engine's decode step)
    for lm in pinned pageable; do
        echo "== $B/cinfer bench --like qwen3.5-4b --device cuda --logits $lm --prefill 512 --no-profile" >> "$OUT/bench-qwen3.5-4b.txt"
        timeout 45 $B/cinfer bench --like qwen3.5-4b --device cuda --logits $lm --prefill 512 --no-profile 2>&1 |
            grep -v "cinfer synth: writing" >> "$OUT/bench-qwen3.5-4b.txt"
    done
    # what the hi + lo split of activations costs: the same 4B run with one bf16 rounding
    echo "== CINFER_CUDA_BF16_PASSES=1 $B/cinfer bench --like qwen3.5-4b --device cuda --no-profile" >> "$OUT/bench-qwen3.5-4b.txt"
    CINFER_CUDA_BF16_PASSES=1 timeout 60 $B/cinfer bench --like qwen3.5-4b --device cuda --no-profile 2>&1 | \
        grep -v "cinfer synth: writing" >> "$OUT/bench-qwen3.5-4b.txt"
fi
if has old; then
    # session 8's defaults (before session 9's MoE selection in the expert kernels, split attention groups and
    # the second clustered DeltaNet decode kernel), beside the defaults of the bench stage: one run says what the
    # new defaults are worth
    OLD="CINFER_CUDA_MOE_VARIANT=8204 CINFER_CUDA_ATTN_DEC_HS=0 CINFER_CUDA_GDN_CLUSTER=1"
    : > "$OUT/bench-old.txt"
    for s in qwen3.5-4b:90 qwen3.5-35b-a3b:120; do
        shape=${s%%:*} lim=${s##*:}
        echo "== $(date -u +%H:%M:%S) $OLD $B/cinfer bench --like $shape --device cuda --batches 1,8 --prefill 4096 --no-profile" |
            tee -a "$OUT/bench-old.txt"
        env $OLD timeout $lim $B/cinfer bench --like $shape --device cuda --batches 1,8 --prefill 4096 --no-profile 2>&1 |
            grep -v "cinfer synth: writing" | tee -a "$OUT/bench-old.txt"
    done
fi
if has peer; then
    for s in ${PEER_SHAPES:-qwen3.5-4b:70}; do
        shape=${s%%:*} lim=${s##*:}
        echo "== python3 bench/peer_transformers.py --like $shape" | tee -a "$OUT/peer.txt"
        timeout $lim python3 bench/peer_transformers.py --like $shape 2>&1 | grep -v Warning | tail -20 | tee -a "$OUT/peer.txt"
    done
fi
date -u >> "$OUT/env.txt"
