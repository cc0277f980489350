#!/usr/bin/env bash
# What TLS costs `ember serve`: /v1/score (TSV over HTTP/1.1) and KServe gRPC (ModelInfer over
# h2), plain and over TLS, in one run, against the shipped model.
#
#   bench/tls_cost.sh [WORKDIR]     (default /tmp/ember-tls-cost)
#
# 1. makes a test CA and a server certificate (openssl, P-256) in WORKDIR;
# 2. starts two servers of the same model and flags: one plain, one with --tls-cert / --tls-key
#    (MUTUAL=1: also --tls-client-ca, and loadgen shows a client certificate);
# 3. for REPS rounds, alternating plain and TLS within each round, for each protocol: the p50 /
#    p99 at a fixed RATE (requests/s) for DURATION s, then the requests answered per second when
#    OVERLOAD requests/s are offered (the server's capacity; what it cannot take it refuses
#    with 503 / RESOURCE_EXHAUSTED);
# 4. prints the medians over rounds and TLS / plain.
#
# The load generator runs on the same cores as the server (2 here): what it spends on TLS
# counts against the server's rate too, as for a client on the same machine. Connections are
# kept open (loadgen's pool), so the figures are TLS's record cost, not its handshakes.
#
# Environment: EMBER (target/release/ember), RATE (1000), DURATION (5), REPS (3),
# OVERLOAD (30000), MUTUAL (0), SAMPLES (samples per request, 1).
set -euo pipefail
cd "$(dirname "$0")/.."
EMBER=${EMBER:-target/release/ember}
W=${1:-/tmp/ember-tls-cost}
RATE=${RATE:-1000}
DURATION=${DURATION:-5}
REPS=${REPS:-3}
OVERLOAD=${OVERLOAD:-30000}
MUTUAL=${MUTUAL:-0}
SAMPLES=${SAMPLES:-1}
mkdir -p "$W"
cd "$W"
if [ ! -f server.pem ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem \
    -days 30 -subj /CN=ember-bench-ca 2>/dev/null
  for n in server client; do
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout $n.key -out $n.csr \
      -subj /CN=$n 2>/dev/null
  done
  printf "subjectAltName=DNS:localhost,IP:127.0.0.1\n" > server.ext
  printf "extendedKeyUsage=clientAuth\n" > client.ext
  for n in server client; do
    openssl x509 -req -in $n.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $n.pem -days 30 \
      -extfile $n.ext 2>/dev/null
  done
fi
cd - >/dev/null
TLS_SERVE=(--tls-cert "$W/server.pem" --tls-key "$W/server.key")
TLS_LOAD=(--tls-ca "$W/ca.pem")
if [ "$MUTUAL" = 1 ]; then
  TLS_SERVE+=(--tls-client-ca "$W/ca.pem")
  TLS_LOAD+=(--tls-cert "$W/client.pem" --tls-key "$W/client.key")
fi

start() { # NAME ARGS...: starts a server, logs to $W/NAME.log
  local name=$1; shift
  "$EMBER" serve --http 127.0.0.1:0 --grpc 127.0.0.1:0 "$@" > /dev/null 2> "$W/$name.log" &
  echo $!
}
PLAIN=$(start plain)
TLS=$(start tls "${TLS_SERVE[@]}")
trap 'kill $PLAIN $TLS 2>/dev/null || true; wait 2>/dev/null || true' EXIT
for name in plain tls; do
  for _ in $(seq 200); do
    grep -q "^gRPC" "$W/$name.log" && break
    sleep 0.1
  done
done
http_of() { grep -o "https\?://[0-9.:]*" "$W/$1.log" | head -1 | sed 's/127.0.0.1/localhost/'; }
grpc_of() { grep "^gRPC" "$W/$1.log" | grep -o "[0-9.]*:[0-9]*$" | sed 's/127.0.0.1/localhost/'; }
PLAIN_HTTP=$(http_of plain); TLS_HTTP=$(http_of tls)
PLAIN_GRPC="grpc://$(grpc_of plain)"; TLS_GRPC="grpcs://$(grpc_of tls)"
echo "plain: $PLAIN_HTTP $PLAIN_GRPC; TLS: $TLS_HTTP $TLS_GRPC (mutual: $MUTUAL)"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"

OUT="$W/results.jsonl"
: > "$OUT"
run() { # ROUND PROTOCOL SIDE KIND ARGS...
  local round=$1 protocol=$2 side=$3 kind=$4; shift 4
  local line
  line=$("$EMBER" loadgen --samples-per-request "$SAMPLES" --warmup 1 --json "$@" | tail -1)
  python3 -c 'import json,sys; d=json.loads(sys.argv[5]); d.update(round=int(sys.argv[1]), protocol=sys.argv[2], side=sys.argv[3], kind=sys.argv[4]); print(json.dumps(d))' \
    "$round" "$protocol" "$side" "$kind" "$line" >> "$OUT"
}
for r in $(seq "$REPS"); do
  for protocol in http grpc; do
    for side in plain tls; do
      if [ $protocol = http ]; then
        args=(--protocol http --format tsv)
        [ $side = plain ] && args+=(--url "$PLAIN_HTTP") || args+=(--url "$TLS_HTTP" "${TLS_LOAD[@]}")
      else
        args=(--protocol grpc)
        [ $side = plain ] && args+=(--url "$PLAIN_GRPC") || args+=(--url "$TLS_GRPC" "${TLS_LOAD[@]}")
      fi
      run "$r" $protocol $side fixed "${args[@]}" --qps "$RATE" --duration "$DURATION"
      run "$r" $protocol $side max "${args[@]}" --qps "$OVERLOAD" --duration "$DURATION"
    done
  done
  echo "round $r done"
done

python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def med(protocol, side, kind, key):
    v = [r[key] for r in rows if (r["protocol"], r["side"], r["kind"]) == (protocol, side, kind)
         and r.get(key) is not None]
    return statistics.median(v) if v else None
print(f"{'':28}{'plain':>10}{'TLS':>10}{'TLS/plain':>11}")
for protocol, name in (("http", "/v1/score (HTTP/1.1)"), ("grpc", "KServe gRPC (h2)")):
    for kind, key, label in (("fixed", "p50_ms", "p50 ms"), ("fixed", "p99_ms", "p99 ms"),
                             ("fixed", "achieved_qps", "answered/s"),
                             ("max", "achieved_qps", "capacity req/s")):
        p, t = med(protocol, "plain", kind, key), med(protocol, "tls", kind, key)
        if p is None or t is None:
            continue
        print(f"{name + ' ' + label:28}{p:10.2f}{t:10.2f}{t / p:11.3f}")
print(f"(medians of {max(r['round'] for r in rows)} rounds; every run: {sys.argv[1]})")
PY
