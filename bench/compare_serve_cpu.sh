#!/usr/bin/env bash
# Two `ember` binaries' servers side by side (a refactor of the serving path must not cost CPU):
# the server's CPU time per request at a fixed rate, and the p50 / p99 the client saw, for
# `/v1/score` TSV (1 sample a request, 3,000 requests/s), KServe v2 with Triton's binary tensor
# data (64 samples, 150/s) and gRPC (64 samples, 150/s), on the shipped default model. CPU time
# is the server process's utime + stime (/proc/PID/stat) over the run, divided by the requests
# answered: steadier on a shared machine than a search for the highest rate, whose steps make one
# slow second halve a result. Rounds alternate which binary goes first; medians of the rounds and
# new/old ratios are printed.
#
#   bench/compare_serve_cpu.sh OLD_EMBER NEW_EMBER [ROUNDS]       (default 4 rounds, ~5 minutes)
#   KINDS="binary64 grpc64" bench/compare_serve_cpu.sh ...         (only those of tsv binary64 grpc64)
set -euo pipefail

OLD=${1:?usage: bench/compare_serve_cpu.sh OLD_EMBER NEW_EMBER [ROUNDS]}
NEW=${2:?usage: bench/compare_serve_cpu.sh OLD_EMBER NEW_EMBER [ROUNDS]}
ROUNDS=${3:-4}
PORT=${PORT:-18090}
GPORT=${GPORT:-18091}
KINDS=${KINDS:-tsv binary64 grpc64}
TCK=$(getconf CLK_TCK)
OUT=$(mktemp)
trap 'rm -f "$OUT"; [ -n "${SERVER:-}" ] && kill "$SERVER" 2>/dev/null || true' EXIT

cpu() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
field() { grep -o "\"$1\":[0-9.e+-]*" | head -1 | cut -d: -f2; }

one() { # binary which kind loadgen-args...
  local bin=$1 which=$2 kind=$3 c0 c1 out n
  shift 3
  "$bin" serve --http "127.0.0.1:$PORT" --grpc "127.0.0.1:$GPORT" 2>/dev/null &
  SERVER=$!
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$PORT/v2/health/ready" > /dev/null && break
    sleep 0.1
  done
  c0=$(cpu "$SERVER")
  out=$("$NEW" loadgen "$@" --json 2>/dev/null | tail -1)
  c1=$(cpu "$SERVER")
  kill "$SERVER"
  wait "$SERVER" 2>/dev/null || true
  SERVER=
  n=$(echo "$out" | field ok)
  echo "$which $kind $(awk -v c=$((c1 - c0)) -v t="$TCK" -v n="${n:-1}" 'BEGIN { print c / t * 1e6 / n }') \
$(echo "$out" | field p50_ms) $(echo "$out" | field p99_ms)" | tee -a "$OUT" >&2
}

for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
  for which in $order; do
    bin=$([ "$which" = old ] && echo "$OLD" || echo "$NEW")
    for kind in $KINDS; do
      case $kind in
        tsv) one "$bin" "$which" tsv --url "http://127.0.0.1:$PORT" --format tsv --qps 3000 --duration 10 ;;
        binary64) one "$bin" "$which" binary64 --url "http://127.0.0.1:$PORT" --format binary \
          --samples-per-request 64 --qps 150 --duration 10 ;;
        grpc64) one "$bin" "$which" grpc64 --url "http://127.0.0.1:$GPORT" --protocol grpc \
          --samples-per-request 64 --qps 150 --duration 10 ;;
      esac
    done
  done
done

python3 - "$OUT" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    which, kind, cpu, p50, p99 = line.split()
    for m, v in (("us CPU / request", cpu), ("p50 ms", p50), ("p99 ms", p99)):
        d[(kind, m, which)].append(float(v))
print(f"{'':32s} {'old':>10s} {'new':>10s} {'new/old':>8s}")
for kind in dict.fromkeys(k[0] for k in d):
    for m in ("us CPU / request", "p50 ms", "p99 ms"):
        o, n = statistics.median(d[(kind, m, "old")]), statistics.median(d[(kind, m, "new")])
        print(f"{kind + ' ' + m:32s} {o:10.3f} {n:10.3f} {n / o:8.3f}")
PY
