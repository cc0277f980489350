//! Parity with PyTorch: each fixture under `tests/fixtures/` is a model exported by
//! `tools/export_torch.py` from a real PyTorch module with random weights, plus inputs and the
//! module's outputs (`tools/make_fixtures.py`). Ember must match to 1e-5 relative error with f32
//! tables, and stay close when the tables are quantized at load.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ember_embed::{DType, Ids, KeyedJagged};
use ember_model::{Engine, LoadOptions, Model, ModelError, Predictor};
use safetensors::SafeTensors;

struct Fixture {
    dense: Vec<f32>,
    lengths: Vec<usize>,
    ids: Vec<i64>,
    logits: Vec<f32>,
    scores: Vec<f32>,
}

fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn read(name: &str) -> Fixture {
    let bytes = std::fs::read(dir(name).join("inputs.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let f32s = |n: &str| -> Vec<f32> {
        st.tensor(n)
            .unwrap()
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let i64s = |n: &str| -> Vec<i64> {
        st.tensor(n)
            .unwrap()
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    Fixture {
        dense: f32s("dense"),
        lengths: i64s("lengths").into_iter().map(|l| l as usize).collect(),
        ids: i64s("ids"),
        logits: f32s("logits"),
        scores: f32s("scores"),
    }
}

/// The fixture's sparse inputs as a batch of `model`'s features.
fn fixture_batch(model: &Model, fx: &Fixture) -> KeyedJagged {
    let batch = fx.logits.len();
    KeyedJagged::from_lengths(
        model.feature_names(),
        batch,
        &fx.lengths,
        Ids::I64(fx.ids.clone()),
        None,
    )
    .unwrap()
}

fn run(name: &str, opts: LoadOptions, threads: usize) -> (Fixture, Vec<f32>, Vec<f32>) {
    let model = Arc::new(Model::load(&dir(name), opts).unwrap());
    let fx = read(name);
    let batch = fx.logits.len();
    let kj = fixture_batch(&model, &fx);
    let mut p = Predictor::new(model, threads).unwrap();
    let mut logits = vec![f32::NAN; batch];
    logits_of(&mut p, &fx.dense, &kj, &mut logits).unwrap();
    let mut scores = vec![f32::NAN; batch];
    p.score(&fx.dense, &kj, &mut scores).unwrap();
    (fx, logits, scores)
}

/// The logits of one batch: checked, prepared (tier rows staged) and run.
fn logits_of(
    p: &mut Predictor,
    dense: &[f32],
    kj: &KeyedJagged,
    out: &mut [f32],
) -> ember_model::Result<ember_model::StageTimes> {
    let model = p.model().clone();
    let prepared = model.prepare(model.batch(dense, kj)?)?;
    p.logits(&prepared, out)
}

/// Largest `|got - want| / max(|want|, 1)`: relative error, measured against 1 for values near
/// zero (where a relative error says nothing about the model: a logit of 1e-4 off by 1e-9).
fn max_rel(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / w.abs().max(1.0))
        .fold(0.0, f32::max)
}

fn check_f32(name: &str) {
    for threads in [1, 2] {
        let (fx, logits, scores) = run(name, LoadOptions::default(), threads);
        // Not a degenerate fixture: logits spread on both sides of zero, empty bags present.
        assert!(fx.logits.iter().any(|&l| l > 0.5) && fx.logits.iter().any(|&l| l < -0.5));
        assert!(fx.lengths.contains(&0) && fx.lengths.iter().any(|&l| l > 1));
        let (rl, rs) = (max_rel(&logits, &fx.logits), max_rel(&scores, &fx.scores));
        assert!(
            rl <= 1e-5 && rs <= 1e-5,
            "{name}, {threads} threads: logits {rl:e}, scores {rs:e}"
        );
    }
}

#[test]
fn dlrm_dot_matches_pytorch() {
    check_f32("dlrm_dot");
}

#[test]
fn dlrm_dot_self_interaction_matches_pytorch() {
    check_f32("dlrm_dot_self");
}

#[test]
fn dlrm_cat_matches_pytorch() {
    check_f32("dlrm_cat");
}

#[test]
fn torchrec_dlrm_matches_pytorch() {
    check_f32("torchrec_dlrm");
}

#[test]
fn torchrec_dlrm_dcn_matches_pytorch() {
    check_f32("torchrec_dcn");
}

/// Tables quantized at export by FBGEMM's own prepack (`tools/export_torch.py --dtype`): Ember reads
/// the bytes as FBGEMM reads them; the expected outputs are PyTorch's on FBGEMM's dequantized rows.
#[test]
fn fbgemm_quantized_exports_match_pytorch() {
    for name in ["dlrm_dot_int8", "dlrm_dot_int4", "torchrec_dcn_int8"] {
        let cfg = std::fs::read_to_string(dir(name).join("config.json")).unwrap();
        let dtype = if name.ends_with("int4") {
            "int4"
        } else {
            "int8"
        };
        assert!(
            cfg.contains(&format!("\"dtype\": \"{dtype}\"")),
            "{name}: {cfg}"
        );
        for threads in [1, 2] {
            let (fx, logits, _) = run(name, LoadOptions::default(), threads);
            let r = max_rel(&logits, &fx.logits);
            assert!(r <= 1e-5, "{name}, {threads} threads: {r:e}");
        }
    }
}

#[test]
fn quantized_tables_stay_close() {
    for (dtype, tol) in [
        (DType::F16, 2e-3),
        (DType::BF16, 1.5e-2),
        (DType::Int8, 2e-2),
    ] {
        for name in ["dlrm_dot", "torchrec_dcn"] {
            let opts = LoadOptions {
                table_dtype: Some(dtype),
                ..LoadOptions::default()
            };
            let (fx, _, scores) = run(name, opts, 1);
            let err = scores
                .iter()
                .zip(&fx.scores)
                .map(|(g, w)| (g - w).abs())
                .fold(0.0, f32::max);
            assert!(
                err <= tol,
                "{name} with {dtype} tables: max score error {err}"
            );
            assert!(
                err > 0.0,
                "{name} with {dtype}: quantization changed nothing?"
            );
        }
    }
}

#[test]
fn bad_batches_are_refused_and_the_predictor_keeps_working() {
    let model = Arc::new(Model::load(&dir("dlrm_dot"), LoadOptions::default()).unwrap());
    let fx = read("dlrm_dot");
    let batch = fx.logits.len();
    let names = model.feature_names();
    let kj = |ids: Vec<i64>| {
        KeyedJagged::from_lengths(names.clone(), batch, &fx.lengths, Ids::I64(ids), None).unwrap()
    };
    let mut p = Predictor::new(model.clone(), 1).unwrap();
    let mut out = vec![0f32; batch];
    // Out-of-range id.
    let mut ids = fx.ids.clone();
    ids[3] = 1 << 40;
    let e = p.score(&fx.dense, &kj(ids), &mut out).unwrap_err();
    assert!(e.to_string().contains("out of range"), "{e}");
    // Dense of the wrong width.
    let e = p
        .score(&fx.dense[1..], &kj(fx.ids.clone()), &mut out)
        .unwrap_err();
    assert!(
        matches!(e, ModelError::Input(_)) && e.to_string().contains("not a multiple"),
        "{e}"
    );
    // Non-finite dense value.
    let mut dense = fx.dense.clone();
    dense[7] = f32::NAN;
    let e = p.score(&dense, &kj(fx.ids.clone()), &mut out).unwrap_err();
    assert!(e.to_string().contains("must be finite"), "{e}");
    // Wrong output length.
    let e = p
        .score(&fx.dense, &kj(fx.ids.clone()), &mut out[1..])
        .unwrap_err();
    assert!(e.to_string().contains("room for"), "{e}");
    // Still serves the good batch.
    p.score(&fx.dense, &kj(fx.ids.clone()), &mut out).unwrap();
    assert!(max_rel(&out, &fx.scores) <= 1e-5);
    // Empty batch.
    let empty = KeyedJagged::from_lengths(names.clone(), 0, &[], Ids::I64(vec![]), None).unwrap();
    let mut none: [f32; 0] = [];
    p.score(&[], &empty, &mut none).unwrap();
}

#[test]
fn broken_model_directories_name_the_problem() {
    let tmp = std::env::temp_dir().join(format!("ember-parity-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let src = dir("dlrm_dot");
    let config = std::fs::read_to_string(src.join("config.json")).unwrap();
    let weights = std::fs::read(src.join("model.safetensors")).unwrap();
    let load = |cfg: &str, w: &[u8]| {
        std::fs::write(tmp.join("config.json"), cfg).unwrap();
        std::fs::write(tmp.join("model.safetensors"), w).unwrap();
        Model::load(&tmp, LoadOptions::default())
            .unwrap_err()
            .to_string()
    };
    let e = load(&config, &weights[..weights.len() - 100]);
    assert!(e.contains("safetensors"), "{e}");
    let e = load(&config.replacen("\"rows\": ", "\"rows\": 1", 1), &weights);
    assert!(e.contains("tables.") && e.contains("shape"), "{e}");
    // A dot config's fields under "cat" are refused, not ignored.
    let e = load(&config.replacen("\"dot\"", "\"cat\"", 1), &weights);
    assert!(e.contains("unknown field `self_interaction`"), "{e}");
    let mut v: serde_json::Value = serde_json::from_str(&config).unwrap();
    v["interaction"] = serde_json::json!({"kind": "cat"});
    let e = load(&v.to_string(), &weights);
    assert!(e.contains("top_mlp.0.weight") && e.contains("shape"), "{e}");
    let e = load(
        &config.replacen("\"format_version\": 1", "\"format_version\": 9", 1),
        &weights,
    );
    assert!(e.contains("format_version 9"), "{e}");
    let e = load("{", &weights);
    assert!(e.contains("config.json"), "{e}");
    let e = Model::load(&tmp.join("nope"), LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a model directory"), "{e}");
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// Tables on the SSD tier or mapped from row files score exactly as in memory: the same bytes,
/// the same kernels. Also through config.json's `placement` and `tier`, with an empty cache (every
/// row read from disk) and pipelined staging, and a clear error when a row file is missing.
#[test]
fn tables_on_the_ssd_tier_or_mapped_score_like_dram() {
    use ember_embed::Placement;
    use ember_embed::rowfile::write_row_file;
    use ember_model::run_ahead;
    use ember_model::weights::row_file_path;
    for name in ["dlrm_dot", "torchrec_dcn", "dlrm_dot_int8"] {
        let tmp =
            std::env::temp_dir().join(format!("ember-tier-parity-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(tmp.join("rows")).unwrap();
        for f in ["config.json", "model.safetensors", "inputs.safetensors"] {
            std::fs::copy(dir(name).join(f), tmp.join(f)).unwrap();
        }
        let (_, want, _) = run(name, LoadOptions::default(), 1);
        // Before the row files exist, an ssd placement names the missing file and the fix.
        let e = Model::load(
            &tmp,
            LoadOptions {
                placement: Some(Placement::Ssd),
                ..LoadOptions::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("does not exist") && e.contains("ember convert"),
            "{e}"
        );
        let dram = Model::load(&tmp, LoadOptions::default()).unwrap();
        for t in dram.embeddings().tables() {
            let bytes = t.resident().unwrap();
            write_row_file(
                &row_file_path(&tmp, t.name()),
                t.name(),
                t.rows(),
                t.dim(),
                t.dtype(),
                bytes,
            )
            .unwrap();
        }
        let fx = read(name);
        let batch = fx.logits.len();
        for placement in [Placement::Ssd, Placement::Mmap] {
            for threads in [1, 2] {
                let model = Arc::new(
                    Model::load(
                        &tmp,
                        LoadOptions {
                            placement: Some(placement),
                            ..LoadOptions::default()
                        },
                    )
                    .unwrap(),
                );
                assert_eq!(model.stager().is_active(), placement == Placement::Ssd);
                let kj = fixture_batch(&model, &fx);
                let mut p = Predictor::new(model.clone(), threads).unwrap();
                // Twice: cold cache, then warm.
                for _ in 0..2 {
                    let mut got = vec![f32::NAN; batch];
                    logits_of(&mut p, &fx.dense, &kj, &mut got).unwrap();
                    assert!(
                        got.iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{name} on {placement}, {threads} threads: {got:?} vs {want:?}"
                    );
                }
                if placement == Placement::Ssd {
                    let s = model.stager().stats();
                    assert!(s.misses > 0 && s.hits > 0, "{s:?}");
                    // Pipelined: three copies of the batch staged one ahead.
                    let items = vec![&kj, &kj, &kj];
                    run_ahead(
                        1,
                        items,
                        |k| model.prepare(model.batch(&fx.dense, k).unwrap()),
                        |prepared| {
                            let prepared = prepared.unwrap();
                            assert!(prepared.staged().is_some());
                            let mut got = vec![f32::NAN; batch];
                            p.logits(&prepared, &mut got).unwrap();
                            assert!(
                                got.iter()
                                    .zip(&want)
                                    .all(|(a, b)| a.to_bits() == b.to_bits())
                            );
                            Ok::<(), ()>(())
                        },
                        |d| model.record_stall(d),
                    )
                    .unwrap();
                }
            }
        }
        // Through config.json: the first table on ssd with a zero cache (every row read).
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(tmp.join("config.json")).unwrap())
                .unwrap();
        v["tables"][0]["placement"] = "ssd".into();
        v["tier"] = serde_json::json!({"cache_mb": 0, "policy": "lru", "io": "pread"});
        std::fs::write(tmp.join("config.json"), v.to_string()).unwrap();
        let model = Arc::new(Model::load(&tmp, LoadOptions::default()).unwrap());
        assert_eq!(model.embeddings().tables()[0].placement(), Placement::Ssd);
        assert_eq!(model.embeddings().tables()[1].placement(), Placement::Dram);
        let kj = fixture_batch(&model, &fx);
        let mut got = vec![f32::NAN; batch];
        let mut p = Predictor::new(model.clone(), 1).unwrap();
        logits_of(&mut p, &fx.dense, &kj, &mut got).unwrap();
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
        let s = model.stager().stats();
        assert_eq!(
            (s.hits, s.misses > 0),
            (0, true),
            "a zero cache never hits: {s:?}"
        );
        // A bad tier setting is refused with its name.
        v["tier"] = serde_json::json!({"policy": "mru"});
        std::fs::write(tmp.join("config.json"), v.to_string()).unwrap();
        let e = Model::load(&tmp, LoadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("tier.policy") && e.contains("mru"), "{e}");
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
