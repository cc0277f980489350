#!/usr/bin/env bash
# Pooling next to the rows (the EMBER.POOL Redis module) against row fetches, in one run:
#  1. `ember bench remote-pool`: bytes per batch, lookups/s and the nodes' CPU per batch, RM1
#     (pooling 80) and DLRM-v2 (multi-hot 1-100) shapes, uniform and zipf ids, 0/10/50% cached;
#  2. the shipped model served from the cluster, pooled against rows read whole: the highest
#     rate at p99 <= 10 ms of each (`ember loadgen --find-max`).
# Each starts its own 3+3 Redis Cluster with the module loaded. About 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p ember-cli -p ember-redis-module
target/release/ember bench remote-pool "$@"
cargo test --release -p ember-cli --test remote -- --ignored --nocapture pool::figure_
