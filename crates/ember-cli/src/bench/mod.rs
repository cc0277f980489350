//! `ember bench ...`: the benchmarks users run to size hardware and to compare Ember with its
//! peers in one run. Each is shaped the same way: set up its workload, measure Ember and its peer
//! side by side, gather a report value, print it as text (and with `--json` as one JSON object
//! on the last line). The measuring blocks they share (the memory-ceiling loop, id streams, the
//! disk's rate, statistics) are in the `ember-bench` crate.
//!
//! | file | benchmark |
//! |---|---|
//! | `embed.rs` (+ `check.rs`, `npy.rs`) | `bench embed`: the embedding stage against the memory ceiling |
//! | `gpu.rs` | `bench embed --device cuda`: every GPU variant against the copy bandwidth |
//! | `tiered/` | `bench tiered`: the SSD tier against DRAM, mmap and the disk |
//! | `remote.rs` | `bench remote`: tables in a Redis Cluster against DRAM and the cluster's own rate |
//! | `remote_pool.rs` | `bench remote-pool`: pooling on the cluster's nodes (`EMBER.POOL`) against row fetches |
//! | `model.rs` (+ `model_args.rs`, `model_report.rs`, `model_gpu.rs`, `dense_layers.rs`, `load.rs`) | `bench model`: the whole forward pass of a model of any family through the serving seam (`model_gpu.rs`: a GPU engine that keeps batches in flight); stages and bf16 / int8 layers against the dense ceiling |
//! | `history_cache.rs` | `bench history-cache`: HSTU requests with the cache of users' histories against the full recompute (speed, AUC / NE kept, hit rate on a streaming replay) |
//! | `history_reuse.rs` | `bench history-reuse`: HSTU history states reused as of the user's previous request against recomputed (the AUC / NE kept) |
//! | `setup.rs` | the embedding benchmarks' flags, tables and batches |

mod check;
mod dense_layers;
mod embed;
mod gpu;
mod graph;
mod history_cache;
mod history_reuse;
mod load;
mod model;
mod model_args;
mod model_gpu;
mod model_report;
mod npy;
mod remote;
mod remote_pool;
mod setup;
mod tiered;

use anyhow::Result;
use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum Bench {
    /// The embedding stage: pooled lookups over every table of a batch, against the memory ceiling.
    Embed(setup::EmbedArgs),
    /// The whole model, of any family: items/s, batch latency and where the time goes.
    Model(model_args::ModelArgs),
    /// The embedding stage with tables on the SSD tier, against the same tables in DRAM and a
    /// cold plain mmap, plus the disk's own random-read rate.
    Tiered(tiered::TieredArgs),
    /// The embedding stage with tables in a Redis Cluster (started here) behind the row cache,
    /// against DRAM, the cluster's own fetch rate, and the field's key layouts.
    Remote(remote::RemoteArgs),
    /// Pooling next to the rows (the EMBER.POOL Redis module) against row fetches: bytes per
    /// batch, lookups/s and the nodes' CPU, on a local cluster started with the module.
    RemotePool(remote_pool::RemotePoolArgs),
    /// HSTU: a user's history states reused as of its previous request against recomputed,
    /// the scores' error and the AUC / NE kept (no cache needed: the states are recomputed as
    /// they were then).
    HistoryReuse(history_reuse::HistoryReuseArgs),
    /// HSTU: requests served with the cache of users' histories against the full recompute,
    /// in the same run (speed per history x candidates, the AUC / NE kept, hit rate and bytes
    /// per user on a streaming replay).
    HistoryCache(history_cache::HistoryCacheArgs),
    /// A graph model's dense part (dense.onnx) on Ember's graph runtime, per batch and thread
    /// count (`bench/compare_onnx.py` runs ONNX Runtime beside it).
    Graph(graph::GraphArgs),
}

pub fn run(cmd: Bench) -> Result<()> {
    match cmd {
        Bench::Embed(a) => embed::run(a),
        Bench::Model(a) => model::run(a),
        Bench::Tiered(a) => tiered::run(a),
        Bench::Remote(a) => remote::run(a),
        Bench::RemotePool(a) => remote_pool::run(a),
        Bench::HistoryReuse(a) => history_reuse::run(a),
        Bench::HistoryCache(a) => history_cache::run(a),
        Bench::Graph(a) => graph::run(a),
    }
}

/// This machine's CPU model, from /proc/cpuinfo.
pub(crate) fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|x| x.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}
