#!/usr/bin/env bash
# run_vision.sh — builds libcinfer.a and bench/vision.c in $BUILD (default build) and runs the image benchmark:
# bench/run_vision.sh [threads] [0.8b|27b] [sides...] (preprocessing from RGB + the vision tower, images/s).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
make -s BUILD="$BUILD" "$BUILD/libcinfer.a"
LIBS=$(make -s -f Makefile --no-print-directory -pn 2>/dev/null | sed -n 's/^LDLIBS := //p' | head -1)
${CC:-cc} -std=c11 -D_GNU_SOURCE -O2 -g -pthread -Iinclude -Isrc bench/vision.c "$BUILD/libcinfer.a" \
    ${LIBS:- -ljansson -lpng16 -ljpeg -lwebp -lgif -lm -lpthread} -lm -lpthread -o "$BUILD/vision-bench"
exec "$BUILD/vision-bench" "$@"
