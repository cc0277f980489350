#!/usr/bin/env bash
# The freshness figure of streaming row updates on this machine, on a release build (about two
# minutes): the shipped model served by two replicas from a fresh local Redis Cluster (3
# primaries + 3 replicas, started and torn down by the test), `ember loadgen` over both at half
# the highest rate whose p99 stays within 10 ms, alternately without and with 10,000 row updates
# per second, and a probe that times publish-to-visible on each replica. Prints FIGURE lines;
# fails when the freshness figure is missed or a request fails (the serving p99 ratio is
# reported). Needs redis-server and redis-cli (apt-get install -y redis-server).
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --release -p ember-cli --test remote -- --ignored --nocapture --test-threads 1 figure_update
