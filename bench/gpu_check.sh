#!/usr/bin/env bash
# The GPU measurements the runtime issue asks for, in the order a lent GPU should spend its minutes on them,
# each stage under its own time limit, logs and JSON packed into $OUT (what comes back from the device machine).
#
#   bash bench/gpu_check.sh tests     # tests/test_gpu.py (fused-layer tests first; real pair if /tmp/models), then
#                                     # capture_gc_probe: a garbage collection inside a CUDA-graph capture
#   bash bench/gpu_check.sh large     # runtime_bench large-v2, fused rows beside the unfused ones
#   bash bench/gpu_check.sh profile   # step_profile large-v2 fused: each product, fused vs unfused vs cuBLAS
#   bash bench/gpu_check.sh tiny      # runtime_bench on the real tiny.en pair (needs /tmp/models)
#   bash bench/gpu_check.sh batch     # batch_bench: B = 1..64, off / exact / transformers, real pair and large-v2
#   bash bench/gpu_check.sh serve     # serve_bench: up to 64 live streams and 64 API requests (needs /tmp/models
#                                     # and the serving wheels: FastAPI, uvicorn, websockets, openai)
#   bash bench/gpu_check.sh serve_engines  # the same streams through the one-lock engine and fixed-length prompts
#   bash bench/gpu_check.sh prompt    # 32 streams, the scheduler beside fixed-length live prompts (rows that can
#                                     # batch), one server run each; the batch samples say what a served batch cost
#   bash bench/gpu_check.sh layers    # api_layers: 64 requests through decoder, transcribe, scheduler and HTTP in turn,
#                                     # 3 rounds (one round took 42 s on an H200; its first round holds the captures)
#   bash bench/gpu_check.sh gil       # gil_probe: a decode beside a thread spinning in Python, switch interval 0.1-5 ms;
#                                     # then serve_bench at N = 32 and 64 API requests, interval 0.5 then 5 ms
#   bash bench/gpu_check.sh host      # alignment_bench (cuda) and features_bench: a live batch's host work
#   bash bench/gpu_check.sh stream    # stream_bench: one stream's latency and WER, off / exact, on 4 test clips
#   bash bench/gpu_check.sh eval      # asr-eval Table 1 (baseline / exact / sigmoid, T = 1) on the test clips
#   bash bench/gpu_check.sh all       # all thirteen, in that order
#   bash bench/gpu_check.sh tests large tiny    # several stages in one call
#
# Measured on an H200 (2026-11-26): tests 160 s, large 80 s, tiny 52 s, batch 133 s, profile 38 s, so
# `tests large tiny` fit one 10-minute device call and `batch profile` another. Logs and the benches' JSON,
# tables and plots go to $WORK (results in $WORK/results/<gpu>/<date>/, the convention of bench/report_io.py),
# which after every stage is packed into $OUT/gpu_check.tgz: a device call returns at most 8 files, none more
# than 2 folders down. Here: tar xzf it, copy its results/* into bench/results/, run
# `python tools/docs_tables.py` for the tables that name them, and commit both.
# Carrying the real pair and the missing wheels: ../shared/gpu/README.md (they land in /tmp/models and
# /root/site or /tmp/site). A stage that fails or times out is reported and the next one still runs.
set -u
cd "$(dirname "$0")/.."
OUT="${OUT:-bench/results/gpu_check}"  # what comes back from the device machine
WORK="${WORK:-/tmp/gpu_check}"         # kept across the calls of one warm machine
MODELS="${ASR_APP_TEST_MODELS:-/tmp/models}"
mkdir -p "$OUT" "$WORK"
for site in /root/site /tmp/site; do [ -d "$site" ] && PYTHONPATH="$site:${PYTHONPATH:-}"; done
export PYTHONPATH="$PWD:${PYTHONPATH:-}" TRITON_INTERPRET=0
RESULTS="$WORK/results/$(python3 -c "import sys; sys.path.insert(0, 'bench'); import report_io as r; \
print(r.results_dir('cuda').relative_to(r.RESULTS))" 2>/dev/null || echo gpu/unknown-date)"
mkdir -p "$RESULTS"
SUMMARY="$WORK/summary.txt"  # every call's stages

pack() { tar czf "$OUT/gpu_check.tgz" -C "$WORK" . && cp "$SUMMARY" "$OUT/summary.txt"; }

stage() {  # stage NAME LIMIT_S COMMAND...: run, keep the log, note the exit status and the time it took
    local name=$1 limit=$2 start rc
    shift 2
    start=$(date +%s)
    echo "== $name: $*" | tee -a "$SUMMARY"
    timeout "$limit" "$@" >"$WORK/$name.log" 2>&1
    rc=$?
    echo "   rc=$rc ($(( $(date +%s) - start )) s; log $name.log)" | tee -a "$SUMMARY"
    tail -n 25 "$WORK/$name.log"
    pack  # a later stage that overruns the call's limit loses nothing of this one
}

real_models() { [ -f "$MODELS/whisper-tiny.en/config.json" ] && [ -f "$MODELS/distil-tiny.en-draft/config.json" ]; }

run_tests() {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$WORK/gpu.txt" 2>&1 || echo "no nvidia-smi" >"$WORK/gpu.txt"
    python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" \
        >>"$WORK/gpu.txt" 2>&1
    real_models && export ASR_APP_TEST_MODELS="$MODELS"
    stage tests_fused 240 python3 -m pytest -q -rs tests/test_gpu.py -k fused
    stage tests_gpu 300 python3 -m pytest -q -rs tests/test_gpu.py -k "not fused"
    # whether a garbage collection inside a capture breaks it, with and without the pause (seconds)
    stage capture_gc 120 python3 bench/capture_gc_probe.py --out "$RESULTS/capture_gc_probe.json"
}

run_large() {  # with the real pair in the same run: the projection uses its measured tokens per target call
    local real=()
    real_models && real=(--real-models "$MODELS")
    stage large_v2 540 python3 bench/runtime_bench.py --shape large-v2 --device cuda --fused-layers "${real[@]}" \
        --out-dir "$RESULTS"
}

run_profile() {
    stage profile 300 python3 bench/step_profile.py --shape large-v2 --device cuda --fused-layers --out-dir "$RESULTS"
}

run_tiny() {
    if ! real_models; then
        echo "== tiny: skipped, no real pair at $MODELS (../shared/gpu/README.md)" | tee -a "$SUMMARY"
        return
    fi
    stage tiny 300 python3 bench/runtime_bench.py --shape tiny --device cuda --tokens 64 --repeats 3 \
        --real-models "$MODELS" --fused-layers --out-dir "$RESULTS"
}

run_batch() {  # batched throughput: the large-v2 shape (random weights), then the real pair on the 64 clips
    stage batch_large_v2 300 python3 bench/batch_bench.py --shape large-v2 --device cuda --clips 64 \
        --batch 1 2 4 8 16 32 64 --tokens 64 --out "$RESULTS/batch_bench_large-v2.json"
    if ! real_models; then
        echo "== batch_real: skipped, no real pair at $MODELS (../shared/gpu/README.md)" | tee -a "$SUMMARY"
        return
    fi
    # the repository's 13 test clips travel with it: repeated up to 64 rows
    stage batch_real 280 python3 bench/batch_bench.py --models "$MODELS" --audio tests/data/audio --device cuda \
        --clips 64 --cycle-clips --batch 1 2 4 8 16 32 64 --modes off exact transformers \
        --out "$RESULTS/batch_bench.json"
}

serve_clips() {  # serve_clips STAGE: the repository's test clips with transcripts (11), repeated up to 64 streams
    SERVE_ARGS=(--models "$MODELS" --audio tests/data/audio --cycle-clips --device cuda --threads 4)
    real_models && return 0
    echo "== $1: skipped, no real pair at $MODELS (../shared/gpu/README.md)" | tee -a "$SUMMARY"
    return 1
}

run_serve() {  # the scheduler's batching where it should pay: N live streams over a real asr-serve, 64 API requests
    serve_clips serve || return
    stage serve 300 python3 bench/serve_bench.py "${SERVE_ARGS[@]}" --streams 1,8,32,64 --engines scheduler \
        --api-requests 64 --out "$RESULTS/serve_bench.json"
}

run_serve_engines() {  # beside it: the old one-lock engine, and live prompts cut to one length so rows batch
    serve_clips serve_engines || return
    stage serve_lock 150 python3 bench/serve_bench.py "${SERVE_ARGS[@]}" --streams 1,32 --engines lock \
        --api-requests 0 --out "$RESULTS/serve_bench_lock.json"
    stage serve_prompt 200 python3 bench/serve_bench.py "${SERVE_ARGS[@]}" --streams 1,8,32,64 \
        --engines scheduler+context+prompt --api-requests 0 --out "$RESULTS/serve_bench_prompt.json"
}

run_prompt() {  # whether live rows batch on a GPU once their prompts share a length, and what those batches cost
    serve_clips prompt || return
    stage prompt 240 python3 bench/serve_bench.py "${SERVE_ARGS[@]}" --streams 1,32 \
        --engines scheduler,scheduler+context+prompt --api-requests 0 --out "$RESULTS/serve_bench_prompt32.json"
}

run_layers() {  # where a served request's time goes, and where batching's gain is lost (bench/api_layers.py)
    serve_clips layers || return
    stage layers 300 python3 bench/api_layers.py --models "$MODELS" --audio tests/data/audio --cycle-clips \
        --device cuda --threads 4 --requests 64 --batch 8 --rounds 3 --out "$RESULTS/api_layers.json"
}

run_gil() {  # how much the interpreter lock makes the decoder wait, alone and in the server (bench/gil_probe.py)
    serve_clips gil || return
    stage gil 120 python3 bench/gil_probe.py --models "$MODELS" --device cuda --threads 4 --busy 1 \
        --intervals-ms 0.1 0.5 5 --out "$RESULTS/gil_probe.json"
    local ms
    # one pair (a device call runs at most 10 minutes), read beside the serve stage's run; 0.5 ms first: on the
    # H200 of 2026-11-28 the device time ran out before it, after the 5 ms run
    for ms in 0.5 5; do
        stage "serve_switch$ms" 150 python3 bench/serve_bench.py "${SERVE_ARGS[@]}" --streams 32 --engines scheduler \
            --api-requests 64 --switch-interval-ms "$ms" --out "$RESULTS/serve_bench_switch${ms}_$(date +%H%M%S).json"
    done
}

run_host() {  # the host work of a batch of live rows: word timing row by row vs batched, features (2026-11-28)
    real_models || { echo "== host: skipped, no real pair at $MODELS" | tee -a "$SUMMARY"; return; }
    stage host_alignment 180 python3 bench/alignment_bench.py --models "$MODELS" --device cuda --threads 4 \
        --out "$RESULTS/alignment_bench.json"
    stage host_features 120 python3 bench/features_bench.py --models "$MODELS" --threads 4 \
        --out "$RESULTS/features_bench.json"
}

run_stream() {  # the streaming pipeline alone on the GPU, paced in real time (4 clips, about 40 s of speech)
    real_models || { echo "== stream: skipped, no real pair at $MODELS" | tee -a "$SUMMARY"; return; }
    local libri=tests/data/audio/librispeech/LibriSpeech/test-clean/1089
    stage stream 420 python3 bench/stream_bench.py --target "$MODELS/whisper-tiny.en" \
        --draft "$MODELS/distil-tiny.en-draft" --device cuda --threads 4 --realtime-only \
        --clips tests/data/audio/jfk/jfk.flac "$libri/134686/1089-134686-0000.flac" \
        "$libri/134691/1089-134691-0001.flac" tests/data/audio/ljspeech/wavs/LJ001-0001.flac \
        --out "$RESULTS/stream_bench.json"
}

run_eval() {  # the paper's comparison on every test clip with a transcript: LibriSpeech, then LJSpeech
    real_models || { echo "== eval: skipped, no real pair at $MODELS" | tee -a "$SUMMARY"; return; }
    local pair=(--target "$MODELS/whisper-tiny.en" --draft "$MODELS/distil-tiny.en-draft" --device cuda --no-progress)
    stage eval_librispeech 240 python3 -m asr_app.eval.cli --dataset librispeech \
        --data-dir tests/data/audio/librispeech "${pair[@]}" --output-dir "$RESULTS/eval_librispeech"
    stage eval_ljspeech 240 python3 -m asr_app.eval.cli --dataset ljspeech --data-dir tests/data/audio/ljspeech \
        "${pair[@]}" --output-dir "$RESULTS/eval_ljspeech"
}

for what in "${@:-all}"; do
    case "$what" in
        tests) run_tests ;;
        large) run_large ;;
        profile) run_profile ;;
        tiny) run_tiny ;;
        batch) run_batch ;;
        serve) run_serve ;;
        serve_engines) run_serve_engines ;;
        prompt) run_prompt ;;
        layers) run_layers ;;
        gil) run_gil ;;
        host) run_host ;;
        stream) run_stream ;;
        eval) run_eval ;;
        all) run_tests; run_large; run_profile; run_tiny; run_batch; run_serve; run_serve_engines; run_prompt; run_layers; run_gil; run_host; run_stream
             run_eval ;;
        *) echo "usage: bash bench/gpu_check.sh [tests|large|profile|tiny|batch|serve|serve_engines|prompt|layers|gil|host|stream|eval|all]..." >&2
           exit 2 ;;
    esac
done
pack
cat "$SUMMARY"
