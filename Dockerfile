# Builds `ember` and runs `ember serve` on the shipped model (models/default): KServe v2 over
# HTTP on 8080 and gRPC on 8081, listening on every interface of the container.
#
#   podman build -t ember .        (or: docker build -t ember .)
#   podman run --rm -p 8080:8080 -p 8081:8081 ember
#   podman run --rm -p 8080:8080 -v ./models/mine:/models/mine:ro ember \
#       serve --model /models/mine --http 0.0.0.0:8080 --grpc 0.0.0.0:8081
#
# The build stage needs a Rust toolchain (rustup's stable) on Debian bookworm; the image that
# runs holds only the binary, the shipped model and sample, and glibc. RUST_IMAGE and RUN_IMAGE
# name other bases (tools/container/local_bases.sh makes equivalent ones where the registries
# cannot be reached).
ARG RUST_IMAGE=docker.io/library/rust:1-bookworm
ARG RUN_IMAGE=docker.io/library/debian:bookworm-slim

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates crates
RUN cargo build --release --locked -p ember-cli \
    && install -D target/release/ember /out/ember

FROM ${RUN_IMAGE}
RUN useradd --system --home-dir /opt/ember --shell /usr/sbin/nologin ember
COPY --from=build /out/ember /usr/local/bin/ember
COPY models/default /opt/ember/models/default
COPY data/sample.tsv /opt/ember/data/sample.tsv
# `ember serve` and `ember predict` find the shipped model and sample under the working directory.
WORKDIR /opt/ember
USER ember
EXPOSE 8080 8081
ENTRYPOINT ["ember"]
CMD ["serve", "--http", "0.0.0.0:8080", "--grpc", "0.0.0.0:8081"]
