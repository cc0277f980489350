#!/usr/bin/env bash
# Swapping an RM1-size model (32 tables x 500K x 64 f32: 4.1 GB in DRAM) under load.
#
#   bench/swap.sh [WORKDIR]     (default /tmp/ember-swap; needs 4.2 GB of disk, ~10 GB of memory)
#
# 1. writes an RM1 model with random weights (`ember data model`, once; kept in WORKDIR);
# 2. serves it from a repository (`ember serve --model-repository R --poll-secs 1`) as version 1;
# 3. finds the highest rate within a p99 of SLO_MS (`ember loadgen --find-max`);
# 4. offers RATE_FRAC of it for DURATION seconds with a per-second timeline; at SWAP_AT seconds
#    version 2 appears in the repository (the same files, hard-linked: the server reads and
#    copies all 4.1 GB again, as for any new version) and the poller loads, warms and swaps it;
# 5. prints the p99 of every second (steady, during the swap, after), failed requests, and the
#    server's RSS over time (sampled every 0.25 s from /proc).
#
# Environment: EMBER (the binary), RATE_FRAC (0.7), SLO_MS (10), DURATION (45), SWAP_AT (15),
# THREADS (forward-pass threads, 1), POOLING (ids per bag, 20), MAX (skip the search: this is the
# highest rate), SERVE_ARGS (more flags for ember serve, e.g. --load-mb-per-s 500), PERF_SECS
# (record the scheduler, `perf sched record -g`, for this many seconds from PERF_AT seconds into
# the load (default SWAP_AT - 1), to WORKDIR/perf.data: `perf sched timehist -i WORKDIR/perf.data`).
set -euo pipefail
cd "$(dirname "$0")/.."
EMBER=${EMBER:-target/release/ember}
W=${1:-/tmp/ember-swap}
RATE_FRAC=${RATE_FRAC:-0.7}
SLO_MS=${SLO_MS:-10}
DURATION=${DURATION:-45}
SWAP_AT=${SWAP_AT:-15}
THREADS=${THREADS:-1}
POOLING=${POOLING:-20}
mkdir -p "$W"
if [ ! -f "$W/v1/model.safetensors" ]; then
  "$EMBER" data model --preset rm1 --seed 1 --out "$W/v1"
fi
rm -rf "$W/repo"
mkdir -p "$W/repo/rm1/1"
ln "$W/v1/config.json" "$W/v1/model.safetensors" "$W/repo/rm1/1/"

"$EMBER" serve --model-repository "$W/repo" --poll-secs 1 --http 127.0.0.1:0 --grpc off \
  --threads "$THREADS" ${SERVE_ARGS:-} 2> "$W/serve.log" &
SERVER=$!
echo $SERVER > "$W/server.pid"
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  grep -q "http://" "$W/serve.log" && break
  kill -0 $SERVER 2>/dev/null || { cat "$W/serve.log"; exit 1; }
  sleep 0.5
done
ADDR=$(grep -o "http://[0-9.:]*" "$W/serve.log" | head -1)
echo "serving on $ADDR ($(grep -o 'loaded and warmed in [0-9.]* s' "$W/serve.log" | head -1))"

# One process samples the server's RSS (every 0.25 s, seconds since the epoch and KiB) and
# notes when version 2 serves (the log is read every 20 ms), so that the benchmark starts no
# process while it measures: a shell loop of `sleep`/`grep`/`date` forks 50 processes a second,
# and on 2 cores that shows in the p99 (`perf sched` of a run).
rm -f "$W/swapped"
python3 - "$SERVER" "$W" <<'PY' &
import os, sys, time
pid, w = sys.argv[1], sys.argv[2]
rss, log, seen, last = open(f"{w}/rss.txt", "w"), open(f"{w}/serve.log"), "", 0.0
while os.path.exists(f"/proc/{pid}"):
    now = time.time()
    if now - last >= 0.25:
        last = now
        try:
            kib = next(l.split()[1] for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS"))
            rss.write(f"{now:.3f} {kib}\n"); rss.flush()
        except (OSError, StopIteration):
            break
    seen += log.read()
    if "model 'rm1' version 2 serving" in seen and not os.path.exists(f"{w}/swapped"):
        open(f"{w}/swapped", "w").write(f"{now:.3f}")
    time.sleep(0.02)
PY
SAMPLER=$!

LG=("$EMBER" loadgen --url "$ADDR" --model rm1 --format binary --pooling "$POOLING" --threads 1)
MAX=${MAX:-}
[ -n "$MAX" ] || MAX=$("${LG[@]}" --find-max --slo-p99-ms "$SLO_MS" --duration 4 --warmup 1 --qps 500 --json | tail -1 \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["max_qps"])')
RATE=$(python3 -c "print(int($MAX * $RATE_FRAC))")
echo "highest rate within p99 <= $SLO_MS ms: $MAX requests/s; offering $RATE ($RATE_FRAC)"

START=$(date +%s.%N)
"${LG[@]}" --qps "$RATE" --duration "$DURATION" --warmup 1 --timeline 1 --json > "$W/load.txt" &
LOAD=$!
PERF_AT=${PERF_AT:-$((SWAP_AT - 1))}
record() { perf sched record -g -o "$W/perf.data" -- sleep "$PERF_SECS" 2> "$W/perf.log" & }
if [ -n "${PERF_SECS:-}" ] && [ "$PERF_AT" -le "$SWAP_AT" ]; then
  sleep $((PERF_AT + 1))
  record
  sleep $((SWAP_AT - PERF_AT))
else
  sleep $((SWAP_AT + 1))
fi
mkdir -p "$W/repo/.rm1-2"
ln "$W/v1/config.json" "$W/v1/model.safetensors" "$W/repo/.rm1-2/"
mv "$W/repo/.rm1-2" "$W/repo/rm1/2"
MOVED=$(date +%s.%N)
if [ -n "${PERF_SECS:-}" ] && [ "$PERF_AT" -gt "$SWAP_AT" ]; then
  sleep $((PERF_AT - SWAP_AT))
  record
fi
wait $LOAD
SWAPPED=$(cat "$W/swapped" 2>/dev/null || echo "$MOVED")
[ -f "$W/swapped" ] || echo "version 2 never served during the load"
sleep 1
kill $SAMPLER 2>/dev/null || true

python3 - "$W" "$START" "$MOVED" "$SWAPPED" <<'EOF'
import json, sys
w, start, moved, swapped = sys.argv[1], *map(float, sys.argv[2:])
run = json.loads(open(f"{w}/load.txt").read().strip().splitlines()[-1])
t0 = run["start_unix_ms"] / 1e3  # the measurement's start, after loadgen's warm-up
tl = run.get("timeline") or []
print(f"version 2 appeared at {moved - t0:.1f} s; it served from {swapped - t0:.1f} s "
      f"(load + warm + swap {swapped - moved:.1f} s)")
print(f"{'second':>6} {'sent':>6} {'ok':>6} {'refused':>7} {'errors':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}")
steady, during, after = [], [], []
for i, s in enumerate(tl):
    a, b = s["t"], s["t"] + 1
    mark = ""
    if b <= moved - t0:
        steady.append(s["p99_ms"])
    elif a <= swapped - t0 + 1:
        during.append(s["p99_ms"]); mark = "  <- swap"
    else:
        after.append(s["p99_ms"])
    print(f"{a:>6.0f} {s['sent']:>6} {s['ok']:>6} {s['refused']:>7} {s['errors']:>6} "
          f"{s['p50_ms']:>7.2f} {s['p99_ms']:>7.2f} {s['max_ms']:>7.2f}{mark}")
failed = sum(s["refused"] + s["errors"] for s in tl)
# The swap's two parts: reading the new version beside the served one, and the swap itself
# with the old version freed (its second and the 3 after it).
loading = [s["p99_ms"] for s in tl if s["t"] + 1 > moved - t0 and s["t"] + 1 <= swapped - t0]
around = [s for s in tl if s["t"] + 1 > swapped - t0 and s["t"] <= swapped - t0 + 3]
med = lambda v: sorted(v)[len(v) // 2] if v else float("nan")
print(f"failed requests: {failed} of {run['sent']} (refused {run['refused']}, errors {run['errors']})")
print(f"p99 steady (median of seconds before): {med(steady):.2f} ms; worst second during the "
      f"swap: {max(during or [float('nan')]):.2f} ms = {max(during or [float('nan')]) / med(steady):.2f}x; "
      f"after (median): {med(after):.2f} ms")
print(f"while loading: worst second {max(loading or [float('nan')]):.2f} ms; the swap and the 3 s "
      f"after it: worst second {max([s['p99_ms'] for s in around] or [float('nan')]):.2f} ms, "
      f"{sum(s['refused'] + s['errors'] for s in around)} failed")
rss = [(float(t) - t0, int(k) / 1024) for t, k in
       (l.split() for l in open(f"{w}/rss.txt") if len(l.split()) == 2)]
before = [r for t, r in rss if t < moved - t0]
peak = max(r for t, r in rss)
end = [r for t, r in rss if t > swapped - t0 + 3]
print(f"RSS MiB: before {med(before):.0f}, peak {peak:.0f} ({peak / med(before):.2f}x), "
      f"after {med(end):.0f}")
print("RSS over time (s, MiB):", " ".join(f"{t:.1f}:{r:.0f}" for t, r in rss[::4] if t > -2))
EOF
