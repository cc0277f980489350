//! `ember bench remote`: the embedding stage with every table in a Redis Cluster behind the row
//! cache, side by side in one run with the same tables in DRAM, with the cluster's own rate for
//! the same fetches (a plain pipelined loop of `GETRANGE` over bare connections: no cache, no
//! routing, no retries), and with the layouts the field uses.
//!
//! Set up: the tables from the seed (DRAM); a local Redis Cluster of `--primaries` x (1 +
//! `--replicas`) nodes started here (or `--redis`); the tables pushed (`ember store push`'s code),
//! timed against `redis-benchmark`'s pipelined `SET` of as many new keys of the same size (and,
//! for reference, its overwrite of 2,000 keys). Measure: the layout
//! study (memory per row from `INFO memory`, fetch rate); DRAM; for each cache size and policy,
//! warm-up then timed runs, checked bit for bit against DRAM; the ceiling loop with as many rows
//! per batch as the smallest cache missed.

use crate::units::human_bytes;
use anyhow::{Context, Result, ensure};
use clap::Args;
use ember_bench::redis_cluster::{self, LocalCluster};
use ember_bench::stats::{median, quantile};
use ember_embed::storage::remote::{self, Cluster, ClusterOptions, PushOptions, RemoteSource};
use ember_embed::{
    CachePolicy, EmbeddingCollection, EmbeddingTable, KeyedJagged, Stager, TierOptions, TierStats,
};
use serde_json::{Value as Json, json};
use std::process::Command;
use std::time::{Duration, Instant};

use super::setup::{self, EmbedArgs};
use super::tiered::{WarmPairs, batches_before, run_tier};

mod ceiling;
mod layouts;

use ceiling::ceiling_loop;
use layouts::layout_study;

#[derive(Debug, Args)]
pub struct RemoteArgs {
    #[command(flatten)]
    embed: EmbedArgs,
    /// An existing cluster, redis://host:port[,...] [default: start a local one].
    #[arg(long)]
    redis: Option<String>,
    /// Primaries of the local cluster.
    #[arg(long, default_value_t = 3)]
    primaries: usize,
    /// Replicas per primary of the local cluster.
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// Cache sizes, as fractions of the tables' bytes.
    #[arg(long, value_delimiter = ',', default_value = "1.0,0.1")]
    cache_fractions: Vec<f64>,
    /// Cache policies to run, comma-separated (lru, lfu, pinned).
    #[arg(long, value_delimiter = ',', default_value = "lru,lfu,pinned")]
    policies: Vec<CachePolicy>,
    /// Batches staged ahead of the one being pooled.
    #[arg(long, default_value_t = 1)]
    prefetch_depth: usize,
    /// Batches that warm the cache before timing [default: --batches x --runs].
    #[arg(long)]
    warmup_batches: Option<usize>,
    /// Rows per layout in the layout study (0: skip it).
    #[arg(long, default_value_t = 100_000)]
    layout_rows: usize,
    /// Seconds of each fetch-rate loop (layouts, ceiling).
    #[arg(long, default_value_t = 2.0)]
    loop_secs: f64,
    /// Deadline of one batch's fetch, ms.
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u64,
}

pub fn run(r: RemoteArgs) -> Result<()> {
    let a = &r.embed;
    let setup::Setup {
        shape: s,
        source,
        isa,
    } = a.setup()?;
    ensure!(
        !r.policies.is_empty(),
        "--policies needs at least one policy"
    );
    let total = s.table_bytes(a.dtype)?;
    let (dram, _) = setup::build_tables(a, s, total)?;
    let local = match &r.redis {
        Some(_) => None,
        None => {
            redis_cluster::available().map_err(anyhow::Error::msg)?;
            eprint!(
                "starting a local Redis Cluster ({} primaries x {} replicas)... ",
                r.primaries, r.replicas
            );
            let c = LocalCluster::start(r.primaries, r.replicas, 2000)?;
            eprintln!("{}", c.url());
            Some(c)
        }
    };
    let url = r
        .redis
        .clone()
        .unwrap_or_else(|| local.as_ref().expect("started").url());
    let mut admin_opts = ClusterOptions::parse(&url)?;
    admin_opts.timeout = Duration::from_secs(60);
    let mut admin = Cluster::connect(admin_opts.clone())?;
    let primaries = admin.primaries();

    let layouts = match r.layout_rows {
        0 => Json::Null,
        n => layout_study(&mut admin, &primaries, n, r.loop_secs)?,
    };

    // Push, against redis-benchmark's pipelined SET of the same value size.
    let model = format!(
        "bench-{}x{}x{}-{}-{}",
        s.tables, s.rows, s.dim, a.dtype, a.seed
    );
    if let Ok(vs) = remote::versions(&mut admin, &model) {
        for (v, _) in vs {
            remote::remove(&mut admin, &model, v, Duration::from_secs(60))?;
        }
    }
    let tables: Vec<&EmbeddingTable> = dram.tables().iter().collect();
    let mem0 = used_memory(&primaries)?;
    let t0 = Instant::now();
    let rep = remote::push(
        &mut admin,
        &model,
        &tables,
        &PushOptions::default(),
        &mut |_, _| {},
    )?;
    let push_s = t0.elapsed().as_secs_f64();
    let stored = used_memory(&primaries)?.saturating_sub(mem0);
    let manifest = remote::read_manifest(&mut admin, &model, rep.version)?;
    let block_bytes = manifest.tables[0].rows_per_block * manifest.tables[0].row_bytes;
    eprintln!(
        "push: {} in {push_s:.2} s, {:.0} MB/s ({} blocks of {}; reading back {:.2} s of it), {:.3} x the raw bytes in INFO memory",
        human_bytes(total),
        total as f64 / push_s / 1e6,
        rep.blocks,
        human_bytes(block_bytes),
        rep.verify_seconds,
        stored as f64 / total as f64
    );
    // The peer: as many new keys of the same size as the push wrote (a push stores new data:
    // the nodes allocate and fault in fresh memory). Also, for reference, the overwrite rate
    // (2,000 keys written 4 times: memory recycled, no new pages): a different workload.
    let push_rate = total as f64 / push_s;
    let bench_set = redis_benchmark_set(&primaries[0], block_bytes, rep.blocks, 1_000_000_000)?;
    let k = rep.blocks.min(2000);
    let bench_overwrite = redis_benchmark_set(&primaries[0], block_bytes, 4 * k, k)?;
    if let (Some(b), Some(o)) = (bench_set, bench_overwrite) {
        eprintln!(
            "redis-benchmark SET -d {block_bytes} -P 16: {} new keys {:.0} MB/s, push at {:.2}x; \
             {k} keys overwritten 4 times {:.0} MB/s, push at {:.2}x",
            rep.blocks,
            b / 1e6,
            push_rate / b,
            o / 1e6,
            push_rate / o
        );
    }

    // DRAM.
    let warm = r.warmup_batches.unwrap_or(a.batches * a.runs);
    let mut all = setup::batches(a, s, &source, warm + a.batches * a.runs)?;
    let timed = all.split_off(warm);
    let warmup = all;
    let runs: Vec<&[KeyedJagged]> = timed.chunks(a.batches).collect();
    let lookups_per_run: usize = runs[0].iter().map(|b| b.num_ids()).sum();
    let pooler = a.pooler(isa)?;
    let out_len = s.batch * s.tables * s.dim;
    let mut out = vec![0f32; out_len];
    for kj in runs[0] {
        pooler.run(&dram, dram.validate(kj)?, &mut out)?;
    }
    // What the tier must give on the last batch of the first run, bit for bit.
    let want = out.clone();
    let mut dram_lps = Vec::new();
    for batches in &runs {
        let t0 = Instant::now();
        for kj in *batches {
            pooler.run(&dram, dram.validate(kj)?, &mut out)?;
        }
        dram_lps.push(lookups_per_run as f64 / t0.elapsed().as_secs_f64());
    }
    let dram_m = median(&dram_lps);
    eprintln!("dram: {:.2} M lookups/s", dram_m / 1e6);

    // The remote tier.
    let coll = EmbeddingCollection::one_feature_per_table(
        dram.tables()
            .iter()
            .map(|t| EmbeddingTable::remote(t.name(), t.rows(), t.dim(), t.dtype()))
            .collect::<Result<_, _>>()?,
    )?;
    let mut src_opts = ClusterOptions::parse(&url)?;
    src_opts.timeout = Duration::from_millis(r.timeout_ms);
    let src = RemoteSource {
        cluster: src_opts,
        model: model.clone(),
        version: Some(rep.version),
    };
    let pin_trace = match &source {
        ember_bench::workload::IdSource::Trace { ids, .. } => Some(ids.clone()),
        _ => None,
    };
    let mut results = Vec::new();
    let mut smallest_misses = None;
    for &fraction in &r.cache_fractions {
        ensure!(fraction >= 0.0, "cache fractions must not be negative");
        let cache_bytes = (total as f64 * fraction) as usize;
        for &policy in &r.policies {
            let opts = TierOptions {
                cache_bytes,
                policy,
                pin_trace: pin_trace.clone(),
                remote: Some(src.clone()),
                ..TierOptions::default()
            };
            let stager = Stager::new(&coll, opts)?;
            run_tier(
                &stager,
                &coll,
                &pooler,
                &warmup,
                r.prefetch_depth,
                &mut out,
                &mut None,
            )?;
            stager.reset_stats();
            stager.take_fetch_samples();
            let mut lps = Vec::new();
            let mut dram_secs = 0.0;
            // Each timed tier run against a DRAM run of the same batches (see `WarmPairs`: as
            // this machine's speed drifts between runs, DRAM measured once moved 2.6x); the
            // tier's counters and fetch samples cover the timed runs only.
            let mut ratios = Vec::new();
            let mut timed = TierStats::default();
            let mut samples = Vec::new();
            let pairs = WarmPairs {
                stager: &stager,
                coll: &coll,
                dram: Some(&dram),
                pooler: &pooler,
                depth: r.prefetch_depth,
                lookups_per_run,
            };
            for (k, batches) in runs.iter().enumerate() {
                let before = batches_before(&warmup, &runs, k);
                let pair = pairs.run(before, batches, &mut out, &mut None)?;
                let dram_run = pair.dram.expect("paired with DRAM");
                dram_secs += lookups_per_run as f64 / dram_run;
                timed = timed.plus(&pair.stats);
                samples.extend(stager.take_fetch_samples());
                lps.push(pair.tier);
                ratios.push(pair.tier / dram_run);
                if k == 0 {
                    ensure!(
                        out.iter()
                            .zip(&want)
                            .all(|(x, y)| x.to_bits() == y.to_bits()),
                        "the remote tier's pooled output ({policy}) differs from DRAM's"
                    );
                }
            }
            let st = timed;
            let mut fetch: Vec<f64> = samples.iter().map(|&x| x as f64).collect();
            fetch.sort_by(f64::total_cmp);
            let batches_timed = (runs.len() * a.batches) as f64;
            let misses_per_batch = st.misses as f64 / batches_timed;
            let fetch_rate = st.misses as f64 / st.io.as_secs_f64().max(1e-9);
            let m = median(&lps);
            let vs_dram = median(&ratios);
            // Where a batch's time goes: the staging thread's work beside the DRAM pooling of
            // the same batches (staging runs beside the tier's own pooling).
            let stage_us = st.stage.as_secs_f64() * 1e6 / batches_timed;
            let dram_us = dram_secs * 1e6 / batches_timed;
            eprintln!(
                "cache {:.0}% {policy}: {:.2} M lookups/s ({:.2}x DRAM, median of run pairs), staging {stage_us:.0} us/batch (DRAM pooling {dram_us:.0} us/batch), hit rate {:.3}, {:.0} rows fetched per batch at {:.0} rows/s, fetch p50 {:.2} ms p99 {:.2} ms",
                fraction * 100.0,
                m / 1e6,
                vs_dram,
                st.hit_rate(),
                misses_per_batch,
                fetch_rate,
                quantile(&fetch, 0.5) * 1e3,
                quantile(&fetch, 0.99) * 1e3,
            );
            if fraction == r.cache_fractions.iter().copied().fold(f64::MAX, f64::min) {
                smallest_misses = Some(
                    smallest_misses.map_or(misses_per_batch, |x: f64| x.max(misses_per_batch)),
                );
            }
            results.push(json!({
                "cache_fraction": fraction,
                "cache_bytes": cache_bytes,
                "policy": policy.name(),
                "lookups_per_s": m,
                "run_lookups_per_s": lps,
                "vs_dram": vs_dram,
                "run_vs_dram": ratios,
                "hit_rate": st.hit_rate(),
                "lookup_hit_rate": st.lookup_hit_rate(),
                "rows_fetched_per_batch": misses_per_batch,
                "fetch_rows_per_s": fetch_rate,
                "fetch_p50_s": quantile(&fetch, 0.5),
                "fetch_p99_s": quantile(&fetch, 0.99),
                "round_trips": st.ssd_reads,
                "bytes_fetched": st.ssd_bytes_read,
                "stall_s": st.stall.as_secs_f64(),
                "stage_us_per_batch": stage_us,
                "dram_us_per_batch": dram_us,
                "distinct_per_batch": st.cache_lookups as f64 / batches_timed,
                "checked_against_dram": true,
            }));
        }
    }
    // The cluster's own rate for fetches of that size.
    let ceiling = match smallest_misses {
        Some(m) if m >= 1.0 => {
            let c = ceiling_loop(
                &url,
                &model,
                rep.version,
                &manifest,
                m.round() as usize,
                r.loop_secs,
                a.seed,
            )?;
            eprintln!(
                "ceiling: plain pipelined GETRANGE loop, {} rows per batch: {:.0} rows/s, p99 {:.2} ms per batch",
                m.round(),
                c.0,
                c.1 * 1e3
            );
            for res in results.iter_mut() {
                if res["cache_fraction"].as_f64()
                    == Some(r.cache_fractions.iter().copied().fold(f64::MAX, f64::min))
                {
                    let rate = res["fetch_rows_per_s"].as_f64().unwrap_or(0.0);
                    res["fetch_vs_ceiling"] = json!(rate / c.0);
                }
            }
            json!({"rows_per_batch": m.round(), "rows_per_s": c.0, "batch_p99_s": c.1})
        }
        _ => Json::Null,
    };
    let report = json!({
        "bench": "remote",
        "tables": s.tables, "rows": s.rows, "dim": s.dim, "dtype": a.dtype.name(),
        "batch": s.batch, "pooling": s.pooling, "ids": source.describe(),
        "cluster": url, "primaries": primaries.len(),
        "dram_lookups_per_s": dram_m, "run_dram_lookups_per_s": dram_lps,
        "push": {
            "seconds": push_s, "verify_seconds": rep.verify_seconds, "bytes_per_s": total as f64 / push_s,
            "rows_per_s": rep.rows as f64 / push_s, "blocks": rep.blocks, "block_bytes": block_bytes,
            "redis_benchmark_set_bytes_per_s": bench_set,
            "vs_redis_benchmark": bench_set.map(|b| push_rate / b),
            "redis_benchmark_overwrite_bytes_per_s": bench_overwrite,
            "vs_redis_benchmark_overwrite": bench_overwrite.map(|b| push_rate / b),
            "memory_vs_raw": stored as f64 / total as f64,
        },
        "policies": results,
        "ceiling": ceiling,
        "layouts": layouts,
    });
    remote::remove(&mut admin, &model, rep.version, Duration::from_secs(60))?;
    if a.json {
        println!("{report}");
    }
    drop(local);
    Ok(())
}

/// Sum over `nodes` (`host:port`) of the memory holding data: `used_memory` less client
/// buffers and the replication backlog, read once no lazily freed value is pending (an `UNLINK`
/// frees values in the background).
pub(super) fn used_memory(nodes: &[String]) -> Result<u64> {
    let mut sum = 0;
    for n in nodes {
        let port: u16 = n.rsplit(':').next().unwrap_or("").parse()?;
        redis_cluster::wait_for(Duration::from_secs(30), || {
            Ok(redis_cluster::info_u64(port, "memory", "lazyfree_pending_objects")? == 0)
        })?;
        let used = redis_cluster::info_u64(port, "memory", "used_memory")?;
        let clients = redis_cluster::info_u64(port, "memory", "mem_clients_normal")?
            + redis_cluster::info_u64(port, "memory", "mem_clients_slaves")?
            + redis_cluster::info_u64(port, "memory", "mem_replication_backlog")?;
        sum += used.saturating_sub(clients);
    }
    Ok(sum)
}

/// `redis-benchmark --cluster` pipelined `SET` of `value` bytes, `n` of them on random keys
/// out of `keyspace`: bytes/s (`None` when the tool is missing). Its keys (`key:{tag}:N`) stay
/// in the cluster.
fn redis_benchmark_set(node: &str, value: usize, n: usize, keyspace: usize) -> Result<Option<f64>> {
    let (host, port) = node.rsplit_once(':').context("host:port")?;
    let out = match Command::new("redis-benchmark")
        .args([
            "--cluster",
            "-h",
            host,
            "-p",
            port,
            "-t",
            "set",
            "-P",
            "16",
            "-c",
            "3",
            "-q",
        ])
        .args([
            "-d",
            &value.to_string(),
            "-n",
            &n.to_string(),
            "-r",
            &keyspace.to_string(),
        ])
        .output()
    {
        Ok(o) => o,
        Err(_) => return Ok(None),
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let rps = text
        .split(['\r', '\n'])
        .filter_map(|l| l.trim().strip_prefix("SET: "))
        .filter_map(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        .next_back();
    Ok(rps.map(|r| r * value as f64))
}
