//! `ember bench history-cache`: HSTU requests served with the cache of users' histories
//! (`ember_model::hstu::cache`) against the full recompute, in the same run
//! (`docs/hstu.md`, "A cache of users' histories").
//!
//! - **Cells** (`--cells HISTORY:CANDIDATES,...`): users with a history of `HISTORY` items fill
//!   their entries, then come back `--rounds` times with `--new` new actions and `CANDIDATES`
//!   new candidates each; every request is scored by the full recompute
//!   ([`HstuPredictor::run`]) and with the cache ([`HstuPredictor::run_cached`], which extends the
//!   entry), alternating which goes first. Reported per cell: the medians, their ratio, the
//!   scores' difference and the AUC / NE the cached scores keep (labels drawn from the fresh
//!   probabilities), and the bytes an entry holds.
//! - **Replay** (`--replay N`): `N` requests of streaming users ([`UserStream`]: random users
//!   return with 1 to `--grow` new actions) through a cache of `--cache-mb`, each also scored
//!   fresh: hit rate, evictions, bytes per user, time per request and the AUC / NE kept with
//!   entries extended over many requests.

use anyhow::{Context, Result, ensure};
use clap::Args;
use ember_bench::stats::median;
use ember_model::dense::DenseDType;
use ember_model::hstu::presets::UserStream;
use ember_model::hstu::{
    Eviction, HistoryCache, HistoryCacheConfig, HstuModel, HstuPredictor, Reuse, SpillConfig, User,
};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Instant;

use super::history_reuse::random_model;
use super::model_report::Accuracy;

#[derive(Debug, Args)]
pub struct HistoryCacheArgs {
    /// Model shape with random weights: dlrm-v3 or hstu-small.
    #[arg(long, default_value = "dlrm-v3")]
    preset: String,
    /// Multiplies every table's rows (dlrm-v3's item table has 1e9).
    #[arg(long, default_value_t = 1e-5)]
    rows_scale: f64,
    /// HISTORY:CANDIDATES cells, comma-separated.
    #[arg(
        long,
        default_value = "1024:64,1024:512,1024:2048,4096:64,4096:512,4096:2048"
    )]
    cells: String,
    /// Users per cell.
    #[arg(long, default_value_t = 2)]
    users: usize,
    /// Returns per user and cell.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// New actions a return.
    #[arg(long, default_value_t = 8)]
    new: usize,
    /// What an entry may stand for: exact, stale (the default bound) or
    /// stale:APPENDED:DAYS.
    #[arg(long, default_value = "stale")]
    reuse: Reuse,
    /// LRU or LFU.
    #[arg(long, default_value = "lru")]
    eviction: Eviction,
    /// The dense layers' precision: f32 or bf16.
    #[arg(long, default_value = "f32")]
    dense_dtype: String,
    /// Requests of streaming users to replay instead of the cells.
    #[arg(long)]
    replay: Option<usize>,
    /// Replay: the cache's size.
    #[arg(long, default_value_t = 1024)]
    cache_mb: usize,
    /// Replay: spill entries evicted from DRAM to this directory.
    #[arg(long)]
    spill_dir: Option<std::path::PathBuf>,
    /// Replay: the spill directory's bound.
    #[arg(long, default_value_t = 8192)]
    spill_mb: u64,
    /// Replay: users, their history before the stream, new actions a return (1 to this).
    #[arg(long, default_value_t = 16)]
    replay_users: usize,
    #[arg(long, default_value_t = 256)]
    replay_history: usize,
    #[arg(long, default_value_t = 8)]
    grow: usize,
    /// Replay: candidates a request.
    #[arg(long, default_value_t = 64)]
    candidates: usize,
    /// Replay: replicas of the model, each with its own cache; each request goes to one at
    /// random (a load balancer without user affinity).
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// Replay: share the replicas' entries through a Redis Cluster: `local` (3 primaries of
    /// `redis-server` started on free loopback ports for the run) or a redis:// URL.
    #[arg(long, value_name = "local|URL")]
    share: Option<String>,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Print each pass's stage times (cells).
    #[arg(long)]
    stages: bool,
    /// Print one JSON object on the last line.
    #[arg(long)]
    json: bool,
}

fn parse_cells(s: &str) -> Result<Vec<(usize, usize)>> {
    s.split(',')
        .map(|c| {
            let (h, k) = c
                .split_once(':')
                .with_context(|| format!("--cells '{c}': expected HISTORY:CANDIDATES"))?;
            Ok((h.trim().parse()?, k.trim().parse()?))
        })
        .collect()
}

pub fn run(a: HistoryCacheArgs) -> Result<()> {
    ensure!(
        a.users > 0 && a.rounds > 0,
        "--users and --rounds must be at least 1"
    );
    let reuse = a.reuse;
    let dtype: DenseDType = a.dense_dtype.parse()?;
    let (model, mut p) = random_model(&a.preset, a.rows_scale, a.seed, a.threads)?;
    p.set_dense_dtype(dtype)?;
    let cpu = super::cpu_name();
    eprintln!(
        "{} (rows x {}), {} dense layers, {} threads, reuse {reuse:?}; {cpu}",
        a.preset, a.rows_scale, a.dense_dtype, a.threads
    );
    let report = match a.replay {
        Some(n) => replay(&a, &model, &mut p, reuse, n)?,
        None => cells(&a, &model, &mut p, reuse)?,
    };
    if a.json {
        let mut r = report;
        r["bench"] = json!("history-cache");
        r["preset"] = json!(a.preset);
        r["rows_scale"] = json!(a.rows_scale);
        r["cpu"] = json!(cpu);
        r["threads"] = json!(a.threads);
        r["dense_dtype"] = json!(a.dense_dtype);
        r["reuse"] = json!(a.reuse.to_string());
        println!("{r}");
    }
    Ok(())
}

fn check(model: &HstuModel, user: &User) -> Result<ember_model::hstu::HstuBatch> {
    Ok(model.check_users(std::slice::from_ref(user), 0)?)
}

/// One request of a cell: each pass's seconds and scores, and whether the cache served it.
#[derive(Default)]
struct Request {
    fresh: (f64, Vec<f32>),
    cached: (f64, Vec<f32>),
    hit: bool,
}

fn cells(
    a: &HistoryCacheArgs,
    model: &Arc<HstuModel>,
    p: &mut HstuPredictor,
    reuse: Reuse,
) -> Result<Value> {
    let mut out = Vec::new();
    eprintln!(
        "{:>7} {:>6}  {:>10} {:>10} {:>7} {:>7} {:>6}  {:>9} {:>9} {:>9}  {:>8}",
        "history",
        "cands",
        "fresh ms",
        "cached ms",
        "x",
        "paired",
        "hits",
        "max diff",
        "AUC kept",
        "NE kept",
        "MiB/user"
    );
    for (history, candidates) in parse_cells(&a.cells)? {
        let cache = HistoryCache::new(HistoryCacheConfig {
            bytes: usize::MAX / 2,
            eviction: a.eviction,
            reuse,
            spill: None,
            share: None,
        })?;
        let mut stream = UserStream::new(model.config(), a.users, a.seed ^ history as u64);
        for u in 0..a.users {
            p.run_cached(&check(model, &stream.user(u, history, candidates))?, &cache)?;
        }
        let bytes = cache.stats().bytes as f64 / a.users as f64;
        // Per request: both passes' seconds and scores, and whether the cache served it.
        let mut reqs: Vec<Request> = Vec::new();
        for r in 0..a.rounds {
            for u in 0..a.users {
                let h = history + a.new * (r + 1);
                let batch = check(model, &stream.user(u, h, candidates))?;
                let mut q = Request::default();
                for first in [(r + u) % 2 == 0, (r + u) % 2 == 1] {
                    let t = Instant::now();
                    if first {
                        let (s, times) = p.run(&batch)?;
                        if a.stages {
                            eprintln!("fresh {times:?}");
                        }
                        q.fresh = (t.elapsed().as_secs_f64(), s.scores[0].clone());
                    } else {
                        let (s, times, used) = p.run_cached(&batch, &cache)?;
                        if a.stages {
                            eprintln!("cached {times:?}");
                        }
                        q.cached = (t.elapsed().as_secs_f64(), s.scores[0].clone());
                        q.hit = used.hits > 0;
                    }
                }
                reqs.push(q);
            }
        }
        // The figures are over the requests the cache served: one it refused (past the
        // staleness bound: the stream's gaps are a week one time in twenty) ran the full pass
        // and says nothing of the cache's speed or error; how many there were is reported.
        let hits: Vec<&Request> = reqs.iter().filter(|q| q.hit).collect();
        ensure!(
            !hits.is_empty(),
            "{history}:{candidates}: the cache served none of {} requests",
            reqs.len()
        );
        let fresh: Vec<f32> = hits.iter().flat_map(|q| q.fresh.1.clone()).collect();
        let cached: Vec<f32> = hits.iter().flat_map(|q| q.cached.1.clone()).collect();
        let acc = Accuracy::of(fresh.len(), &fresh, &cached, a.seed);
        let tf: Vec<f64> = hits.iter().map(|q| q.fresh.0).collect();
        let tc: Vec<f64> = hits.iter().map(|q| q.cached.0).collect();
        let (f, c) = (median(&tf) * 1e3, median(&tc) * 1e3);
        // Each request's two passes ran back to back: the median of their ratios is the
        // speed-up least moved by a shared machine's slow spells.
        let ratios: Vec<f64> = tf.iter().zip(&tc).map(|(f, c)| f / c).collect();
        let paired = median(&ratios);
        eprintln!(
            "{history:>7} {candidates:>6}  {f:>10.1} {c:>10.1} {:>6.2}x {paired:>6.2}x {:>6}  {:>9.2e} {:>8.4}% {:>8.4}%  {:>8.1}",
            f / c,
            format!("{}/{}", hits.len(), reqs.len()),
            acc.max_abs,
            100.0 * acc.auc_kept(),
            100.0 * acc.ne_kept(),
            bytes / (1 << 20) as f64
        );
        out.push(json!({
            "history": history, "candidates": candidates, "new": a.new,
            "fresh_ms": f, "cached_ms": c, "speedup": f / c, "speedup_paired": paired,
            "hits": hits.len(), "requests": reqs.len(), "bytes_per_user": bytes,
            "max_abs": acc.max_abs, "mean_abs": acc.mean_abs,
            "auc": {"fresh": acc.auc.0, "cached": acc.auc.1, "kept": acc.auc_kept()},
            "ne": {"fresh": acc.ne.0, "cached": acc.ne.1, "kept": acc.ne_kept()},
        }));
    }
    Ok(json!({ "cells": out }))
}

fn replay(
    a: &HistoryCacheArgs,
    model: &Arc<HstuModel>,
    p: &mut HstuPredictor,
    reuse: Reuse,
    n: usize,
) -> Result<Value> {
    ensure!(a.replicas > 0, "--replicas must be at least 1");
    // Held for the run: the cluster stops when it drops.
    let (_cluster, share) = share_of(a)?;
    let config = HistoryCacheConfig {
        bytes: a.cache_mb << 20,
        eviction: a.eviction,
        reuse,
        spill: a.spill_dir.clone().map(|dir| SpillConfig {
            dir,
            bytes: a.spill_mb << 20,
        }),
        share,
    };
    let caches = (0..a.replicas)
        .map(|_| model.new_history_cache(config.clone()))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut pick = a.seed | 1;
    let mut stream = UserStream::new(model.config(), a.replay_users, a.seed);
    for u in 0..a.replay_users {
        stream.user(u, a.replay_history, a.candidates);
    }
    let (mut tf, mut tc, mut fresh, mut cached) = (vec![], vec![], vec![], vec![]);
    let mut tokens = 0usize;
    for _ in 0..n {
        let (_, user) = stream.next_request(a.grow, a.candidates, usize::MAX);
        let batch = check(model, &user)?;
        tokens += batch.users()[0].history;
        // xorshift: the replica a load balancer sends the request to.
        pick ^= pick << 13;
        pick ^= pick >> 7;
        pick ^= pick << 17;
        let cache = &caches[(pick % a.replicas as u64) as usize];
        let t = Instant::now();
        let (s, _, _) = p.run_cached(&batch, cache)?;
        tc.push(t.elapsed().as_secs_f64());
        cached.extend_from_slice(&s.scores[0]);
        let t = Instant::now();
        fresh.extend_from_slice(&p.run(&batch)?.0.scores[0]);
        tf.push(t.elapsed().as_secs_f64());
    }
    let st = sum_stats(&caches);
    let acc = Accuracy::of(fresh.len(), &fresh, &cached, a.seed);
    let mean_history = tokens as f64 / n.max(1) as f64;
    Ok(replay_report(a, n, mean_history, &st, &acc, (&tf, &tc)))
}

/// Prints a replay's figures (`times`: the fresh and the cached passes' seconds) and gives
/// them as JSON.
fn replay_report(
    a: &HistoryCacheArgs,
    n: usize,
    mean_history: f64,
    st: &ember_model::hstu::CacheStats,
    acc: &Accuracy,
    times: (&[f64], &[f64]),
) -> Value {
    let (tf, tc) = times;
    if a.share.is_some() {
        let rd = st.share_read_ns as f64 / 1e6 / st.shared_hits.max(1) as f64;
        let wr = st.share_write_ns as f64 / 1e6 / st.shared_writes.max(1) as f64;
        eprintln!(
            "shared tier ({} replicas): {} entries read from the cluster, {} writes, {} \
             errors; {rd:.1} ms an entry read, {wr:.1} ms a write (a first visit writes it whole, a \
             return its new segment); \
             the full recompute: {:.1} ms a request",
            a.replicas,
            st.shared_hits,
            st.shared_writes,
            st.share_errors,
            median(tf) * 1e3
        );
    }
    let lookups = (st.hits + st.misses + st.refused).max(1) as f64;
    let per_user = st.bytes as f64 / st.entries.max(1) as f64;
    if st.disk_hits > 0 {
        let ms = st.disk_read_ns as f64 / 1e6 / st.disk_hits as f64;
        eprintln!(
            "disk tier: {} entries spilled, {} read back in {ms:.1} ms each ({:.0} MiB/s, \
             checksum included; the full recompute: {:.1} ms a request), {} damaged",
            st.spilled,
            st.disk_hits,
            per_user / (1 << 20) as f64 / (ms / 1e3),
            median(tf) * 1e3,
            st.damaged
        );
    }
    eprintln!(
        "{n} requests of {} users ({:.0} history items on average, 1-{} new a return, {} \
         candidates), cache {} MiB {:?}: hits {:.1}% ({} hits, {} misses, {} refused), {} \
         evictions, {} entries of {:.2} MiB on average; fresh {:.1} ms, cached {:.1} ms a request \
         (medians, {:.2}x); scores within {:.2e}, AUC {:.4}% kept, NE {:.4}% kept: {}",
        a.replay_users,
        mean_history,
        a.grow,
        a.candidates,
        a.cache_mb,
        a.eviction,
        100.0 * st.hits as f64 / lookups,
        st.hits,
        st.misses,
        st.refused,
        st.evictions,
        st.entries,
        per_user / (1 << 20) as f64,
        median(tf) * 1e3,
        median(tc) * 1e3,
        median(tf) / median(tc),
        acc.max_abs,
        100.0 * acc.auc_kept(),
        100.0 * acc.ne_kept(),
        acc.verdict()
    );
    json!({
        "replay": n, "users": a.replay_users, "grow": a.grow, "candidates": a.candidates,
        "cache_mb": a.cache_mb, "mean_history": mean_history,
        "hits": st.hits, "misses": st.misses, "refused": st.refused,
        "evictions": st.evictions, "entries": st.entries, "bytes_per_user": per_user,
        "spilled": st.spilled, "disk_hits": st.disk_hits, "damaged": st.damaged,
        "disk_bytes": st.disk_bytes, "disk_read_ms": st.disk_read_ns as f64 / 1e6,
        "replicas": a.replicas, "shared_hits": st.shared_hits, "shared_writes": st.shared_writes,
        "share_errors": st.share_errors, "share_read_ms": st.share_read_ns as f64 / 1e6,
        "share_write_ms": st.share_write_ns as f64 / 1e6,
        "fresh_ms": median(tf) * 1e3, "cached_ms": median(tc) * 1e3,
        "max_abs": acc.max_abs, "mean_abs": acc.mean_abs,
        "auc": {"fresh": acc.auc.0, "cached": acc.auc.1, "kept": acc.auc_kept()},
        "ne": {"fresh": acc.ne.0, "cached": acc.ne.1, "kept": acc.ne_kept()},
    })
}

/// The shared tier `--share` asks for, and the cluster started for it (`local`).
fn share_of(
    a: &HistoryCacheArgs,
) -> Result<(
    Option<ember_bench::redis_cluster::LocalCluster>,
    Option<ember_model::hstu::ShareConfig>,
)> {
    let Some(s) = &a.share else {
        return Ok((None, None));
    };
    let (cluster, url) = if s == "local" {
        ember_bench::redis_cluster::available()?;
        let c = ember_bench::redis_cluster::LocalCluster::start(3, 0, 1000)?;
        c.wait_healthy(std::time::Duration::from_secs(20))?;
        let url = c.url();
        (Some(c), url)
    } else {
        (None, s.clone())
    };
    let cfg = ember_model::hstu::ShareConfig {
        url,
        ttl_s: 3600,
        timeout: std::time::Duration::from_secs(2),
    };
    Ok((cluster, Some(cfg)))
}

/// The replicas' counters added up.
fn sum_stats(caches: &[HistoryCache]) -> ember_model::hstu::CacheStats {
    let mut t = ember_model::hstu::CacheStats::default();
    for c in caches {
        t += c.stats();
    }
    t
}
