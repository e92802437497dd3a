#!/bin/bash
# bench/peer_llamacpp_pack.sh — pack the part of llama.cpp's source that llama-bench and llama-batched-bench
# need with the CUDA and CPU backends into one small tarball for the GPU machine (no network there).
# usage: bash bench/peer_llamacpp_pack.sh LLAMA_SRC OUT.tgz
#   LLAMA_SRC: a llama.cpp tree (we use tag v0.5.0, commit de3ff81, from the gitRelease.bundle inside the npm
#   package node-llama-cpp@3.22.1: `npm pack node-llama-cpp@3.22.1`, untar, `git clone package/llama/gitRelease.bundle`).
# The other backends' folders (Metal, Vulkan, SYCL, ...) are left out: CMake adds a backend's folder only when
# its GGML_<NAME> option is on. tools/CMakeLists.txt is replaced by one naming only the two benchmarks (the
# full one adds every tool, whose folders are not packed); no source file is changed.
set -eu
SRC=$1
OUT=$2
ST=$(mktemp -d)
mkdir -p "$ST/llama/tools" "$ST/llama/ggml/src"
cd "$SRC"
cp -a CMakeLists.txt cmake include src common vendor licenses LICENSE "$ST/llama/"
cp -a ggml/CMakeLists.txt ggml/cmake ggml/include "$ST/llama/ggml/"
for f in ggml/src/*; do
    case "$(basename "$f")" in
    ggml-blas | ggml-cann | ggml-et | ggml-hexagon | ggml-metal | ggml-musa | ggml-opencl | ggml-openvino | \
        ggml-rpc | ggml-sycl | ggml-virtgpu | ggml-vulkan | ggml-webgpu | ggml-zdnn | ggml-zendnn | ggml-hip) ;;
    *) cp -a "$f" "$ST/llama/ggml/src/" ;;
    esac
done
cp -a tools/llama-bench tools/batched-bench "$ST/llama/tools/"
cat > "$ST/llama/tools/CMakeLists.txt" << 'EOF'
# packed by cinfer's bench/peer_llamacpp_pack.sh: only the two benchmarks
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(batched-bench)
add_subdirectory(llama-bench)
EOF
git -C "$SRC" log -1 --format='%H %cd' > "$ST/llama/COMMIT" 2>/dev/null || echo unknown > "$ST/llama/COMMIT"
tar czf "$OUT" -C "$ST" llama
rm -rf "$ST"
ls -la "$OUT"
