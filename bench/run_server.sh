#!/usr/bin/env bash
# run_server.sh — the server benchmark: starts `cinfer serve` on 127.0.0.1 and drives it with bench/load.mjs
# from the same machine.
#
#   bench/run_server.sh overhead [MODEL_DIR]  single-stream decode over HTTP vs `cinfer bench` in process,
#                                             interleaved (bench, http, bench, http, ...) until REPS clean
#                                             pairs (other work on the VM under CLEAN CPUs during both
#                                             halves) or MAX_PAIRS pairs
#   bench/run_server.sh load [MODEL_DIR]      1, 8, 32, 64 concurrent streams (LEVELS)
#   bench/run_server.sh all [MODEL_DIR]       both
#
# MODEL_DIR needs tokenizer.json + tokenizer_config.json next to the weights; for a synth checkpoint:
#   build/cinfer synth --like qwen3.5-0.8b --out /tmp/s08
#   cp models/default/tokenizer.json models/default/tokenizer_config.json /tmp/s08/
# Environment: BIN (build/cinfer), PORT (18431), MAX_SEQS (64), CTX (512), LEVELS (1,8,32,64), PROMPT (128),
# MAXTOK (64:128 for load), DECODE (128 for overhead), REPS (3), MAX_PAIRS (3 x REPS), CLEAN (0.10),
# THREADS (0: all CPUs), OUT (directory for
# the JSON records and logs; default /tmp/cinfer-bench-server).
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-all}
dir=${2:-/tmp/s08}
BIN=${BIN:-build/cinfer}
PORT=${PORT:-18431}
MAX_SEQS=${MAX_SEQS:-64}
CTX=${CTX:-512}
LEVELS=${LEVELS:-1,8,32,64}
PROMPT=${PROMPT:-128}
MAXTOK=${MAXTOK:-64:128}
DECODE=${DECODE:-128}
REPS=${REPS:-3}
MAX_PAIRS=${MAX_PAIRS:-$((3 * REPS))}
CLEAN=${CLEAN:-0.10}
THREADS=${THREADS:-0}
OUT=${OUT:-/tmp/cinfer-bench-server}
url=http://127.0.0.1:$PORT

case $mode in overhead|load|all) ;; *) echo "usage: $0 overhead|load|all [MODEL_DIR]" >&2; exit 2 ;; esac
[ -x "$BIN" ] || { echo "$BIN not built (make)" >&2; exit 2; }
[ -f "$dir/tokenizer.json" ] || { echo "$dir has no tokenizer.json: copy models/default/tokenizer*.json into it" >&2; exit 2; }
mkdir -p "$OUT"

srv_pid=
stop_server() {
    if [ -n "$srv_pid" ]; then
        kill "$srv_pid" 2>/dev/null || true
        wait "$srv_pid" 2>/dev/null || true
        srv_pid=
    fi
}
trap stop_server EXIT

# CPU accounting: other engineers' jobs share this VM (in containers ps does not show, but /proc/stat
# counts), so every figure comes with the CPUs that were busy on something other than this benchmark.
vm_busy() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat; } # jiffies, all CPUs
pid_cpu() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
hz=$(getconf CLK_TCK)
# foreign CPUs over an interval: (VM busy - ours) / wall; args: busy0 busy1 ours_jiffies wall_s
foreign() { awk -v a="$1" -v b="$2" -v o="$3" -v w="$4" -v hz="$hz" 'BEGIN {f = (b - a - o) / hz / w; if (f < 0) f = 0; printf "%.2f", f}'; }
now() { date +%s.%N; }

start_server() { # $1: max-seqs
    "$BIN" serve -m "$dir" --host 127.0.0.1 --port "$PORT" --max-seqs "$1" --ctx-size "$CTX" --threads "$THREADS" \
        --queue-limit 256 --timeout 3600 >"$OUT/server.log" 2>&1 &
    srv_pid=$!
    for _ in $(seq 1 600); do
        if curl -sf "$url/health" >/dev/null 2>&1; then return 0; fi
        kill -0 "$srv_pid" 2>/dev/null || { cat "$OUT/server.log" >&2; exit 1; }
        sleep 0.2
    done
    echo "server did not become ready" >&2
    exit 1
}

echo "# $(date -u +%FT%TZ) checkout $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src include || echo +dirty), binary $BIN, model $dir"
echo "# $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load average $(cut -d' ' -f1-3 /proc/loadavg)"

if [ "$mode" = overhead ] || [ "$mode" = all ]; then
    start_server "$MAX_SEQS"
    echo "## overhead: decode tok/s, $PROMPT-token prompt, $DECODE tokens; server --max-seqs $MAX_SEQS --ctx-size $CTX"
    echo "# foreign = CPUs busy with other work during the run (of $(nproc)); a pair is clean when both are < $CLEAN"
    : >"$OUT/ratios-all"
    : >"$OUT/ratios-clean"
    for r in $(seq 1 "$MAX_PAIRS"); do
        la=$(cut -d' ' -f1 /proc/loadavg)
        v0=$(vm_busy); t0=$(now)
        b=$(/usr/bin/time -f 'cpu %U %S' -o "$OUT/time-bench" "$BIN" bench -m "$dir" -p "$PROMPT" -n "$DECODE" --threads "$THREADS" |
            awk '/^decode/ {print $4}')
        v1=$(vm_busy); t1=$(now)
        fb=$(foreign "$v0" "$v1" "$(awk -v hz="$hz" '{print ($2 + $3) * hz}' "$OUT/time-bench")" "$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')")
        s0=$(pid_cpu "$srv_pid"); v0=$(vm_busy); t0=$(now)
        h=$(/usr/bin/time -f 'cpu %U %S' -o "$OUT/time-node" node bench/load.mjs --url "$url" --concurrency 1 --prompt-tokens "$PROMPT" \
                --max-tokens "$DECODE" --seed "$r" --json "$OUT/overhead-$r.json" | awk '$1 == 1 {print $12}')
        s1=$(pid_cpu "$srv_pid"); v1=$(vm_busy); t1=$(now)
        fh=$(foreign "$v0" "$v1" "$(awk -v hz="$hz" -v s="$((s1 - s0))" '{print ($2 + $3) * hz + s}' "$OUT/time-node")" "$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')")
        ratio=$(awk -v h="$h" -v b="$b" 'BEGIN {printf "%.3f", h / b}')
        clean=$(awk -v a="$fb" -v b="$fh" -v c="$CLEAN" 'BEGIN {print (a < c && b < c) ? "clean" : "noisy"}')
        echo "pair $r: in-process $b tok/s (foreign $fb), HTTP $h tok/s (foreign $fh), ratio $ratio, $clean (load $la -> $(cut -d' ' -f1 /proc/loadavg))"
        echo "$ratio" >>"$OUT/ratios-all"
        [ "$clean" = clean ] && echo "$ratio" >>"$OUT/ratios-clean"
        [ "$(wc -l <"$OUT/ratios-clean")" -ge "$REPS" ] && break
    done
    med() { sort -n "$1" | awk '{a[NR] = $1} END {if (NR) printf "%.3f (%d pairs, %.3f..%.3f)", (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2), NR, a[1], a[NR]; else printf "none"}'; }
    echo "ratio HTTP / in-process: median of clean pairs $(med "$OUT/ratios-clean"); of all pairs $(med "$OUT/ratios-all")"
    stop_server
fi

if [ "$mode" = load ] || [ "$mode" = all ]; then
    start_server "$MAX_SEQS"
    echo "## load: server --max-seqs $MAX_SEQS --ctx-size $CTX; levels $LEVELS"
    IFS=, read -r -a lv <<<"$LEVELS"
    for c in "${lv[@]}"; do
        s0=$(pid_cpu "$srv_pid"); v0=$(vm_busy); t0=$(now)
        /usr/bin/time -f 'cpu %U %S' -o "$OUT/time-node" node bench/load.mjs --url "$url" --concurrency "$c" \
            --prompt-tokens "$PROMPT" --max-tokens "$MAXTOK" --json "$OUT/load-$c.json" | { [ "$c" = "${lv[0]}" ] && cat || tail -n +3; }
        s1=$(pid_cpu "$srv_pid"); v1=$(vm_busy); t1=$(now)
        echo "      foreign CPUs during the level: $(foreign "$v0" "$v1" "$(awk -v hz="$hz" -v s="$((s1 - s0))" '{print ($2 + $3) * hz + s}' "$OUT/time-node")" "$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')")"
    done
    curl -s "$url/metrics" | grep -E '^cinfer_(engine_|requests_|http_requests)' | head -20 || true
    stop_server
fi
