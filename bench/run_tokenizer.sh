#!/usr/bin/env bash
# run_tokenizer.sh — builds libcinfer.a and bench/tokenizer.c in $BUILD (default build) and times single-thread
# encoding: bench/run_tokenizer.sh CORPUS.jsonl[.xz] NAME=TOKENIZER_DIR ...  The peer, on the same machine and
# corpus: python3 tools/oracle/tokenizer_goldens.py bench CORPUS NAME=DIR ...  (HF `tokenizers`, same method).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
make -s BUILD="$BUILD" "$BUILD/libcinfer.a"
${CC:-cc} -std=c11 -D_GNU_SOURCE -O2 -g -pthread -Iinclude -Isrc $(pkg-config --cflags jansson) bench/tokenizer.c \
    "$BUILD/libcinfer.a" $(pkg-config --libs jansson libpcre2-8 libutf8proc libpng libjpeg libwebp libmicrohttpd) \
    -lgif -lm -lpthread -o "$BUILD/tokenizer-bench"
corpus=$1
shift
if [[ $corpus == *.xz ]]; then
    xz -dc "$corpus" > "$BUILD/tokenizer-bench-corpus.jsonl"
    corpus=$BUILD/tokenizer-bench-corpus.jsonl
fi
# a DIR may hold tokenizer.json.xz (as .tokcarry/ does, so the files travel small)
args=()
for spec in "$@"; do
    name=${spec%%=*} dir=${spec#*=}
    if [ ! -e "$dir/tokenizer.json" ] && [ -e "$dir/tokenizer.json.xz" ]; then
        mkdir -p "$BUILD/tok-$name"
        xz -dc "$dir/tokenizer.json.xz" > "$BUILD/tok-$name/tokenizer.json"
        [ -e "$dir/tokenizer_config.json" ] && cp "$dir/tokenizer_config.json" "$BUILD/tok-$name/"
        dir=$BUILD/tok-$name
    fi
    args+=("$name=$dir")
done
exec "$BUILD/tokenizer-bench" "$corpus" "${args[@]}"
