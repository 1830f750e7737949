#!/usr/bin/env bash
# The GPU measurements the runtime issue asks for, in the order a lent GPU should spend its minutes on them,
# each stage under its own time limit, logs and JSON under $OUT (what comes back from the device machine).
#
#   bash bench/gpu_check.sh tests     # tests/test_gpu.py (fused-layer tests first); real pair if /tmp/models
#   bash bench/gpu_check.sh large     # runtime_bench large-v2, fused rows beside the unfused ones
#   bash bench/gpu_check.sh profile   # step_profile large-v2 fused: each product, fused vs unfused vs cuBLAS
#   bash bench/gpu_check.sh tiny      # runtime_bench on the real tiny.en pair (needs /tmp/models)
#   bash bench/gpu_check.sh all       # the four, in that order (about 10 minutes: may need two calls)
#
# One device call runs at most 10 minutes: `tests` + `large` fit in one, `profile` + `tiny` in another.
# Carrying the real pair and the missing wheels: ../shared/gpu/README.md (they land in /tmp/models and
# /root/site or /tmp/site). A stage that fails or times out is reported and the next one still runs.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/results/gpu_check}"
MODELS="${ASR_APP_TEST_MODELS:-/tmp/models}"
mkdir -p "$OUT"
for site in /root/site /tmp/site; do [ -d "$site" ] && PYTHONPATH="$site:${PYTHONPATH:-}"; done
export PYTHONPATH="$PWD:${PYTHONPATH:-}" TRITON_INTERPRET=0
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"  # this call's stages only

stage() {  # stage NAME LIMIT_S COMMAND...: run, keep the log, note the exit status and the time it took
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s)
    echo "== $name: $*" | tee -a "$SUMMARY"
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    echo "   rc=$rc ($(( $(date +%s) - start )) s; log $OUT/$name.log)" | tee -a "$SUMMARY"
    tail -n 25 "$OUT/$name.log"
}

real_models() { [ -f "$MODELS/whisper-tiny.en/config.json" ] && [ -f "$MODELS/distil-tiny.en-draft/config.json" ]; }

run_tests() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$OUT/gpu.txt" 2>&1 || echo "no nvidia-smi" >"$OUT/gpu.txt"
    python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" \
        >>"$OUT/gpu.txt" 2>&1
    real_models && export ASR_APP_TEST_MODELS="$MODELS"
    stage tests_fused 240 python3 -m pytest -q -rs tests/test_gpu.py -k fused
    stage tests_gpu 300 python3 -m pytest -q -rs tests/test_gpu.py
}

run_large() {
    stage large_v2 540 python3 bench/runtime_bench.py --shape large-v2 --device cuda --fused-layers --out-dir "$OUT"
}

run_profile() {
    stage profile 300 python3 bench/step_profile.py --shape large-v2 --device cuda --fused-layers --out-dir "$OUT"
}

run_tiny() {
    if ! real_models; then
        echo "== tiny: skipped, no real pair at $MODELS (../shared/gpu/README.md)" | tee -a "$SUMMARY"
        return
    fi
    stage tiny 300 python3 bench/runtime_bench.py --shape tiny --device cuda --tokens 64 --repeats 3 \
        --real-models "$MODELS" --fused-layers --out-dir "$OUT"
}

case "${1:-all}" in
    tests) run_tests ;;
    large) run_large ;;
    profile) run_profile ;;
    tiny) run_tiny ;;
    all) run_tests; run_large; run_profile; run_tiny ;;
    *) echo "usage: bash bench/gpu_check.sh tests|large|profile|tiny|all" >&2; exit 2 ;;
esac
cat "$SUMMARY"
