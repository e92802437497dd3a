#!/bin/bash
# bench/peer_llamacpp_build.sh — build llama.cpp's llama-bench and llama-batched-bench with the CUDA backend
# from the tarball bench/peer_llamacpp_pack.sh makes (the GPU machine has no network), for the llama.cpp
# peer measurement (bench/PEER-LLAMACPP.md). Writes DIR/BUILT on success.
# usage: bash bench/peer_llamacpp_build.sh TARBALL DIR [JOBS]      (e.g. .devdeps/s8/llama-src.tgz /tmp/llama 14)
# DIR.FAILED appears when the build fails (bench/peer_llamacpp_run.sh stops waiting then).
# Flags: Release, GGML_CUDA=ON for sm_90 only (CMAKE_CUDA_ARCHITECTURES=90-real: the H200; one architecture
# keeps the build inside its time), GGML_NATIVE=OFF, CUDA graphs and flash-attention kernels on (llama.cpp's
# defaults for a standalone build), no OpenSSL / NCCL / OpenMP (nothing at run time needs them, and the
# binaries then need no more than libcuda, libcudart / libcublas(Lt).so.13, libstdc++ and glibc). COMPRESS (default
# none, the fastest link; `size` for binaries that travel) is GGML_CUDA_COMPRESSION_MODE. PACK=FILE.tgz then packs
# build/bin (the two tools and the shared libraries, stripped) and COMMIT into FILE.tgz with xz.
# Session 8 built the binaries that travel on the dev VM (nvcc 13.0.88, as the H200's), because the H200 build did
# not finish inside a device call: COMPRESS=size PACK=.devdeps/s8/llama-bin.tgz bash bench/peer_llamacpp_build.sh
#   .devdeps/s8/llama-src.tgz /tmp/lb/llama 2
set -u
TGZ=$1
DIR=$2
JOBS=${3:-14}
T0=$(date +%s)
el() { echo "[$(($(date +%s) - T0)) s] $*"; }
CMAKE=$(command -v cmake || ls /opt/torch/.venv/bin/cmake 2> /dev/null || true)
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2> /dev/null || true)
echo "cmake: ${CMAKE:-MISSING} $([ -n "$CMAKE" ] && "$CMAKE" --version | head -1) | nvcc: ${NVCC:-MISSING}" \
    "$([ -n "$NVCC" ] && "$NVCC" --version | tail -1) | cores $(nproc)"
if [ -z "$CMAKE" ] || [ -z "$NVCC" ]; then
    el "cannot build: cmake or nvcc missing"
    exit 2
fi
rm -rf "$DIR" "$DIR.FAILED"
trap '[ -e "$DIR/BUILT" ] || touch "$DIR.FAILED"' EXIT
mkdir -p "$(dirname "$DIR")"
tar xzf "$TGZ" -C "$(dirname "$DIR")" || exit 3
[ "$(dirname "$DIR")/llama" = "$DIR" ] || mv "$(dirname "$DIR")/llama" "$DIR"
el "unpacked $(cat "$DIR/COMMIT")"
COMMIT=$(cut -c1-7 "$DIR/COMMIT")
nice -n 10 "$CMAKE" -S "$DIR" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90-real -DCMAKE_CUDA_COMPILER="$NVCC" -DGGML_NATIVE=OFF -DGGML_CUDA_NCCL=OFF \
    -DGGML_OPENMP=OFF -DGGML_CUDA_COMPRESSION_MODE="${COMPRESS:-none}" -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_COMMIT="$COMMIT" -DLLAMA_BUILD_NUMBER=0 > "$DIR/cmake.txt" 2>&1
rc=$?
grep -E "CUDA|Including|error" "$DIR/cmake.txt" | head -20
el "configured rc=$rc"
[ $rc = 0 ] || exit 4
nice -n 10 make -C "$DIR/build" -j"$JOBS" llama-bench llama-batched-bench > "$DIR/make.txt" 2>&1
rc=$?
grep -iE "error|warning: .*deprecated" "$DIR/make.txt" | head -20
tail -3 "$DIR/make.txt"
el "built rc=$rc"
[ $rc = 0 ] && [ -x "$DIR/build/bin/llama-bench" ] || exit 5
touch "$DIR/BUILT"
el "BUILT: $(ls "$DIR/build/bin")"
if [ -n "${PACK:-}" ]; then
    # stripped of the static symbol tables (the dynamic ones stay): libggml-cuda.so 46 -> 39 MB, 18.6 MB in xz
    P=$(mktemp -d)
    mkdir -p "$P/build"
    cp -a "$DIR/COMMIT" "$P/" && cp -a "$DIR/build/bin" "$P/build/" &&
        find "$P/build/bin" -type f -exec strip --strip-unneeded {} + &&
        (cd "$P" && tar cf - COMMIT build/bin | xz -9 -T2 > "$PACK.tmp") && mv "$PACK.tmp" "$PACK"
    rm -rf "$P"
    el "packed $(ls -la "$PACK")"
fi
