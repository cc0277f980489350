//! `HstuPredictor::run_as_of`: a user's first tokens as a cache computed at an earlier request
//! would hold them (that request's positions, time buckets and attention divisor). Checked
//! where an exact answer exists: as of the same request it is the fresh pass bit for bit; as of
//! another query time it is the fresh pass of the user with its history's times shifted; with
//! positions that all sit at the clamp and the same divisor it is the fresh pass; and a stale
//! prefix moves the scores. Bad `as_of`s are refused.

use std::sync::Arc;

use ember_embed::DType;
use ember_model::hstu::presets::{UserStream, preset};
use ember_model::hstu::{
    AsOf, AttentionNorm, HstuBatch, HstuModel, HstuPredictor, HstuScores, User,
};

fn model(position_buckets: Option<usize>) -> Arc<HstuModel> {
    let mut cfg = preset("hstu-small", 1e-2, DType::F32).unwrap();
    if let Some(p) = position_buckets {
        cfg.hstu.num_position_buckets = p;
    }
    Arc::new(HstuModel::random(cfg, 7, 1).unwrap())
}

fn users(m: &HstuModel, n: usize, history: usize, candidates: usize) -> Vec<User> {
    let mut s = UserStream::new(m.config(), n, 11);
    (0..n).map(|u| s.user(u, history, candidates)).collect()
}

/// A model, `n` users of it checked as one batch, and a predictor on `threads` threads.
fn setup(
    positions: Option<usize>,
    n: usize,
    history: usize,
    candidates: usize,
    threads: usize,
) -> (Arc<HstuModel>, Vec<User>, HstuBatch, HstuPredictor) {
    let m = model(positions);
    let us = users(&m, n, history, candidates);
    let batch = m.check_users(&us, 0).unwrap();
    let p = HstuPredictor::new(m.clone(), threads).unwrap();
    (m, us, batch, p)
}

fn flat(s: &HstuScores) -> Vec<f32> {
    s.scores.concat()
}

fn close(a: &[f32], b: &[f32], tol: f32) -> f32 {
    assert_eq!(a.len(), b.len());
    let worst = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(worst <= tol, "worst {worst} over {tol}");
    worst
}

#[test]
fn as_of_the_same_request_is_the_fresh_pass() {
    let (_, _, batch, mut p) = setup(None, 3, 40, 5, 2);
    let fresh = flat(&p.run(&batch).unwrap().0);
    let as_of: Vec<Option<AsOf>> = vec![Some(AsOf::of(&batch, 0)), None, Some(AsOf::of(&batch, 2))];
    let got = flat(&p.run_as_of(&batch, &as_of).unwrap().0);
    assert_eq!(got, fresh);
}

#[test]
fn as_of_another_query_time_is_the_history_shifted_in_time() {
    let (m, us, all, mut p) = setup(None, 2, 60, 4, 1);
    for shift in [7_200i64, 86_400 * 3] {
        let mut then = AsOf::of(&all, 1);
        then.query += shift;
        // The same buckets: every history time moved back by the shift, the query kept.
        let mut moved = us[1].clone();
        for t in moved.uih.get_mut("action_timestamp").unwrap() {
            *t -= shift;
        }
        let want = flat(&p.run(&m.check_users(&[moved], 0).unwrap()).unwrap().0);
        let batch = m.check_users(&us[1..], 0).unwrap();
        let got = flat(&p.run_as_of(&batch, &[Some(then)]).unwrap().0);
        close(&got, &want, 1e-6);
        let fresh = flat(&p.run(&batch).unwrap().0);
        assert_ne!(got, fresh, "a query {shift} s later moves the scores");
    }
}

#[test]
fn a_prefix_at_the_position_clamp_with_the_same_divisor_is_the_fresh_pass() {
    // Two position buckets: every history token at the clamp, now and then.
    let (_, _, batch, mut p) = setup(Some(2), 1, 50, 6, 1);
    let now = AsOf::of(&batch, 0);
    // 8 fewer history items then, 8 more candidates: the same length, the same query.
    let then = AsOf {
        history: now.history - 8,
        candidates: now.candidates + 8,
        query: now.query,
    };
    let fresh = flat(&p.run(&batch).unwrap().0);
    let got = flat(&p.run_as_of(&batch, &[Some(then)]).unwrap().0);
    close(&got, &fresh, 1e-6);
}

#[test]
fn a_stale_prefix_moves_the_scores_and_bad_ones_are_refused() {
    let (_, _, batch, mut p) = setup(None, 1, 64, 8, 1);
    let now = AsOf::of(&batch, 0);
    let fresh = flat(&p.run(&batch).unwrap().0);
    // Cached at an earlier request with 4 fewer items and 2 candidates: positions, divisor and
    // query time all differ for the prefix.
    let then = AsOf {
        history: now.history - 4,
        candidates: 2,
        query: now.query - 600,
    };
    let stale = flat(&p.run_as_of(&batch, &[Some(then)]).unwrap().0);
    assert_ne!(stale, fresh);
    assert!(stale.iter().all(|s| s.is_finite()));
    let refused = |p: &mut HstuPredictor, a: &[Option<AsOf>], want: &str| {
        let e = p.run_as_of(&batch, a).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    };
    let longer = AsOf {
        history: now.history + 1,
        ..now
    };
    refused(&mut p, &[Some(longer)], "65 earlier history items, 64 now");
    refused(&mut p, &[], "0 entries for 1 users");
    p.set_attention_norm(AttentionNorm::BatchMax);
    refused(&mut p, &[Some(now)], "attention_norm alone");
}
