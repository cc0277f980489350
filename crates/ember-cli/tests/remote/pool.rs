//! Pooling next to the rows (`EMBER.POOL`, the Ember Redis module loaded by the tests' own
//! `redis-server`s): the tier's pooled results against DRAM pooling for every dtype, weighted
//! and not, mean, empty bags and batches, batch 1, ids over every node; the same bits from run
//! to run; a cluster where one primary lacks the module (a rolling upgrade), and `pool_remote:
//! on` refusing it; a node killed while batches run; the whole cluster paused with a local copy;
//! bags that never mix two versions of a row while updates flow; malformed calls refused by a
//! live node that keeps serving.

use crate::updates::admin;
use ember_bench::redis_cluster::{self, LocalCluster};
use ember_embed::{
    DType, EmbedError, EmbeddingCollection, EmbeddingTable, Ids, KeyedJagged, PoolOptions, Pooler,
    Pooling,
};
use ember_registry::PushOptions;
use ember_tier::CachePolicy;
use ember_tier::storage::remote::{ClusterOptions, PoolRemote, RemoteSource};
use ember_tier::{Stager, TierOptions};
use rand::{Rng, SeedableRng, rngs::StdRng};
use std::time::{Duration, Instant};

const ROWS: usize = 2500;

/// One table per dtype, odd dims among them: (name, dim, dtype).
const TABLES: [(&str, usize, DType); 5] = [
    ("f32", 16, DType::F32),
    ("f16", 7, DType::F16),
    ("bf16", 33, DType::BF16),
    ("int8", 12, DType::Int8),
    ("int4", 9, DType::Int4),
];

fn values(seed: u64, dim: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..ROWS * dim)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect()
}

/// The tables in memory (what DRAM pooling reads, and what is pushed).
pub(crate) fn dram_tables() -> Vec<EmbeddingTable> {
    TABLES
        .iter()
        .enumerate()
        .map(|(i, &(name, dim, dtype))| {
            EmbeddingTable::from_f32(name, ROWS, dim, dtype, &values(i as u64, dim)).unwrap()
        })
        .collect()
}

pub(crate) fn push(url: &str, model: &str, tables: &[EmbeddingTable]) -> u64 {
    let mut cl = admin(url);
    let refs: Vec<&EmbeddingTable> = tables.iter().collect();
    ember_registry::push(
        &mut cl,
        model,
        &refs,
        &PushOptions::default(),
        &mut |_, _| {},
    )
    .unwrap()
    .version
}

/// The same tables placed remote, with a stager of `cache_rows` rows per table (`pinned`: the
/// hottest ids 0..cache_rows pinned, a static cache) pooling as `pool`.
pub(crate) fn remote(
    url: &str,
    model: &str,
    cache_rows: usize,
    pool: PoolRemote,
) -> ember_embed::Result<(EmbeddingCollection, Stager)> {
    let coll = EmbeddingCollection::one_feature_per_table(
        TABLES
            .iter()
            .map(|&(n, d, t)| EmbeddingTable::remote(n, ROWS, d, t).unwrap())
            .collect(),
    )
    .unwrap();
    let bytes: usize = TABLES
        .iter()
        .map(|&(_, d, t)| cache_rows.max(1) * t.row_bytes(d))
        .sum();
    // Every cache slot pinned, none left to LRU: ids below `cache_rows` first (three times in
    // the trace), then the lowest others (once) where a table's share of the budget holds more
    // rows. A cache that never changes lets the tests compare two runs of a batch bit for bit.
    let hot = 0..cache_rows.max(1) as u64;
    let trace: Vec<u64> = hot.clone().chain(hot).chain(0..ROWS as u64).collect();
    let opts = TierOptions {
        cache_bytes: bytes,
        policy: CachePolicy::Pinned,
        pin_fraction: Some(1.0),
        pin_trace: Some(std::sync::Arc::new(trace)),
        staging_rows: Some(64),
        remote: Some(RemoteSource {
            cluster: ClusterOptions::parse(url).unwrap(),
            model: model.into(),
            version: None,
        }),
        follow_updates: false,
        pool_remote: pool,
        ..TierOptions::default()
    };
    let stager = Stager::new(&coll, opts)?;
    Ok((coll, stager))
}

/// A batch of `n` samples over every table: bags of 0 to `max_bag` ids (repeats and empty bags
/// included), ids over the whole table (so over every node), weights at random where `pooling`
/// weighs.
pub(crate) fn batch(rng: &mut StdRng, n: usize, max_bag: usize, pooling: Pooling) -> KeyedJagged {
    let lengths: Vec<usize> = (0..TABLES.len() * n)
        .map(|_| rng.random_range(0..=max_bag))
        .collect();
    let total = lengths.iter().sum::<usize>() as u32;
    let ids: Vec<u32> = (0..total)
        .map(|k| match k % 7 {
            // Now and then an id twice in a row (a repeat within a bag).
            0 if k > 0 => (k * 31) % ROWS as u32,
            _ => rng.random_range(0..ROWS as u32),
        })
        .collect();
    let weights: Vec<f32> = (0..total).map(|_| rng.random_range(-2.0..2.0)).collect();
    KeyedJagged::from_lengths(
        TABLES.iter().map(|t| t.0.to_string()).collect(),
        n,
        &lengths,
        Ids::U32(ids),
        (pooling == Pooling::WeightedSum).then_some(weights),
    )
    .unwrap()
}

pub(crate) fn pooler(pooling: Pooling) -> Pooler {
    Pooler::new(PoolOptions {
        pooling,
        threads: 1,
        ..PoolOptions::default()
    })
    .unwrap()
}

/// `kj` pooled by the tier of `(coll, stager)`.
pub(crate) fn staged(
    p: &Pooler,
    (coll, stager): &(EmbeddingCollection, Stager),
    kj: &KeyedJagged,
) -> ember_embed::Result<Vec<f32>> {
    let s = stager.stage(coll, coll.check_view(kj)?)?;
    let mut out = vec![0f32; kj.batch_size() * coll.total_dim()];
    p.run_staged(coll, coll.check_view(kj)?, &s, &mut out)?;
    Ok(out)
}

/// `kj` pooled from memory.
fn dram(p: &Pooler, mem: &EmbeddingCollection, kj: &KeyedJagged) -> Vec<f32> {
    let mut out = vec![0f32; kj.batch_size() * mem.total_dim()];
    p.run(mem, mem.check_view(kj).unwrap(), &mut out).unwrap();
    out
}

/// Within a sum's rounding in another order: rows' elements are within 2 (weights too), bags of
/// at most 40 rows.
fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * (1.0 + w.abs()),
            "{what}: element {i}: pooled {g}, DRAM {w}"
        );
    }
}

/// Every dtype, weighted and not, mean, with a static cache of none, 30% and all of the rows:
/// the tier pooling on the nodes gives DRAM's results within rounding; the same bits twice; the
/// same results as reading rows whole (`off`), for far fewer bytes once bags are long; empty
/// bags, an empty batch, batch 1.
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn pooled_on_the_nodes_equals_dram_pooling_for_every_dtype() {
    let Some(c) = crate::cluster_with_module(0, &[]) else {
        return;
    };
    let url = c.url();
    let tables = dram_tables();
    push(&url, "p", &tables);
    let mem = EmbeddingCollection::one_feature_per_table(tables).unwrap();
    let mut rng = StdRng::seed_from_u64(45);
    for cache_rows in [0, ROWS * 3 / 10, ROWS] {
        let on = remote(&url, "p", cache_rows, PoolRemote::On).unwrap();
        let off = remote(&url, "p", cache_rows, PoolRemote::Off).unwrap();
        for pooling in [Pooling::Sum, Pooling::Mean, Pooling::WeightedSum] {
            let p = pooler(pooling);
            for (n, max_bag) in [(37, 40), (1, 5), (0, 3), (9, 0)] {
                let kj = batch(&mut rng, n, max_bag, pooling);
                let what = format!("{pooling:?}, cache {cache_rows} rows, batch {n}");
                let before = on.1.stats();
                let got = staged(&p, &on, &kj).unwrap();
                let st = on.1.stats().since(&before);
                assert_close(&got, &dram(&p, &mem, &kj), &what);
                // The same bits again (same batch, cache and slot map). On a mismatch the two
                // runs' counters say whether a node's share was read whole in one of them
                // (`pool_plain_rows`) or the cache answered differently (`hits`). The flake seen
                // under load was the second: with `cache_rows` 0 the cache had one LRU slot,
                // which the first run's fill could reach before the second run or not, moving a
                // row between a node's sum and the local one (another order of additions); every
                // slot is pinned now.
                let before2 = on.1.stats();
                let again = staged(&p, &on, &kj).unwrap();
                let st2 = on.1.stats().since(&before2);
                if got != again {
                    let differ = got.iter().zip(&again).filter(|(a, b)| a != b).count();
                    panic!(
                        "{what}: not reproducible ({differ} of {} values differ); first run: \
                         {st:?}; second run: {st2:?}",
                        got.len()
                    );
                }
                let plain = staged(&p, &off, &kj).unwrap();
                assert_close(&got, &plain, &what);
                if cache_rows < ROWS && n * max_bag >= 100 {
                    assert!(st.pooled_rows > 0, "{what}: {st:?}");
                }
                if cache_rows == ROWS {
                    assert_eq!(
                        st.pooled_rows + st.store_bytes_read,
                        0,
                        "{what}: all cached"
                    );
                }
            }
        }
        // Long bags (pooling 80, no cache): the sums cost far fewer bytes than the rows.
        if cache_rows == 0 {
            let p = pooler(Pooling::Sum);
            let kj = batch(&mut rng, 64, 160, Pooling::Sum);
            let (b0, b1) = (on.1.stats(), off.1.stats());
            staged(&p, &on, &kj).unwrap();
            staged(&p, &off, &kj).unwrap();
            let (pooled, plain) = (on.1.stats().since(&b0), off.1.stats().since(&b1));
            assert!(
                pooled.store_bytes_read * 5 < plain.store_bytes_read,
                "pooled {} bytes, plain {} bytes",
                pooled.store_bytes_read,
                plain.store_bytes_read
            );
        }
    }
}

/// A rolling upgrade: one primary without the module. `auto` reads that node's rows whole and
/// pools the rest on the nodes, with DRAM's results; `on` refuses to start, naming the node.
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn a_node_without_the_module_is_read_whole_and_on_refuses_to_start() {
    let Some(c) = crate::cluster_with_module(0, &[0]) else {
        return;
    };
    let url = c.url();
    let lacking = c.nodes[0].addr();
    assert!(c.primaries().unwrap().contains(&c.nodes[0].port));
    let tables = dram_tables();
    push(&url, "m", &tables);
    let mem = EmbeddingCollection::one_feature_per_table(tables).unwrap();
    let err = remote(&url, "m", 0, PoolRemote::On)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&lacking) && err.contains("--loadmodule") && err.contains("auto"),
        "{err}"
    );
    let auto = remote(&url, "m", 0, PoolRemote::Auto).unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    for pooling in [Pooling::Sum, Pooling::WeightedSum] {
        let p = pooler(pooling);
        for _ in 0..3 {
            let kj = batch(&mut rng, 16, 30, pooling);
            let before = auto.1.stats();
            let got = staged(&p, &auto, &kj).unwrap();
            let st = auto.1.stats().since(&before);
            assert_close(&got, &dram(&p, &mem, &kj), "mixed cluster");
            assert!(st.pooled_rows > 0 && st.pool_plain_rows > 0, "{st:?}");
        }
    }
}

/// A primary killed while batches run: each batch is either DRAM's result or an error saying
/// the store is unavailable, never a wrong sum, never a hang past the deadline; once its replica
/// took over, batches pool on the nodes again.
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn a_node_failing_mid_batch_fails_the_batch_or_answers_right() {
    let Some(mut c) = crate::cluster_with_module(1, &[]) else {
        return;
    };
    let url = c.url();
    let tables = dram_tables();
    push(&url, "k", &tables);
    c.wait_replicated(Duration::from_secs(30)).unwrap();
    let mem = EmbeddingCollection::one_feature_per_table(tables).unwrap();
    let tier = remote(&url, "k", 0, PoolRemote::On).unwrap();
    let p = pooler(Pooling::Sum);
    let mut rng = StdRng::seed_from_u64(3);
    let primary = c.index(c.primaries().unwrap()[0]).unwrap();
    let (mut ok, mut failed, mut ok_after) = (0, 0, 0);
    let killed = std::sync::atomic::AtomicBool::new(false);
    let t0 = Instant::now();
    let cluster: &mut LocalCluster = &mut c;
    let killed = &killed;
    std::thread::scope(|s| {
        // Killed from another thread while batches run back to back: mid-batch, at some point.
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            cluster.kill(primary).unwrap();
            killed.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        while ok_after < 5 {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "no pooled batch 60 s after the kill ({ok} answered, {failed} failed)"
            );
            let after = killed.load(std::sync::atomic::Ordering::SeqCst);
            let kj = batch(&mut rng, 16, 40, Pooling::Sum);
            let t = Instant::now();
            match staged(&p, &tier, &kj) {
                Ok(got) => {
                    assert_close(&got, &dram(&p, &mem, &kj), "around a failover");
                    ok += 1;
                    if after {
                        ok_after += 1;
                    }
                }
                Err(EmbedError::StoreUnavailable { .. }) => failed += 1,
                Err(e) => panic!("a failed batch says the store is unavailable, not: {e}"),
            }
            // The deadline (100 ms) and its retries bound a batch; a loaded machine gets slack.
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "a batch took {:?}",
                t.elapsed()
            );
        }
    });
    let st = tier.1.stats();
    assert!(st.pooled_rows > 0, "{st:?}");
    eprintln!("failover: {ok} batches answered, {failed} failed");
}

/// Updates flowing: every row of table `f32` flips between two states (all elements 1, all 2)
/// while bags holding one row four times (weights 1, 10, 100, 1000) are pooled on the nodes, by
/// a server that follows the updates with an LRU cache of a third of the rows filled in the
/// background. A bag's sum is 1111 or 2222 in every element, never a mix of the row's two
/// versions; once the updates stop, every row reads as last written (the fill never left an
/// older row in the cache).
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn a_bag_never_mixes_two_versions_of_a_row() {
    let Some(c) = crate::cluster_with_module(0, &[]) else {
        return;
    };
    let url = c.url();
    let (dim, rows) = (16, 600);
    let ones = vec![1f32; rows * dim];
    let t = EmbeddingTable::from_f32("f32", rows, dim, DType::F32, &ones).unwrap();
    push(&url, "v", &[t]);
    let coll = EmbeddingCollection::one_feature_per_table(vec![
        EmbeddingTable::remote("f32", rows, dim, DType::F32).unwrap(),
    ])
    .unwrap();
    let opts = TierOptions {
        cache_bytes: rows / 3 * dim * 4,
        policy: CachePolicy::Lru,
        staging_rows: Some(64),
        remote: Some(RemoteSource {
            cluster: ClusterOptions::parse(&url).unwrap(),
            model: "v".into(),
            version: None,
        }),
        follow_updates: true,
        pool_remote: PoolRemote::On,
        ..TierOptions::default()
    };
    let stager = Stager::new(&coll, opts).unwrap();
    let tier = (coll, stager);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let p = pooler(Pooling::Sum);
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut cl = admin(&url);
            let ids: Vec<u64> = (0..rows as u64).collect();
            let mut flips = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let v = if flips.is_multiple_of(2) { 2f32 } else { 1f32 };
                let bytes: Vec<u8> = std::iter::repeat_n(v.to_le_bytes(), rows * dim)
                    .flatten()
                    .collect();
                ember_registry::updates::publish(&mut cl, "v", None, "f32", &ids, &bytes, 1000)
                    .unwrap();
                flips += 1;
            }
            flips
        });
        let mut rng = StdRng::seed_from_u64(1);
        let (mut ones, mut twos, mut pooled) = (0, 0, 0);
        let weighted = pooler(Pooling::WeightedSum);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(3) {
            // Each bag: row x four times, weights 1, 10, 100, 1000 (a consistent x sums to 1111
            // or 2222 times one version), then four other rows of weight 0 (so that partial
            // sums cost fewer bytes than the rows and the bag is pooled on the nodes).
            let n = 32;
            let (mut ids, mut w) = (Vec::new(), Vec::new());
            for _ in 0..n {
                let x = rng.random_range(0..rows as u32);
                ids.extend([x; 4]);
                w.extend([1.0, 10.0, 100.0, 1000.0]);
                ids.extend((0..4).map(|_| rng.random_range(0..rows as u32)));
                w.extend([0.0; 4]);
            }
            let kj = KeyedJagged::from_lengths(
                vec!["f32".into()],
                n,
                &vec![8; n],
                Ids::U32(ids),
                Some(w),
            )
            .unwrap();
            let before = tier.1.stats().pooled_rows;
            let got = staged(&weighted, &tier, &kj).unwrap();
            pooled += tier.1.stats().pooled_rows - before;
            for bag in got.chunks_exact(dim) {
                match bag[0] {
                    1111.0 => ones += 1,
                    2222.0 => twos += 1,
                    x => panic!("a bag of one row repeated 4 times summed to {x}: versions mixed"),
                }
                assert!(bag.iter().all(|&x| x == bag[0]), "a torn row: {bag:?}");
            }
        }
        assert!(pooled > 0, "the bags were pooled on the nodes");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let flips = writer.join().unwrap();
        assert!(flips >= 4, "the rows flipped {flips} times only");
        eprintln!("{ones} bags at version 1, {twos} at version 2, {flips} flips");
        assert!(ones > 0 && twos > 0, "both versions seen: {ones}, {twos}");
        // The last write: flips - 1 (even: 2, odd: 1). Every row reads so once the server has
        // applied the updates (bounded wait: each round stages every row once).
        let last = if (flips - 1).is_multiple_of(2) {
            16.0
        } else {
            8.0
        };
        let all: Vec<u32> = (0..rows as u32)
            .flat_map(|i| std::iter::repeat_n(i, 8))
            .collect();
        let kj = KeyedJagged::from_lengths(
            vec!["f32".into()],
            rows,
            &vec![8; rows],
            Ids::U32(all),
            None,
        )
        .unwrap();
        let t0 = Instant::now();
        loop {
            let got = staged(&p, &tier, &kj).unwrap();
            let stale = got.chunks_exact(dim).filter(|b| b[0] != last).count();
            if stale == 0 {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{stale} rows still read an older version 30 s after the last update"
            );
            std::thread::yield_now();
        }
        let st = tier.1.stats();
        assert!(
            st.fill_rows > 0,
            "the cache was filled in the background: {st:?}"
        );
        eprintln!(
            "fill: {} rows landed, {} dropped",
            st.fill_rows, st.fill_dropped
        );
    });
}

/// The whole cluster paused with a local copy of every table (`--remote-fallback`): batches
/// that would pool on the nodes are summed from the copy's rows instead, DRAM's results within
/// rounding, and pool on the nodes again once the cluster answers.
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn with_a_local_copy_the_cluster_paused_pools_from_the_copy() {
    let Some(mut c) = crate::cluster_with_module(0, &[]) else {
        return;
    };
    let url = c.url();
    let tables = dram_tables();
    push(&url, "c", &tables);
    let dir = std::env::temp_dir().join(format!("ember-pool-copy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let remote_tables: Vec<EmbeddingTable> = tables
        .iter()
        .map(|t| {
            let path = dir.join(format!("{}.rows", t.name()));
            ember_embed::rowfile::write_row_file(
                &path,
                t.name(),
                t.rows(),
                t.dim(),
                t.dtype(),
                t.resident().unwrap(),
            )
            .unwrap();
            EmbeddingTable::remote_with_copy(EmbeddingTable::open_row_file(&path).unwrap()).unwrap()
        })
        .collect();
    let mem = EmbeddingCollection::one_feature_per_table(tables).unwrap();
    let coll = EmbeddingCollection::one_feature_per_table(remote_tables).unwrap();
    let mut cluster = ClusterOptions::parse(&url).unwrap();
    cluster.timeout = Duration::from_millis(200);
    let opts = TierOptions {
        cache_bytes: 1 << 20,
        policy: CachePolicy::Lru,
        remote: Some(RemoteSource {
            cluster,
            model: "c".into(),
            version: None,
        }),
        follow_updates: false,
        pool_remote: PoolRemote::On,
        ..TierOptions::default()
    };
    let stager = Stager::new(&coll, opts).unwrap();
    let tier = (coll, stager);
    let p = pooler(Pooling::Sum);
    let mut rng = StdRng::seed_from_u64(11);
    let mut check = |what: &str| {
        let kj = batch(&mut rng, 16, 40, Pooling::Sum);
        let got = staged(&p, &tier, &kj).unwrap();
        assert_close(&got, &dram(&p, &mem, &kj), what);
    };
    check("cluster whole");
    let pooled = tier.1.stats().pooled_rows;
    assert!(pooled > 0, "pooled on the nodes first");
    for i in 0..c.nodes.len() {
        c.pause(i);
    }
    for _ in 0..3 {
        check("cluster paused, from the copy");
    }
    for i in 0..c.nodes.len() {
        c.resume(i);
    }
    assert_eq!(
        tier.1.stats().pooled_rows,
        pooled,
        "nothing was pooled on paused nodes"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Malformed calls to a live node are refused, each naming what is wrong, and the node keeps
/// serving with its other keys untouched.
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn malformed_calls_are_refused_and_the_node_keeps_serving() {
    let Some(c) = crate::cluster_with_module(0, &[]) else {
        return;
    };
    let port = c.nodes[0].port;
    let q = |cmd: &ember_redis::Cmd| redis_cluster::query(port, cmd);
    // A key of this node's own slots, to see it untouched.
    let key = (0..10_000)
        .map(|i| format!("keep:{i}"))
        .find(|k| {
            matches!(
                q(ember_redis::cmd("SET").arg(k).arg("v")),
                Ok(ember_redis::Value::Okay)
            )
        })
        .expect("a key this node holds");
    let u32s = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let calls: Vec<(Vec<Vec<u8>>, &str)> = vec![
        (vec![b"p:".to_vec()], "arguments"),
        (
            vec![
                b"p:".to_vec(),
                b"f64".to_vec(),
                b"4".to_vec(),
                b"1".to_vec(),
                vec![],
                vec![],
                vec![],
            ],
            "dtype",
        ),
        (
            vec![
                b"p:".to_vec(),
                b"f32".to_vec(),
                b"4".to_vec(),
                b"1".to_vec(),
                vec![1, 2, 3],
                vec![],
                vec![],
            ],
            "blocks",
        ),
        (
            vec![
                b"p:".to_vec(),
                b"f32".to_vec(),
                b"4".to_vec(),
                b"1".to_vec(),
                u32s(&[0]),
                u32s(&[1]),
                u32s(&[0, 0]),
            ],
            "MISSING",
        ),
        (
            vec![
                b"p:".to_vec(),
                b"f32".to_vec(),
                b"4".to_vec(),
                b"1".to_vec(),
                u32s(&[0]),
                u32s(&[1]),
                u32s(&[5, 0]),
            ],
            "block index 5",
        ),
        (
            vec![
                key.as_bytes()[..5].to_vec(),
                b"f32".to_vec(),
                b"4".to_vec(),
                b"1".to_vec(),
                vec![],
                u32s(&[2]),
                u32s(&[0, 0]),
            ],
            "count 2 rows",
        ),
    ];
    for (args, says) in calls {
        let mut cmd = ember_redis::cmd("EMBER.POOL");
        for a in &args {
            cmd.arg(a.as_slice());
        }
        let e = q(&cmd).expect_err("a malformed call is an error");
        assert!(e.to_string().contains(says), "{says}: {e}");
    }
    assert_eq!(
        q(ember_redis::cmd("GET").arg(&key)).unwrap(),
        ember_redis::Value::BulkString(b"v".to_vec())
    );
    assert!(matches!(
        q(&ember_redis::cmd("PING")),
        Ok(ember_redis::Value::SimpleString(_))
    ));
}

/// The figure: the shipped model served from the cluster with no row cache (1% of its 3.4 MB
/// of tables is under the 1 MiB `--cache-mb` step), pooled (`--pool-remote on`) against rows
/// read whole (`off`): the highest rate at p99 <= 10 ms of each, `ember loadgen --find-max`,
/// alternated twice. Run with `bench/remote_pool.sh`.
#[test]
#[ignore = "a figure (minutes): bench/remote_pool.sh"]
fn figure_serving_pooled_against_rows() {
    let Some(c) = crate::cluster_with_module(1, &[]) else {
        return;
    };
    crate::push_default(&c);
    for round in 0..2 {
        for mode in ["on", "off"] {
            let s =
                crate::serve::remote_server(&c.url(), &["--cache-mb", "0", "--pool-remote", mode]);
            let max = crate::load::find_max(&format!("http://{}", s.addr), 500.0);
            eprintln!("round {round}: --pool-remote {mode}: {max:.0} requests/s at p99 <= 10 ms");
        }
    }
}
