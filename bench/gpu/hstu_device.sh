#!/usr/bin/env bash
# HSTU (MLPerf DLRMv3) on a lent GPU machine, in one call: the GPU parity tests, `ember serve
# --device cuda` checked against the CPU, MLCommons' LoadGen against that server, then Ember against
# the reference model (its Triton kernels, and its PyTorch kernels) on the same GPU. The machine
# has no Rust and no network: build here and carry .gpu and .whl (see docs/gpu.md, "HSTU"):
#
#   cargo build --release -p ember-cli --features cuda
#   cargo test --release -p ember-cuda --test hstu_gpu --no-run     # prints the test binary
#   strip -o .gpu/ember target/release/ember; strip -o .gpu/hstu_gpu target/release/deps/hstu_gpu-<hash>
#   .gpu/gr/generative_recommenders   (git archive of meta-recsys/generative-recommenders)
#   .gpu/site/{torchrec,fbgemm_gpu}   (their pure-Python files: torchrec's wheel; fbgemm_gpu's .py only)
#   .whl/ mlcommons-loadgen, tritonclient, python-rapidjson for Python 3.12 (loadgen: docs/gpu.md)
#
#   bench/gpu/hstu_device.sh [--steps tests,accuracy,serve,loadgen[,loadgen_cache],compare]
#       [--cells 1024:512,4096:2048]
#       [--upb 1,8] [--iters 20] [--rounds 1] [--dtypes bf16,bf16-v2[,f32]] [--rows-scale 1e-4]
#       [--compare-secs 300] [--loadgen-cell 1024:512]
#
# Steps, in the order they run (a 15-minute lease: `--steps tests,accuracy,serve,loadgen` first,
# about 6 minutes, then `--steps compare` with what is left; the reference's Triton autotuning
# takes minutes a shape):
#   tests    the parity tests (crates/ember-cuda/tests/hstu_gpu.rs)
#   accuracy bf16's AUC and NE against the CPU's f32 (`bench model --accuracy 512`), both kernels
#   serve    `ember serve --device cuda` against `ember predict` on the CPU (hstu_serve_check.py):
#            the hstu_small fixture in f32, the DLRMv3 model in f32 and bf16, and in f32 with
#            a history cache on the GPU
#   loadgen  bench/mlperf/harness.py --workload dlrm-v3 on `ember serve --device cuda` (bf16):
#            Offline, then Server's highest VALID rate at p99 <= 80 ms
#   loadgen_cache  (not in the default steps) Offline again with the history cache on the GPU
#   compare  bench/gpu/compare_hstu_gpu.py: Ember against the reference, per cell; Ember's bf16
#            with both attention kernels (--dtypes bf16,bf16-v2, the default)
# The serve and loadgen steps run the default attention kernel (v1); EMBER_HSTU_ATTENTION=v2 in
# the environment runs the second one there.
#
# Logs go to $OUT (else bench/gpu/out): summary.txt, tests.txt, serve_*.txt, loadgen_*.txt and
# lg_*/ (LoadGen's logs), compare.txt / .err / .json; under $OUT all but summary.txt and
# compare.json (and triton-autotune.tgz) are packed into logs.tgz at the end (the tool brings
# back 8 files).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
DEST="${OUT:-$HERE/out}"
STEPS="tests,accuracy,serve,loadgen,compare"
LG_CELL="1024:512"
SV_CELL="${SV_CELL:-1024:512}"
CELLS="1024:512,4096:2048"
UPB="1,8"
ROWS_SCALE="1e-4"
ITERS=20
ROUNDS=1
COMPARE_SECS=300
DTYPES=bf16,bf16-v2
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS="$2"; shift 2 ;;
    --cells) CELLS="$2"; shift 2 ;;
    --upb) UPB="$2"; shift 2 ;;
    --iters) ITERS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --dtypes) DTYPES="$2"; shift 2 ;;
    --rows-scale) ROWS_SCALE="$2"; shift 2 ;;
    --compare-secs) COMPARE_SECS="$2"; shift 2 ;;
    --loadgen-cell) LG_CELL="$2"; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$DEST"
SUMMARY="$DEST/summary.txt"
: > "$SUMMARY"
# The device tool brings back at most 8 files from $OUT: every log but the summary and
# compare.json goes into logs.tgz when the script ends.
pack() {
  [ -n "${OUT:-}" ] || return 0
  (cd "$DEST" && tar czf /tmp/hstu-logs.tgz --exclude summary.txt --exclude compare.json --exclude triton-autotune.tgz . 2>/dev/null \
    && find . -mindepth 1 -maxdepth 1 ! -name summary.txt ! -name compare.json ! -name triton-autotune.tgz -exec rm -rf {} + \
    && mv /tmp/hstu-logs.tgz logs.tgz)
}
trap pack EXIT
want() { [[ ",$STEPS," == *",$1,"* ]]; }
say() { echo "$*" | tee -a "$SUMMARY"; }
. "$HERE/cuda_libs.sh"
export RUST_BACKTRACE=1 GR_ROOT="$ROOT/.gpu/gr" PYTHONPATH="$ROOT/.gpu/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee -a "$SUMMARY"

if want tests; then
  t0=$SECONDS
  timeout -k 5 200 "$ROOT/.gpu/hstu_gpu" --include-ignored --nocapture --test-threads 1 > "$DEST/tests.txt" 2>&1
  say "tests: rc=$? in $((SECONDS - t0)) s"
  grep -E "^test |test result|GPU f32|against the CPU|panicked|assert" "$DEST/tests.txt" | head -n 30 | tee -a "$SUMMARY"
fi

E="$ROOT/.gpu/ember"
M=/tmp/ember-dlrmv3
# The DLRMv3-dims model, made once: random weights, tables scaled by $ROWS_SCALE, f16 rows.
model() {
  [ -f "$M/config.json" ] && return 0
  "$E" data model --preset dlrm-v3 --rows-scale "$ROWS_SCALE" --dtype f16 --out "$M" \
    > "$DEST/data.txt" 2>&1 || { say "data model failed"; tail -n 5 "$DEST/data.txt" | tee -a "$SUMMARY"; return 1; }
}

if want accuracy; then
  # bf16 on the GPU (both attention kernels) against the CPU's f32 on the same users: the AUC
  # and NE it keeps (MLPerf's 99.9%), the largest score error.
  model
  for k in v1 v2; do
    t0=$SECONDS
    EMBER_HSTU_ATTENTION=$k timeout -k 5 150 "$E" bench model --device cuda --model "$M" --dense-dtype bf16 \
      --accuracy 512 --iters 2 --warmup 1 --threads 16 > "$DEST/accuracy_$k.txt" 2>&1
    say "accuracy bf16 ($k): rc=$? in $((SECONDS - t0)) s"
    grep -E "accuracy" "$DEST/accuracy_$k.txt" | tail -n 1 | tee -a "$SUMMARY"
  done
fi

if want serve; then
  # Served scores on the GPU against the CPU's f32 `ember predict`, each user alone, batched and
  # concurrent; a bad user refused, the server serving on.
  model
  FX="$ROOT/crates/ember-model/tests/fixtures/hstu_small"
  "$E" data users --model "$M" --users 16 --history "${SV_CELL%%:*}" --candidates "${SV_CELL##*:}" \
    --out /tmp/v3-users16.jsonl \
    > /dev/null 2>&1
  t0=$SECONDS
  timeout -k 5 120 python3 "$HERE/hstu_serve_check.py" --ember "$E" --model "$FX" --users "$FX/users.jsonl" \
    --tol 2e-5 > "$DEST/serve_small.txt" 2>&1
  say "serve hstu_small f32: rc=$? in $((SECONDS - t0)) s"
  for dt in f32:1e-4 bf16:0.03; do
    t0=$SECONDS
    timeout -k 5 240 python3 "$HERE/hstu_serve_check.py" --ember "$E" --model "$M" --users /tmp/v3-users16.jsonl \
      --dense-dtype "${dt%%:*}" --tol "${dt##*:}" --label "dlrm-v3 ${dt%%:*}" > "$DEST/serve_v3_${dt%%:*}.txt" 2>&1
    say "serve dlrm-v3 ${dt%%:*}: rc=$? in $((SECONDS - t0)) s"
  done
  # With a history cache on the GPU: a user sent again is scored from its entry (the same
  # history: the full recompute's scores to rounding), and the hits are counted.
  t0=$SECONDS
  timeout -k 5 240 python3 "$HERE/hstu_serve_check.py" --ember "$E" --model "$M" --users /tmp/v3-users16.jsonl \
    --tol 1e-4 --label "dlrm-v3 f32, history cache" --serve-args "--history-cache-mb 8192" \
    > "$DEST/serve_v3_cache.txt" 2>&1
  say "serve dlrm-v3 f32 with a history cache: rc=$? in $((SECONDS - t0)) s"
  grep -hE "FAIL|PASS|server up|INFO ember::serve: model" "$DEST"/serve_*.txt | tee -a "$SUMMARY"
fi

if want loadgen; then
  # MLCommons' LoadGen (harness.py --workload dlrm-v3) against `ember serve --device cuda` in bf16:
  # a streaming replay of 64 users of H history items and C candidates each (--loadgen-cell H:C),
  # each request a user's whole history (no history cache: the loadgen_cache step runs with one).
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$ROOT"/.whl/*.whl > "$DEST/wheels.txt" 2>&1 || say "wheels: $(tail -n 2 "$DEST/wheels.txt")"
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  model
  S=/tmp/v3-stream.jsonl
  "$E" data users --model "$M" --users 64 --history "${LG_CELL%%:*}" --candidates "${LG_CELL##*:}" \
    --returns "${LG_RETURNS:-2000}" --grow 8 --out "$S" > "$DEST/loadgen_data.txt" 2>&1
  "$E" serve --model "$M" --name dlrm-v3 --device cuda --dense-dtype bf16 --instances "${LG_INSTANCES:-2}" \
    --max-batch "${LG_MAX_BATCH:-16}" --max-queue-delay-ms 0 --http 127.0.0.1:18220 --grpc 127.0.0.1:18221 \
    > "$DEST/loadgen_serve.txt" 2>&1 &
  SPID=$!
  for _ in $(seq 120); do curl -sf -o /dev/null 127.0.0.1:18220/v2/health/ready && break; sleep 1; done
  say "loadgen server ready: $(curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:18220/v2/health/ready)"
  grep -E "INFO ember::serve: model|rror" "$DEST/loadgen_serve.txt" | head -n 3 | tee -a "$SUMMARY"
  H=(python3 "$ROOT/bench/mlperf/harness.py" --workload dlrm-v3 --users "$S" --warm-lines 64
     --grpc 127.0.0.1:18221 --metrics-url http://127.0.0.1:18220/metrics --server-pid "$SPID")
  t0=$SECONDS
  timeout -k 5 120 "${H[@]}" --scenario Offline --duration "${LG_DURATION:-30}" --max-inflight "${LG_INFLIGHT:-32}" \
    --out "$DEST/lg_offline" > "$DEST/loadgen_offline.txt" 2>&1
  say "loadgen Offline: rc=$? in $((SECONDS - t0)) s"
  grep -E "samples/s|VALID|INVALID|B200|Result" "$DEST/loadgen_offline.txt" | head -n 8 | tee -a "$SUMMARY"
  t0=$SECONDS
  timeout -k 5 "${LG_SERVER_SECS:-240}" "${H[@]}" --find-max --max-inflight "${LG_INFLIGHT:-32}" \
    --search-steps "${LG_STEPS:-3}" --search-duration 10 --duration "${LG_DURATION:-30}" --confirm-tries 1 \
    --out "$DEST/lg_server" > "$DEST/loadgen_server.txt" 2>&1
  say "loadgen Server: rc=$? in $((SECONDS - t0)) s"
  grep -E "samples/s|VALID|INVALID|p99|target|Result" "$DEST/loadgen_server.txt" | tail -n 12 | tee -a "$SUMMARY"
  kill "$SPID"; wait "$SPID" 2>/dev/null
fi

if want loadgen_cache; then
  # The same LoadGen Offline run with the history cache on the GPU (--history-reuse
  # stale:100000:100000, as docs/mlperf.md's CPU runs): returning users compute only their new
  # items and candidates. Needs the loadgen step's stream (run it first, in the same call).
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  "$E" serve --model "$M" --name dlrm-v3 --device cuda --dense-dtype bf16 --instances "${LG_INSTANCES:-2}" \
    --max-batch "${LG_MAX_BATCH:-16}" --max-queue-delay-ms 0 --history-cache-mb "${LG_CACHE_MB:-16384}" \
    --history-reuse stale:100000:100000 --http 127.0.0.1:18222 --grpc 127.0.0.1:18223 \
    > "$DEST/loadgen_cache_serve.txt" 2>&1 &
  SPID=$!
  for _ in $(seq 120); do curl -sf -o /dev/null 127.0.0.1:18222/v2/health/ready && break; sleep 1; done
  say "loadgen (cache) server ready: $(curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:18222/v2/health/ready)"
  t0=$SECONDS
  timeout -k 5 120 python3 "$ROOT/bench/mlperf/harness.py" --workload dlrm-v3 --users /tmp/v3-stream.jsonl \
    --warm-lines 64 --grpc 127.0.0.1:18223 --metrics-url http://127.0.0.1:18222/metrics --server-pid "$SPID" \
    --scenario Offline --duration "${LG_DURATION:-30}" --max-inflight "${LG_INFLIGHT:-32}" \
    --out "$DEST/lg_offline_cache" > "$DEST/loadgen_offline_cache.txt" 2>&1
  say "loadgen Offline with the history cache: rc=$? in $((SECONDS - t0)) s"
  grep -E "samples/s|VALID|INVALID|history|Result" "$DEST/loadgen_offline_cache.txt" | head -n 10 | tee -a "$SUMMARY"
  kill "$SPID"; wait "$SPID" 2>/dev/null
fi

if want compare; then
  model
  # The reference's Triton autotuning (minutes a shape) kept between leases: each kernel's
  # timings are written to the cache as it is tuned (TRITON_CACHE_AUTOTUNING), brought back in
  # triton-autotune.tgz, and read again when carried as .gpu/triton-autotune.tgz (the same Triton,
  # GPU and config lists: the cache's key holds all three).
  export TRITON_CACHE_DIR=/tmp/triton-cache TRITON_CACHE_AUTOTUNING=1
  mkdir -p "$TRITON_CACHE_DIR"
  [ -f "$ROOT/.gpu/triton-autotune.tgz" ] && tar xzf "$ROOT/.gpu/triton-autotune.tgz" -C "$TRITON_CACHE_DIR" \
    && say "triton autotuning carried: $(find "$TRITON_CACHE_DIR" -name '*.autotune.json' | wc -l) kernels' timings"
  t0=$SECONDS
  timeout -k 5 "$COMPARE_SECS" python3 "$HERE/compare_hstu_gpu.py" --ember "$E" --model "$M" \
    --cells "$CELLS" --users-per-batch "$UPB" --iters "$ITERS" --rounds "$ROUNDS" --warmup 2 \
    --ember-dtypes "$DTYPES" --peers "${PEERS:-pytorch,triton}" ${COMPARE_FLAGS:-} --threads 8 --json "$DEST/compare.json" \
    > "$DEST/compare.txt" 2> "$DEST/compare.err"
  say "compare: rc=$? in $((SECONDS - t0)) s"
  cat "$DEST/compare.txt" | tee -a "$SUMMARY"
  grep -E "Error|error|Traceback|accuracy" "$DEST/compare.err" | head -n 20 | tee -a "$SUMMARY"
  (cd "$TRITON_CACHE_DIR" && find . -name '*.autotune.json' | tar czf "$DEST/triton-autotune.tgz" -T -)
  say "triton autotuning kept: $(tar tzf "$DEST/triton-autotune.tgz" | grep -c autotune) kernels' timings"
fi
