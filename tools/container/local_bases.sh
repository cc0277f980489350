#!/usr/bin/env bash
# Makes local stand-ins for the Dockerfile's base images on a machine that can reach Debian's
# mirror and static.rust-lang.org but not a container registry:
#   localhost/debian-local:bookworm   Debian bookworm, minbase (debootstrap), as debian:bookworm-slim
#   localhost/rust-local:bookworm     the same plus gcc, libc6-dev and rustup's stable Rust, as
#                                     rust:1-bookworm
# then builds the Dockerfile on them:
#   podman build --build-arg RUST_IMAGE=localhost/rust-local:bookworm \
#       --build-arg RUN_IMAGE=localhost/debian-local:bookworm -t ember .
# Needs root, podman and debootstrap (apt-get install -y podman debootstrap).
#
# Certificates in /usr/local/share/ca-certificates (a TLS-intercepting proxy's CA) are trusted
# in the Rust stand-in too, so that rustup and cargo reach their servers through it.
#
# PODMAN_FLAGS: extra flags for `podman build` where the host needs them (this project's
# development VM: `--runtime runc` for its hybrid cgroups and `--ulimit nofile=1024:1024
# --ulimit nproc=4096:4096`, as it refuses podman's default limits).
set -euo pipefail
root=$(mktemp -d /var/tmp/ember-bookworm.XXXXXX)
ctx=$(mktemp -d)
trap 'rm -rf "$root" "$ctx"' EXIT
mkdir "$ctx/ca"
cp /usr/local/share/ca-certificates/*.crt "$ctx/ca/" 2>/dev/null || true
debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian
tar -C "$root" -c . | podman import - localhost/debian-local:bookworm
# shellcheck disable=SC2086
podman build ${PODMAN_FLAGS:-} -t localhost/rust-local:bookworm -f - "$ctx" <<'CONTAINERFILE'
FROM localhost/debian-local:bookworm
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY ca/ /usr/local/share/ca-certificates/
RUN update-ca-certificates
ENV RUSTUP_HOME=/usr/local/rustup CARGO_HOME=/usr/local/cargo PATH=/usr/local/cargo/bin:$PATH
RUN curl -sSf -o /tmp/rustup-init \
        https://static.rust-lang.org/rustup/dist/x86_64-unknown-linux-gnu/rustup-init \
    && chmod +x /tmp/rustup-init \
    && /tmp/rustup-init -y --no-modify-path --profile minimal --default-toolchain stable \
    && rm /tmp/rustup-init && rustc --version
CONTAINERFILE
