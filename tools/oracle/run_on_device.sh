#!/bin/bash
# Run from the repository root on the GPU machine (the `run` tool's working copy).
# Makes every fixture under $GEN, packs tests/fixtures and models/default into
# $OUT/fixtures.tgz and $OUT/default.tgz, keeps the whole log in $OUT/log.txt.
# Extra arguments go to make_fixtures.py (e.g. --only qwen3_next --skip-default).
set -o pipefail
OUT=${OUT:-/tmp/oracle-out}
GEN=${GEN:-/tmp/oracle-gen}
rm -rf "$GEN"
mkdir -p "$GEN" "$OUT"
python3 -c "import transformers, torch, tokenizers, safetensors, numpy; print('transformers', transformers.__version__, 'torch', torch.__version__, 'tokenizers', tokenizers.__version__, 'safetensors', safetensors.__version__, 'numpy', numpy.__version__)"
PYTHONUNBUFFERED=1 python3 tools/oracle/make_fixtures.py --root "$GEN" "$@" > "$OUT/log.txt" 2>&1
rc=$?
tar czf "$OUT/fixtures.tgz" -C "$GEN" tests/fixtures
if [ -d "$GEN/models/default" ]; then tar czf "$OUT/default.tgz" -C "$GEN" models/default; fi
du -sh "$GEN"/tests/fixtures/* "$GEN"/models/default 2>/dev/null
ls -l "$OUT"
grep -v -i "warn" "$OUT/log.txt" | tail -n 60
exit $rc
