#!/usr/bin/env bash
# The soak of a model repository served from a local Redis Cluster while its rows are updated,
# on a release build (an hour; EMBER_SOAK_SECS=N for another length): two models (the shipped one
# pushed as `a` and `b`) served by one `ember serve --model-repository --placement remote`, table
# t5 of each rewritten 5,000 rows a second, and `ember loadgen --verify-against` per model at 40%
# of the highest rate of one (80% in all; EMBER_SOAK_SHARE=0.2 for 20% each). Prints each
# model's p99, the server's RSS and the machine's steal time per minute, and FIGURE lines; fails
# when a target is missed (0 errors, 0 wrong, every row as last published, RSS slope < 1 MiB per
# 10 min, p99 per minute within 1.2x of the first). Needs redis-server and redis-cli
# (apt-get install -y redis-server).
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --release -p ember-cli --test remote -- --ignored --nocapture --test-threads 1 soak::
