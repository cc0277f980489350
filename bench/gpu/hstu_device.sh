#!/usr/bin/env bash
# HSTU (MLPerf DLRMv3) on a lent GPU machine, in one call: the GPU parity tests, then Ember against
# the reference model (its Triton kernels, and its PyTorch kernels) on the same GPU. The machine
# has no Rust: build here and carry .gpu (see docs/gpu.md, "HSTU"):
#
#   cargo build --release -p ember-cli --features cuda
#   cargo test --release -p ember-cuda --test hstu_gpu --no-run     # prints the test binary
#   strip -o .gpu/ember target/release/ember; strip -o .gpu/hstu_gpu target/release/deps/hstu_gpu-<hash>
#   .gpu/gr/generative_recommenders   (git archive of meta-recsys/generative-recommenders)
#   .gpu/site/{torchrec,fbgemm_gpu}   (their pure-Python files: torchrec's wheel; fbgemm_gpu's .py only)
#
#   bench/gpu/hstu_device.sh [--steps tests,compare] [--cells 1024:512,4096:2048] [--upb 1,8]
#       [--iters 20] [--rounds 1] [--dtypes bf16[,f32]] [--rows-scale 1e-4] [--compare-secs 300]
#
# Logs go to $OUT (else bench/gpu/out): summary.txt, tests.txt, compare.txt / .err / .json.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
DEST="${OUT:-$HERE/out}"
STEPS="tests,compare"
CELLS="1024:512,4096:2048"
UPB="1,8"
ROWS_SCALE="1e-4"
ITERS=20
ROUNDS=1
COMPARE_SECS=300
DTYPES=bf16
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
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$DEST"
SUMMARY="$DEST/summary.txt"
: > "$SUMMARY"
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

if want compare; then
  M=/tmp/ember-dlrmv3
  "$ROOT/.gpu/ember" data model --preset dlrm-v3 --rows-scale "$ROWS_SCALE" --dtype f16 --out "$M" \
    > "$DEST/data.txt" 2>&1 || { say "data model failed"; tail -n 5 "$DEST/data.txt" | tee -a "$SUMMARY"; }
  t0=$SECONDS
  timeout -k 5 "$COMPARE_SECS" python3 "$HERE/compare_hstu_gpu.py" --ember "$ROOT/.gpu/ember" --model "$M" \
    --cells "$CELLS" --users-per-batch "$UPB" --iters "$ITERS" --rounds "$ROUNDS" --warmup 2 \
    --ember-dtypes "$DTYPES" --peers "${PEERS:-pytorch,triton}" ${COMPARE_FLAGS:-} --threads 8 --json "$DEST/compare.json" \
    > "$DEST/compare.txt" 2> "$DEST/compare.err"
  say "compare: rc=$? in $((SECONDS - t0)) s"
  cat "$DEST/compare.txt" | tee -a "$SUMMARY"
  grep -E "Error|error|Traceback|accuracy" "$DEST/compare.err" | head -n 20 | tee -a "$SUMMARY"
fi
