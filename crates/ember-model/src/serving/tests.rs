//! The seam on both families: a request checked from its columns, prepared and run through a
//! runner, gives the scores the family's own path gives.

use std::path::Path;

use super::*;
use crate::hstu::HstuModel;

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[test]
fn outputs_split_into_parts_and_offsets() {
    let o = Outputs {
        values: vec![
            vec![1.0, 2.0, 3.0, 4.0, 5.0],
            vec![6.0, 7.0, 8.0, 9.0, 10.0],
        ],
        counts: vec![2, 0, 3],
    };
    assert_eq!(o.items(), 3);
    assert_eq!(o.offsets(), vec![0, 2, 2, 5]);
    let (a, at) = o.part(0..2, 0);
    assert_eq!(
        (a.values[1].clone(), a.counts.clone(), at),
        (vec![6.0, 7.0], vec![2, 0], 2)
    );
    let (b, end) = o.part(2..3, at);
    assert_eq!((b.values[0].clone(), end), (vec![3.0, 4.0, 5.0], 5));
    let mut joined = a.clone();
    joined.append(&b);
    assert_eq!(joined, o);
    // One value per item.
    let s = Outputs {
        values: vec![vec![0.5, 0.25, 0.125]],
        counts: vec![],
    };
    assert_eq!((s.items(), s.offsets()), (3, vec![0, 1, 2, 3]));
    let (p, end) = s.part(1..3, 1);
    assert_eq!((p.scores(), end), (&[0.25, 0.125][..], 3));
}

/// Columns of `users` as a decoder builds them from the signature.
fn columns(sig: &Signature, users: &[crate::hstu::User]) -> InputColumns {
    let n = users.len();
    let mut c = InputColumns {
        n,
        floats: vec![],
        lengths: Lengths::Each(vec![]),
        values: sig.new_values(0),
        present: vec![true; sig.inputs.len()],
    };
    let get = |u: &crate::hstu::User, name: &str| -> Vec<i64> {
        u.uih
            .get(name)
            .or_else(|| u.candidates.get(name))
            .cloned()
            .unwrap_or_default()
    };
    let base = |s: &str| s.rsplit_once('_').map(|(b, _)| b.to_string()).unwrap();
    for i in &sig.inputs {
        if i.kind == InputKind::Lengths {
            for u in users {
                if let Lengths::Each(l) = &mut c.lengths {
                    l.push(get(u, &base(&i.name)).len() as u32);
                }
            }
        }
    }
    for i in &sig.inputs {
        if let InputKind::Values { .. } = i.kind {
            for u in users {
                for v in get(u, &base(&i.name)) {
                    c.values.push(v);
                }
            }
        }
    }
    c
}

#[test]
fn an_hstu_request_through_the_seam_scores_as_the_predictor_does() {
    let s = load(&fixture("hstu_small"), LoadOptions::default()).unwrap();
    let sig = s.signature();
    assert_eq!(sig.offsets.as_deref(), Some("candidate_offsets"));
    assert!(sig.inputs.iter().any(|i| i.name == "item_id_ids"));
    assert!(
        sig.inputs
            .iter()
            .any(|i| i.name == "action_timestamp_values")
    );
    let m = s.as_any().downcast_ref::<HstuModel>().unwrap();
    let users = m.random_users(3, 17, 4, 9);
    let req = s.check(columns(&sig, &users)).unwrap();
    assert_eq!(req.len(), 3);
    // A user weighs its history items and candidates (17 + 4), against a bound in tokens.
    assert_eq!(req.weight(), 3 * (17 + 4));
    assert_eq!(s.max_batch_weight(), super::hstu::BATCH_TOKENS);
    // The same users as JSON lines.
    let lines: Vec<String> = users
        .iter()
        .map(|u| serde_json::to_string(u).unwrap())
        .collect();
    let from_json = s.check_json(lines.join("\n").as_bytes()).unwrap().unwrap();
    assert_eq!(from_json.len(), 3);
    let mut runner = s.clone().cpu_runner(1).unwrap();
    let mut out = Outputs::default();
    let parts: Vec<Request> = req.pieces(2).collect();
    assert_eq!(parts.len(), 2);
    let batch = s.prepare(&[parts[0].as_ref(), parts[1].as_ref()]).unwrap();
    runner.run(&batch, &mut out).unwrap();
    assert_eq!(out.counts, vec![4, 4, 4]);
    assert_eq!(out.values.len(), sig.outputs.len());
    // As the predictor scores them, batched.
    let arc: Arc<HstuModel> = s.clone().into_any_arc().downcast().unwrap();
    let mut p = crate::hstu::HstuPredictor::new(arc.clone(), 1).unwrap();
    let (want, _) = p.run(&arc.check_users(&users, 0).unwrap()).unwrap();
    assert_eq!(out.values, want.scores);
    // A bad request names the user and the feature.
    let mut bad = users.clone();
    bad[1].candidates.get_mut("item_candidate_id").unwrap()[0] = -3;
    let e = s.check(columns(&sig, &bad)).unwrap_err().to_string();
    assert!(
        e.contains("user 1") && e.contains("item_candidate_id"),
        "{e}"
    );
    let e = s
        .check_json(b"{\"uih\": {}, \"candidates\": {}, \"x\": 1}")
        .unwrap()
        .unwrap_err();
    assert!(e.to_string().contains("user 0"), "{e}");
    // It records no lookups for a placement profile, and says so.
    assert!(!s.records_lookups());
    assert!(s.record_accesses(crate::RecordOptions::default()).is_err());
    // Warming requests check and run.
    let w = s.warm_request(4, 1);
    assert!(runner.run_request(w.as_ref(), &mut out).is_ok());
}

#[test]
fn a_dlrm_request_through_the_seam_scores_as_the_predictor_does() {
    let s = load(&fixture("dlrm_dot"), LoadOptions::default()).unwrap();
    let sig = s.signature();
    assert_eq!(
        (sig.outputs.clone(), sig.offsets.clone()),
        (vec!["scores".to_string()], None)
    );
    let w = s.warm_request(5, 3);
    assert_eq!(w.len(), 5);
    // A sample weighs one, with no bound beside the item count.
    assert_eq!((w.weight(), s.max_batch_weight()), (5, usize::MAX));
    let samples = w.as_any().downcast_ref::<crate::Samples>().unwrap().clone();
    let mut runner = s.clone().cpu_runner(1).unwrap();
    let mut out = Outputs::default();
    let t = runner.run_request(w.as_ref(), &mut out).unwrap();
    assert_eq!(t.stages.len(), sig.stages.len());
    let m: Arc<crate::Model> = s.clone().into_any_arc().downcast().unwrap();
    let mut p = crate::Predictor::new(m.clone(), 1).unwrap();
    let prepared = m.prepare(m.merge(&[&samples]).unwrap()).unwrap();
    let mut want = vec![0.0; 5];
    crate::Engine::run(&mut p, &prepared, &mut want).unwrap();
    assert_eq!(out.scores(), &want[..]);
    assert!(out.counts.is_empty());
    assert!(s.records_lookups());
}

/// `Servable::synthetic` on both families: the items, bag sizes, history and candidates asked
/// for, checked; a setting the family has no use for is refused by name; `flops` counts the
/// family's dense stages in proportion to the items.
#[test]
fn synthetic_requests_have_the_shape_asked_and_their_flops() {
    use crate::family::AnyPreset;
    use crate::presets::RowsOptions;
    let rows = RowsOptions {
        scale: 0.01,
        max_rows: None,
    };
    // DLRM: `items` samples, every bag of `pooling` ids (or one size per feature).
    let small = AnyPreset::new("small", ember_embed::DType::F32, rows).unwrap();
    let dlrm = servable(small.build(3, 1).unwrap());
    let features = small.config.tables().len();
    for (pooling, ids) in [(vec![5], 5 * features), ((1..=features).collect(), 36)] {
        let w = Workload {
            items: Some(7),
            pooling: Some(pooling),
            ..Workload::default()
        };
        let r = dlrm.synthetic(&w, 1).unwrap();
        let s = r.as_any().downcast_ref::<crate::Samples>().unwrap();
        assert_eq!((s.len(), s.ids().len()), (7, 7 * ids));
        let f = dlrm.flops(&*r);
        let [b, i, t] = crate::presets::stage_macs(dlrm_config(&small));
        assert_eq!(
            f,
            vec![
                ("bottom_mlp", 14.0 * b as f64),
                ("interaction", 14.0 * i as f64),
                ("top_mlp", 14.0 * t as f64)
            ]
        );
    }
    let two_sizes = Workload {
        pooling: Some(vec![1, 2]),
        ..Workload::default()
    };
    let err = dlrm.synthetic(&two_sizes, 1).unwrap_err().to_string();
    assert!(err.contains("pooling") && err.contains("2 sizes"), "{err}");
    let history = Workload {
        history: Some(3),
        ..Workload::default()
    };
    let err = dlrm.synthetic(&history, 1).unwrap_err().to_string();
    assert!(err.contains("history") && err.contains("samples"), "{err}");
    // The default: 64 samples.
    assert_eq!(dlrm.synthetic(&Workload::default(), 2).unwrap().len(), 64);

    // HSTU: `items` users of `history` items and `candidates` candidates.
    let hp = AnyPreset::new("hstu-small", ember_embed::DType::F32, rows).unwrap();
    assert!(hp.pooling.is_none());
    let hstu = servable(hp.build(3, 1).unwrap());
    let w = Workload {
        items: Some(2),
        history: Some(9),
        candidates: Some(4),
        ..Workload::default()
    };
    let r = hstu.synthetic(&w, 5).unwrap();
    let users = &r.as_any().downcast_ref::<super::hstu::Users>().unwrap().0;
    let model = hstu.clone().into_any_arc().downcast::<HstuModel>().unwrap();
    let h = &model.config().hstu;
    assert_eq!(users.len(), 2);
    for u in users {
        assert_eq!(u.uih[&h.uih_post_id_feature_name].len(), 9);
        assert_eq!(u.candidates[&h.candidates_querytime_feature_name].len(), 4);
    }
    let one = model.layer_flops(&users[0]);
    assert!(one.0 > 0.0 && one.1 > 0.0);
    assert_eq!(
        hstu.flops(&*r),
        vec![("projections", 2.0 * one.0), ("attention", 2.0 * one.1)]
    );
    let pooled = Workload {
        pooling: Some(vec![3]),
        ..Workload::default()
    };
    let err = hstu.synthetic(&pooled, 1).unwrap_err().to_string();
    assert!(err.contains("pooling") && err.contains("users"), "{err}");
    // A history longer than the model takes is refused by the check, naming it.
    let long = Workload {
        history: Some(h.max_seq_len + 1),
        ..Workload::default()
    };
    assert!(hstu.synthetic(&long, 1).is_err());
    // The default: one user.
    assert_eq!(hstu.synthetic(&Workload::default(), 2).unwrap().len(), 1);
    // An unknown preset lists both families' names.
    let err = AnyPreset::new("rm9", ember_embed::DType::F32, RowsOptions::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("rm1") && err.contains("dlrm-v3"), "{err}");
}

fn dlrm_config(p: &crate::family::AnyPreset) -> &crate::config::ModelConfig {
    match &p.config {
        crate::family::AnyConfig::Dlrm(c) => c,
        crate::family::AnyConfig::Hstu(_) => panic!("a DLRM preset"),
    }
}

/// A DLRM batch merged into the buffers of the batch before (larger, then smaller, then
/// larger again) holds exactly what a fresh merge holds and scores the same; the model keeps
/// the buffers of a batch once it is dropped.
#[test]
fn batches_merged_into_reused_buffers_score_as_fresh_ones() {
    let model = Arc::new(crate::Model::load(&fixture("dlrm_dot"), LoadOptions::default()).unwrap());
    let s: Arc<dyn Servable> = model.clone();
    let mut runner = s.clone().cpu_runner(1).unwrap();
    let w = |items, pooling| Workload {
        items: Some(items),
        pooling: Some(vec![pooling]),
        ..Workload::default()
    };
    let requests: Vec<Request> = [(9, 4), (2, 1), (13, 7), (0, 1)]
        .into_iter()
        .enumerate()
        .map(|(i, (n, p))| s.synthetic(&w(n, p), i as u64).unwrap())
        .collect();
    let mut out = Outputs::default();
    for r in &requests {
        let samples = r.as_any().downcast_ref::<crate::Samples>().unwrap();
        let fresh = model.merge(&[samples]).unwrap();
        let reused = model
            .merge_reusing(&[samples], model.spare().take())
            .unwrap();
        assert_eq!(reused.dense(), fresh.dense());
        assert_eq!(reused.sparse(), fresh.sparse());
        if let Some(b) = reused.into_buffers() {
            model.spare().keep(b);
        }
        // Through the seam: prepared into the spare buffers, the same scores as the engine's
        // own pass over the fresh batch.
        let batch = s.prepare(&[&**r]).unwrap();
        runner.run(&batch, &mut out).unwrap();
        drop(batch);
        let mut want = vec![0.0; r.len()];
        let mut p = crate::Predictor::new(model.clone(), 1).unwrap();
        crate::Engine::run(&mut p, &model.prepare(fresh).unwrap(), &mut want).unwrap();
        assert_eq!(out.scores(), &want[..]);
        assert!(
            model.spare().take().is_some(),
            "the batch's buffers are kept"
        );
    }
}

/// Admission weighs an HSTU request by its forward pass's MFLOP (`Servable::cost`): a user's
/// cost is the model's count for its history and candidates, grows with history times
/// candidates, and a request's is its users' sum; a DLRM request costs its samples. Each user
/// is classed by its history's length for the per-user latency metric.
#[test]
fn an_hstu_users_cost_follows_history_times_candidates() {
    use crate::family::AnyPreset;
    use crate::presets::RowsOptions;
    let rows = RowsOptions {
        scale: 0.01,
        max_rows: None,
    };
    let hp = AnyPreset::new("hstu-small", ember_embed::DType::F32, rows).unwrap();
    let hstu = servable(hp.build(3, 1).unwrap());
    let model = hstu.clone().into_any_arc().downcast::<HstuModel>().unwrap();
    let request = |items, history, candidates| {
        let w = Workload {
            items: Some(items),
            history: Some(history),
            candidates: Some(candidates),
            ..Workload::default()
        };
        hstu.synthetic(&w, 7).unwrap()
    };
    let mut last = 0;
    for (h, c) in [
        (1, 1),
        (64, 8),
        (64, 64),
        (300, 64),
        (1500, 64),
        (1500, 512),
    ] {
        let r = request(1, h, c);
        let (dense, attention) = model.macs(h, c);
        let want = (2.0 * (dense + attention) / 1e6).ceil().max(1.0) as u64;
        assert_eq!(hstu.cost(&*r), want, "{h} x {c}");
        assert!(want > last, "{h} x {c}: {want} after {last}");
        last = want;
    }
    // The attention's pairs: four times the history costs more than four times as much.
    let (short, long) = (
        hstu.cost(&*request(1, 256, 64)),
        hstu.cost(&*request(1, 1024, 64)),
    );
    assert!(long > 4 * short, "{short} {long}");
    // More candidates over a long history cost more than over a short one.
    let extra = |h| hstu.cost(&*request(1, h, 512)) - hstu.cost(&*request(1, h, 64));
    assert!(extra(1500) > extra(100), "{} {}", extra(1500), extra(100));
    // A request of three users: the sum of theirs (each rounded up once).
    let three = request(3, 300, 64);
    let one = hstu.cost(&*request(1, 300, 64));
    assert!((3 * one - 2..=3 * one).contains(&hstu.cost(&*three)));
    assert_eq!(three.classes(), vec!["1024"; 3]);
    assert_eq!(request(1, 64, 4).classes(), vec!["64"]);
    assert_eq!(request(1, 65, 4).classes(), vec!["256"]);
    assert_eq!(request(1, 5000, 4).classes(), vec!["16384"]);
    // DLRM: one per sample, no classes.
    let small = AnyPreset::new("small", ember_embed::DType::F32, rows).unwrap();
    let dlrm = servable(small.build(3, 1).unwrap());
    let w = Workload {
        items: Some(5),
        ..Workload::default()
    };
    let r = dlrm.synthetic(&w, 1).unwrap();
    assert_eq!(dlrm.cost(&*r), 5);
    assert!(r.classes().is_empty());
}
