#!/usr/bin/env bash
# The remote tier's fault figures on this machine, on a release build (about six minutes): the
# shipped model served by two replicas (one with no row cache, one with a 1 MiB cache reading
# replicas too) from a fresh local Redis Cluster per fault (3 primaries + 3 replicas, started
# and torn down by the test), every row of table t5 rewritten 10,000 times a second, and
# `ember loadgen --verify-against` two DRAM references (each row's two states) at half the
# highest rate whose p99 stays within 10 ms. Faults: a primary killed, a primary paused for 5 s,
# a replica killed, the whole cluster paused for 10 s without and with the local copy
# (--remote-fallback), a primary killed and restarted empty after its failover, and a primary
# restarted empty before it (its rows lost) without and with the local copy. Prints the counts
# by status and the p99 over time around each fault, the update lag, whether every row ends as
# last published, and FIGURE lines; fails when a figure is missed.
#
#   EMBER_FAULTS=paused bench/remote_faults.sh     only the faults whose name holds "paused"
#   EMBER_FAULT_RATE=3000 bench/remote_faults.sh   at 3,000 requests/s instead of half the max
#
# Needs redis-server and redis-cli (apt-get install -y redis-server).
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --release -p ember-cli --test remote -- --ignored --nocapture --test-threads 1 faults::figure_
