//! Pooled-lookup micro-benchmarks (divan): every ISA this CPU has x every dtype, on 4 tables of
//! 256K rows x dim 64, uniform ids, pooling 32, batch 64. Like FBGEMM's EmbeddingSpMDMBenchmark,
//! each configuration is checked against the reference before it is timed. Throughput is shown
//! in logical bytes (lookups x row bytes). `cargo bench -p ember-embed --bench pool`.
//! The side-by-side figures against PyTorch come from `ember bench embed` and
//! `bench/compare_torch.py`, not from here.

use divan::Bencher;
use divan::counter::BytesCount;
use ember_embed::pool::reference;
use ember_embed::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const TABLES: usize = 4;
const ROWS: usize = 256 * 1024;
const DIM: usize = 64;

fn main() {
    divan::main();
}

fn setup(dtype: DType) -> (EmbeddingCollection, Vec<KeyedJagged>) {
    let tables = (0..TABLES)
        .map(|t| {
            let mut tab =
                EmbeddingTable::zeroed(&format!("t{t}"), ROWS, DIM, dtype, PagePolicy::Huge)
                    .unwrap();
            tab.fill_rows(2, |r, out| {
                let mut rng = SmallRng::seed_from_u64((t * ROWS + r) as u64);
                out.iter_mut()
                    .for_each(|x| *x = rng.random_range(-1.0..1.0));
            });
            tab
        })
        .collect();
    let coll = EmbeddingCollection::one_feature_per_table(tables).unwrap();
    // 16 batches of 64 samples x 32 uniform ids per table.
    let (batch, pooling) = (64, 32);
    let mut rng = SmallRng::seed_from_u64(3);
    let keys: Vec<String> = (0..TABLES).map(|t| format!("t{t}")).collect();
    let batches = (0..16)
        .map(|_| {
            let ids = (0..TABLES * batch * pooling)
                .map(|_| rng.random_range(0..ROWS as u32))
                .collect();
            let lengths = vec![pooling; TABLES * batch];
            KeyedJagged::from_lengths(keys.clone(), batch, &lengths, Ids::U32(ids), None).unwrap()
        })
        .collect();
    (coll, batches)
}

/// `ISA/dtype` pairs, e.g. `avx512/int8`.
const CASES: [&str; 15] = [
    "scalar/f32",
    "scalar/f16",
    "scalar/bf16",
    "scalar/int8",
    "scalar/int4",
    "avx2/f32",
    "avx2/f16",
    "avx2/bf16",
    "avx2/int8",
    "avx2/int4",
    "avx512/f32",
    "avx512/f16",
    "avx512/bf16",
    "avx512/int8",
    "avx512/int4",
];

#[divan::bench(args = CASES)]
fn pooled_lookup(bencher: Bencher, case: &str) {
    let (isa, dtype) = case.split_once('/').unwrap();
    let (isa, dtype): (Isa, DType) = (isa.parse().unwrap(), dtype.parse().unwrap());
    if !isa.available() {
        return;
    }
    let (coll, batches) = setup(dtype);
    let pooler = Pooler::new(PoolOptions {
        isa: Some(isa),
        dedup: Dedup::Off,
        ..Default::default()
    })
    .unwrap();
    let width = coll.total_dim();
    let (mut got, mut want) = (vec![0f32; 64 * width], vec![0f32; 64 * width]);
    let first = coll.check_view(&batches[0]).unwrap();
    pooler.run(&coll, first, &mut got).unwrap();
    reference::pooled_lookup(&coll, first, Pooling::Sum, &mut want).unwrap();
    assert!(
        got.iter()
            .zip(&want)
            .all(|(a, b)| (a - b).abs() <= 1e-4 * (1.0 + b.abs())),
        "{isa} {dtype} disagrees with the reference"
    );
    let validated: Vec<_> = batches
        .iter()
        .map(|b| coll.check_view(b).unwrap())
        .collect();
    let bytes = batches.iter().map(|b| b.num_ids()).sum::<usize>() * dtype.row_bytes(DIM);
    bencher.counter(BytesCount::new(bytes)).bench_local(|| {
        for vb in &validated {
            pooler.run(&coll, *vb, &mut got).unwrap();
        }
    });
}
