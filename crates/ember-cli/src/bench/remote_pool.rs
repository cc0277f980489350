//! `ember bench remote-pool`: pooling next to the rows (`EMBER.POOL`, the Ember Redis module)
//! against today's row fetches, in one run on one cluster, for the figures users size a remote
//! tier by: bytes received from the cluster per batch, lookups/s, and the nodes' CPU per batch.
//!
//! Set up: a local Redis Cluster of `--primaries` x (1 + `--replicas`) nodes started here with
//! the module loaded (`redis_cluster::pool_module`); per shape, seeded tables pushed. Shapes: RM1
//! (`--rm1-tables` tables, pooling 80) and DLRM-v2 (26 tables, MLPerf's multi-hot sizes 1-100).
//! Ids: each distribution of `--ids` (uniform, zipf:ALPHA; a rank maps to the same row in every
//! table, so that one hot set serves them all). Cache: per `--cache-fractions`, that share of
//! each table's rows held fixed in the cache (the pinned policy, the hottest ranks pinned, no
//! LRU part: nothing else enters it), the same for both paths.
//!
//! Measure, per shape, ids, cache and path (`pool_remote` on, then off): warm-up, then `--runs`
//! timed runs of `--batches` batches each (stage, then pool); lookups/s (median of runs); bytes
//! of partial sums or rows received per batch; the primaries' `INFO commandstats` CPU time of
//! `EMBER.POOL` or `GETRANGE` per batch (reset before each path); every batch of the first run
//! checked against DRAM (bit for bit for rows read whole, within a sum's rounding for pooled).

use anyhow::{Context, Result, ensure};
use clap::Args;
use ember_bench::redis_cluster::{self, LocalCluster};
use ember_bench::stats::median;
use ember_embed::{
    DType, EmbeddingCollection, EmbeddingTable, Ids, KeyedJagged, PoolOptions, Pooler, Pooling,
};
use ember_registry::PushOptions;
use ember_tier::storage::remote::{ClusterOptions, PoolRemote, RemoteSource};
use ember_tier::{CachePolicy, Stager, TierOptions};
use rand::{Rng, SeedableRng, rngs::SmallRng};
use rand_distr::{Distribution, Zipf};
use serde_json::{Value as Json, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// MLPerf DLRM-v2's multi-hot sizes per table (the reference's `--multi_hot_sizes`).
const DLRM_V2_HOT: [usize; 26] = [
    3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1,
];

#[derive(Debug, Args)]
pub struct RemotePoolArgs {
    /// Shapes to run: rm1 (pooling 80), dlrm-v2 (26 tables, multi-hot 1-100).
    #[arg(long, value_delimiter = ',', default_value = "rm1,dlrm-v2")]
    shapes: Vec<String>,
    /// RM1: tables, rows per table, dim.
    #[arg(long, default_value_t = 8)]
    rm1_tables: usize,
    #[arg(long, default_value_t = 100_000)]
    rm1_rows: usize,
    #[arg(long, default_value_t = 64)]
    rm1_dim: usize,
    /// DLRM-v2: rows per table, dim.
    #[arg(long, default_value_t = 20_000)]
    dlrm_rows: usize,
    #[arg(long, default_value_t = 128)]
    dlrm_dim: usize,
    /// Samples per batch.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Ids: uniform or zipf:ALPHA, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "uniform,zipf:1.05")]
    ids: Vec<String>,
    /// Shares of each table's rows held in the cache.
    #[arg(long, value_delimiter = ',', default_value = "0,0.1,0.5")]
    cache_fractions: Vec<f64>,
    /// Batches per timed run, timed runs, warm-up batches.
    #[arg(long, default_value_t = 30)]
    batches: usize,
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Primaries and replicas per primary of the local cluster.
    #[arg(long, default_value_t = 3)]
    primaries: usize,
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// Deadline of one batch's fetch, ms.
    #[arg(long, default_value_t = 5000)]
    timeout_ms: u64,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Print one JSON object on the last line.
    #[arg(long)]
    json: bool,
}

/// A shape: tables (rows, dim) and ids per bag of each.
struct Shape {
    name: &'static str,
    rows: usize,
    dim: usize,
    hot: Vec<usize>,
}

impl Shape {
    fn of(a: &RemotePoolArgs, name: &str) -> Result<Shape> {
        Ok(match name {
            "rm1" => Shape {
                name: "rm1",
                rows: a.rm1_rows,
                dim: a.rm1_dim,
                hot: vec![80; a.rm1_tables],
            },
            "dlrm-v2" => Shape {
                name: "dlrm-v2",
                rows: a.dlrm_rows,
                dim: a.dlrm_dim,
                hot: DLRM_V2_HOT.to_vec(),
            },
            other => anyhow::bail!("--shapes: '{other}' is not rm1 or dlrm-v2"),
        })
    }
}

/// Ids by rank: `zipf:ALPHA` ranks or uniform, rank r at row `r x mult mod rows` in every table.
struct RankedIds {
    rng: SmallRng,
    zipf: Option<Zipf<f64>>,
    rows: usize,
    mult: u64,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

impl RankedIds {
    fn new(spec: &str, rows: usize, seed: u64) -> Result<Self> {
        let zipf = match spec {
            "uniform" => None,
            s => {
                let a: f64 = s
                    .strip_prefix("zipf:")
                    .and_then(|x| x.parse().ok())
                    .with_context(|| format!("--ids: '{s}' is not uniform or zipf:ALPHA"))?;
                Some(Zipf::new(rows as f64, a)?)
            }
        };
        let mut mult = 0x9E37_79B9_7F4A_7C15u64 % rows as u64;
        while rows > 1 && gcd(mult, rows as u64) != 1 {
            mult += 1;
        }
        Ok(RankedIds {
            rng: SmallRng::seed_from_u64(seed),
            zipf,
            rows,
            mult: mult.max(1),
        })
    }

    fn row_of_rank(&self, rank: u64) -> u64 {
        ((u128::from(rank) * u128::from(self.mult)) % self.rows as u128) as u64
    }

    fn next(&mut self) -> u32 {
        let rank = match &self.zipf {
            Some(z) => (z.sample(&mut self.rng) as u64).saturating_sub(1),
            None => self.rng.random_range(0..self.rows as u64),
        };
        self.row_of_rank(rank) as u32
    }
}

fn batches(s: &Shape, ids: &mut RankedIds, batch: usize, n: usize) -> Result<Vec<KeyedJagged>> {
    let keys: Vec<String> = (0..s.hot.len()).map(|t| format!("t{t}")).collect();
    let lengths: Vec<usize> = s
        .hot
        .iter()
        .flat_map(|&h| std::iter::repeat_n(h, batch))
        .collect();
    let total: usize = lengths.iter().sum();
    (0..n)
        .map(|_| {
            let v: Vec<u32> = (0..total).map(|_| ids.next()).collect();
            Ok(KeyedJagged::from_lengths(
                keys.clone(),
                batch,
                &lengths,
                Ids::U32(v),
                None,
            )?)
        })
        .collect()
}

fn reset_stats(ports: &[u16]) -> Result<()> {
    for &p in ports {
        redis_cluster::query(p, ember_redis::cmd("CONFIG").arg("RESETSTAT"))?;
    }
    Ok(())
}

/// One path's figures at one cache size.
struct PathRun {
    lps: Vec<f64>,
    bytes_per_batch: f64,
    round_trips_per_batch: f64,
    node_usec_per_batch: f64,
    calls_per_batch: f64,
    plain_rows_per_batch: f64,
    hit_rate: f64,
    max_err: f64,
}

/// One path (`pool`) of `case` with the hottest `fraction` of each table's rows cached.
fn run_path(case: &Case<'_>, fraction: f64, pool: PoolRemote) -> Result<PathRun> {
    let Case {
        a,
        s,
        coll,
        dram,
        src,
        ref hot,
        ref warm,
        ref timed,
        ports,
        ..
    } = *case;
    let cached = (s.rows as f64 * fraction) as usize;
    let row_bytes = DType::F32.row_bytes(s.dim);
    let opts = TierOptions {
        cache_bytes: cached * row_bytes * s.hot.len(),
        policy: CachePolicy::Pinned,
        pin_fraction: Some(1.0),
        pin_trace: Some(Arc::new(hot[..cached].to_vec())),
        remote: Some(src.clone()),
        follow_updates: false,
        pool_remote: pool,
        ..TierOptions::default()
    };
    let stager = Stager::new(coll, opts)?;
    let pooler = Pooler::new(PoolOptions {
        pooling: Pooling::Sum,
        threads: 1,
        ..PoolOptions::default()
    })?;
    let width = coll.total_dim();
    let mut out = vec![0f32; a.batch * width];
    let mut want = vec![0f32; a.batch * width];
    for kj in warm {
        let st = stager.stage(coll, coll.check_view(kj)?)?;
        pooler.run_staged(coll, coll.check_view(kj)?, &st, &mut out)?;
    }
    stager.reset_stats();
    reset_stats(ports)?;
    let per_run = timed.len() / a.runs;
    let mut lps = Vec::new();
    let mut max_err = 0f64;
    for (r, run) in timed.chunks(per_run).enumerate() {
        let t0 = Instant::now();
        let mut lookups = 0;
        for kj in run {
            let st = stager.stage(coll, coll.check_view(kj)?)?;
            pooler.run_staged(coll, coll.check_view(kj)?, &st, &mut out)?;
            lookups += kj.num_ids();
            if r == 0 {
                // Checked outside the clock would be fairer; it is the same for both paths.
                pooler.run(dram, dram.check_view(kj)?, &mut want)?;
                for (g, w) in out.iter().zip(&want) {
                    let e = f64::from((g - w).abs()) / (1.0 + f64::from(w.abs()));
                    max_err = max_err.max(e);
                }
                if pool == PoolRemote::Off {
                    ensure!(
                        out.iter()
                            .zip(&want)
                            .all(|(g, w)| g.to_bits() == w.to_bits()),
                        "rows read whole differ from DRAM"
                    );
                }
            }
        }
        if r > 0 {
            lps.push(lookups as f64 / t0.elapsed().as_secs_f64());
        }
    }
    ensure!(
        max_err < 1e-4,
        "pooled results differ from DRAM by {max_err:e}"
    );
    let st = stager.stats();
    let n = (per_run * a.runs) as f64;
    // The nodes' CPU for the batch's misses: GETRANGE, and EMBER.POOL where pooled (features
    // whose sums would not save bytes are still read whole beside it).
    let (mut usec, mut calls) = redis_cluster::command_stats(ports, "getrange")?;
    if pool != PoolRemote::Off {
        let (u, c) = redis_cluster::command_stats(ports, ember_pool_command::COMMAND)?;
        (usec, calls) = (usec + u, calls + c);
    }
    Ok(PathRun {
        lps,
        bytes_per_batch: st.store_bytes_read as f64 / n,
        round_trips_per_batch: st.store_reads as f64 / n,
        node_usec_per_batch: usec as f64 / n,
        calls_per_batch: calls as f64 / n,
        plain_rows_per_batch: st.pool_plain_rows as f64 / n,
        hit_rate: st.lookup_hit_rate(),
        max_err,
    })
}

/// One shape and id distribution on the cluster: everything a cache size's two paths share.
struct Case<'a> {
    a: &'a RemotePoolArgs,
    s: &'a Shape,
    coll: &'a EmbeddingCollection,
    dram: &'a EmbeddingCollection,
    src: &'a RemoteSource,
    dist: &'a str,
    hot: Vec<u64>,
    warm: Vec<KeyedJagged>,
    timed: Vec<KeyedJagged>,
    ports: &'a [u16],
}

impl Case<'_> {
    /// Both paths at one cache size: printed, and the report's entry.
    fn compare(&self, fraction: f64) -> Result<Json> {
        ensure!(
            (0.0..=1.0).contains(&fraction),
            "cache fractions are in [0, 1]"
        );
        let (a, s) = (self.a, self.s);
        let path = |pool| run_path(self, fraction, pool);
        let on = path(PoolRemote::On)?;
        let off = path(PoolRemote::Off)?;
        let (lon, loff) = (median(&on.lps), median(&off.lps));
        eprintln!(
            "{} {} cache {:.0}% (hit rate {:.3}): bytes/batch pooled {:.0} vs rows {:.0} ({:.1}x fewer); lookups/s {:.2} M vs {:.2} M ({:.2}x); node CPU/batch {:.0} us ({:.1} calls, EMBER.POOL and GETRANGE) vs GETRANGE {:.0} us ({:.0} calls); round trips/batch {:.1} vs {:.1}; max error vs DRAM {:.1e}",
            s.name,
            self.dist,
            fraction * 100.0,
            on.hit_rate,
            on.bytes_per_batch,
            off.bytes_per_batch,
            off.bytes_per_batch / on.bytes_per_batch.max(1.0),
            lon / 1e6,
            loff / 1e6,
            lon / loff,
            on.node_usec_per_batch,
            on.calls_per_batch,
            off.node_usec_per_batch,
            off.calls_per_batch,
            on.round_trips_per_batch,
            off.round_trips_per_batch,
            on.max_err,
        );
        Ok(json!({
            "shape": s.name, "tables": s.hot.len(), "rows": s.rows, "dim": s.dim,
            "ids_per_bag": s.hot, "batch": a.batch, "ids": self.dist,
            "cache_fraction": fraction, "lookup_hit_rate": on.hit_rate,
            "pooled": {"lookups_per_s": lon, "run_lookups_per_s": on.lps,
                "bytes_per_batch": on.bytes_per_batch, "round_trips_per_batch": on.round_trips_per_batch,
                "node_usec_per_batch": on.node_usec_per_batch, "calls_per_batch": on.calls_per_batch,
                "plain_rows_per_batch": on.plain_rows_per_batch,
                "max_rel_error_vs_dram": on.max_err},
            "rows": {"lookups_per_s": loff, "run_lookups_per_s": off.lps,
                "bytes_per_batch": off.bytes_per_batch, "round_trips_per_batch": off.round_trips_per_batch,
                "node_usec_per_batch": off.node_usec_per_batch, "calls_per_batch": off.calls_per_batch},
            "bytes_ratio": off.bytes_per_batch / on.bytes_per_batch.max(1.0),
            "lookups_ratio": lon / loff,
        }))
    }
}

/// The seeded f32 tables of `s` in memory.
fn dram_tables(s: &Shape, seed: u64) -> Result<EmbeddingCollection> {
    Ok(EmbeddingCollection::one_feature_per_table(
        (0..s.hot.len())
            .map(|t| {
                let mut rng = SmallRng::seed_from_u64(seed ^ t as u64);
                let v: Vec<f32> = (0..s.rows * s.dim)
                    .map(|_| rng.random_range(-1.0..1.0))
                    .collect();
                EmbeddingTable::from_f32(&format!("t{t}"), s.rows, s.dim, DType::F32, &v)
            })
            .collect::<Result<_, _>>()?,
    )?)
}

/// Shape `name` pushed to the cluster at `url`, each id distribution and cache size measured:
/// the report's entries.
fn measure_shape(a: &RemotePoolArgs, url: &str, ports: &[u16], name: &str) -> Result<Vec<Json>> {
    let s = Shape::of(a, name)?;
    let dram = dram_tables(&s, a.seed)?;
    let mut admin = {
        let mut o = ClusterOptions::parse(url)?;
        o.timeout = Duration::from_secs(60);
        ember_tier::storage::remote::Cluster::connect(o)?
    };
    let model = format!("pool-{}", s.name);
    let tables: Vec<&EmbeddingTable> = dram.tables().iter().collect();
    let rep = ember_registry::push(
        &mut admin,
        &model,
        &tables,
        &PushOptions::default(),
        &mut |_, _| {},
    )?;
    let coll = EmbeddingCollection::one_feature_per_table(
        dram.tables()
            .iter()
            .map(|t| EmbeddingTable::remote(t.name(), t.rows(), t.dim(), t.dtype()))
            .collect::<Result<_, _>>()?,
    )?;
    let mut cluster = ClusterOptions::parse(url)?;
    cluster.timeout = Duration::from_millis(a.timeout_ms);
    let src = RemoteSource {
        cluster,
        model: model.clone(),
        version: Some(rep.version),
    };
    let mut out = Vec::new();
    for dist in &a.ids {
        let mut ranked = RankedIds::new(dist, s.rows, a.seed)?;
        let case = Case {
            a,
            s: &s,
            coll: &coll,
            dram: &dram,
            src: &src,
            dist,
            hot: (0..s.rows as u64).map(|r| ranked.row_of_rank(r)).collect(),
            warm: batches(&s, &mut ranked, a.batch, a.warmup)?,
            timed: batches(&s, &mut ranked, a.batch, a.batches * a.runs)?,
            ports,
        };
        for &fraction in &a.cache_fractions {
            out.push(case.compare(fraction)?);
        }
    }
    ember_registry::remove(&mut admin, &model, rep.version, Duration::from_secs(60))?;
    Ok(out)
}

pub fn run(a: RemotePoolArgs) -> Result<()> {
    ensure!(
        a.runs >= 2,
        "--runs must be at least 2 (the first run is checked, not timed)"
    );
    redis_cluster::available()?;
    let module = redis_cluster::pool_module()?;
    eprint!(
        "starting a local Redis Cluster ({} primaries x {} replicas) with {}... ",
        a.primaries,
        a.replicas,
        module.display()
    );
    let c = LocalCluster::start_with_module(a.primaries, a.replicas, 2000, Some(&module), &[])?;
    let url = c.url();
    eprintln!("{url}");
    let ports = c.primaries()?;
    let cpu = super::cpu_name();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    eprintln!("cpu: {cpu}, {cores} cores");
    let mut report = Vec::new();
    for name in &a.shapes {
        report.extend(measure_shape(&a, &url, &ports, name)?);
    }
    if a.json {
        println!(
            "{}",
            json!({"bench": "remote-pool", "cpu": cpu, "cores": cores, "cluster": url, "primaries": ports.len(), "results": Json::Array(report)})
        );
    }
    drop(c);
    Ok(())
}
