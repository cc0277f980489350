//! The SSD tier against in-memory tables: row files round-trip every dtype; staged lookups equal
//! in-memory lookups bit for bit on random batches (odd dims, empty bags, empty batches, weights,
//! shared tables, u32 and i64 ids) for every cache policy, cache sizes from zero to everything,
//! inline and pipelined, from files in id order or laid out by a profile; the cache never exceeds
//! its budget and never evicts a pinned row; damaged files are refused at open or at read.

use crate::common;

use common::{BatchShape, random_batch};
use ember_embed::rowfile::{
    BLOCK, RowFile, RowFileWriter, RowLayout, write_row_file, write_row_file_laid_out,
};
use ember_embed::*;
use ember_tier::*;
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        // Under target/ (a real disk filesystem, where O_DIRECT works; /tmp may be tmpfs).
        let p = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "ember-tier-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn random_table(
    rng: &mut SmallRng,
    name: &str,
    rows: usize,
    dim: usize,
    dt: DType,
) -> EmbeddingTable {
    let offset: f32 = rng.random_range(-3.0..3.0);
    let vals: Vec<f32> = (0..rows * dim)
        .map(|_| offset + rng.random_range(-2.0f32..2.0))
        .collect();
    EmbeddingTable::from_f32(name, rows, dim, dt, &vals).unwrap()
}

/// A layout of `rows` rows from a random profile (repeats, ids past the table) and a random
/// number of hot rows.
fn random_layout(rng: &mut SmallRng, rows: usize) -> RowLayout {
    let n = rng.random_range(0..3 * rows + 2);
    let ids: Vec<u64> = (0..n)
        .map(|_| match rng.random_range(0..4) {
            0 => rng.random_range(0..(rows as u64 / 4).max(1)),
            1 => rows as u64 + rng.random_range(0..3),
            _ => rng.random_range(0..rows as u64),
        })
        .collect();
    let hot = rng.random_range(0..=rows);
    RowLayout::from_profile(rows, &ids, hot).unwrap().0
}

/// Writes `t` laid out by `layout`.
fn write_laid_out(t: &EmbeddingTable, path: &Path, layout: &RowLayout) {
    write_row_file_laid_out(
        path,
        t.name(),
        t.dim(),
        t.dtype(),
        t.resident().unwrap(),
        layout,
    )
    .unwrap();
}

fn write(t: &EmbeddingTable, path: &Path) {
    write_row_file(
        path,
        t.name(),
        t.rows(),
        t.dim(),
        t.dtype(),
        t.resident().unwrap(),
    )
    .unwrap();
}

#[test]
fn row_files_round_trip_every_dtype_and_odd_shapes() {
    let dir = TempDir::new("roundtrip");
    let mut rng = SmallRng::seed_from_u64(7);
    for dt in DType::ALL {
        for (rows, dim) in [(1, 1), (3, 13), (700, 64), (257, 33), (50, 1100)] {
            let t = random_table(&mut rng, "tab", rows, dim, dt);
            let p = dir.path(&format!("{dt}-{rows}-{dim}.rows"));
            write(&t, &p);
            let f = RowFile::open(&p).unwrap();
            assert_eq!(
                (f.rows(), f.dim(), f.dtype(), f.row_bytes()),
                (rows, dim, dt, dt.row_bytes(dim))
            );
            assert_eq!(f.header().name, "tab");
            assert_eq!(f.header().data_offset % BLOCK as u64, 0);
            f.verify_all().unwrap();
            for placement in [Placement::Dram, Placement::Mmap, Placement::Ssd] {
                let u = EmbeddingTable::from_row_file(&p, placement, PagePolicy::Small).unwrap();
                assert_eq!(u.placement(), placement);
                let mut a = vec![0u8; t.stride()];
                let mut b = vec![0u8; t.stride()];
                for r in (0..rows).step_by(1 + rows / 17).chain([rows - 1]) {
                    t.read_row(r, &mut a).unwrap();
                    u.read_row(r, &mut b).unwrap();
                    assert_eq!(a, b, "{dt} {rows}x{dim} row {r} via {placement}");
                }
                if placement != Placement::Ssd {
                    assert_eq!(u.resident(), t.resident());
                }
            }
        }
    }
}

/// Builds tables (some on the tier) and random batches of the same features.
struct Case {
    seed: u64,
    dtype: DType,
    dims: Vec<usize>,
    on_ssd: Vec<bool>,
    features: usize,
    batch: usize,
    batches: usize,
    max_len: usize,
    pooling: Pooling,
    wide: bool,
    policy: CachePolicy,
    /// Cache budget as a fraction of the tier tables' bytes.
    cache_frac: f64,
    depth: usize,
    /// Tier tables' files laid out by a random profile (else in id order).
    laid_out: bool,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed={} {} dims={:?} ssd={:?} feats={} batch={}x{} len<={} {:?} wide={} {} cache={:.2} depth={} laid_out={}",
            self.seed,
            self.dtype,
            self.dims,
            self.on_ssd,
            self.features,
            self.batch,
            self.batches,
            self.max_len,
            self.pooling,
            self.wide,
            self.policy,
            self.cache_frac,
            self.depth,
            self.laid_out
        )
    }
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (
        any::<u64>(),
        prop::sample::select(DType::ALL.to_vec()),
        prop::collection::vec((1usize..=70, any::<bool>()), 1..=3),
        1usize..=4,
        0usize..=6,
        1usize..=5,
        0usize..=12,
        prop::sample::select(vec![Pooling::Sum, Pooling::Mean, Pooling::WeightedSum]),
        any::<bool>(),
        prop::sample::select(CachePolicy::ALL.to_vec()),
        prop::sample::select(vec![0.0, 0.05, 0.3, 1.0]),
        (0usize..=2, any::<bool>()),
    )
        .prop_map(
            |(
                seed,
                dtype,
                tabs,
                features,
                batch,
                batches,
                max_len,
                pooling,
                wide,
                policy,
                cache_frac,
                (depth, laid_out),
            )| {
                let (dims, mut on_ssd): (Vec<usize>, Vec<bool>) = tabs.into_iter().unzip();
                on_ssd[0] = true; // at least one table on the tier
                Case {
                    seed,
                    dtype,
                    dims,
                    on_ssd,
                    features,
                    batch,
                    batches,
                    max_len,
                    pooling,
                    wide,
                    policy,
                    cache_frac,
                    depth,
                    laid_out,
                }
            },
        )
}

/// The same tables twice (in memory, and with `on_ssd` tables from row files), features, and batches.
fn build(
    c: &Case,
    dir: &TempDir,
) -> (
    EmbeddingCollection,
    EmbeddingCollection,
    Vec<KeyedJagged>,
    usize,
) {
    let mut rng = SmallRng::seed_from_u64(c.seed);
    let (mut mem, mut tier) = (Vec::new(), Vec::new());
    let mut tier_bytes = 0;
    for (t, (&dim, &ssd)) in c.dims.iter().zip(&c.on_ssd).enumerate() {
        // Enough rows that tables span several 4 KiB blocks.
        let rows = rng.random_range(1..400);
        let table = random_table(&mut rng, &format!("table{t}"), rows, dim, c.dtype);
        let p = dir.path(&format!("table{t}.rows"));
        if c.laid_out && ssd {
            write_laid_out(&table, &p, &random_layout(&mut rng, rows));
        } else {
            write(&table, &p);
        }
        if ssd {
            tier_bytes += table.rows() * table.stride();
        }
        let placement = if ssd { Placement::Ssd } else { Placement::Dram };
        tier.push(EmbeddingTable::from_row_file(&p, placement, PagePolicy::Small).unwrap());
        mem.push(table);
    }
    let features: Vec<Feature> = (0..c.features)
        .map(|f| Feature {
            name: format!("f{f}"),
            table: rng.random_range(0..mem.len()),
        })
        .collect();
    let rows: Vec<usize> = features.iter().map(|f| mem[f.table].rows()).collect();
    let keys: Vec<String> = features.iter().map(|f| f.name.clone()).collect();
    let mem = EmbeddingCollection::new(mem, features.clone()).unwrap();
    let tier = EmbeddingCollection::new(tier, features).unwrap();
    // Half the bags draw from a few rows, so the cache sees reuse.
    let shape = BatchShape {
        batch: c.batch,
        max_len: c.max_len,
        hot: 5,
        weighted: c.pooling == Pooling::WeightedSum,
        wide: c.wide,
    };
    let batches = (0..c.batches)
        .map(|_| random_batch(&mut rng, &keys, &rows, shape))
        .collect();
    (mem, tier, batches, tier_bytes)
}

fn check_case(c: &Case) {
    let dir = TempDir::new("prop");
    let (mem, tier, batches, tier_bytes) = build(c, &dir);
    let budget = (tier_bytes as f64 * c.cache_frac) as usize;
    // Pin from a "trace" of the batches' own ids (the pinned policy's profile).
    let trace: Vec<u64> = batches
        .iter()
        .flat_map(|b| (0..b.num_ids()).map(|j| b.ids().get(j) as u64))
        .collect();
    // The store the case draws, and the mapped store over the same files: every store gives
    // the in-memory results.
    let drawn = if c.seed.is_multiple_of(2) {
        IoMode::Auto
    } else {
        IoMode::Pread
    };
    for io in [drawn, IoMode::Mmap] {
        check_store(c, io, &mem, &tier, &batches, budget, &trace);
    }
}

fn check_store(
    c: &Case,
    io: IoMode,
    mem: &EmbeddingCollection,
    tier: &EmbeddingCollection,
    batches: &[KeyedJagged],
    budget: usize,
    trace: &[u64],
) {
    let opts = TierOptions {
        cache_bytes: budget,
        policy: c.policy,
        io,
        queue_depth: 1 + (c.seed % 7) as usize,
        pin_trace: (!c.seed.is_multiple_of(3)).then(|| Arc::new(trace.to_vec())),
        refresh_batches: if c.seed.is_multiple_of(3) { 2 } else { 0 },
        // No staging slot, a few, or the default: rows the cache does not keep are then copied,
        // pooled in place until the slots run out, or (mostly) pooled in place.
        staging_rows: [Some(0), Some(3), None][(c.seed % 5 % 3) as usize],
        ..TierOptions::default()
    };
    let stager = Stager::new(tier, opts).unwrap();
    if stager.is_active() {
        assert_eq!(stager.engine() == Some("mmap"), io == IoMode::Mmap);
    }
    for threads in [1, 2] {
        let pooler = Pooler::new(PoolOptions {
            pooling: c.pooling,
            // Staged rows pool straight from the cache's slab, or through a compact gather.
            dedup: [Dedup::Off, Dedup::On, Dedup::Auto][((c.seed >> 8) % 3) as usize],
            threads,
            ..PoolOptions::default()
        })
        .unwrap();
        let width = mem.total_dim();
        let mut n = 0;
        pipeline(
            &stager,
            tier,
            c.depth,
            batches.iter(),
            |b| *b,
            |kj, staged| -> Result<(), String> {
                let staged = staged.map_err(|e| e.to_string())?;
                let mut want = vec![f32::NAN; kj.batch_size() * width];
                pooler
                    .run(mem, mem.check_view(kj).unwrap(), &mut want)
                    .unwrap();
                let mut got = vec![f32::NAN; want.len()];
                pooler
                    .run_staged(tier, tier.check_view(kj).unwrap(), &staged, &mut got)
                    .unwrap();
                // Bit-identical: the same kernel sums the same bytes in the same order.
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{c:?} {io:?} threads={threads}: staged {got:?} != in-memory {want:?}"
                );
                stager.check_invariants(budget);
                n += 1;
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(n, batches.len());
    }
    let s = stager.stats();
    assert_eq!(s.hits + s.misses, s.cache_lookups);
    assert!(s.cache_lookups <= s.lookups);
    assert!(
        s.hits <= s.lookup_hits && s.lookup_hits <= s.lookups,
        "{s:?}"
    );
    assert_eq!(s.misses == 0, s.lookup_hits == s.lookups, "{s:?}");
    if budget == 0 && c.policy != CachePolicy::Pinned {
        assert_eq!(s.hits, 0, "an empty cache cannot hit");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn staged_lookups_equal_in_memory_lookups(c in case_strategy()) {
        check_case(&c);
    }
}

#[test]
fn unstaged_tier_lookup_is_an_error() {
    let dir = TempDir::new("unstaged");
    let mut rng = SmallRng::seed_from_u64(3);
    let t = random_table(&mut rng, "t", 20, 8, DType::F32);
    let p = dir.path("t.rows");
    write(&t, &p);
    let coll = EmbeddingCollection::one_feature_per_table(vec![
        EmbeddingTable::open_row_file(&p).unwrap(),
    ])
    .unwrap();
    let kj =
        KeyedJagged::from_lengths(vec!["t".into()], 1, &[2], Ids::U32(vec![1, 19]), None).unwrap();
    let pooler = Pooler::new(PoolOptions::default()).unwrap();
    let mut out = vec![0f32; 8];
    let e = pooler
        .run(&coll, coll.check_view(&kj).unwrap(), &mut out)
        .unwrap_err();
    assert!(matches!(e, EmbedError::NotStaged { .. }), "{e}");
    // A staged batch of the same shape but other ids is refused (its rows are another batch's).
    let same_shape =
        KeyedJagged::from_lengths(vec!["t".into()], 1, &[2], Ids::U32(vec![1, 18]), None).unwrap();
    let stager = Stager::new(&coll, TierOptions::default()).unwrap();
    let staged = stager
        .stage(&coll, coll.check_view(&same_shape).unwrap())
        .unwrap();
    let e = pooler
        .run_staged(&coll, coll.check_view(&kj).unwrap(), &staged, &mut out)
        .unwrap_err();
    assert!(matches!(e, EmbedError::NotStaged { .. }), "{e}");
    // The same batch pools.
    pooler
        .run_staged(
            &coll,
            coll.check_view(&same_shape).unwrap(),
            &staged,
            &mut out,
        )
        .unwrap();
    // A stager built for another collection (same shape, another file) refuses to stage.
    let p2 = dir.path("t2.rows");
    write(&t, &p2);
    let other = EmbeddingCollection::one_feature_per_table(vec![
        EmbeddingTable::open_row_file(&p2).unwrap(),
    ])
    .unwrap();
    let e = stager
        .stage(&other, other.check_view(&kj).unwrap())
        .unwrap_err();
    assert!(e.to_string().contains("other than the stager's"), "{e}");
    // A staged batch of another shape is refused too.
    let other =
        KeyedJagged::from_lengths(vec!["t".into()], 1, &[1], Ids::U32(vec![3]), None).unwrap();
    let stager = Stager::new(&coll, TierOptions::default()).unwrap();
    let staged = stager
        .stage(&coll, coll.check_view(&other).unwrap())
        .unwrap();
    let e = pooler
        .run_staged(&coll, coll.check_view(&kj).unwrap(), &staged, &mut out)
        .unwrap_err();
    assert!(matches!(e, EmbedError::NotStaged { .. }), "{e}");
}

/// One random 4000 x 16 f32 table written to `dir`: on the SSD tier, and in DRAM.
fn ssd_and_dram(dir: &TempDir, rng: &mut SmallRng) -> (EmbeddingCollection, EmbeddingCollection) {
    let t = random_table(rng, "t", 4000, 16, DType::F32);
    let p = dir.path("t.rows");
    write(&t, &p);
    let tier = EmbeddingCollection::one_feature_per_table(vec![
        EmbeddingTable::open_row_file(&p).unwrap(),
    ])
    .unwrap();
    let mem = EmbeddingCollection::one_feature_per_table(vec![
        EmbeddingTable::from_row_file(&p, Placement::Dram, PagePolicy::Small).unwrap(),
    ])
    .unwrap();
    (tier, mem)
}

/// `kj` pooled from `staged` equals `kj` pooled from the DRAM tables, bit for bit.
fn assert_pools_as_dram(
    pooler: &Pooler,
    tier: &EmbeddingCollection,
    mem: &EmbeddingCollection,
    kj: &KeyedJagged,
    staged: &StagedBatch,
) {
    let mut want = vec![0f32; kj.batch_size() * mem.total_dim()];
    pooler
        .run(mem, mem.check_view(kj).unwrap(), &mut want)
        .unwrap();
    let mut got = vec![f32::NAN; want.len()];
    pooler
        .run_staged(tier, tier.check_view(kj).unwrap(), staged, &mut got)
        .unwrap();
    assert!(
        got.iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "staged {got:?} != in memory {want:?}"
    );
}

#[test]
fn cached_rows_pool_in_place_held_until_dropped() {
    let dir = TempDir::new("inplace");
    let mut rng = SmallRng::seed_from_u64(12);
    let (tier, mem) = ssd_and_dram(&dir, &mut rng);
    // 100 rows of cache (64 bytes each) and 50 staging slots.
    let budget = 100 * 64;
    let stager = Stager::new(
        &tier,
        TierOptions {
            cache_bytes: budget,
            policy: CachePolicy::Lru,
            staging_rows: Some(50),
            ..TierOptions::default()
        },
    )
    .unwrap();
    let pooler = Pooler::new(PoolOptions::default()).unwrap();
    let batch = |lo: u32| {
        // 80 distinct ids, each twice, over 4 bags.
        let ids: Vec<u32> = (0..160).map(|i| lo + (i * 7) % 80).collect();
        KeyedJagged::from_lengths(vec!["t".into()], 4, &[40; 4], Ids::U32(ids), None).unwrap()
    };
    let check = |kj: &KeyedJagged, staged: &StagedBatch| {
        assert_pools_as_dram(&pooler, &tier, &mem, kj, staged);
    };
    let (ka, kb, kc) = (batch(0), batch(1000), batch(2000));
    let a = stager.stage(&tier, tier.check_view(&ka).unwrap()).unwrap();
    // An empty cache admits all 80 rows: pooled in place, 80 slots held.
    assert_eq!(a.in_place(), (1, 1));
    assert_eq!(stager.held_slots(), 80);
    // While `a` lives its 80 slots are not evicted: 20 free slots and 50 staging slots hold
    // 70 of b's 80 rows; the last 10 find none, so b is copied.
    let b = stager.stage(&tier, tier.check_view(&kb).unwrap()).unwrap();
    assert_eq!(b.in_place(), (0, 1));
    stager.check_invariants(budget);
    check(&ka, &a);
    check(&kb, &b);
    assert_eq!(stager.held_slots(), 80, "b's slots are let go at once");
    drop((a, b));
    assert_eq!(
        stager.held_slots(),
        0,
        "dropped batches release their slots"
    );
    // With a's slots back, c's rows evict them and are pooled in place again.
    let c = stager.stage(&tier, tier.check_view(&kc).unwrap()).unwrap();
    assert_eq!(c.in_place(), (1, 1));
    check(&kc, &c);
    stager.check_invariants(budget);
    let s = stager.stats();
    assert_eq!((s.hits, s.misses), (0, 240));
}

#[test]
fn pinned_rows_survive_cold_traffic() {
    let dir = TempDir::new("pinned");
    let mut rng = SmallRng::seed_from_u64(11);
    let rows = 4000;
    let t = random_table(&mut rng, "t", rows, 16, DType::F32);
    let p = dir.path("t.rows");
    write(&t, &p);
    let coll = EmbeddingCollection::one_feature_per_table(vec![
        EmbeddingTable::open_row_file(&p).unwrap(),
    ])
    .unwrap();
    // Hot ids 0..50 appear 5 times each in the profile.
    let trace: Vec<u64> = (0..5).flat_map(|_| 0..50u64).chain(100..300).collect();
    let budget = 100 * 64; // 100 rows of 64 bytes, all pinned (a trace is given)
    let stager = Stager::new(
        &coll,
        TierOptions {
            cache_bytes: budget,
            policy: CachePolicy::Pinned,
            pin_trace: Some(Arc::new(trace)),
            ..TierOptions::default()
        },
    )
    .unwrap();
    for id in 0..50 {
        assert!(stager.is_pinned(0, id), "row {id} not pinned");
    }
    // Thousands of one-shot cold ids, then check.
    for b in 0..40u32 {
        let ids: Vec<u32> = (0..100)
            .map(|i| 1000 + b * 70 + i)
            .filter(|&i| (i as usize) < rows)
            .collect();
        let kj = KeyedJagged::from_lengths(vec!["t".into()], 1, &[ids.len()], Ids::U32(ids), None)
            .unwrap();
        stager.stage(&coll, coll.check_view(&kj).unwrap()).unwrap();
        stager.check_invariants(budget);
    }
    for id in 0..50 {
        assert!(
            stager.is_pinned(0, id),
            "row {id} was evicted by cold traffic"
        );
    }
    // The hot rows hit without a read.
    let before = stager.stats();
    let ids: Vec<u32> = (0..50).collect();
    let kj = KeyedJagged::from_lengths(vec!["t".into()], 1, &[50], Ids::U32(ids), None).unwrap();
    stager.stage(&coll, coll.check_view(&kj).unwrap()).unwrap();
    let d = stager.stats().since(&before);
    assert_eq!((d.hits, d.misses, d.store_reads), (50, 0, 0));
    assert_eq!((d.lookups, d.lookup_hits), (50, 50));
}

/// Edits the header of `path` with `f` and rewrites its CRC, as a buggy or foreign writer would.
fn rewrite_header(path: &Path, f: impl FnOnce(&mut [u8])) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut h = vec![0u8; 4096];
    file.read_exact_at(&mut h, 0).unwrap();
    f(&mut h);
    let crc = crc32fast::hash(&h[..4092]);
    h[4092..].copy_from_slice(&crc.to_le_bytes());
    file.write_all_at(&h, 0).unwrap();
}

/// Flips one byte of `path` at `at`.
fn flip(path: &Path, at: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 0x5A;
    f.write_all_at(&b, at).unwrap();
}

#[test]
fn damaged_files_are_refused_with_a_clear_error() {
    let dir = TempDir::new("corrupt");
    let mut rng = SmallRng::seed_from_u64(5);
    let rows = 100;
    let t = random_table(&mut rng, "t", rows, 64, DType::F32); // 256-byte rows, 16 per block
    let good = dir.path("good.rows");
    write(&t, &good);
    let f = RowFile::open(&good).unwrap();
    let data = f.header().data_offset;
    let sums = f.header().sums_offset;
    let len = std::fs::metadata(&good).unwrap().len();
    drop(f);
    let copy = |name: &str| {
        let p = dir.path(name);
        std::fs::copy(&good, &p).unwrap();
        p
    };
    let open_err = |p: &Path| RowFile::open(p).unwrap_err().to_string();

    // A flipped data byte in block 2 (rows 32..48): open succeeds, a read of that block fails,
    // naming the block; rows of other blocks still read.
    let p = copy("data.rows");
    flip(&p, data + 2 * BLOCK as u64 + 100);
    let coll = EmbeddingCollection::one_feature_per_table(vec![
        EmbeddingTable::open_row_file(&p).unwrap(),
    ])
    .unwrap();
    let kj = |ids: Vec<u32>| {
        KeyedJagged::from_lengths(vec!["t".into()], 1, &[ids.len()], Ids::U32(ids), None).unwrap()
    };
    // Every store checks blocks before any row lands.
    for io in [IoMode::Auto, IoMode::Pread, IoMode::Mmap] {
        let opts = TierOptions {
            io,
            ..TierOptions::default()
        };
        let stager = Stager::new(&coll, opts).unwrap();
        let bad = kj(vec![3, 40]);
        let e = stager
            .stage(&coll, coll.check_view(&bad).unwrap())
            .unwrap_err();
        assert!(
            matches!(e, EmbedError::Corrupt { block: 2, .. }),
            "{io:?}: {e}"
        );
        assert!(e.to_string().contains("fails its checksum"), "{e}");
        let ok = kj(vec![3, 60, 99]);
        stager.stage(&coll, coll.check_view(&ok).unwrap()).unwrap();
        // The bad row was not cached by the failed read: asking again fails again.
        assert!(stager.stage(&coll, coll.check_view(&bad).unwrap()).is_err());
    }
    assert!(matches!(
        RowFile::open(&p).unwrap().verify_all(),
        Err(EmbedError::Corrupt { block: 2, .. })
    ));
    let mut row = vec![0u8; 256];
    assert!(coll.tables()[0].read_row(40, &mut row).is_err());
    // Loading it into memory refuses too.
    assert!(EmbeddingTable::from_row_file(&p, Placement::Dram, PagePolicy::Small).is_err());

    // Header, checksum table, length, magic, version.
    let p = copy("header.rows");
    flip(&p, 20);
    assert!(
        open_err(&p).contains("header checksum mismatch"),
        "{}",
        open_err(&p)
    );
    let p = copy("sums.rows");
    flip(&p, sums + 4);
    assert!(
        open_err(&p).contains("checksum table damaged"),
        "{}",
        open_err(&p)
    );
    let p = copy("short.rows");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len - BLOCK as u64)
        .unwrap();
    assert!(open_err(&p).contains("truncated"), "{}", open_err(&p));
    let p = copy("long.rows");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len + 1)
        .unwrap();
    assert!(open_err(&p).contains("extra bytes"), "{}", open_err(&p));
    // A version this build does not read, with a valid header CRC.
    let p = copy("version.rows");
    rewrite_header(&p, |h| h[8..12].copy_from_slice(&3u32.to_le_bytes()));
    assert!(
        open_err(&p).contains("format version 3"),
        "{}",
        open_err(&p)
    );
    // A file in id order that claims a layout (version 2, valid CRC) is inconsistent.
    let p = copy("claims-layout.rows");
    rewrite_header(&p, |h| h[8..12].copy_from_slice(&2u32.to_le_bytes()));
    assert!(open_err(&p).contains("inconsistent"), "{}", open_err(&p));
    // Fields inconsistent with the shape (valid CRC): data offset moved.
    let p = copy("fields.rows");
    rewrite_header(&p, |h| {
        let v = u64::from_le_bytes(h[56..64].try_into().unwrap()) + 4096;
        h[56..64].copy_from_slice(&v.to_le_bytes());
    });
    assert!(open_err(&p).contains("inconsistent"), "{}", open_err(&p));
    let p = copy("magic.rows");
    flip(&p, 0);
    assert!(open_err(&p).contains("not a row file"), "{}", open_err(&p));
    let p = dir.path("tiny.rows");
    std::fs::write(&p, b"EMBROWS\0").unwrap();
    assert!(open_err(&p).contains("shorter than"), "{}", open_err(&p));

    // A writer that never finishes leaves no file under the final name.
    let p = dir.path("torn.rows");
    let mut w = RowFileWriter::create(&p, "t", rows, 64, DType::F32).unwrap();
    w.write_rows(&t.resident().unwrap()[..256 * 10]).unwrap();
    drop(w);
    assert!(!p.exists());
    assert!(
        !dir.path("torn.rows.tmp").exists(),
        "an unfinished writer leaves its temporary file"
    );
    // Finishing with rows missing is an error, and too many rows too.
    let mut w = RowFileWriter::create(&p, "t", rows, 64, DType::F32).unwrap();
    w.write_rows(&t.resident().unwrap()[..256 * 10]).unwrap();
    assert!(
        w.finish()
            .unwrap_err()
            .to_string()
            .contains("10 of 100 rows")
    );
    let mut w = RowFileWriter::create(&p, "t", 2, 64, DType::F32).unwrap();
    assert!(w.write_rows(&t.resident().unwrap()[..256 * 3]).is_err());
}

/// Where the kernel allowed an io_uring when the tests were built, the tier gets one: the
/// io_uring case of `large_rows_and_split_merged_reads_equal_in_memory` really runs.
#[test]
#[cfg_attr(
    not(ember_io_uring),
    ignore = "needs io_uring (io_uring_setup was refused when built: a sandbox or an old kernel)"
)]
fn large_rows_need_io_uring() {
    let dir = TempDir::new("uring");
    let mut rng = SmallRng::seed_from_u64(5);
    let t = random_table(&mut rng, "t", 10, 8, DType::F32);
    let p = dir.path("t.rows");
    write(&t, &p);
    let tier = EmbeddingCollection::one_feature_per_table(vec![
        EmbeddingTable::open_row_file(&p).unwrap(),
    ])
    .unwrap();
    let opts = TierOptions {
        io: IoMode::Uring,
        ..TierOptions::default()
    };
    let stager = Stager::new(&tier, opts).expect("io_uring was available when built");
    assert_eq!(stager.engine(), Some("io_uring"));
}

/// Rows larger than a block (4400 bytes: two or three blocks each) and a table larger than the
/// biggest merged read (256 KiB), every row of it in one batch: reads split at the merge limit,
/// rows straddling blocks, through io_uring when the kernel allows it and through pread.
#[test]
fn large_rows_and_split_merged_reads_equal_in_memory() {
    let dir = TempDir::new("large");
    let mut rng = SmallRng::seed_from_u64(21);
    let (rows, dim) = (300, 1100);
    let t = random_table(&mut rng, "t", rows, dim, DType::F32);
    let p = dir.path("t.rows");
    write(&t, &p);
    let mem = EmbeddingCollection::one_feature_per_table(vec![t]).unwrap();
    let tier = EmbeddingCollection::one_feature_per_table(vec![
        EmbeddingTable::open_row_file(&p).unwrap(),
    ])
    .unwrap();
    let mut ids: Vec<u32> = (0..rows as u32).collect();
    ids.extend((0..50).map(|_| rng.random_range(0..rows as u32)));
    let lengths: Vec<usize> = vec![ids.len() / 2, ids.len() - ids.len() / 2];
    let kj = KeyedJagged::from_lengths(vec!["t".into()], 2, &lengths, Ids::U32(ids), None).unwrap();
    let pooler = Pooler::new(PoolOptions::default()).unwrap();
    let mut want = vec![0f32; 2 * dim];
    pooler
        .run(&mem, mem.check_view(&kj).unwrap(), &mut want)
        .unwrap();
    for io in [IoMode::Uring, IoMode::Pread, IoMode::Mmap] {
        let opts = TierOptions {
            cache_bytes: 0,
            io,
            queue_depth: 8,
            ..TierOptions::default()
        };
        let stager = match Stager::new(&tier, opts) {
            Ok(s) => s,
            // Refused where build.rs found io_uring unavailable: that case is
            // `large_rows_need_io_uring`'s to report (ignored there, with the reason).
            Err(_) if io == IoMode::Uring && !cfg!(ember_io_uring) => continue,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(
            stager.engine(),
            Some(match io {
                IoMode::Uring => "io_uring",
                IoMode::Pread => "pread",
                _ => "mmap",
            })
        );
        let staged = stager.stage(&tier, tier.check_view(&kj).unwrap()).unwrap();
        let mut got = vec![f32::NAN; 2 * dim];
        pooler
            .run_staged(&tier, tier.check_view(&kj).unwrap(), &staged, &mut got)
            .unwrap();
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{io:?}"
        );
        let s = stager.stats();
        // 300 rows x 4400 bytes = 1.3 MB of blocks: more than 5 reads of at most 256 KiB.
        assert_eq!(s.misses, rows as u64);
        assert!(s.store_reads >= 6, "{s:?}");
        assert!(s.store_bytes_read >= (rows * 4400) as u64, "{s:?}");
    }
}

/// Batches large enough that the stager stages its tier tables in parallel (thousands of ids
/// over three tier tables, one looked up by two features) equal in-memory lookups bit for bit,
/// under every policy and cache size, inline and pipelined; run inside a 4-thread pool so that
/// the parallel path is taken on any machine.
#[test]
fn large_batches_staged_in_parallel_equal_in_memory() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(4)
        .build()
        .unwrap();
    for (k, policy) in CachePolicy::ALL.into_iter().enumerate() {
        for (j, cache_frac) in [0.0, 0.05, 0.3, 1.0].into_iter().enumerate() {
            let c = Case {
                seed: 1000 + (k * 10 + j) as u64,
                dtype: DType::F32,
                dims: vec![64, 33, 8, 16],
                on_ssd: vec![true, true, true, false],
                features: 6,
                batch: 64,
                batches: 3,
                max_len: 120,
                pooling: Pooling::Sum,
                wide: false,
                policy,
                cache_frac,
                depth: j % 2,
                laid_out: j % 2 == 1,
            };
            pool.install(|| check_case(&c));
        }
    }
}

/// Pinned rows are read in place without a hold; a batch still in flight when the pinned set is
/// replaced keeps reading its rows intact (the old pinned slots are held for it until it is
/// dropped), and nothing stays held after.
#[test]
fn pinned_rows_read_unheld_survive_a_new_pinned_set() {
    let dir = TempDir::new("repin");
    let mut rng = SmallRng::seed_from_u64(13);
    let (tier, mem) = ssd_and_dram(&dir, &mut rng);
    // 100 rows of cache, all pinned, the pinned set taken from the live counts after every batch.
    let budget = 100 * 64;
    let stager = Stager::new(
        &tier,
        TierOptions {
            cache_bytes: budget,
            policy: CachePolicy::Pinned,
            pin_fraction: Some(1.0),
            refresh_batches: 1,
            ..TierOptions::default()
        },
    )
    .unwrap();
    let pooler = Pooler::new(PoolOptions::default()).unwrap();
    let batch = |lo: u32, n: u32| {
        let ids: Vec<u32> = (0..2 * n).map(|i| lo + (i * 7) % n).collect();
        KeyedJagged::from_lengths(vec!["t".into()], 2, &[n as usize; 2], Ids::U32(ids), None)
            .unwrap()
    };
    let check = |kj: &KeyedJagged, staged: &StagedBatch| {
        assert_pools_as_dram(&pooler, &tier, &mem, kj, staged);
    };
    // The first batch's rows are fetched, then pinned by the refresh after it.
    let hot = batch(0, 50);
    drop(stager.stage(&tier, tier.check_view(&hot).unwrap()).unwrap());
    assert!((0..50).all(|id| stager.is_pinned(0, id)));
    // `a` reads them pinned: unheld.
    let before = stager.stats();
    let a = stager.stage(&tier, tier.check_view(&hot).unwrap()).unwrap();
    let d = stager.stats().since(&before);
    assert_eq!((d.hits, d.misses, d.lookup_hits), (50, 0, 100));
    assert_eq!(a.in_place(), (1, 1));
    // Cold batches while `a` lives: each refresh pins their rows instead, which would evict
    // and overwrite the rows `a` reads if they were not held for it.
    for b in 0..6 {
        let cold = batch(1000 + 100 * b, 100);
        let s = stager
            .stage(&tier, tier.check_view(&cold).unwrap())
            .unwrap();
        check(&cold, &s);
        stager.check_invariants(budget);
    }
    let still: Vec<u64> = (0..50).filter(|&id| stager.is_pinned(0, id)).collect();
    assert!(still.is_empty(), "{still:?}");
    check(&hot, &a);
    drop(a);
    // Once `a` is gone, its rows are let go, and evicted by the next batches.
    assert_eq!(stager.held_slots(), 0);
    for b in 0..2 {
        let cold = batch(2000 + 100 * b, 100);
        drop(
            stager
                .stage(&tier, tier.check_view(&cold).unwrap())
                .unwrap(),
        );
    }
    stager.check_invariants(budget);
    assert_eq!(stager.held_slots(), 0);
}

/// Files laid out by a profile: every row reads back by its id (one at a time, all at once into
/// memory, through every store); the mmap placement refuses them; a damaged layout (its CRC, or
/// positions that are not a permutation under a valid CRC) is refused at open.
#[test]
fn laid_out_files_read_by_id_and_damage_is_refused() {
    let dir = TempDir::new("layout");
    let mut rng = SmallRng::seed_from_u64(23);
    for dt in DType::ALL {
        // 12-byte rows over 4 MiB straddle `read_all`'s chunks; 4400-byte rows span blocks.
        for (rows, dim) in [(1, 1), (257, 33), (700, 64), (400_000, 3), (60, 1100)] {
            let t = random_table(&mut rng, "tab", rows, dim, dt);
            let layout = random_layout(&mut rng, rows);
            let p = dir.path(&format!("{dt}-{rows}-{dim}.rows"));
            write_laid_out(&t, &p, &layout);
            let f = RowFile::open(&p).unwrap();
            assert!(f.header().laid_out());
            assert_eq!(f.layout(), Some(&layout));
            f.verify_all().unwrap();
            let mut all = vec![0u8; rows * t.stride()];
            f.read_all(&mut all).unwrap();
            assert!(all == t.resident().unwrap(), "{dt} {rows}x{dim}: read_all");
            let (mut a, mut b) = (vec![0u8; t.stride()], vec![0u8; t.stride()]);
            for r in (0..rows).step_by(1 + rows / 37).chain([rows - 1]) {
                t.read_row(r, &mut a).unwrap();
                f.read_row(r, &mut b).unwrap();
                assert_eq!(a, b, "{dt} {rows}x{dim} row {r}");
            }
            let dram =
                EmbeddingTable::from_row_file(&p, Placement::Dram, PagePolicy::Small).unwrap();
            assert!(dram.resident() == t.resident(), "{dt} {rows}x{dim} as dram");
            let e = EmbeddingTable::from_row_file(&p, Placement::Mmap, PagePolicy::Small)
                .unwrap_err()
                .to_string();
            assert!(e.contains("laid out by a profile"), "{e}");
        }
    }
    // Every store reads every row of a laid-out table where its layout put it.
    let rows = 3000;
    let t = random_table(&mut rng, "t", rows, 20, DType::F32);
    let layout = random_layout(&mut rng, rows);
    assert!(!layout.is_identity());
    let p = dir.path("stores.rows");
    write_laid_out(&t, &p, &layout);
    let tier = EmbeddingCollection::one_feature_per_table(vec![
        EmbeddingTable::open_row_file(&p).unwrap(),
    ])
    .unwrap();
    let mem = EmbeddingCollection::one_feature_per_table(vec![t]).unwrap();
    let ids: Vec<u32> = (0..rows as u32).rev().collect();
    let kj = KeyedJagged::from_lengths(vec!["t".into()], rows, &vec![1; rows], Ids::U32(ids), None)
        .unwrap();
    for io in [IoMode::Auto, IoMode::Pread, IoMode::Mmap] {
        let stager = Stager::new(
            &tier,
            TierOptions {
                io,
                cache_bytes: 0,
                ..TierOptions::default()
            },
        )
        .unwrap();
        let staged = stager.stage(&tier, tier.check_view(&kj).unwrap()).unwrap();
        let pooler = Pooler::new(PoolOptions::default()).unwrap();
        assert_pools_as_dram(&pooler, &tier, &mem, &kj, &staged);
    }

    // Damage: a flipped position fails the layout's CRC; positions that are not a permutation
    // under a rewritten CRC are refused too.
    let f = RowFile::open(&p).unwrap();
    let at = f.header().layout_offset;
    drop(f);
    let open_err = |p: &Path| RowFile::open(p).unwrap_err().to_string();
    let q = dir.path("layout-crc.rows");
    std::fs::copy(&p, &q).unwrap();
    flip(&q, at + 5);
    assert!(open_err(&q).contains("layout damaged"), "{}", open_err(&q));
    let q = dir.path("layout-perm.rows");
    std::fs::copy(&p, &q).unwrap();
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&q)
            .unwrap();
        // Row 1 moved onto row 0's position.
        let mut pos = vec![0u8; 4 * rows];
        file.read_exact_at(&mut pos, at).unwrap();
        let first: [u8; 4] = pos[0..4].try_into().unwrap();
        pos[4..8].copy_from_slice(&first);
        file.write_all_at(&pos, at).unwrap();
        let crc = crc32fast::hash(&pos);
        rewrite_header(&q, |h| h[1112..1116].copy_from_slice(&crc.to_le_bytes()));
    }
    assert!(
        open_err(&q).contains("not a permutation"),
        "{}",
        open_err(&q)
    );
}
