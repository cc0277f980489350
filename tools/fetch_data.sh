#!/usr/bin/env bash
# Puts the production-derived embedding trace that the trace benchmarks read under data/traces/
# (ignored by git): 429,951 row ids of one table of Meta's dlrm_datasets (2021), as published,
# MIT-licensed, with the MICRO 2024 artifact "Pushing the Performance Envelope of DNN-based
# Recommendation Systems Inference on GPUs" (github.com/rishucoding/reproduce_MICRO24_GPU_DLRM_inference),
# and its 60K hottest ids. Each file is checked against its SHA-256 before it is kept.
#
#   tools/fetch_data.sh              # download (about 4 MB)
#   SHARED=../shared/data tools/fetch_data.sh   # link a local copy instead (the project's own)
#
# BASE_URL overrides where the files come from (a mirror, or file:// for a test).
set -euo pipefail
cd "$(dirname "$0")/.."
base=${BASE_URL:-https://raw.githubusercontent.com/rishucoding/reproduce_MICRO24_GPU_DLRM_inference/main/datasets}
mkdir -p data/traces
fetch() { # name, path under the artifact's datasets/, sha256
    local out=data/traces/$1 tmp
    if [[ -n ${SHARED:-} && -f $SHARED/traces/$1 ]]; then
        ln -sfn "$(realpath "$SHARED/traces/$1")" "$out"
    elif ! { [[ -f $out ]] && sha256sum --status -c <<<"$3  $out"; }; then
        tmp=$(mktemp "data/traces/.$1.XXXXXX")
        trap 'rm -f "$tmp"' EXIT
        curl -fsSL --retry 3 -o "$tmp" "$base/$2"
        chmod 644 "$tmp"
        mv "$tmp" "$out"
    fi
    if ! sha256sum --status -c <<<"$3  $out"; then
        echo "$out: SHA-256 does not match the artifact's file; removed" >&2
        rm -f "$out"
        exit 1
    fi
    echo "$out: $(wc -l <"$out") ids, checksum ok"
}
fetch reuse_medium_table_500K.txt reuse_medium/table_500K.txt \
    628524ab361ec19617039adffab8618701a9a220fda90a1de66289a83e3a6e9e
fetch reuse_medium_hot60k.txt pinned_indices/rj_60K_medium_hot_indices.txt \
    663a97b2bc7ed39e62919feeaea31c09fe59caa2600b24c29a3e7b008b17d956
