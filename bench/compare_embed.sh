#!/usr/bin/env bash
# Two `ember` binaries' embedding stage side by side in one run (a kernel change must not cost
# speed anywhere): `bench embed` lookups/s for each case below, rounds alternating which binary
# goes first so that a drifting machine hits both alike; medians of the rounds and new/old ratios.
#
#   bench/compare_embed.sh OLD_EMBER NEW_EMBER [ROUNDS]     (from the repository root)
#
# Cases: RM1 with uniform ids and with the production trace (data/traces/, see
# tools/fetch_data.sh), 1 and 2 threads, f32 and int8. Set CASES to a ';'-separated list of
# `bench embed` flag sets to run others. Each case builds RM1's 4 GB of tables per binary and
# round: 3 rounds of the default cases take about 8 minutes on a 2-core machine.
set -euo pipefail

OLD=${1:?usage: bench/compare_embed.sh OLD_EMBER NEW_EMBER [ROUNDS]}
NEW=${2:?usage: bench/compare_embed.sh OLD_EMBER NEW_EMBER [ROUNDS]}
ROUNDS=${3:-3}
TRACE=${TRACE:-data/traces/reuse_medium_table_500K.txt}
[ -f "$TRACE" ] || { echo "no trace at $TRACE: run tools/fetch_data.sh (or set TRACE)" >&2; exit 2; }
CASES=${CASES:-"--preset rm1;--preset rm1 --threads 2;--preset rm1 --ids $TRACE;--preset rm1 --ids $TRACE --threads 2;--preset rm1 --ids $TRACE --dtype int8"}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

field() { grep -o "\"$1\":[0-9.e+-]*" | head -1 | cut -d: -f2; }
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }

IFS=';' read -r -a cases <<< "$CASES"
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
  for i in "${!cases[@]}"; do
    for which in $order; do
      bin=$([ "$which" = old ] && echo "$OLD" || echo "$NEW")
      echo "round $r, case $i: $which" >&2
      # shellcheck disable=SC2086
      "$bin" bench embed ${cases[$i]} --json 2>/dev/null | tail -1 | field lookups_per_s >> "$OUT/$which.$i"
    done
  done
done

printf '%-64s %10s %10s %8s\n' "bench embed, M lookups/s (median of $ROUNDS)" old new "new/old"
for i in "${!cases[@]}"; do
  o=$(median < "$OUT/old.$i")
  n=$(median < "$OUT/new.$i")
  printf '%-64s %10.1f %10.1f %8.3f\n' "${cases[$i]}" "$(awk -v x="$o" 'BEGIN { print x / 1e6 }')" \
    "$(awk -v x="$n" 'BEGIN { print x / 1e6 }')" "$(awk -v a="$n" -v b="$o" 'BEGIN { print a / b }')"
done
