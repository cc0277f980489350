//! HSTU parity with the reference: each `tests/fixtures/hstu_*` directory is a `DlrmHSTU` of
//! meta-recsys/generative-recommenders with random weights, exported by `tools/export_torch.py
//! --from generative-recommenders`, with users (`users.jsonl`) and the reference's f32 scores
//! run on its PyTorch kernels (`expected.json`: each user alone, and all users in one batch),
//! written by `tools/hstu_fixtures.py`. Ember must match within 1e-5 relative, alone and
//! batched, with its attention rule set to match; bf16 stays within the stated tolerance; and
//! bad users are refused naming the user and the feature.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ember_model::hstu::{AttentionNorm, HstuModel, HstuPredictor, HstuScores, User};
use ember_model::{DenseDType, LoadOptions, ModelError};

/// `hstu_small` (streaming layout, 3 binary tasks and a regression task, the PyTorch kernel's
/// time-bucket clamp), `hstu_ctx2` (two contextual features, one of them partly given, the
/// layer-norm postprocessor, 3 layers), `hstu_triton` (the Triton kernel's clamp, scored by the
/// reference's Triton position kernel under Triton's interpreter).
const FIXTURES: [&str; 3] = ["hstu_small", "hstu_ctx2", "hstu_triton"];

fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn users(name: &str) -> Vec<User> {
    std::fs::read_to_string(dir(name).join("users.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `expected.json`'s `key` (`alone` or `batched`): per user, per task, the scores.
fn expected(name: &str, key: &str) -> Vec<BTreeMap<String, Vec<f32>>> {
    let text = std::fs::read_to_string(dir(name).join("expected.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    serde_json::from_value(v[key].clone()).unwrap()
}

fn load(name: &str, dense: Option<DenseDType>) -> Arc<HstuModel> {
    let opts = LoadOptions {
        dense_dtype: dense,
        ..LoadOptions::default()
    };
    Arc::new(HstuModel::load(&dir(name), opts).unwrap())
}

/// The largest error of `got` (user `u` of a batch) against `want`, relative to `max(|want|,
/// 1)`: scores are probabilities, and the regression task's logits near zero carry the
/// reference's own f32 rounding (its f32 and f64 runs differ by up to 1.9e-6).
fn worst(got: &HstuScores, u: usize, want: &BTreeMap<String, Vec<f32>>) -> f32 {
    let mut worst = 0f32;
    assert_eq!(got.tasks.len(), want.len());
    for (t, task) in got.tasks.iter().enumerate() {
        let w = &want[task];
        let g = got.user(t, u);
        assert_eq!(g.len(), w.len(), "task {task}: candidates");
        for (a, b) in g.iter().zip(w) {
            assert!(a.is_finite(), "task {task}: {a}");
            worst = worst.max((a - b).abs() / b.abs().max(1.0));
        }
    }
    worst
}

#[test]
fn f32_matches_the_reference_user_by_user_and_batched() {
    for name in FIXTURES {
        let model = load(name, None);
        let us = users(name);
        for threads in [1, 2] {
            let mut p = HstuPredictor::new(model.clone(), threads).unwrap();
            // Each user alone: the reference's batch of one.
            let alone = expected(name, "alone");
            for (u, user) in us.iter().enumerate() {
                let batch = model.check_users(std::slice::from_ref(user), u).unwrap();
                let (s, _) = p.run(&batch).unwrap();
                let e = worst(&s, 0, &alone[u]);
                assert!(
                    e < 1e-5,
                    "{name} user {u} alone, {threads} threads: rel err {e}"
                );
            }
            // All users in one batch: alone scores under `alone`, the reference's batched
            // scores under `batch_max`.
            let batch = model.check_users(&us, 0).unwrap();
            p.set_attention_norm(AttentionNorm::Alone);
            let (s, _) = p.run(&batch).unwrap();
            for (u, want) in alone.iter().enumerate() {
                let e = worst(&s, u, want);
                assert!(e < 1e-5, "{name} user {u} in a batch, alone: rel err {e}");
            }
            let batched = expected(name, "batched");
            p.set_attention_norm(AttentionNorm::BatchMax);
            let (s, _) = p.run(&batch).unwrap();
            let mut differs = false;
            for u in 0..us.len() {
                let e = worst(&s, u, &batched[u]);
                assert!(e < 1e-5, "{name} user {u} batched, batch_max: rel err {e}");
                differs |= worst(&s, u, &alone[u]) > 1e-4;
            }
            // Not a vacuous check: the reference's rule does change scores in a batch.
            assert!(differs, "{name}: batch_max gave the alone scores");
        }
    }
}

#[test]
fn alone_scores_do_not_depend_on_batch_mates() {
    let name = FIXTURES[0];
    let model = load(name, None);
    let us = users(name);
    let mut p = HstuPredictor::new(model.clone(), 2).unwrap();
    let all = p.run(&model.check_users(&us, 0).unwrap()).unwrap().0;
    // The last user with the first, with the second, reversed.
    let n = us.len() - 1;
    for mates in [vec![0, n], vec![1, n], vec![n, 0, 1]] {
        let sub: Vec<User> = mates.iter().map(|&i| us[i].clone()).collect();
        let s = p.run(&model.check_users(&sub, 0).unwrap()).unwrap().0;
        let at = mates.iter().position(|&i| i == n).unwrap();
        for t in 0..s.tasks.len() {
            for (a, b) in s.user(t, at).iter().zip(all.user(t, n)) {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                    "{mates:?}: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn bf16_stays_near_f32() {
    for name in FIXTURES {
        let f32m = load(name, None);
        let bf16m = load(name, Some(DenseDType::Bf16));
        let us = users(name);
        let batch = f32m.check_users(&us, 0).unwrap();
        let a = HstuPredictor::new(f32m.clone(), 1)
            .unwrap()
            .run(&batch)
            .unwrap()
            .0;
        let batch = bf16m.check_users(&us, 0).unwrap();
        let b = HstuPredictor::new(bf16m.clone(), 1)
            .unwrap()
            .run(&batch)
            .unwrap()
            .0;
        let mut worst = 0f32;
        for t in 0..a.tasks.len() {
            for (x, y) in a.scores[t].iter().zip(&b.scores[t]) {
                worst = worst.max((x - y).abs());
            }
        }
        // bf16 keeps 8 bits of mantissa per product's inputs: scores in [0, 1] (and the
        // regression task's logits) move by a few 1e-3 through two STU layers.
        assert!(worst < 0.03, "{name}: bf16 moved a score by {worst}");
        assert!(
            worst > 0.0,
            "{name}: bf16 gave f32's exact scores (did it run?)"
        );
    }
}

fn refused(model: &HstuModel, user: &User, want: &[&str]) {
    let e = model
        .check_users(std::slice::from_ref(user), 7)
        .unwrap_err();
    assert!(matches!(e, ModelError::Input(_)), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("user 7"), "{msg}");
    for w in want {
        assert!(msg.contains(w), "'{msg}' does not say '{w}'");
    }
}

#[test]
fn bad_users_are_refused_naming_the_user_and_the_feature() {
    let model = load("hstu_small", None);
    let good = users("hstu_small")
        .into_iter()
        .max_by_key(|u| u.uih["item_id"].len())
        .unwrap();
    assert!(model.check_users(std::slice::from_ref(&good), 0).is_ok());
    let mut u = good.clone();
    u.uih.get_mut("item_id").unwrap().pop();
    refused(&model, &u, &["item_", "values"]);
    let mut u = good.clone();
    u.uih.remove("action_timestamp");
    refused(&model, &u, &["action_timestamp", "missing"]);
    let mut u = good.clone();
    u.uih.insert("nonsense".into(), vec![1]);
    refused(&model, &u, &["nonsense", "not a history feature"]);
    let mut u = good.clone();
    let ts = u.uih.get_mut("action_timestamp").unwrap();
    ts.swap(0, 1);
    ts[0] += 100;
    refused(&model, &u, &["action_timestamp", "out of order"]);
    let mut u = good.clone();
    u.uih.get_mut("item_id").unwrap()[3] = 1 << 40;
    refused(&model, &u, &["item_id", "not a row"]);
    let mut u = good.clone();
    u.candidates.get_mut("item_candidate_id").unwrap()[0] = -1;
    refused(&model, &u, &["item_candidate_id", "negative"]);
    let max_c = model.config().hstu.max_num_candidates_inference;
    let mut u = good.clone();
    for v in u.candidates.values_mut() {
        let last = *v.last().unwrap();
        v.resize(max_c + 1, last);
    }
    refused(&model, &u, &["candidates", "max_num_candidates_inference"]);
    let max_len = model.config().hstu.max_seq_len;
    let mut u = good.clone();
    for v in u.uih.values_mut().filter(|v| v.len() > 1) {
        let last = *v.last().unwrap();
        v.resize(max_len, last);
    }
    refused(&model, &u, &["max_seq_len"]);
    let mut u = good.clone();
    u.uih.insert("user_id".into(), vec![1, 2]);
    refused(&model, &u, &["user_id", "contextual"]);
    // The model keeps serving: the good user still scores.
    let mut p = HstuPredictor::new(model.clone(), 1).unwrap();
    let (s, _) = p.run(&model.check_users(&[good], 0).unwrap()).unwrap();
    assert!(s.scores[0].iter().all(|v| v.is_finite()));
}

#[test]
fn weights_that_do_not_fit_the_config_are_refused_naming_the_tensor() {
    let src = dir("hstu_small");
    let tmp = std::env::temp_dir().join(format!("ember-hstu-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::copy(src.join("model.safetensors"), tmp.join("model.safetensors")).unwrap();
    let cfg = std::fs::read_to_string(src.join("config.json")).unwrap();
    // One dim changed: the first tensor it shapes is named.
    let bad = cfg.replace("\"hstu_attn_qk_dim\": 7", "\"hstu_attn_qk_dim\": 8");
    assert_ne!(bad, cfg);
    std::fs::write(tmp.join("config.json"), bad).unwrap();
    let e = HstuModel::load(&tmp, LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("_uvqk_weight") && e.contains("shape"), "{e}");
    // A layer fewer: the last layer's tensors are unexpected.
    let bad = cfg.replace("\"hstu_attn_num_layers\": 2", "\"hstu_attn_num_layers\": 1");
    std::fs::write(tmp.join("config.json"), bad).unwrap();
    let e = HstuModel::load(&tmp, LoadOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("_stu_layers.1.") && e.contains("not part of the model"),
        "{e}"
    );
    std::fs::remove_dir_all(&tmp).ok();
}

#[test]
fn tables_on_the_ssd_tier_score_exactly_as_in_memory() {
    let src = dir("hstu_small");
    let tmp = std::env::temp_dir().join(format!("ember-hstu-ssd-{}", std::process::id()));
    std::fs::create_dir_all(tmp.join("rows")).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(src.join(f), tmp.join(f)).unwrap();
    }
    let dram = load("hstu_small", None);
    for t in dram.embeddings().tables() {
        let rb = t.dtype().row_bytes(t.dim());
        let mut bytes = vec![0u8; t.rows() * rb];
        for (r, row) in bytes.chunks_exact_mut(rb).enumerate() {
            t.read_row(r, row).unwrap();
        }
        let path = tmp.join("rows").join(format!("{}.rows", t.name()));
        ember_embed::rowfile::write_row_file(&path, t.name(), t.rows(), t.dim(), t.dtype(), &bytes)
            .unwrap();
    }
    let opts = LoadOptions {
        placement: Some(ember_embed::Placement::Ssd),
        ..LoadOptions::default()
    };
    let ssd = Arc::new(HstuModel::load(&tmp, opts).unwrap());
    assert!(ssd.stager().is_active());
    let us = users("hstu_small");
    let mut a = HstuPredictor::new(dram.clone(), 2).unwrap();
    let mut b = HstuPredictor::new(ssd.clone(), 2).unwrap();
    // Twice: rows read from the files, then from the tier's cache.
    for round in 0..2 {
        let want = a.run(&dram.check_users(&us, 0).unwrap()).unwrap().0;
        let got = b.run(&ssd.check_users(&us, 0).unwrap()).unwrap().0;
        assert_eq!(got, want, "round {round}");
    }
    let stats = ssd.stager().stats();
    assert!(stats.store_reads > 0, "{stats:?}");
    std::fs::remove_dir_all(&tmp).ok();
}

#[test]
fn an_empty_batch_scores_nothing() {
    let model = load("hstu_small", None);
    let batch = model.check_users(&[], 0).unwrap();
    assert!(batch.is_empty() && batch.tokens() == 0);
    let (s, _) = HstuPredictor::new(model.clone(), 2)
        .unwrap()
        .run(&batch)
        .unwrap();
    assert_eq!(s.tasks.len(), 4);
    assert!(s.scores.iter().all(|t| t.is_empty()));
    assert_eq!(s.offsets, vec![0]);
}

#[test]
fn the_dlrm_loader_says_an_hstu_model_is_one() {
    let e = ember_model::Model::load(&dir("hstu_small"), LoadOptions::default()).unwrap_err();
    assert!(e.to_string().contains("an HSTU model"), "{e}");
    assert!(!HstuModel::is_hstu_dir(&dir("dlrm_dot")));
    assert!(HstuModel::is_hstu_dir(&dir("hstu_ctx2")));
}
