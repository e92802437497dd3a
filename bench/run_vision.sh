#!/usr/bin/env bash
# run_vision.sh — builds libcinfer.a and bench/vision.c in $BUILD (default build) and runs the image benchmark:
# [CINFER_DEVICE=cuda] bench/run_vision.sh [threads] [0.8b|27b] [sides...] (preprocessing from RGB + the vision
# tower, images/s; on the GPU with CINFER_DEVICE=cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
make -s BUILD="$BUILD" "$BUILD/libcinfer.a"
LIBS=$(make -s -f Makefile --no-print-directory -pn 2>/dev/null | sed -n 's/^LDLIBS := //p' | head -1)
# a library built with the CUDA backend (CINFER_DEVICE=cuda runs the GPU tower) links cuBLAS and the runtime
CUDA_LIBS=
if nm "$BUILD/libcinfer.a" 2>/dev/null | grep -q " T cu_vis_attn"; then
    CUDA_LIBS="-L${CUDA_HOME:-/usr/local/cuda}/lib64 -Wl,-rpath,${CUDA_HOME:-/usr/local/cuda}/lib64 -lcublas -lcudart -lstdc++"
fi
${CC:-cc} -std=c11 -D_GNU_SOURCE -O2 -g -pthread -Iinclude -Isrc bench/vision.c "$BUILD/libcinfer.a" \
    ${LIBS:- -ljansson -lpng16 -ljpeg -lwebp -lgif -lm -lpthread} $CUDA_LIBS -lm -lpthread -o "$BUILD/vision-bench"
exec "$BUILD/vision-bench" "$@"
