#!/usr/bin/env bash
# run_matmul.sh — builds libcinfer.a and bench/matmul.c in $BUILD (default build) and runs the matmul
# benchmark: bench/run_matmul.sh [threads] [case filter]. CINFER_SIMD=avx2|scalar caps the kernels.
# Filter "step" runs only the whole-decode-step cases (every matmul of a 0.8B / 2B step at M=1 and M=8).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
make -s BUILD="$BUILD" "$BUILD/libcinfer.a"
${CC:-cc} -std=c11 -D_GNU_SOURCE -O2 -g -pthread -Iinclude -Isrc bench/matmul.c "$BUILD/libcinfer.a" \
    -lm -lpthread -o "$BUILD/matmul-bench"
exec "$BUILD/matmul-bench" "$@"
