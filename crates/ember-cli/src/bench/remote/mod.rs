//! `ember bench remote`: the embedding stage with every table in a Redis Cluster behind the row
//! cache, side by side in one run with the same tables in DRAM, with the cluster's own rate for
//! the same fetches (a plain pipelined loop of `GETRANGE` over bare connections: no cache, no
//! routing, no retries), and with the layouts the field uses.
//!
//! Set up: the tables from the seed (DRAM); a local Redis Cluster of `--primaries` x (1 +
//! `--replicas`) nodes started here (or `--redis`); the tables pushed (`ember registry push`'s code),
//! timed against `redis-benchmark`'s pipelined `SET` of as many new keys of the same size (and,
//! for reference, its overwrite of 2,000 keys). Measure: the layout
//! study (memory per row from `INFO memory`, fetch rate); DRAM; for each cache size and policy,
//! warm-up then timed runs, checked bit for bit against DRAM; the ceiling loop with as many rows
//! per batch as the smallest cache missed.

use crate::units::human_bytes;
use anyhow::{Context, Result, ensure};
use clap::Args;
use ember_bench::redis_cluster::{self, LocalCluster};
use ember_bench::stats::median;
use ember_embed::{EmbeddingCollection, EmbeddingTable, KeyedJagged};
use ember_registry::PushOptions;
use ember_tier::CachePolicy;
use ember_tier::storage::remote::{Cluster, ClusterOptions, RemoteSource};
use serde_json::{Value as Json, json};
use std::process::Command;
use std::time::{Duration, Instant};

use super::setup::{self, EmbedArgs};

mod ceiling;
mod layouts;
mod tier;

use ceiling::ceiling_loop;
use layouts::layout_study;
use tier::TierBench;

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

/// Runs `bench remote`: the tables pushed to a Redis Cluster (started here unless `--redis`),
/// the layout study, DRAM, the remote tier at each cache size and policy, the cluster's own
/// rate; one JSON object with `--json`.
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
    let (local, url) = cluster(&r)?;
    let mut admin = connect(&url, Duration::from_secs(60))?;
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
    let pushed = push_tables(&mut admin, &primaries, &model, &dram, total)?;

    // DRAM.
    let (warmup, timed) = batches(&r, s, &source)?;
    let runs: Vec<&[KeyedJagged]> = timed.chunks(a.batches).collect();
    let lookups_per_run: usize = runs[0].iter().map(|b| b.num_ids()).sum();
    let pooler = a.pooler(isa)?;
    let mut out = vec![0f32; s.batch * s.tables * s.dim];
    let (want, dram_lps) = dram_runs(&dram, &pooler, &runs, lookups_per_run, &mut out)?;
    let dram_m = median(&dram_lps);
    eprintln!("dram: {:.2} M lookups/s", dram_m / 1e6);

    // The remote tier.
    let version = pushed.rep.version;
    let tier = TierBench {
        r: &r,
        coll: remote_tables(&dram)?,
        src: remote_source(&r, &url, &model, version)?,
        pin_trace: match &source {
            ember_bench::workload::IdSource::Trace { ids, .. } => Some(ids.clone()),
            _ => None,
        },
        dram: &dram,
        pooler: &pooler,
        warmup: &warmup,
        runs: &runs,
        lookups_per_run,
        want: &want,
        total,
    };
    let (mut results, smallest_misses) = tier.measure_all(&mut out)?;
    let ceiling = measure_ceiling(&r, &url, &model, &pushed, smallest_misses, &mut results)?;
    let report = json!({
        "bench": "remote",
        "tables": s.tables, "rows": s.rows, "dim": s.dim, "dtype": a.dtype.name(),
        "batch": s.batch, "pooling": s.pooling, "ids": source.describe(),
        "cluster": url, "primaries": primaries.len(),
        "dram_lookups_per_s": dram_m, "run_dram_lookups_per_s": dram_lps,
        "push": pushed.json(total),
        "policies": results,
        "ceiling": ceiling,
        "layouts": layouts,
    });
    ember_registry::remove(&mut admin, &model, version, Duration::from_secs(60))?;
    if a.json {
        println!("{report}");
    }
    drop(local);
    Ok(())
}

/// A connection to the cluster at `url` whose calls wait at most `timeout`.
fn connect(url: &str, timeout: Duration) -> Result<Cluster> {
    let mut opts = ClusterOptions::parse(url)?;
    opts.timeout = timeout;
    Ok(Cluster::connect(opts)?)
}

/// The warm-up batches (`--warmup-batches`, default `--batches` x `--runs`), then the timed
/// ones (`--runs` runs of `--batches`).
fn batches(
    r: &RemoteArgs,
    s: setup::Shape,
    source: &ember_bench::workload::IdSource,
) -> Result<(Vec<KeyedJagged>, Vec<KeyedJagged>)> {
    let a = &r.embed;
    let warm = r.warmup_batches.unwrap_or(a.batches * a.runs);
    let mut all = setup::batches(a, s, source, warm + a.batches * a.runs)?;
    let timed = all.split_off(warm);
    Ok((all, timed))
}

/// Where the remote tier's rows are: `model`'s `version` in the cluster at `url`, a batch's
/// fetch waiting at most `--timeout-ms`.
fn remote_source(r: &RemoteArgs, url: &str, model: &str, version: u64) -> Result<RemoteSource> {
    let mut cluster = ClusterOptions::parse(url)?;
    cluster.timeout = Duration::from_millis(r.timeout_ms);
    Ok(RemoteSource {
        cluster,
        model: model.to_string(),
        version: Some(version),
    })
}

/// The cluster to run on, by its URL: `--redis`, or a local Redis Cluster of `--primaries` x
/// (1 + `--replicas`) nodes started here (returned too: it stops when dropped).
fn cluster(r: &RemoteArgs) -> Result<(Option<LocalCluster>, String)> {
    if let Some(url) = &r.redis {
        return Ok((None, url.clone()));
    }
    redis_cluster::available()?;
    eprint!(
        "starting a local Redis Cluster ({} primaries x {} replicas)... ",
        r.primaries, r.replicas
    );
    let c = LocalCluster::start(r.primaries, r.replicas, 2000)?;
    let url = c.url();
    eprintln!("{url}");
    Ok((Some(c), url))
}

/// What the push did and what it is held against: its report, seconds and the memory its rows
/// took on the primaries, its version's manifest and block size, and redis-benchmark's rates
/// for the same value size (`None` where the tool is missing).
struct Pushed {
    rep: ember_registry::PushReport,
    push_s: f64,
    stored: u64,
    manifest: ember_registry::Manifest,
    block_bytes: usize,
    bench_set: Option<f64>,
    bench_overwrite: Option<f64>,
}

impl Pushed {
    /// The push's figures in the report (`total`: bytes of the tables).
    fn json(&self, total: usize) -> Json {
        let push_rate = total as f64 / self.push_s;
        json!({
            "seconds": self.push_s, "verify_seconds": self.rep.verify_seconds,
            "bytes_per_s": push_rate, "rows_per_s": self.rep.rows as f64 / self.push_s,
            "blocks": self.rep.blocks, "block_bytes": self.block_bytes,
            "redis_benchmark_set_bytes_per_s": self.bench_set,
            "vs_redis_benchmark": self.bench_set.map(|b| push_rate / b),
            "redis_benchmark_overwrite_bytes_per_s": self.bench_overwrite,
            "vs_redis_benchmark_overwrite": self.bench_overwrite.map(|b| push_rate / b),
            "memory_vs_raw": self.stored as f64 / total as f64,
        })
    }
}

/// Pushes `dram`'s tables (`total` bytes) as `model`, its earlier versions removed first;
/// timed, with the memory it took on the `primaries`, and held against redis-benchmark.
fn push_tables(
    admin: &mut Cluster,
    primaries: &[String],
    model: &str,
    dram: &EmbeddingCollection,
    total: usize,
) -> Result<Pushed> {
    if let Ok(vs) = ember_registry::versions(admin, model) {
        for (v, _) in vs {
            ember_registry::remove(admin, model, v, Duration::from_secs(60))?;
        }
    }
    let tables: Vec<&EmbeddingTable> = dram.tables().iter().collect();
    let mem0 = used_memory(primaries)?;
    let t0 = Instant::now();
    let rep = ember_registry::push(
        admin,
        model,
        &tables,
        &PushOptions::default(),
        &mut |_, _| {},
    )?;
    let push_s = t0.elapsed().as_secs_f64();
    let stored = used_memory(primaries)?.saturating_sub(mem0);
    let manifest = ember_registry::read_manifest(admin, model, rep.version)?;
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
    let push_rate = total as f64 / push_s;
    let (bench_set, bench_overwrite) =
        redis_benchmark_peers(&primaries[0], block_bytes, rep.blocks, push_rate)?;
    Ok(Pushed {
        rep,
        push_s,
        stored,
        manifest,
        block_bytes,
        bench_set,
        bench_overwrite,
    })
}

/// redis-benchmark's `SET` rates (bytes/s) of values of `block_bytes` on `node`'s cluster,
/// printed beside the push's `push_rate`. The peer: as many new keys as the push wrote
/// (`blocks`; a push stores new data: the nodes allocate and fault in fresh memory). Also, for
/// reference, the overwrite rate (2,000 keys written 4 times: memory recycled, no new pages):
/// a different workload.
fn redis_benchmark_peers(
    node: &str,
    block_bytes: usize,
    blocks: usize,
    push_rate: f64,
) -> Result<(Option<f64>, Option<f64>)> {
    let bench_set = redis_benchmark_set(node, block_bytes, blocks, 1_000_000_000)?;
    let k = blocks.min(2000);
    let bench_overwrite = redis_benchmark_set(node, block_bytes, 4 * k, k)?;
    if let (Some(b), Some(o)) = (bench_set, bench_overwrite) {
        eprintln!(
            "redis-benchmark SET -d {block_bytes} -P 16: {blocks} new keys {:.0} MB/s, push at \
             {:.2}x; {k} keys overwritten 4 times {:.0} MB/s, push at {:.2}x",
            b / 1e6,
            push_rate / b,
            o / 1e6,
            push_rate / o
        );
    }
    Ok((bench_set, bench_overwrite))
}

/// DRAM's runs of `runs` (after one untimed run of the first): what the tier must give on the
/// last batch of the first run, bit for bit, and lookups/s of each run.
fn dram_runs(
    dram: &EmbeddingCollection,
    pooler: &ember_embed::Pooler,
    runs: &[&[KeyedJagged]],
    lookups_per_run: usize,
    out: &mut [f32],
) -> Result<(Vec<f32>, Vec<f64>)> {
    for kj in runs[0] {
        pooler.run(dram, dram.check_view(kj)?, out)?;
    }
    let want = out.to_vec();
    let mut dram_lps = Vec::new();
    for batches in runs {
        let t0 = Instant::now();
        for kj in *batches {
            pooler.run(dram, dram.check_view(kj)?, out)?;
        }
        dram_lps.push(lookups_per_run as f64 / t0.elapsed().as_secs_f64());
    }
    Ok((want, dram_lps))
}

/// `dram`'s tables as remote tables of the same names and shapes, one feature each.
fn remote_tables(dram: &EmbeddingCollection) -> Result<EmbeddingCollection> {
    Ok(EmbeddingCollection::one_feature_per_table(
        dram.tables()
            .iter()
            .map(|t| EmbeddingTable::remote(t.name(), t.rows(), t.dim(), t.dtype()))
            .collect::<Result<_, _>>()?,
    )?)
}

/// The cluster's own rate for fetches of the smallest cache's size (`misses` rows per batch,
/// when at least one): a plain pipelined `GETRANGE` loop over the pushed version; each result
/// at that cache size gets its fetch rate against it (`fetch_vs_ceiling`).
fn measure_ceiling(
    r: &RemoteArgs,
    url: &str,
    model: &str,
    pushed: &Pushed,
    misses: Option<f64>,
    results: &mut [Json],
) -> Result<Json> {
    let Some(m) = misses.filter(|&m| m >= 1.0) else {
        return Ok(Json::Null);
    };
    let c = ceiling_loop(
        url,
        model,
        pushed.rep.version,
        &pushed.manifest,
        m.round() as usize,
        r.loop_secs,
        r.embed.seed,
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
    Ok(json!({"rows_per_batch": m.round(), "rows_per_s": c.0, "batch_p99_s": c.1}))
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
