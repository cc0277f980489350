#!/usr/bin/env bash
# The embedding lookups of a 4,096-item history of MLPerf DLRMv3's model (tables scaled by 1e-4)
# from DRAM, from the SSD tier and from a local 3-node Redis Cluster (started and torn down by
# the test), per user: `ember predict --batch 1 --json`, median of 3 runs. Needs redis-server.
# About 5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --release -p ember-cli --test remote -- --ignored --nocapture hstu::figure_hstu_lookups_by_tier
