#!/usr/bin/env bash
# Builds the Dockerfile and checks the image: `ember serve` answers readiness and scores the
# shipped sample over HTTP, answers gRPC (tritonclient, when TRITON_PYTHON names a Python with
# tritonclient installed), and stops cleanly on `podman stop` (exit 0).
#
#   tools/container/check.sh                       # bases from the registries
#   LOCAL_BASES=1 PODMAN_FLAGS="--runtime runc --ulimit nofile=1024:1024 --ulimit nproc=4096:4096" \
#       tools/container/check.sh                   # bases from tools/container/local_bases.sh
#
# About 7 minutes on 2 cores (a release build in the container); not part of CI.
set -euo pipefail
cd "$(dirname "$0")/../.."
flags=${PODMAN_FLAGS:-}
args=()
if [[ -n ${LOCAL_BASES:-} ]]; then
    args+=(--build-arg RUST_IMAGE=localhost/rust-local:bookworm
           --build-arg RUN_IMAGE=localhost/debian-local:bookworm)
fi
# shellcheck disable=SC2086
podman build $flags "${args[@]}" -t localhost/ember:check .
name=ember-check-$$
http=${HTTP_PORT:-18190}
grpc=${GRPC_PORT:-18191}
# `podman run` takes the runtime as a global flag and the limits as its own.
runtime=$(grep -o -- '--runtime [^ ]*' <<<"$flags" || true)
limits=$(sed 's/--runtime [^ ]*//' <<<"$flags")
# shellcheck disable=SC2086
podman $runtime run -d --name "$name" $limits -p "127.0.0.1:$http:8080" -p "127.0.0.1:$grpc:8081" \
    localhost/ember:check >/dev/null
trap 'podman rm -f "$name" >/dev/null 2>&1 || true' EXIT
for _ in $(seq 100); do
    curl -sf "127.0.0.1:$http/v2/health/ready" >/dev/null && break
    sleep 0.1
done
curl -sf "127.0.0.1:$http/v2/health/ready" >/dev/null || { podman logs "$name"; exit 1; }
scores=$(head -3 data/sample.tsv | curl -sf --data-binary @- "127.0.0.1:$http/v1/score")
[[ $(wc -l <<<"$scores") == 3 ]] || { echo "expected 3 scores, got: $scores"; exit 1; }
echo "HTTP: ready, 3 scores: $(tr '\n' ' ' <<<"$scores")"
if [[ -n ${TRITON_PYTHON:-} ]]; then
    "$TRITON_PYTHON" tools/triton_client_check.py --http "127.0.0.1:$http" --grpc "127.0.0.1:$grpc"
fi
podman stop -t 10 "$name" >/dev/null
code=$(podman inspect "$name" --format '{{.State.ExitCode}}')
[[ $code == 0 ]] || { podman logs "$name"; echo "exit code $code"; exit 1; }
echo "stopped cleanly (exit 0); image: $(podman images localhost/ember:check --format '{{.Size}}')"
