#!/usr/bin/env bash
# One command for the GPU machine: Ember's GPU embedding variants and PyTorch's nn.EmbeddingBag on
# CUDA on the seed paper's configuration (12 tables x 500K rows x dim 128 f32, pooling 150,
# batch 2048), ids from reuse_medium and from a uniform distribution; a device-to-device copy for
# the bandwidth; then the RM1 model end to end at batch 2048 against PyTorch eager on the GPU.
#
#   bench/gpu/run.sh [--trace PATH] [--out DIR] [--quick]
#
# Needs: an ember binary built with `--features cuda` (EMBER=path, default target/release/ember;
# the GPU machine has no Rust: build it elsewhere and carry it), Python with PyTorch (CUDA) and
# NumPy (PYTHON=..., default python3). CUDA's NVRTC and cuBLAS are loaded at run time: this script
# puts the PyTorch wheel's nvidia/*/lib directories on LD_LIBRARY_PATH when they exist.
# Each step's full output goes to OUT (default bench/gpu/out), the summary to stdout.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
EMBER="${EMBER:-$ROOT/target/release/ember}"
PYTHON="${PYTHON:-python3}"
TRACE="$ROOT/data/traces/reuse_medium_table_500K.txt"   # tools/fetch_data.sh
OUT="$HERE/out"
QUICK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --trace) TRACE="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
[ -x "$EMBER" ] || { echo "no ember binary at $EMBER (build with: cargo build --release -p ember-cli --features cuda)" >&2; exit 2; }
[ -f "$TRACE" ] || { echo "no trace at $TRACE (pass --trace PATH to reuse_medium_table_500K.txt)" >&2; exit 2; }
mkdir -p "$OUT"

# PyTorch's CUDA libraries for Ember's dynamic loading.
. "$HERE/cuda_libs.sh"
export EMBER_TUNE_CACHE="$OUT/cuda-tune.json"

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv | tee "$OUT/gpu.txt"

SHAPE=(--tables 12 --rows 500000 --dim 128 --pooling 150 --batch 2048)
if [ "$QUICK" = 1 ]; then RUNS=(--batches 4 --runs 2 --gpu-iters 3 --profile-batches 4); else RUNS=(--batches 16 --runs 3 --gpu-iters 5 --profile-batches 16); fi

for ids in reuse_medium uniform; do
  if [ "$ids" = reuse_medium ]; then IDS="$TRACE"; else IDS=uniform; fi
  echo "== embedding stage, ids $ids" | tee -a "$OUT/summary.txt"
  "$PYTHON" "$HERE/compare_torch_gpu.py" --ember "$EMBER" "${SHAPE[@]}" "${RUNS[@]}" --ids "$IDS" \
    > "$OUT/embed_$ids.txt" 2> "$OUT/embed_$ids.err" || { cat "$OUT/embed_$ids.err" >&2; exit 1; }
  sed -n '/^side by side/,$p' "$OUT/embed_$ids.txt" | tee -a "$OUT/summary.txt"
done

if [ "$QUICK" = 1 ]; then ITERS=(--iters 20 --warmup 5 --rounds 1); else ITERS=(--iters 200 --warmup 20 --rounds 3); fi
for v in prefetch tuned; do
  echo "== RM1 end to end, batch 2048, ember --gpu-variant $v" | tee -a "$OUT/summary.txt"
  "$PYTHON" "$ROOT/bench/compare_torch_dlrm.py" --ember "$EMBER" --device cuda --gpu-variant "$v" \
    --preset rm1 --batch 2048 "${ITERS[@]}" --json > "$OUT/model_$v.txt" 2> "$OUT/model_$v.err" \
    || { cat "$OUT/model_$v.err" >&2; exit 1; }
  sed -n '/^medians of/,$p' "$OUT/model_$v.txt" | tee -a "$OUT/summary.txt"
done
echo "full outputs in $OUT"
