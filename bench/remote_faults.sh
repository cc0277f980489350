#!/usr/bin/env bash
# The remote tier's fault figures on this machine, on a release build (about two minutes): the
# shipped model served from a fresh local Redis Cluster (3 primaries + 3 replicas, started and
# torn down by the test) with no row cache, `ember loadgen --verify` at half the highest rate
# whose p99 stays within 10 ms, and a killed primary, a paused primary, and a killed primary then
# the whole cluster paused with the local copy (--remote-fallback). Prints the counts by status,
# the p99 over time around each fault, and FIGURE lines; fails when a figure is missed.
# Needs redis-server and redis-cli (apt-get install -y redis-server).
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --release -p ember-cli --test remote -- --ignored --nocapture --test-threads 1 figure_
