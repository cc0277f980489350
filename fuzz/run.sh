#!/usr/bin/env bash
# fuzz/run.sh [SECONDS_PER_TARGET]: builds every fuzz target (`cargo +nightly fuzz build`) and
# runs each for SECONDS_PER_TARGET seconds (default 10), one after another, each one libFuzzer
# process on one core, from the kept corpus (fuzz/corpus/<target>/) and the fixed crashes
# (fuzz/regressions/<target>/). New inputs go to fuzz/work/<target>/ (ignored by git), a crash's
# input to fuzz/artifacts/<target>/. Exits non-zero when a target crashes (or fails to build);
# exits 0, saying so, where `cargo +nightly fuzz` is not available (no nightly toolchain, or no
# cargo-fuzz: `cargo install cargo-fuzz`).
set -uo pipefail

secs="${1:-10}"
case "$secs" in
  '' | *[!0-9]*)
    echo "usage: fuzz/run.sh [SECONDS_PER_TARGET]" >&2
    exit 2
    ;;
esac
cd "$(dirname "$0")/.." || exit 2

if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz/run.sh: 'cargo +nightly fuzz' is not available (it needs a nightly toolchain and" \
    "cargo-fuzz: cargo install cargo-fuzz); no fuzzing done." >&2
  exit 0
fi

if ! cargo +nightly fuzz build; then
  echo "fuzz/run.sh: the fuzz targets do not build" >&2
  exit 1
fi

failed=()
for t in $(cargo +nightly fuzz list); do
  dirs=("fuzz/work/$t" "fuzz/corpus/$t")
  [ -d "fuzz/regressions/$t" ] && dirs+=("fuzz/regressions/$t")
  mkdir -p "fuzz/work/$t"
  log="fuzz/work/$t.log"
  # One process, one thread (libFuzzer's default: no -jobs / -workers); -timeout: an input
  # that runs for 30 s is a hang, reported as a crash.
  cargo +nightly fuzz run "$t" "${dirs[@]}" -- \
    -max_total_time="$secs" -timeout=30 -print_final_stats=1 >"$log" 2>&1
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  corpus=$(find "${dirs[@]}" -type f | wc -l)
  if [ "$rc" -eq 0 ]; then
    echo "fuzz/run.sh: $t: ${secs} s, ${runs:-?} executions, $corpus inputs"
  else
    echo "fuzz/run.sh: $t FAILED (exit $rc); the end of $log:" >&2
    tail -40 "$log" >&2
    failed+=("$t")
  fi
done

if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz/run.sh: crashed: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
  exit 1
fi
echo "fuzz/run.sh: every target ran ${secs} s without a crash"
