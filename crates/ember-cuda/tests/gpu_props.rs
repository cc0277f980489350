//! The GPU against the CPU reference, on the device: random tables (every dtype, odd dims,
//! features sharing tables), random batches (empty bags, empty batches, weights, u32 and i64
//! ids), every variant and pooling; and whole models (dot, cat, DCN) against the CPU
//! predictor. Built where there is no CUDA device, every test is ignored, saying why (build.rs);
//! run with `--include-ignored` there, a test skips, saying why.

mod common;

use std::sync::Arc;

use common::gpu;
use ember_cuda::{GpuEmbeddings, GpuModel, GpuPredictor, HotPlan, TuneCache, Variant};
use ember_embed::{
    DType, EmbeddingCollection, EmbeddingTable, Feature, Ids, KeyedJagged, Pooling, pooled_lookup,
};
use ember_model::config::{InteractionConfig, ModelConfig, PairOrder, PoolingName, TableConfig};
use ember_model::{Engine, Model, Predictor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A random collection: 1-4 tables of random dtype and (often odd) dim, 1-5 features.
fn random_collection(rng: &mut StdRng) -> EmbeddingCollection {
    let ntab = rng.random_range(1..=4);
    let dims = [1usize, 3, 8, 13, 16, 31, 64, 100, 128, 200, 256, 512];
    let tables: Vec<EmbeddingTable> = (0..ntab)
        .map(|t| {
            let rows = rng.random_range(1..3000);
            let dim = dims[rng.random_range(0..dims.len())];
            let dtype = DType::ALL[rng.random_range(0..DType::ALL.len())];
            let values: Vec<f32> = (0..rows * dim)
                .map(|_| rng.random::<f32>() * 2.0 - 1.0)
                .collect();
            EmbeddingTable::from_f32(&format!("t{t}"), rows, dim, dtype, &values).unwrap()
        })
        .collect();
    let nf = rng.random_range(1..=5);
    let features = (0..nf)
        .map(|f| Feature {
            name: format!("f{f}"),
            table: rng.random_range(0..ntab),
        })
        .collect();
    EmbeddingCollection::new(tables, features).unwrap()
}

/// A random batch: bags of 0-200 ids (some empty), a skewed id distribution (repeats, so that
/// dedup and pinning have work), weights when `weighted`, 32- or 64-bit ids.
fn random_batch(
    rng: &mut StdRng,
    coll: &EmbeddingCollection,
    batch: usize,
    weighted: bool,
) -> KeyedJagged {
    let nf = coll.features().len();
    let mut lengths = Vec::new();
    let mut ids = Vec::new();
    for f in 0..nf {
        let rows = coll.table_of(f).rows();
        for _ in 0..batch {
            let len = if rng.random_bool(0.1) {
                0
            } else {
                rng.random_range(0..200)
            };
            lengths.push(len);
            for _ in 0..len {
                let id = if rng.random_bool(0.7) {
                    rng.random_range(0..rows.min(20))
                } else {
                    rng.random_range(0..rows)
                };
                ids.push(id as i64);
            }
        }
    }
    let weights = weighted.then(|| {
        (0..ids.len())
            .map(|_| rng.random::<f32>() * 2.0 - 0.5)
            .collect::<Vec<f32>>()
    });
    let ids = if rng.random_bool(0.5) {
        Ids::I64(ids)
    } else {
        Ids::U32(ids.iter().map(|&i| i as u32).collect())
    };
    KeyedJagged::from_lengths(coll.feature_names(), batch, &lengths, ids, weights).unwrap()
}

/// |gpu - ref| within f32 accumulation error of the bag's magnitude.
fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = 1e-4 * w.abs().max(1.0) * 8.0;
        assert!(
            (g - w).abs() <= tol && g.is_finite(),
            "{what}: element {i}: gpu {g} vs reference {w}"
        );
    }
}

#[test]
#[cfg_attr(
    not(ember_cuda_device),
    ignore = "needs a CUDA device (none when built); a GPU machine runs it with --include-ignored"
)]
fn every_variant_matches_the_cpu_reference() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(2024);
    let mut cache = TuneCache::in_memory();
    for case in 0..24 {
        let coll = random_collection(&mut rng);
        let batch = [0usize, 1, 7, 64, 129][case % 5];
        let profile = random_batch(&mut rng, &coll, batch, false);
        let strides_total: usize = coll.tables().iter().map(|t| t.bytes()).sum();
        let plan =
            HotPlan::profile(&coll, std::slice::from_ref(&profile), strides_total / 2).unwrap();
        let plain = GpuEmbeddings::upload(&gpu, &coll, None).unwrap();
        let pinned = GpuEmbeddings::upload(&gpu, &coll, Some(&plan)).unwrap();
        for pooling in [Pooling::Sum, Pooling::Mean, Pooling::WeightedSum] {
            let weighted = pooling == Pooling::WeightedSum;
            let kj = random_batch(&mut rng, &coll, batch, weighted);
            let mut want = vec![0f32; batch * coll.total_dim()];
            pooled_lookup(&coll, coll.check_view(&kj).unwrap(), pooling, &mut want).unwrap();
            for variant in Variant::ALL {
                // The tuned variants compile and time ~20 kernels per new shape: a few cases.
                if matches!(variant, Variant::Tuned | Variant::Combined) && case >= 6 {
                    continue;
                }
                let emb = if variant.pins_l2() { &pinned } else { &plain };
                let mut run = emb.runner(variant, pooling).unwrap();
                // 64-bit ids travel as 32-bit ones by default; every other case keeps them wide
                // (the 64-bit kernels).
                run.narrow_ids(case % 2 == 0);
                run.upload(emb, &coll, &kj).unwrap();
                run.tune(emb, &mut cache).unwrap();
                let mut got = vec![f32::NAN; want.len()];
                run.launch(emb).unwrap();
                run.download(emb, &mut got).unwrap();
                assert_close(&got, &want, &format!("case {case} {variant} {pooling:?}"));
                // A second batch through the same runner (buffers reused, dedup state reset).
                let kj2 = random_batch(&mut rng, &coll, batch + 3, weighted);
                let mut want2 = vec![0f32; (batch + 3) * coll.total_dim()];
                pooled_lookup(&coll, coll.check_view(&kj2).unwrap(), pooling, &mut want2).unwrap();
                let mut got2 = vec![f32::NAN; want2.len()];
                run.pool(emb, &coll, &kj2, &mut got2).unwrap();
                assert_close(
                    &got2,
                    &want2,
                    &format!("case {case} {variant} {pooling:?} again"),
                );
            }
        }
    }
}

#[test]
#[cfg_attr(
    not(ember_cuda_device),
    ignore = "needs a CUDA device (none when built); a GPU machine runs it with --include-ignored"
)]
fn every_launch_the_tuner_can_pick_is_correct() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(99);
    let values: Vec<f32> = (0..5000 * 128).map(|_| rng.random::<f32>() - 0.5).collect();
    for dtype in [DType::F32, DType::F16, DType::Int8] {
        let tables = vec![
            EmbeddingTable::from_f32("a", 5000, 128, dtype, &values).unwrap(),
            EmbeddingTable::from_f32("b", 2500, 256, dtype, &values[..2500 * 256]).unwrap(),
        ];
        let coll = EmbeddingCollection::one_feature_per_table(tables).unwrap();
        let kj = random_batch(&mut rng, &coll, 100, true);
        let mut want = vec![0f32; 100 * coll.total_dim()];
        pooled_lookup(
            &coll,
            coll.check_view(&kj).unwrap(),
            Pooling::WeightedSum,
            &mut want,
        )
        .unwrap();
        let emb = GpuEmbeddings::upload(&gpu, &coll, None).unwrap();
        let mut launches = ember_cuda::tune::occupancy_grid(1);
        for base in ember_cuda::tune::occupancy_grid(1) {
            launches.extend(ember_cuda::tune::prefetch_grid(base));
        }
        for launch in launches {
            let mut run = emb.runner(Variant::Baseline, Pooling::WeightedSum).unwrap();
            run.force_launch(launch);
            let mut got = vec![f32::NAN; want.len()];
            match run.pool(&emb, &coll, &kj, &mut got) {
                Ok(()) => assert_close(&got, &want, &format!("{dtype} {launch:?}")),
                // A register cap too small for the block cannot launch; the tuner skips it.
                Err(e) if e.to_string().contains("OUT_OF_RESOURCES") => {}
                Err(e) => panic!("{dtype} {launch:?}: {e}"),
            }
        }
    }
}

#[test]
#[cfg_attr(
    not(ember_cuda_device),
    ignore = "needs a CUDA device (none when built); a GPU machine runs it with --include-ignored"
)]
fn bad_batches_are_refused_before_the_device_sees_them() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(5);
    let coll = random_collection(&mut rng);
    let emb = GpuEmbeddings::upload(&gpu, &coll, None).unwrap();
    let mut run = emb.runner(Variant::Baseline, Pooling::Sum).unwrap();
    let rows = coll.table_of(0).rows();
    let nf = coll.features().len();
    let mut lengths = vec![0usize; nf];
    lengths[0] = 1;
    let kj = KeyedJagged::from_lengths(
        coll.feature_names(),
        1,
        &lengths,
        Ids::I64(vec![rows as i64]),
        None,
    )
    .unwrap();
    let e = run.upload(&emb, &coll, &kj).unwrap_err().to_string();
    assert!(e.contains(&rows.to_string()), "{e}");
    // Weighted pooling without weights, and weights with plain sums: the CPU's rule.
    let one = |weights: Option<Vec<f32>>| {
        KeyedJagged::from_lengths(
            coll.feature_names(),
            1,
            &lengths,
            Ids::U32(vec![0]),
            weights,
        )
        .unwrap()
    };
    let mut wrun = emb.runner(Variant::Baseline, Pooling::WeightedSum).unwrap();
    let e = wrun
        .upload(&emb, &coll, &one(None))
        .unwrap_err()
        .to_string();
    assert!(e.contains("weights"), "{e}");
    let e = run
        .upload(&emb, &coll, &one(Some(vec![0.5])))
        .unwrap_err()
        .to_string();
    assert!(e.contains("weights") && e.contains("sum"), "{e}");
    let mut run = wrun;
    // Pinning variants need a plan.
    assert!(emb.runner(Variant::L2Pin, Pooling::Sum).is_err());
    // The runner still works after the refusals.
    let good = random_batch(&mut rng, &coll, 4, true);
    let mut out = vec![0f32; 4 * coll.total_dim()];
    run.pool(&emb, &coll, &good, &mut out).unwrap();
}

fn model_config(interaction: InteractionConfig, dtype: DType, pooling: PoolingName) -> ModelConfig {
    ModelConfig {
        format: ember_model::config::FORMAT.into(),
        format_version: ember_model::config::FORMAT_VERSION,
        family: None,
        dense_in: 13,
        bottom_mlp: vec![64, 16],
        interaction,
        top_mlp: vec![48, 1],
        tables: (0..5)
            .map(|i| TableConfig {
                name: format!("t{i}"),
                rows: 1000 + 37 * i,
                dim: 16,
                dtype,
                placement: Default::default(),
            })
            .collect(),
        features: None,
        pooling,
        dense_dtype: Default::default(),
        tier: None,
        remote: None,
    }
}

#[test]
#[cfg_attr(
    not(ember_cuda_device),
    ignore = "needs a CUDA device (none when built); a GPU machine runs it with --include-ignored"
)]
fn whole_models_match_the_cpu_predictor() {
    let gpu = gpu();
    let interactions = [
        InteractionConfig::Dot {
            self_interaction: false,
            pair_order: PairOrder::Lower,
        },
        InteractionConfig::Dot {
            self_interaction: false,
            pair_order: PairOrder::Upper,
        },
        InteractionConfig::Dot {
            self_interaction: true,
            pair_order: PairOrder::Lower,
        },
        InteractionConfig::Cat {},
        InteractionConfig::Dcn {
            layers: 2,
            low_rank: 8,
        },
    ];
    for (k, inter) in interactions.into_iter().enumerate() {
        for (dtype, pooling) in [
            (DType::F32, PoolingName::Sum),
            (DType::Int8, PoolingName::Mean),
        ] {
            let cfg = model_config(inter.clone(), dtype, pooling);
            let model = Arc::new(Model::random(cfg.clone(), 11 + k as u64, 1).unwrap());
            let gm = Arc::new(GpuModel::upload(&gpu, model.clone(), None).unwrap());
            for variant in [Variant::Baseline, Variant::Combined, Variant::Dedup] {
                let gm = if variant.pins_l2() {
                    let (_, kj) = ember_model::presets::random_batch(&cfg, 64, 10, 3);
                    let plan = HotPlan::profile(model.embeddings(), &[kj], 64 << 10).unwrap();
                    Arc::new(GpuModel::upload(&gpu, model.clone(), Some(&plan)).unwrap())
                } else {
                    gm.clone()
                };
                let mut gp = GpuPredictor::new(gm, variant).unwrap();
                let mut cpu = Predictor::new(model.clone(), 1).unwrap();
                // Several batches, as many in flight as the predictor takes, sizes changing
                // (buffers grow).
                let batches: Vec<_> = [5usize, 300, 0, 1, 64]
                    .iter()
                    .enumerate()
                    .map(|(i, &b)| ember_model::presets::random_batch(&cfg, b, 7, 100 + i as u64))
                    .collect();
                let mut want = Vec::new();
                for (dense, kj) in &batches {
                    let mut s = vec![0f32; kj.batch_size()];
                    cpu.score(dense, kj, &mut s).unwrap();
                    want.push(s);
                }
                let mut i_out = 0;
                let mut collect_one = |gp: &mut GpuPredictor| {
                    let mut got = vec![f32::NAN; want[i_out].len()];
                    gp.collect(&mut got).unwrap();
                    for (g, w) in got.iter().zip(&want[i_out]) {
                        assert!(
                            (g - w).abs() <= 1e-4,
                            "{inter:?} {dtype} {variant} batch {i_out}: {g} vs {w}"
                        );
                    }
                    i_out += 1;
                };
                for (dense, kj) in &batches {
                    if gp.in_flight() == gp.capacity() {
                        collect_one(&mut gp);
                    }
                    gp.submit(dense, kj).unwrap();
                }
                while gp.in_flight() > 0 {
                    collect_one(&mut gp);
                }
                assert_eq!(i_out, batches.len());
                // Bad input: an error, and the predictor goes on.
                let (dense, kj) = &batches[1];
                assert!(
                    gp.predict(&dense[1..], kj, &mut vec![0.0; kj.batch_size()])
                        .is_err()
                );
                let mut nan = dense.clone();
                nan[3] = f32::NAN;
                assert!(
                    gp.predict(&nan, kj, &mut vec![0.0; kj.batch_size()])
                        .is_err()
                );
                // An id past its table's end: refused as the CPU refuses it, word for word.
                let mut bad_ids: Vec<i64> = (0..kj.num_ids()).map(|i| kj.ids().get(i)).collect();
                let at = bad_ids.len() / 2;
                bad_ids[at] = 1 << 40;
                let bad = KeyedJagged::from_offsets(
                    kj.keys().to_vec(),
                    kj.batch_size(),
                    kj.offsets().to_vec(),
                    Ids::I64(bad_ids),
                    None,
                )
                .unwrap();
                let cpu_err = model.batch(dense, &bad).map(|_| ()).unwrap_err();
                let gpu_err = gp
                    .predict(dense, &bad, &mut vec![0.0; kj.batch_size()])
                    .unwrap_err();
                assert!(
                    gpu_err.to_string().contains(&cpu_err.to_string()),
                    "{gpu_err} / {cpu_err}"
                );
                let mut s = vec![0f32; kj.batch_size()];
                gp.predict(dense, kj, &mut s).unwrap();
                assert!(s.iter().zip(&want[1]).all(|(g, w)| (g - w).abs() <= 1e-4));
            }
        }
    }
}

/// bf16 dense layers on tensor cores (cuBLASLt) against the CPU's f32 predictor, on every
/// interaction, batch sizes changing. Tolerance: a score within 0.05 of f32's, 0.004 on average,
/// about twice what an H200 measured over these 2,418 samples (dot: max 1.36e-2, mean 1.1e-3;
/// the 3-layer cross net: max 2.47e-2, mean 1.9e-3). Looser than the CPU's bf16 (0.015 /
/// 0.0025, ember-model's tests/dense_dtype.rs, measured on other models): every layer's
/// output here is rounded to bf16, as under PyTorch's autocast.
#[test]
#[cfg_attr(
    not(ember_cuda_device),
    ignore = "needs a CUDA device (none when built); a GPU machine runs it with --include-ignored"
)]
fn bf16_dense_layers_score_within_bf16_tolerance_of_f32() {
    let gpu = gpu();
    let interactions = [
        InteractionConfig::Dot {
            self_interaction: false,
            pair_order: PairOrder::Lower,
        },
        InteractionConfig::Cat {},
        InteractionConfig::Dcn {
            layers: 3,
            low_rank: 24,
        },
    ];
    for (k, inter) in interactions.into_iter().enumerate() {
        let cfg = model_config(inter.clone(), DType::F32, PoolingName::Sum);
        let model = Arc::new(Model::random(cfg.clone(), 31 + k as u64, 1).unwrap());
        let gm = GpuModel::upload_dense(&gpu, model.clone(), None, ember_model::DenseDType::Bf16);
        let gm = Arc::new(gm.unwrap());
        assert_eq!(gm.dense_dtype(), ember_model::DenseDType::Bf16);
        let mut gp = GpuPredictor::new(gm, Variant::Prefetch).unwrap();
        let mut cpu = Predictor::new(model.clone(), 1).unwrap();
        let (mut max, mut sum, mut n) = (0f32, 0f32, 0usize);
        for (i, b) in [300usize, 5, 0, 1, 2048, 64].into_iter().enumerate() {
            let (dense, kj) = ember_model::presets::random_batch(&cfg, b, 7, 500 + i as u64);
            let mut want = vec![0f32; b];
            cpu.score(&dense, &kj, &mut want).unwrap();
            let mut got = vec![f32::NAN; b];
            gp.predict(&dense, &kj, &mut got).unwrap();
            for (g, w) in got.iter().zip(&want) {
                assert!(g.is_finite(), "{inter:?} batch {b}: {g}");
                max = max.max((g - w).abs());
                sum += (g - w).abs();
            }
            n += b;
        }
        let mean = sum / n as f32;
        eprintln!("bf16 on the GPU, {inter:?}: |score - f32| max {max:e}, mean {mean:e} over {n}");
        assert!(
            max > 0.0,
            "{inter:?}: bf16 scores identical to f32's: bf16 did not run"
        );
        assert!(
            max <= 0.05 && mean <= 0.004,
            "{inter:?}: max {max:e}, mean {mean:e}"
        );
    }
    // int8 dense layers are refused, saying so.
    let cfg = model_config(InteractionConfig::Cat {}, DType::F32, PoolingName::Sum);
    let model = Arc::new(Model::random(cfg, 5, 1).unwrap());
    let e = GpuModel::upload_dense(&gpu, model, None, ember_model::DenseDType::Int8).unwrap_err();
    assert!(e.to_string().contains("int8"), "{e}");
}

/// Batches handed over in page-locked memory and checked on the device score as the CPU does;
/// a bad one (an id past its table, a dense value not finite, at a random place) is refused
/// with the CPU's words and no score, dense values first as the CPU checks them, and the
/// predictor goes on.
#[test]
#[cfg_attr(
    not(ember_cuda_device),
    ignore = "needs a CUDA device (none when built); a GPU machine runs it with --include-ignored"
)]
fn pinned_batches_are_checked_on_the_device() {
    let gpu = gpu();
    let mut rng = StdRng::seed_from_u64(17);
    for (k, (dense_dtype, inter)) in [
        (
            ember_model::DenseDType::F32,
            InteractionConfig::Dot {
                self_interaction: false,
                pair_order: PairOrder::Lower,
            },
        ),
        (
            ember_model::DenseDType::Bf16,
            InteractionConfig::Dcn {
                layers: 2,
                low_rank: 8,
            },
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let cfg = model_config(inter, DType::Int8, PoolingName::Sum);
        let model = Arc::new(Model::random(cfg.clone(), 50 + k as u64, 1).unwrap());
        let gm = Arc::new(GpuModel::upload_dense(&gpu, model.clone(), None, dense_dtype).unwrap());
        let mut staged = GpuPredictor::new(gm.clone(), Variant::Baseline).unwrap();
        let mut gp = GpuPredictor::new(gm, Variant::Prefetch).unwrap();
        assert!(gp.set_capacity(0).is_err() && gp.set_capacity(9).is_err());
        gp.set_capacity(2 + k).unwrap();
        assert_eq!(gp.capacity(), 2 + k);
        let batches: Vec<_> = [5usize, 300, 0, 1, 64, 2048]
            .iter()
            .enumerate()
            .map(|(i, &b)| ember_model::presets::random_batch(&cfg, b, 7, 900 + i as u64))
            .collect();
        // Good batches, as many in flight as the predictor takes: the staged path's scores.
        let pinned: Vec<_> = batches.iter().map(|(d, s)| gp.pin(d, s).unwrap()).collect();
        let mut want = Vec::new();
        for (d, s) in &batches {
            let mut w = vec![0f32; s.batch_size()];
            staged.predict(d, s, &mut w).unwrap();
            want.push(w);
        }
        let mut next = 0;
        for (i, p) in pinned.iter().enumerate() {
            if gp.in_flight() == gp.capacity() {
                let mut got = vec![f32::NAN; want[next].len()];
                gp.collect(&mut got).unwrap();
                assert_eq!(got, want[next], "{dense_dtype} batch {next}");
                next += 1;
            }
            gp.submit_pinned(p).unwrap();
            assert_eq!(gp.in_flight(), (i + 1 - next).min(gp.capacity()));
        }
        while gp.in_flight() > 0 {
            let mut got = vec![f32::NAN; want[next].len()];
            gp.collect(&mut got).unwrap();
            assert_eq!(got, want[next], "{dense_dtype} batch {next}");
            next += 1;
        }
        // Bad batches: refused as Model::batch refuses them.
        for round in 0..12 {
            let (dense, kj) = &batches[1 + round % 2 * 3]; // 300 or 64 samples
            let mut d = dense.clone();
            let mut ids: Vec<i64> = (0..kj.num_ids()).map(|i| kj.ids().get(i)).collect();
            let (bad_id, bad_dense) = (round % 3 != 1, round % 3 != 0);
            if bad_id {
                let at = rng.random_range(0..ids.len());
                ids[at] = if round % 2 == 0 {
                    1 << 40
                } else {
                    1000 + 37 * 4
                };
            }
            if bad_dense {
                let at = rng.random_range(0..d.len());
                d[at] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][round % 3];
            }
            let bad = KeyedJagged::from_offsets(
                kj.keys().to_vec(),
                kj.batch_size(),
                kj.offsets().to_vec(),
                Ids::I64(ids),
                None,
            )
            .unwrap();
            let cpu_err = model.batch(&d, &bad).map(|_| ()).unwrap_err().to_string();
            let p = gp.pin(&d, &bad).unwrap();
            gp.submit_pinned(&p).unwrap();
            let mut got = vec![f32::NAN; kj.batch_size()];
            let e = gp.collect(&mut got).unwrap_err().to_string();
            assert_eq!(e, cpu_err, "round {round}");
            assert!(
                got.iter().all(|v| v.is_nan()),
                "round {round}: scores of a refused batch"
            );
            // And the next good batch scores right.
            gp.submit_pinned(&pinned[1]).unwrap();
            let mut ok = vec![0f32; want[1].len()];
            gp.collect(&mut ok).unwrap();
            assert_eq!(ok, want[1], "round {round}");
        }
    }
    // Dedup reads offsets on the host: a page-locked batch is refused, saying so.
    let cfg = model_config(InteractionConfig::Cat {}, DType::F32, PoolingName::Sum);
    let model = Arc::new(Model::random(cfg.clone(), 5, 1).unwrap());
    let gm = Arc::new(GpuModel::upload(&gpu, model, None).unwrap());
    let mut gp = GpuPredictor::new(gm, Variant::Dedup).unwrap();
    let (d, s) = ember_model::presets::random_batch(&cfg, 8, 3, 1);
    let p = gp.pin(&d, &s).unwrap();
    let e = gp.submit_pinned(&p).unwrap_err().to_string();
    assert!(e.contains("dedup"), "{e}");
    // A batch pinned for another model's shape is refused, saying so.
    let mut other_cfg = model_config(InteractionConfig::Cat {}, DType::F32, PoolingName::Sum);
    other_cfg.dense_in = 7;
    let other = Arc::new(Model::random(other_cfg, 6, 1).unwrap());
    let ogm = Arc::new(GpuModel::upload(&gpu, other, None).unwrap());
    let mut ogp = GpuPredictor::new(ogm, Variant::Baseline).unwrap();
    let e = ogp.submit_pinned(&p).unwrap_err().to_string();
    assert!(e.contains("another model"), "{e}");
}
