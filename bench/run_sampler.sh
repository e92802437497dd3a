#!/usr/bin/env bash
# run_sampler.sh — builds libcinfer.a and bench/sampler.c in $BUILD (default build) and prints the
# sampler chain's per-token CPU time at V = 248320.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
make -s BUILD="$BUILD" "$BUILD/libcinfer.a"
${CC:-cc} -std=c11 -D_GNU_SOURCE -O2 -g -pthread -Iinclude -Isrc bench/sampler.c "$BUILD/libcinfer.a" \
    $(pkg-config --libs jansson libpcre2-8 libutf8proc) -lm -lpthread -o "$BUILD/sampler-bench"
exec "$BUILD/sampler-bench"
