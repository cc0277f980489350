#!/usr/bin/env bash
# The reliability figures of `ember serve` on this machine, on a release build, one at a time:
#
#   bench/reliability.sh            10,000 idle + 500 slowloris connections; 5x the sustainable
#                                   rate for 60 s; peak memory of 16 MiB requests (~6 minutes)
#   bench/reliability.sh soak       an hour at 80% of the highest rate (EMBER_SOAK_SECS=N for
#                                   another length)
#   bench/reliability.sh NAME       one figure test by name (see crates/ember-cli/tests/reliability/figures.rs)
#
# The short checks of the same suite run in CI (`cargo test`); these are `#[ignore]`d there.
# Each prints lines starting with FIGURE (or the per-request memory table) and fails when the
# figure is missed.
set -euo pipefail
cd "$(dirname "$0")/.."
which="${1:-figure_}"
case "$which" in
  soak) filter=soak_ ;;
  *) filter="$which" ;;
esac
exec cargo test --release -p ember-cli --test reliability -- \
  --ignored --nocapture --test-threads 1 "$filter"
