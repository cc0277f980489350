#!/usr/bin/env bash
# Two `ember` binaries side by side in one run (a refactor must not cost speed): the embedding
# stage (`bench embed --preset rm1`), the whole model (`bench model --preset rm1`), the SSD tier
# (`bench tiered`, 8 tables x 500K rows, the best cache policy), the remote tier (`bench remote`,
# 4 tables x 200K rows on a 3+3 Redis Cluster it starts, LFU with 10% of the rows cached), and the
# sums on the cluster's nodes (`bench remote-pool`, RM1's shape, zipf ids, 10% cached: EMBER.POOL
# through the Ember Redis module found beside each binary, `libember_redis_module.so` in its
# directory or the one above, so that old and new each run their own module), and the
# server over /v1/score (`serve` + `loadgen --format tsv`, the same load generator for both): its
# highest rate within a 10 ms p99 (`--find-max`, 10 s a step) and its p50 / p99 at a fixed rate
# (`RATE`, 5000 requests/s by default). Rounds alternate which binary goes first, so
# that a drifting machine hits both alike; medians of the rounds and new/old ratios are printed.
#
#   bench/compare_binaries.sh OLD_EMBER NEW_EMBER [ROUNDS]     (from the repository root)
#   PARTS="remote serve" bench/compare_binaries.sh ...          (only those of embed, model,
#                                                                tiered, remote, pool, serve)
#
# Each round builds RM1's 4 GB of tables twice (about 30 s), runs the tiers' benchmarks (about a
# minute each) and two find-max searches of about 90 s each: 3 rounds take about 20 minutes on a
# 2-core machine. `bench remote` and `bench remote-pool` need `redis-server` on the PATH.
set -euo pipefail

OLD=${1:?usage: bench/compare_binaries.sh OLD_EMBER NEW_EMBER [ROUNDS]}
NEW=${2:?usage: bench/compare_binaries.sh OLD_EMBER NEW_EMBER [ROUNDS]}
ROUNDS=${3:-3}
PORT=${PORT:-18080}
RATE=${RATE:-5000}
PARTS=${PARTS:-embed model tiered remote pool serve}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"; [ -n "${SERVER:-}" ] && kill "$SERVER" 2>/dev/null || true' EXIT

# Whether PART is to be measured.
want() { [[ " $PARTS " == *" $1 "* ]]; }
# The number after "NAME": in a JSON line.
field() { grep -o "\"$1\":[0-9.e+-]*" | head -1 | cut -d: -f2; }
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }

run_one() { # which binary
  local which=$1 bin
  bin=$([ "$which" = old ] && echo "$OLD" || echo "$NEW")
  if want embed; then
    "$bin" bench embed --preset rm1 --json 2>/dev/null | tail -1 > "$OUT/embed.json"
    field lookups_per_s < "$OUT/embed.json" >> "$OUT/$which.embed"
    field fraction_of_ceiling < "$OUT/embed.json" >> "$OUT/$which.ceiling"
  fi
  want model && "$bin" bench model --preset rm1 --json 2>/dev/null | tail -1 | field samples_per_s >> "$OUT/$which.model"
  want tiered && "$bin" bench tiered --tables 8 --rows 500000 --runs 3 --json 2>/dev/null | tail -1 \
    | field lookups_per_s >> "$OUT/$which.tiered"
  want remote && "$bin" bench remote --tables 4 --rows 200000 --runs 3 --cache-fractions 0.1 --layout-rows 0 \
    --json 2>/dev/null | tail -1 | python3 -c 'import json, sys
print(next(p["lookups_per_s"] for p in json.load(sys.stdin)["policies"] if p["policy"] == "lfu"))' \
    >> "$OUT/$which.remote"
  want pool && "$bin" bench remote-pool --shapes rm1 --ids zipf:1.05 --cache-fractions 0.1 --runs 3 \
    --json 2>/dev/null | tail -1 | python3 -c 'import json, sys
print(json.load(sys.stdin)["results"][0]["pooled"]["lookups_per_s"])' >> "$OUT/$which.pool"
  want serve || return 0
  "$bin" serve --http "127.0.0.1:$PORT" --grpc off 2>/dev/null &
  SERVER=$!
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$PORT/v2/health/ready" > /dev/null && break
    sleep 0.1
  done
  "$NEW" loadgen --url "http://127.0.0.1:$PORT" --format tsv --find-max --qps 5000 \
    --slo-p99-ms 10 --duration 10 --json 2>/dev/null | tail -1 | field max_samples_per_s >> "$OUT/$which.serve"
  "$NEW" loadgen --url "http://127.0.0.1:$PORT" --format tsv --qps "$RATE" --duration 10 \
    --json 2>/dev/null | tail -1 > "$OUT/fixed.json"
  field p50_ms < "$OUT/fixed.json" >> "$OUT/$which.p50"
  field p99_ms < "$OUT/fixed.json" >> "$OUT/$which.p99"
  kill "$SERVER"
  wait "$SERVER" 2>/dev/null || true
  SERVER=
}

for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
  for which in $order; do
    echo "round $r: $which" >&2
    run_one "$which"
  done
done

printf '%-44s %14s %14s %9s\n' "" old new "new/old"
for m in "embed:bench embed rm1, lookups/s" "ceiling:bench embed rm1, fraction of ceiling" \
         "model:bench model rm1, samples/s" "tiered:bench tiered 8x500K, lookups/s" \
         "remote:bench remote 4x200K lfu 10%, lookups/s" "pool:bench remote-pool rm1 zipf 10%, lookups/s" \
         "serve:serve /v1/score find-max, samples/s" \
         "p50:serve /v1/score at $RATE/s, p50 ms" "p99:serve /v1/score at $RATE/s, p99 ms"; do
  key=${m%%:*}
  [ -s "$OUT/old.$key" ] || continue
  o=$(median < "$OUT/old.$key")
  n=$(median < "$OUT/new.$key")
  printf '%-44s %14.4g %14.4g %9.3f\n' "${m#*:}" "$o" "$n" "$(awk -v a="$n" -v b="$o" 'BEGIN { print a / b }')"
  echo "  runs old: $(tr '\n' ' ' < "$OUT/old.$key")  new: $(tr '\n' ' ' < "$OUT/new.$key")"
done
