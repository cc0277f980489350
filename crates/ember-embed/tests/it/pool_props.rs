//! Every kernel (each ISA this CPU has), dtype and option against `pool::reference` on random
//! inputs: dims 1..=1024 (many not multiples of 8 or 16), empty bags, empty batches, weights,
//! mean, dedup on/off/auto, u32 and i64 ids, 1 and 2 threads, several prefetch distances.

use crate::common;

use common::{BatchShape, random_batch};
use ember_embed::pool::reference;
use ember_embed::*;
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

#[derive(Debug, Clone)]
struct Case {
    seed: u64,
    dtype: DType,
    dims: Vec<usize>,
    features: usize,
    batch: usize,
    max_len: usize,
    pooling: Pooling,
    wide_ids: bool,
}

fn dim_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        1usize..=20,
        (1usize..=64).prop_map(|k| 16 * k),
        (1usize..=64).prop_flat_map(|k| prop_oneof![
            Just(16 * k - 1),
            Just(16 * k + 1),
            Just(8 * k + 3)
        ]),
        1usize..=1024,
    ]
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (
        any::<u64>(),
        prop::sample::select(DType::ALL.to_vec()),
        prop::collection::vec(dim_strategy(), 1..=3),
        1usize..=4,
        0usize..=7,
        0usize..=9,
        prop::sample::select(vec![Pooling::Sum, Pooling::Mean, Pooling::WeightedSum]),
        any::<bool>(),
    )
        .prop_map(
            |(seed, dtype, dims, features, batch, max_len, pooling, wide_ids)| Case {
                seed,
                dtype,
                dims,
                features,
                batch,
                max_len,
                pooling,
                wide_ids,
            },
        )
}

/// Tables with random contents (offset so quantized rows have a non-zero bias), features mapped
/// onto them (tables may be shared), and a random batch with some empty bags.
fn build(c: &Case) -> (EmbeddingCollection, KeyedJagged, f32) {
    let mut rng = SmallRng::seed_from_u64(c.seed);
    let mut tables = Vec::new();
    for (t, &dim) in c.dims.iter().enumerate() {
        let rows = rng.random_range(1..40);
        let offset: f32 = rng.random_range(-3.0..3.0);
        let vals: Vec<f32> = (0..rows * dim)
            .map(|_| offset + rng.random_range(-2.0f32..2.0))
            .collect();
        tables.push(
            EmbeddingTable::from_f32(&format!("table{t}"), rows, dim, c.dtype, &vals).unwrap(),
        );
    }
    let max_abs = 5.0;
    let features: Vec<Feature> = (0..c.features)
        .map(|f| Feature {
            name: format!("f{f}"),
            table: rng.random_range(0..tables.len()),
        })
        .collect();
    let rows: Vec<usize> = features.iter().map(|f| tables[f.table].rows()).collect();
    let keys: Vec<String> = features.iter().map(|f| f.name.clone()).collect();
    let coll = EmbeddingCollection::new(tables, features).unwrap();
    // Half the bags draw from a few rows, so dedup finds repeats.
    let shape = BatchShape {
        batch: c.batch,
        max_len: c.max_len,
        hot: 3,
        weighted: c.pooling == Pooling::WeightedSum,
        wide: c.wide_ids,
    };
    let kj = random_batch(&mut rng, &keys, &rows, shape);
    (coll, kj, max_abs)
}

/// |got - want| <= tolerance scaled by the bag's total |weight| x the largest |value|.
fn assert_close(
    coll: &EmbeddingCollection,
    kj: &KeyedJagged,
    pooling: Pooling,
    max_abs: f32,
    got: &[f32],
    want: &[f32],
    what: &str,
) {
    let width = coll.total_dim();
    for f in 0..coll.features().len() {
        let dim = coll.table_of(f).dim();
        for b in 0..kj.batch_size() {
            let bag = kj.bag(f, b);
            let wsum: f32 = match (pooling, kj.weights()) {
                (Pooling::WeightedSum, Some(w)) => bag.clone().map(|j| w[j].abs()).sum(),
                (Pooling::Mean, _) => 1.0,
                _ => bag.len() as f32,
            };
            let tol = 2e-6 * (1.0 + wsum * max_abs) * (1.0 + bag.len() as f32);
            for d in 0..dim {
                let i = b * width + coll.col_offset(f) + d;
                assert!(
                    (got[i] - want[i]).abs() <= tol,
                    "{what}: feature {f} sample {b} elem {d} of dim {dim}: got {} want {} (tol {tol}, bag {:?})",
                    got[i],
                    want[i],
                    bag
                );
            }
        }
    }
}

fn check_all_variants(c: &Case) {
    let (coll, kj, max_abs) = build(c);
    let batch = coll.check_view(&kj).unwrap();
    let mut want = vec![f32::NAN; kj.batch_size() * coll.total_dim()];
    reference::pooled_lookup(&coll, batch, c.pooling, &mut want).unwrap();
    for isa in Isa::available_all() {
        for dedup in [Dedup::Off, Dedup::On, Dedup::Auto] {
            for threads in [1, 2] {
                for prefetch in [
                    Prefetch::Ids(0),
                    Prefetch::Ids(3),
                    Prefetch::Ids(16),
                    Prefetch::Auto,
                ] {
                    let opts = PoolOptions {
                        pooling: c.pooling,
                        dedup,
                        threads,
                        prefetch,
                        isa: Some(isa),
                    };
                    let pooler = Pooler::new(opts).unwrap();
                    // NaN-filled output: every element must be written.
                    let mut got = vec![f32::NAN; want.len()];
                    let stats = pooler.run(&coll, batch, &mut got).unwrap();
                    assert_eq!(stats.lookups, kj.num_ids());
                    if dedup == Dedup::Off {
                        assert_eq!(stats.deduped_units, 0);
                    }
                    let what = format!(
                        "{isa} {} dedup={dedup} threads={threads} pf={prefetch} {:?}",
                        c.dtype, c.pooling
                    );
                    assert_close(&coll, &kj, c.pooling, max_abs, &got, &want, &what);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    #[test]
    fn every_kernel_matches_the_reference(c in case_strategy()) {
        check_all_variants(&c);
    }
}

#[test]
fn empty_batch_and_all_empty_bags() {
    for dtype in DType::ALL {
        for batch in [0, 3] {
            let c = Case {
                seed: 9,
                dtype,
                dims: vec![17, 64],
                features: 3,
                batch,
                max_len: 0,
                pooling: Pooling::Mean,
                wide_ids: false,
            };
            check_all_variants(&c);
            let (coll, kj, _) = build(&c);
            let mut out = vec![f32::NAN; kj.batch_size() * coll.total_dim()];
            pooled_lookup(
                &coll,
                coll.check_view(&kj).unwrap(),
                Pooling::Mean,
                &mut out,
            )
            .unwrap();
            assert!(out.iter().all(|&x| x == 0.0), "empty bags give zeros");
        }
    }
}

#[test]
fn large_bags_with_heavy_reuse_dedup_on_every_isa() {
    // Long bags over few rows: auto must try dedup (it times both paths), and every call, whichever
    // path it takes, must match the reference.
    for dtype in DType::ALL {
        let c = Case {
            seed: 4,
            dtype,
            dims: vec![130],
            features: 2,
            batch: 64,
            max_len: 40,
            pooling: Pooling::WeightedSum,
            wide_ids: true,
        };
        check_all_variants(&c);
        let (coll, kj, max_abs) = build(&c);
        let batch = coll.check_view(&kj).unwrap();
        let mut want = vec![0f32; kj.batch_size() * coll.total_dim()];
        reference::pooled_lookup(&coll, batch, Pooling::WeightedSum, &mut want).unwrap();
        let pooler = Pooler::new(PoolOptions {
            pooling: Pooling::WeightedSum,
            dedup: Dedup::Auto,
            ..Default::default()
        })
        .unwrap();
        let mut total = PoolStats::default();
        for call in 0..12 {
            let mut out = vec![f32::NAN; want.len()];
            let st = pooler.run(&coll, batch, &mut out).unwrap();
            assert_close(
                &coll,
                &kj,
                Pooling::WeightedSum,
                max_abs,
                &out,
                &want,
                &format!("auto call {call} {dtype}"),
            );
            total.deduped_units += st.deduped_units;
            total.deduped_lookups += st.deduped_lookups;
            total.unique_rows += st.unique_rows;
        }
        assert!(
            total.deduped_units > 0 && total.unique_rows < total.deduped_lookups,
            "{total:?}"
        );
    }
}

#[test]
fn bad_calls_are_errors_not_panics() {
    let c = Case {
        seed: 1,
        dtype: DType::F32,
        dims: vec![8],
        features: 1,
        batch: 2,
        max_len: 3,
        pooling: Pooling::WeightedSum,
        wide_ids: false,
    };
    let (coll, kj, _) = build(&c);
    let batch = coll.check_view(&kj).unwrap();
    let pool = |pooling| {
        Pooler::new(PoolOptions {
            pooling,
            ..Default::default()
        })
        .unwrap()
    };
    let mut out = vec![0f32; 2 * 8];
    if kj.num_ids() > 0 {
        let e = pool(Pooling::Sum).run(&coll, batch, &mut out).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the batch carries per-id weights but pooling is sum; use weighted_sum"
        );
    }
    let e = pool(Pooling::WeightedSum)
        .run(&coll, batch, &mut out[..15])
        .unwrap_err();
    assert_eq!(
        e,
        EmbedError::OutputLen {
            got: 15,
            batch_size: 2,
            dim: 8,
            expected: 16
        }
    );
    let plain =
        KeyedJagged::from_lengths(vec!["f0".into()], 1, &[1], Ids::U32(vec![0]), None).unwrap();
    let e = pool(Pooling::WeightedSum)
        .run(&coll, coll.check_view(&plain).unwrap(), &mut out[..8])
        .unwrap_err();
    assert_eq!(e, EmbedError::MissingWeights);
    let e = Pooler::new(PoolOptions {
        threads: 0,
        ..Default::default()
    })
    .unwrap_err();
    assert!(e.to_string().contains("threads"), "{e}");
    for isa in Isa::ALL.into_iter().filter(|i| !i.available()) {
        let e = Pooler::new(PoolOptions {
            isa: Some(isa),
            ..Default::default()
        })
        .unwrap_err();
        assert_eq!(e, EmbedError::IsaUnavailable { isa: isa.name() });
    }
}

#[test]
fn quantized_pooling_stays_close_to_f32_pooling() {
    // Pooled int8 / f16 / bf16 outputs against pooled f32 outputs of the same source values.
    let mut rng = SmallRng::seed_from_u64(11);
    let (rows, dim, batch, len) = (500, 64, 32, 40);
    let vals: Vec<f32> = (0..rows * dim)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let ids: Vec<u32> = (0..batch * len)
        .map(|_| rng.random_range(0..rows as u32))
        .collect();
    let kj = KeyedJagged::from_lengths(
        vec!["t".into()],
        batch,
        &vec![len; batch],
        Ids::U32(ids),
        None,
    )
    .unwrap();
    let pooled = |dt: DType| {
        let coll = EmbeddingCollection::one_feature_per_table(vec![
            EmbeddingTable::from_f32("t", rows, dim, dt, &vals).unwrap(),
        ])
        .unwrap();
        let mut out = vec![0f32; batch * dim];
        pooled_lookup(&coll, coll.check_view(&kj).unwrap(), Pooling::Sum, &mut out).unwrap();
        out
    };
    let exact = pooled(DType::F32);
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    for (dt, bound) in [
        (DType::F16, 1e-3),
        (DType::BF16, 5e-3),
        (DType::Int8, 0.01),
        (DType::Int4, 0.15),
    ] {
        let q = pooled(dt);
        let diff: Vec<f32> = q.iter().zip(&exact).map(|(a, b)| a - b).collect();
        let rel = norm(&diff) / norm(&exact);
        assert!(rel < bound, "{dt}: relative error {rel} >= {bound}");
        assert!(rel > 0.0 || dt == DType::F32);
    }
}

#[test]
fn overlapping_calls_on_one_pooler_keep_results_and_stats_apart() {
    let c = Case {
        seed: 21,
        dtype: DType::Int8,
        dims: vec![33, 64],
        features: 3,
        batch: 16,
        max_len: 9,
        pooling: Pooling::Sum,
        wide_ids: false,
    };
    let (coll, kj, max_abs) = build(&c);
    let batch = coll.check_view(&kj).unwrap();
    let mut want = vec![0f32; kj.batch_size() * coll.total_dim()];
    reference::pooled_lookup(&coll, batch, Pooling::Sum, &mut want).unwrap();
    for threads in [1, 2] {
        let pooler = Pooler::new(PoolOptions {
            threads,
            dedup: Dedup::On,
            ..Default::default()
        })
        .unwrap();
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..20 {
                        let mut out = vec![f32::NAN; want.len()];
                        let st = pooler.run(&coll, batch, &mut out).unwrap();
                        assert_eq!(st.lookups, kj.num_ids(), "stats of one call only");
                        assert_close(
                            &coll,
                            &kj,
                            Pooling::Sum,
                            max_abs,
                            &out,
                            &want,
                            "overlapping calls",
                        );
                    }
                });
            }
        });
    }
}

#[test]
fn auto_prefetch_matches_the_reference_at_every_distance_it_tries() {
    // Units of >= 256 ids are timed, so 240 calls walk `auto` through every candidate distance
    // (and then its rechecks); each call, at whatever distance, must pool what the reference does.
    for dtype in [DType::F32, DType::Int8, DType::F16] {
        for pooling in [Pooling::Sum, Pooling::WeightedSum] {
            let c = Case {
                seed: 11,
                dtype,
                dims: vec![64, 37],
                features: 2,
                batch: 48,
                max_len: 20,
                pooling,
                wide_ids: false,
            };
            let (coll, kj, max_abs) = build(&c);
            assert!(kj.num_ids() >= 2 * 256, "units big enough to be timed");
            let batch = coll.check_view(&kj).unwrap();
            let mut want = vec![0f32; kj.batch_size() * coll.total_dim()];
            reference::pooled_lookup(&coll, batch, pooling, &mut want).unwrap();
            for isa in Isa::available_all() {
                let pooler = Pooler::new(PoolOptions {
                    pooling,
                    dedup: Dedup::Off,
                    prefetch: Prefetch::Auto,
                    isa: Some(isa),
                    ..Default::default()
                })
                .unwrap();
                for call in 0..240 {
                    let mut got = vec![f32::NAN; want.len()];
                    pooler.run(&coll, batch, &mut got).unwrap();
                    let what = format!("{isa} {dtype} {pooling:?} auto call {call}");
                    assert_close(&coll, &kj, pooling, max_abs, &got, &want, &what);
                }
                let chosen = pooler.prefetch_distances(&coll);
                assert!(
                    chosen
                        .iter()
                        .all(|d| d.is_some_and(|d| PREFETCH_CANDIDATES.contains(&d))),
                    "{isa} {dtype}: every row size settled on a candidate: {chosen:?}"
                );
            }
        }
    }
}
