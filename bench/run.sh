#!/usr/bin/env bash
# run.sh — `make bench`: the CPU benchmarks recorded in bench/RESULTS.md. Makes the synthetic checkpoints once
# (in $BENCH_DIR, default /tmp/cinfer-bench), then runs cinfer bench on them and the kernel benches.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
D=${BENCH_DIR:-/tmp/cinfer-bench}
mkdir -p "$D"
for m in qwen3.5-0.8b qwen3.5-2b; do
  [ -f "$D/$m/config.json" ] || "$BUILD/cinfer" synth --like "$m" --out "$D/$m"
  "$BUILD/cinfer" bench -m "$D/$m" -p 512 -n 32
done
BUILD=$BUILD bench/run_matmul.sh 2
BUILD=$BUILD bench/run_sampler.sh
