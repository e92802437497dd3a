#!/bin/bash
# Run from the repository root on the GPU machine (CPU math): makes tests/fixtures/qwen35_vision
# under $GEN with make_vision_fixtures.py, packs it into $OUT/vision.tgz, log in $OUT/vision-log.txt.
# Here, in the repository root: tar xzf <files_at>/vision.tgz
set -o pipefail
OUT=${OUT:-/tmp/oracle-out}
GEN=${GEN:-/tmp/vision-gen}
rm -rf "$GEN"
mkdir -p "$GEN" "$OUT"
PYTHONUNBUFFERED=1 timeout 300 python3 tools/oracle/make_vision_fixtures.py --root "$GEN" "$@" > "$OUT/vision-log.txt" 2>&1
rc=$?
# the whole stdout travels inside the fixture too (a device call's own log can be lost)
mkdir -p "$GEN/tests/fixtures/qwen35_vision"
cp "$OUT/vision-log.txt" "$GEN/tests/fixtures/qwen35_vision/oracle-stdout.txt"
echo "$rc" > "$GEN/tests/fixtures/qwen35_vision/oracle-rc.txt"
tar czf "$OUT/vision.tgz" -C "$GEN" tests/fixtures/qwen35_vision
ls -l "$OUT"
grep -v -i "warn" "$OUT/vision-log.txt" | tail -n 40
echo "make_vision_fixtures rc=$rc"
exit $rc
