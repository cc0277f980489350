#!/usr/bin/env bash
# Everything a lent GPU machine should run in one call, each step bounded in time, every log kept:
# the tools, the CUDA crate's tests on the device, compute-sanitizer over a short run of each
# variant, and bench/gpu/run.sh. Binaries are built elsewhere (the GPU machine has no Rust):
#
#   cargo build --release -p ember-cli --features cuda
#   cargo test -p ember-cuda --release --no-run          # prints the test binaries' paths
#   mkdir -p .gpu && strip -o .gpu/ember target/release/ember
#   strip -o .gpu/gpu_props target/release/deps/gpu_props-<hash>     (likewise nvrtc_compile,
#   and the crate's unit tests as .gpu/ember_cuda_unit); cp <trace> .gpu/
#
#   bench/gpu/device_check.sh [--dir .gpu] [--out DIR]
#       [--steps tools,tests,model,dlrmv2,fullsize,mlperf,ncu,serve,sanitize,bench,full]
#
# mlperf needs mlcommons-loadgen and tritonclient: carry their wheels in .whl (bench/mlperf/README.md).
#
# Logs go to OUT (default $OUT, else bench/gpu/out) as one tarball plus summary.txt.
set -uo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
DIR="$ROOT/.gpu"
DEST="${OUT:-$HERE/out}"
STEPS="tools,tests,sanitize,bench"
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) DIR="$2"; shift 2 ;;
    --out) DEST="$2"; shift 2 ;;
    --steps) STEPS="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
LOG="$(mktemp -d)/logs"
mkdir -p "$LOG" "$DEST"
SUMMARY="$DEST/summary.txt"
: > "$SUMMARY"
want() { [[ ",$STEPS," == *",$1,"* ]]; }
say() { echo "$*" | tee -a "$SUMMARY"; }
# step NAME SECONDS CMD...: runs CMD with a time limit, its output in LOG/NAME.txt, one summary line.
step() {
  local name="$1" secs="$2"; shift 2
  local t0=$SECONDS
  timeout -k 10 "$secs" "$@" > "$LOG/$name.txt" 2>&1
  local rc=$?
  say "step $name: rc=$rc in $((SECONDS - t0)) s"
  return $rc
}

# PyTorch's CUDA libraries for Ember's dynamic loading.
. "$HERE/cuda_libs.sh"
export EMBER_TUNE_CACHE="$LOG/cuda-tune.json"
export RUST_BACKTRACE=1

if want tools; then
  {
    nvidia-smi
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
    ncu --version; compute-sanitizer --version; nvcc --version
    python3 -c 'import torch; p = torch.cuda.get_device_properties(0); print(torch.__version__, p.name, p.multi_processor_count, "SMs", getattr(p, "L2_cache_size", "?"), "B L2")'
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    for l in libcuda.so.1 libnvrtc.so.13 libcublas.so.13; do
      echo "$l: $(ldconfig -p | grep -m1 "$l" || find ${CUDA_LIBS//:/ } -name "$l*" 2>/dev/null | head -1)"
    done
  } > "$LOG/tools.txt" 2>&1
  head -n 40 "$LOG/tools.txt" | grep -E "H100|H200|NVIDIA|Version|release|SMs|lib" | tee -a "$SUMMARY"
fi

if want tests; then
  # Built on a machine without a GPU, these tests are marked ignored: run them all here.
  step unit 120 "$DIR/ember_cuda_unit" --include-ignored --test-threads 4
  want nvrtc && step nvrtc 300 "$DIR/nvrtc_compile" --include-ignored --test-threads 8
  step props 400 "$DIR/gpu_props" --include-ignored --nocapture --test-threads 1
  grep -E "^test |test result|skipped|panicked|mismatch|error" "$LOG/props.txt" | head -n 40 | tee -a "$SUMMARY"
fi

E="$DIR/ember"
SMALL=(--tables 4 --rows 20000 --dim 72 --pooling 9 --batch 64 --batches 2 --runs 1 --gpu-iters 1 --profile-batches 2)
if want bench; then
  step run_quick 600 env EMBER="$E" PYTHON=python3 "$HERE/run.sh" --quick \
    --trace "$DIR/reuse_medium_table_500K.txt" --out "$LOG/run_quick"
  cat "$LOG/run_quick/summary.txt" >> "$SUMMARY" 2>/dev/null
  tail -n 30 "$LOG/run_quick.txt"
fi

if want full; then
  step run_full 480 env EMBER="$E" PYTHON=python3 "$HERE/run.sh" \
    --trace "$DIR/reuse_medium_table_500K.txt" --out "$LOG/run_full"
  cat "$LOG/run_full/summary.txt" >> "$SUMMARY" 2>/dev/null
fi

if want model; then
  step model_breakdown 200 "$E" bench model --device cuda --gpu-variant prefetch --preset rm1 \
    --batch 2048 --iters 50 --warmup 5
  grep -E "samples/s|batch ms|per batch" "$LOG/model_breakdown.txt" | tee -a "$SUMMARY"
  # RM1 end to end against PyTorch eager, every batch from the host, per variant.
  for v in ${MODEL_VARIANTS:-prefetch}; do
    step "model_$v" 300 python3 "$ROOT/bench/compare_torch_dlrm.py" --ember "$E" --device cuda \
      --gpu-variant "$v" --preset rm1 --batch 2048 --iters 200 --warmup 20 --rounds 3
    grep -E "per batch|samples/s|ember|pytorch" "$LOG/model_$v.txt" | tail -n 6 | tee -a "$SUMMARY"
  done
fi

if want dlrmv2; then
  # MLPerf DLRM-v2 (tables capped at 200,000 rows on both sides) at batch 2048, every batch from
  # the host: Ember's bf16 and f32 dense layers against PyTorch eager in f32 and bf16 autocast.
  step dlrmv2 420 python3 "$ROOT/bench/compare_torch_dlrm.py" --ember "$E" --device cuda \
    --gpu-variant prefetch --preset dlrm-v2 --batch 2048 --iters 100 --warmup 10 --rounds 3 \
    --ember-dense bf16,f32 --torch-modes fp32,bf16 --json
  grep -E "ember|pytorch|per batch|medians" "$LOG/dlrmv2.txt" | tail -n 12 | tee -a "$SUMMARY"
  # bf16's accuracy on the GPU against the CPU's f32 scores (MLPerf's AUC rule).
  step dlrmv2_accuracy 200 "$E" bench model --device cuda --gpu-variant prefetch --preset dlrm-v2 \
    --dense-dtype bf16 --batch 2048 --iters 20 --warmup 3 --accuracy 16384
  grep -E "samples/s|AUC|accuracy|per batch" "$LOG/dlrmv2_accuracy.txt" | tee -a "$SUMMARY"
fi

if want fullsize; then
  # Full-size DLRM-v2 (204M rows) with int8 tables in HBM, bf16 dense layers.
  step fullsize 400 "$E" bench model --device cuda --gpu-variant prefetch --preset dlrm-v2 \
    --max-rows 0 --dtype int8 --dense-dtype bf16 --batch 2048 --iters 100 --warmup 10 --threads 16
  grep -E "samples/s|per batch|tables|GB" "$LOG/fullsize.txt" | head -n 8 | tee -a "$SUMMARY"
fi

if want mlperf; then
  # `ember serve --device cuda` under MLCommons' LoadGen (bench/mlperf/harness.py): DLRM-v2 with
  # int8 tables (rows scaled by $MLPERF_ROWS_SCALE, default 0.05; 1.0 is full size) and bf16
  # dense layers.
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$ROOT"/.whl/*.whl > "$LOG/wheels.txt" 2>&1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  M=/tmp/ember-mlperf/int8
  step mlperf_model 300 "$E" data model --preset dlrm-v2 --rows-scale "${MLPERF_ROWS_SCALE:-0.05}" \
    --dtype int8 --dense-dtype bf16 --threads "$(nproc)" --out "$M"
  "$E" serve --model "$M" --name dlrm-v2 --device cuda --gpu-variant prefetch --dense-dtype bf16 \
    --instances "${MLPERF_INSTANCES:-2}" --max-batch "${MLPERF_MAX_BATCH:-4096}" \
    --max-queue-delay-ms 0 --http 127.0.0.1:18120 --grpc 127.0.0.1:18121 > "$LOG/mlperf_serve.txt" 2>&1 &
  SPID=$!
  for _ in $(seq 180); do curl -sf -o /dev/null 127.0.0.1:18120/v2/health/ready && break; sleep 1; done
  say "server ready: $(curl -s -o /dev/null -w '%{http_code}' 127.0.0.1:18120/v2/health/ready)"; tail -n 5 "$LOG/mlperf_serve.txt" | tee -a "$SUMMARY"
  [ "${MLPERF_OFFLINE:-1}" = 1 ] && step mlperf_offline 150 python3 "$ROOT/bench/mlperf/harness.py" --grpc 127.0.0.1:18121 \
    --scenario Offline --duration 30 --max-inflight 32 --metrics-url http://127.0.0.1:18120/metrics \
    --server-pid "$SPID" --out "$LOG/mlperf_offline"
  grep -E "samples/s|VALID|INVALID|pairs|Result" "$LOG/mlperf_offline.txt" | head -n 8 | tee -a "$SUMMARY"
  # The search's upper end: the closed-loop rate with 32 calls in flight, times the headroom.
  step mlperf_server 330 python3 "$ROOT/bench/mlperf/harness.py" --grpc 127.0.0.1:18121 --find-max \
    --max-inflight 32 --search-headroom "${MLPERF_HEADROOM:-1.5}" \
    --search-steps "${MLPERF_STEPS:-4}" --search-duration 10 --duration "${MLPERF_DURATION:-40}" \
    --metrics-url http://127.0.0.1:18120/metrics --server-pid "$SPID" --out "$LOG/mlperf_server"
  grep -E "samples/s|VALID|INVALID|p99|pairs|Result|target" "$LOG/mlperf_server.txt" | tail -n 12 | tee -a "$SUMMARY"
  kill "$SPID"; wait "$SPID" 2>/dev/null
fi

if want ncu; then
  # Hardware counters of the pooling kernel: baseline and l2pin on the trace (a few launches).
  for v in baseline l2pin; do
    step "ncu_$v" 300 ncu --clock-control none --kernel-name regex:ember_pool --launch-skip 2 \
      --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
      --section LaunchStats "$E" bench embed --device cuda --variants "$v" --tables 12 \
      --rows 500000 --dim 128 --pooling 150 --batch 2048 --batches 2 --runs 1 --gpu-iters 1 \
      --profile-batches 8 --no-check --ids "$DIR/reuse_medium_table_500K.txt"
    grep -E "Memory Throughput|DRAM Throughput|L2 Hit Rate|L1/TEX Hit|Achieved Occupancy|Registers Per|Duration" \
      "$LOG/ncu_$v.txt" | head -n 16 | tee -a "$SUMMARY"
  done
fi

if want serve; then
  # `predict` and `serve` with --device cuda on the shipped model, against the CPU: the same
  # scores, a bad request refused with 400, and a short fixed-rate load on each server.
  step predict_cpu 120 "$E" predict --out "$LOG/pred_cpu.txt"
  step predict_gpu 120 "$E" predict --device cuda --gpu-variant prefetch --out "$LOG/pred_gpu.txt"
  grep -hiE "auc|samples/s" "$LOG/predict_cpu.txt" "$LOG/predict_gpu.txt" | tee -a "$SUMMARY"
  "$E" serve --device cuda --gpu-variant prefetch --http 127.0.0.1:9300 --grpc off \
    > "$LOG/serve_gpu.txt" 2>&1 &
  GPID=$!
  "$E" serve --http 127.0.0.1:9301 --grpc off > "$LOG/serve_cpu.txt" 2>&1 &
  CPID=$!
  for _ in $(seq 60); do
    curl -sf -o /dev/null 127.0.0.1:9300/v2/health/ready && curl -sf -o /dev/null 127.0.0.1:9301/v2/health/ready && break
    sleep 1
  done
  curl -s --data-binary @"$ROOT/data/sample.tsv" 127.0.0.1:9300/v1/score > "$LOG/serve_gpu_scores.txt"
  curl -s --data-binary @"$ROOT/data/sample.tsv" 127.0.0.1:9301/v1/score > "$LOG/serve_cpu_scores.txt"
  python3 - "$LOG" <<'PY' | tee -a "$SUMMARY"
import sys
d = sys.argv[1]
def read(name):
    try:
        return [float(x) for x in open(f"{d}/{name}").read().split()]
    except (OSError, ValueError) as e:
        return f"unreadable ({e})"
for a, b in (("pred_cpu.txt", "pred_gpu.txt"), ("serve_cpu_scores.txt", "serve_gpu_scores.txt")):
    x, y = read(a), read(b)
    if isinstance(x, str) or isinstance(y, str) or len(x) != len(y) or not x:
        print(f"{a} vs {b}: cannot compare: {x if isinstance(x, str) else len(x)} / {y if isinstance(y, str) else len(y)}")
    else:
        print(f"{a} vs {b}: {len(x)} scores, max |cpu - gpu| = {max(abs(p - q) for p, q in zip(x, y)):.2e}")
PY
  echo "bad request on the GPU server: HTTP $(curl -s -o "$LOG/serve_gpu_bad.txt" -w '%{http_code}' --data-binary 'not a row' 127.0.0.1:9300/v1/score) $(head -c 200 "$LOG/serve_gpu_bad.txt")" | tee -a "$SUMMARY"
  for q in 2000 8000; do
    step "load_gpu_$q" 60 "$E" loadgen --url http://127.0.0.1:9300 --format tsv --qps "$q" --duration 10
    step "load_cpu_$q" 60 "$E" loadgen --url http://127.0.0.1:9301 --format tsv --qps "$q" --duration 10
    grep -hE "p99|achieved|requests/s|errors" "$LOG/load_gpu_$q.txt" "$LOG/load_cpu_$q.txt" | head -n 12 | tee -a "$SUMMARY"
  done
  curl -s 127.0.0.1:9300/v2/health/ready -o /dev/null -w "GPU server ready after the load: %{http_code}\n" | tee -a "$SUMMARY"
  kill "$GPID" "$CPID"; wait "$GPID" "$CPID" 2>/dev/null
fi

if want sanitize; then
  for tool in memcheck racecheck; do
    step "sanitize_$tool" 300 compute-sanitizer --tool "$tool" --error-exitcode 9 \
      "$E" bench embed --device cuda --variants all "${SMALL[@]}"
    grep -E "ERROR SUMMARY|Invalid|Race|error" "$LOG/sanitize_$tool.txt" | head -n 8 | tee -a "$SUMMARY"
  done
  step sanitize_model 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$E" bench model --device cuda --preset small --batch 256 --iters 3 --warmup 1
  grep -E "ERROR SUMMARY|Invalid|error" "$LOG/sanitize_model.txt" | head -n 8 | tee -a "$SUMMARY"
fi

tar -C "$(dirname "$LOG")" -czf "$DEST/logs.tgz" logs
echo "summary: $SUMMARY; every log: $DEST/logs.tgz"
cat "$SUMMARY"
