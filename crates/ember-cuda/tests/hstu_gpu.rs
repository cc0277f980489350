//! HSTU models on the GPU against the reference and the CPU pass: the parity fixtures of
//! `ember-model` (odd widths: attention on CUDA cores) scored in f32 against the reference's
//! scores, alone and batched; random users of random lengths at the `hstu-small` and MLPerf
//! DLRMv3 widths (attention on tensor cores in bf16, both kernels) against the CPU's f32 pass;
//! an empty batch; a history cache on the GPU against the CPU's cached pass. Built where there
//! is no CUDA device, every test is ignored, saying why (build.rs).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::gpu;
use ember_cuda::{AttentionKernel, Gpu, GpuHstu, GpuHstuPredictor, Variant};
use ember_embed::DType;
use ember_model::hstu::presets::{preset, synthetic_users};
use ember_model::hstu::{AttentionNorm, HstuModel, HstuPredictor, HstuScores, User};
use ember_model::{DenseDType, LoadOptions};

/// `ember-model`'s fixture `name`: beside this crate where it was built, else under the current
/// directory's `crates/` (a test binary carried to a GPU machine runs from the repository root).
fn fixture(name: &str) -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ember-model/tests/fixtures");
    let dir = match built.is_dir() {
        true => built,
        false => PathBuf::from("crates/ember-model/tests/fixtures"),
    };
    dir.join(name)
}

fn fixture_users(name: &str) -> Vec<User> {
    std::fs::read_to_string(fixture(name).join("users.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn expected(name: &str, key: &str) -> Vec<BTreeMap<String, Vec<f32>>> {
    let text = std::fs::read_to_string(fixture(name).join("expected.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    serde_json::from_value(v[key].clone()).unwrap()
}

fn gpu_predictor(g: &Arc<Gpu>, m: &Arc<HstuModel>, dense: DenseDType) -> GpuHstuPredictor {
    let up = Arc::new(GpuHstu::upload(g, m.clone(), dense).unwrap());
    GpuHstuPredictor::new(up, Variant::Baseline).unwrap()
}

/// The largest error of user `u`'s scores against `want`, relative to `max(|want|, 1)`.
fn worst(got: &HstuScores, u: usize, want: &BTreeMap<String, Vec<f32>>) -> f32 {
    let mut worst = 0f32;
    for (t, task) in got.tasks.iter().enumerate() {
        let (g, w) = (got.user(t, u), &want[task]);
        assert_eq!(g.len(), w.len(), "task {task}: candidates");
        for (a, b) in g.iter().zip(w) {
            assert!(a.is_finite(), "task {task}: {a}");
            worst = worst.max((a - b).abs() / b.abs().max(1.0));
        }
    }
    worst
}

/// The largest difference of two batches' scores, relative to `max(|want|, 1)`.
fn diff(got: &HstuScores, want: &HstuScores) -> f32 {
    assert_eq!(got.offsets, want.offsets);
    assert_eq!(got.tasks, want.tasks);
    let mut worst = 0f32;
    for (g, w) in got.scores.iter().zip(&want.scores) {
        assert_eq!(g.len(), w.len());
        for (a, b) in g.iter().zip(w) {
            assert!(a.is_finite(), "{a}");
            worst = worst.max((a - b).abs() / b.abs().max(1.0));
        }
    }
    worst
}

/// Users of random lengths (history 1 to `max_h`, candidates 1 to `max_c`).
fn random_users(m: &HstuModel, n: usize, max_h: usize, max_c: usize, seed: u64) -> Vec<User> {
    let mut s = seed;
    let mut next = |k: usize| {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        1 + ((s >> 33) as usize) % k
    };
    (0..n)
        .map(|u| {
            let (h, c) = (next(max_h), next(max_c));
            synthetic_users(m.config(), 1, h, c, seed ^ u as u64)
                .pop()
                .unwrap()
        })
        .collect()
}

#[test]
#[cfg_attr(
    not(ember_cuda_device),
    ignore = "needs a CUDA device (none when built); a GPU machine runs it with --include-ignored"
)]
fn f32_matches_the_reference_fixtures_alone_and_batched() {
    let g = gpu();
    for name in ["hstu_small", "hstu_ctx2", "hstu_triton"] {
        let m = Arc::new(HstuModel::load(&fixture(name), LoadOptions::default()).unwrap());
        let us = fixture_users(name);
        let mut p = gpu_predictor(&g, &m, DenseDType::F32);
        assert!(!p.tensor_core_attention());
        let alone = expected(name, "alone");
        let mut e_max = 0f32;
        for (u, user) in us.iter().enumerate() {
            let b = m.check_users(std::slice::from_ref(user), u).unwrap();
            let (s, _) = p.run(&b).unwrap();
            e_max = e_max.max(worst(&s, 0, &alone[u]));
        }
        let b = m.check_users(&us, 0).unwrap();
        p.set_attention_norm(AttentionNorm::Alone);
        let (s, _) = p.run(&b).unwrap();
        for (u, want) in alone.iter().enumerate() {
            e_max = e_max.max(worst(&s, u, want));
        }
        let batched = expected(name, "batched");
        p.set_attention_norm(AttentionNorm::BatchMax);
        let (s, _) = p.run(&b).unwrap();
        for (u, want) in batched.iter().enumerate() {
            e_max = e_max.max(worst(&s, u, want));
        }
        eprintln!("{name}: GPU f32 against the reference, max rel err {e_max:.2e}");
        assert!(e_max < 2e-5, "{name}: max rel err {e_max}");
    }
}

/// `name` preset with small tables in f16, random weights.
fn preset_model(name: &str, rows_scale: f64) -> Arc<HstuModel> {
    let cfg = preset(name, rows_scale, DType::F16).unwrap();
    Arc::new(HstuModel::random(cfg, 11, 4).unwrap())
}

#[test]
#[cfg_attr(
    not(ember_cuda_device),
    ignore = "needs a CUDA device (none when built); a GPU machine runs it with --include-ignored"
)]
fn f32_and_bf16_match_the_cpu_on_random_users() {
    let g = gpu();
    // hstu-small: widths 32 (tensor cores in bf16); dlrm-v3: MLPerf's widths (128).
    for (name, scale, max_h, max_c) in [("hstu-small", 0.01, 300, 70), ("dlrm-v3", 1e-5, 1100, 300)]
    {
        let m = preset_model(name, scale);
        let mut cpu = HstuPredictor::new(m.clone(), 8).unwrap();
        let mut f32p = gpu_predictor(&g, &m, DenseDType::F32);
        let mut bf16p = gpu_predictor(&g, &m, DenseDType::Bf16);
        assert!(
            bf16p.tensor_core_attention(),
            "{name}: widths allow tensor cores"
        );
        let (mut e32, mut e16, mut e16_cuda_cores) = (0f32, 0f32, 0f32);
        let (mut e16_v2, mut v2_v1) = (0f32, 0f32);
        for (k, n) in [1usize, 3, 5].into_iter().enumerate() {
            let us = random_users(&m, n, max_h, max_c, 100 + k as u64);
            let b = m.check_users(&us, 0).unwrap();
            for norm in [AttentionNorm::Alone, AttentionNorm::BatchMax] {
                cpu.set_attention_norm(norm);
                f32p.set_attention_norm(norm);
                bf16p.set_attention_norm(norm);
                let want = cpu.run(&b).unwrap().0;
                e32 = e32.max(diff(&f32p.run(&b).unwrap().0, &want));
                bf16p.set_tensor_core_attention(true);
                bf16p.set_attention_kernel(AttentionKernel::V1);
                let v1 = bf16p.run(&b).unwrap().0;
                e16 = e16.max(diff(&v1, &want));
                bf16p.set_attention_kernel(AttentionKernel::V2);
                let v2 = bf16p.run(&b).unwrap().0;
                e16_v2 = e16_v2.max(diff(&v2, &want));
                v2_v1 = v2_v1.max(diff(&v2, &v1));
                bf16p.set_tensor_core_attention(false);
                e16_cuda_cores = e16_cuda_cores.max(diff(&bf16p.run(&b).unwrap().0, &want));
            }
        }
        eprintln!(
            "{name}: against the CPU's f32, GPU f32 {e32:.2e}, GPU bf16 {e16:.2e} (attention on \
             tensor cores, v1), {e16_v2:.2e} (v2; v2 against v1 {v2_v1:.2e}), \
             {e16_cuda_cores:.2e} (bf16 projections, f32 attention)"
        );
        assert!(e32 < 1e-4, "{name}: GPU f32 {e32}");
        assert!(e16 < 0.03, "{name}: GPU bf16 {e16}");
        assert!(e16_v2 < 0.03, "{name}: GPU bf16, kernel v2 {e16_v2}");
        // The same products summed in the same key order: only the chunks' atomic adds may
        // land in another order.
        assert!(v2_v1 < 1e-4, "{name}: kernel v2 against v1 {v2_v1}");
        assert!(
            e16_cuda_cores < 0.03,
            "{name}: GPU bf16, f32 attention {e16_cuda_cores}"
        );
    }
}

#[test]
#[cfg_attr(
    not(ember_cuda_device),
    ignore = "needs a CUDA device (none when built); a GPU machine runs it with --include-ignored"
)]
fn scores_do_not_depend_on_batch_mates_and_empty_batches_score_nothing() {
    let g = gpu();
    let m = preset_model("hstu-small", 0.01);
    let mut p = gpu_predictor(&g, &m, DenseDType::F32);
    let us = random_users(&m, 4, 200, 40, 7);
    let all = p.run(&m.check_users(&us, 0).unwrap()).unwrap().0;
    let last = p.run(&m.check_users(&us[3..], 0).unwrap()).unwrap().0;
    for t in 0..all.tasks.len() {
        for (a, b) in all.user(t, 3).iter().zip(last.user(t, 0)) {
            // Each user's rows are its own; cuBLAS may pick another GEMM kernel for another
            // batch size, which sums in another order.
            assert!((a - b).abs() <= 2e-5 * b.abs().max(1.0), "{a} vs {b}");
        }
    }
    let (s, _) = p.run(&m.check_users(&[], 0).unwrap()).unwrap();
    assert_eq!(s.offsets, vec![0]);
    assert!(s.scores.iter().all(|v| v.is_empty()));
}

/// Attention widths that `ldmatrix.x4` does not cover whole (q.k 48 = 32 + 16, output 24 =
/// 16 + 8: the v2 kernel reads the rest as v1 does), on tensor cores: both kernels against the
/// CPU's f32 pass and against each other, users of random lengths, batches of 1 and 4.
#[test]
#[cfg_attr(
    not(ember_cuda_device),
    ignore = "needs a CUDA device (none when built); a GPU machine runs it with --include-ignored"
)]
fn tensor_core_attention_at_widths_ldmatrix_does_not_cover() {
    let g = gpu();
    let mut cfg = preset("hstu-small", 0.01, DType::F16).unwrap();
    cfg.hstu.hstu_attn_qk_dim = 48;
    cfg.hstu.hstu_attn_linear_dim = 24;
    let m = Arc::new(HstuModel::random(cfg, 5, 4).unwrap());
    let mut cpu = HstuPredictor::new(m.clone(), 8).unwrap();
    let mut p = gpu_predictor(&g, &m, DenseDType::Bf16);
    assert!(p.tensor_core_attention(), "48 and 24 take tensor cores");
    let (mut e1, mut e2, mut e21) = (0f32, 0f32, 0f32);
    for (k, n) in [1usize, 4].into_iter().enumerate() {
        let us = random_users(&m, n, 400, 90, 300 + k as u64);
        let b = m.check_users(&us, 0).unwrap();
        let want = cpu.run(&b).unwrap().0;
        p.set_attention_kernel(AttentionKernel::V1);
        let v1 = p.run(&b).unwrap().0;
        p.set_attention_kernel(AttentionKernel::V2);
        let v2 = p.run(&b).unwrap().0;
        e1 = e1.max(diff(&v1, &want));
        e2 = e2.max(diff(&v2, &want));
        e21 = e21.max(diff(&v2, &v1));
    }
    eprintln!(
        "q.k 48, output 24: bf16 v1 {e1:.2e}, v2 {e2:.2e} against the CPU's f32; v2 against v1 {e21:.2e}"
    );
    assert!(e1 < 0.03 && e2 < 0.03, "v1 {e1}, v2 {e2}");
    assert!(e21 < 1e-4, "v2 against v1 {e21}");
}

/// `hstu-small` of seed 11 (f32 tables) with a history cache of its own (1 GiB, LRU, the default
/// staleness bound).
fn cached_model() -> Arc<HstuModel> {
    use ember_model::hstu::{Eviction, HistoryCacheConfig, Reuse};
    let cfg = preset("hstu-small", 0.01, DType::F32).unwrap();
    let mut m = HstuModel::random(cfg, 11, 4).unwrap();
    m.set_history_cache(Some(HistoryCacheConfig {
        bytes: 1 << 30,
        eviction: Eviction::Lru,
        reuse: Reuse::DEFAULT,
        spill: None,
        share: None,
    }))
    .unwrap();
    Arc::new(m)
}

/// A history cache on the GPU, against the CPU's cached pass on a cache of its own (the same
/// model): streaming users, first visits of 40 to 240 items, then returns of 1 to 8 new actions,
/// three users a pass. Per pass the same users reuse their entries on both sides and the
/// scores agree (f32 within 1e-4; bf16 projections and tensor-core attention within 0.03). One
/// cache is used by the GPU alone (its entries' device copies read back pass after pass), one
/// by the GPU and a CPU engine in turns (each device reading the other's entries).
#[test]
#[cfg_attr(
    not(ember_cuda_device),
    ignore = "needs a CUDA device (none when built); a GPU machine runs it with --include-ignored"
)]
fn a_history_cache_on_the_gpu_scores_as_the_cpu_s_does() {
    use ember_model::hstu::presets::UserStream;
    let g = gpu();
    for dense in [DenseDType::F32, DenseDType::Bf16] {
        let reference = cached_model();
        let mut cpu = HstuPredictor::new(reference.clone(), 8).unwrap();
        let alone = cached_model();
        let mut gpu_alone = gpu_predictor(&g, &alone, dense);
        let turns = cached_model();
        let mut gpu_turns = gpu_predictor(&g, &turns, dense);
        let mut cpu_turns = HstuPredictor::new(turns.clone(), 8).unwrap();
        let mut stream = UserStream::new(reference.config(), 6, 21);
        let mut requests: Vec<User> = (0..6).map(|u| stream.user(u, 40 + 40 * u, 20)).collect();
        requests.extend((0..18).map(|_| stream.next_request(8, 15, 400).1));
        let (mut e_alone, mut e_turns, mut hits) = (0f32, 0f32, 0usize);
        for (k, us) in requests.chunks(3).enumerate() {
            let b = reference.check_users(us, 0).unwrap();
            let (want, _, used) = cpu
                .run_cached(&b, reference.history_cache().unwrap())
                .unwrap();
            let (got, _, used_gpu) = gpu_alone
                .run_cached(&b, alone.history_cache().unwrap())
                .unwrap();
            assert_eq!(
                (used.hits, used.held_tokens, used.computed_tokens),
                (
                    used_gpu.hits,
                    used_gpu.held_tokens,
                    used_gpu.computed_tokens
                ),
                "pass {k}: what the GPU reused"
            );
            e_alone = e_alone.max(diff(&got, &want));
            let turn = match k % 2 == 0 || dense != DenseDType::F32 {
                true => {
                    gpu_turns
                        .run_cached(&b, turns.history_cache().unwrap())
                        .unwrap()
                        .0
                }
                false => {
                    cpu_turns
                        .run_cached(&b, turns.history_cache().unwrap())
                        .unwrap()
                        .0
                }
            };
            e_turns = e_turns.max(diff(&turn, &want));
            hits += used.hits;
        }
        let (held, budget) = gpu_alone.gpu_model().held_bytes();
        eprintln!(
            "history cache, GPU {dense}: against the CPU's cached pass {e_alone:.2e} (GPU alone), \
             {e_turns:.2e} (GPU and CPU in turns); {hits} users reused; {held} of {budget} bytes \
             of segments on the device"
        );
        assert!(hits >= 12, "returns reused their entries: {hits}");
        assert!(held > 0, "the GPU keeps its segments' copies");
        let bound = if dense == DenseDType::F32 { 1e-4 } else { 0.03 };
        assert!(e_alone < bound && e_turns < bound, "{e_alone} {e_turns}");
    }
}
