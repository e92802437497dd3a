#!/usr/bin/env bash
# run_grammar.sh — builds libcinfer.a and bench/grammar.c in $BUILD (default build) and prints the
# constrained-decoding mask's cost per step on Qwen3's vocabulary (151669 tokens).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
make -s BUILD="$BUILD" "$BUILD/libcinfer.a"
${CC:-cc} -std=c11 -D_GNU_SOURCE -O2 -g -pthread -Iinclude -Isrc bench/grammar.c "$BUILD/libcinfer.a" \
    $(pkg-config --libs jansson libpcre2-8 libutf8proc) -lm -lpthread -o "$BUILD/grammar-bench"
exec "$BUILD/grammar-bench" "$@"
