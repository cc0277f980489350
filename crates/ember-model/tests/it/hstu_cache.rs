//! `HstuPredictor::run_cached` with a `HistoryCache`: checked against the passes that say
//! what it must compute. A user served from its entry scores as `run_as_of` scores it as of
//! the request that filled the entry (the same keys and values, computed once here and read
//! back there); with `Reuse::Exact` a repeat with new candidates scores as the fresh pass; a
//! user whose history changed, whose entry is past the staleness bound or damaged, or who has
//! no id, is computed whole (the fresh pass's scores), and so is one whose held rows were
//! rewritten since its entry was computed; mixed batches score each user as alone.

use std::sync::Arc;

use ember_embed::DType;
use ember_model::hstu::cache::{Entry, Segment, user_key};
use ember_model::hstu::presets::{UserStream, preset};
use ember_model::hstu::{
    AsOf, AttentionNorm, Eviction, HistoryCache, HistoryCacheConfig, HstuModel, HstuPredictor,
    HstuScores, Reuse, User,
};

fn model() -> Arc<HstuModel> {
    let cfg = preset("hstu-small", 1e-2, DType::F32).unwrap();
    Arc::new(HstuModel::random(cfg, 7, 1).unwrap())
}

fn cache(reuse: Reuse) -> HistoryCache {
    HistoryCache::new(HistoryCacheConfig {
        bytes: 1 << 30,
        eviction: Eviction::Lru,
        reuse,
        spill: None,
        share: None,
    })
    .unwrap()
}

fn flat(s: &HstuScores) -> Vec<f32> {
    s.scores.concat()
}

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    let worst = (a.iter().zip(b))
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(worst <= tol, "worst {worst} over {tol}");
}

/// Scores of `users` run fresh, each alone.
fn fresh(m: &HstuModel, p: &mut HstuPredictor, users: &[User]) -> Vec<f32> {
    (users.iter())
        .flat_map(|u| {
            flat(
                &p.run(&m.check_users(std::slice::from_ref(u), 0).unwrap())
                    .unwrap()
                    .0,
            )
        })
        .collect()
}

/// A user's first request and its next, `k` actions later, with new candidates.
fn two_requests(s: &mut UserStream, u: usize, history: usize, k: usize) -> (User, User) {
    let a = s.user(u, history, 6);
    let b = s.user(u, history + k, 9);
    (a, b)
}

#[test]
fn a_returning_user_scores_as_of_the_request_that_filled_its_entry() {
    let m = model();
    let mut s = UserStream::new(m.config(), 3, 5);
    for threads in [1, 2] {
        let mut p = HstuPredictor::new(m.clone(), threads).unwrap();
        let c = cache(Reuse::DEFAULT);
        let (a, b) = two_requests(&mut s, threads, 50, 7);
        let first = m.check_users(std::slice::from_ref(&a), 0).unwrap();
        let (got_a, _, used) = p.run_cached(&first, &c).unwrap();
        assert_eq!(used.hits, 0);
        close(
            &flat(&got_a),
            &fresh(&m, &mut p, std::slice::from_ref(&a)),
            1e-6,
        );
        let next = m.check_users(std::slice::from_ref(&b), 0).unwrap();
        let (got, _, used) = p.run_cached(&next, &c).unwrap();
        assert_eq!((used.hits, used.held_tokens), (1, 1 + 50));
        assert_eq!(used.computed_tokens, 7 + 9);
        let want = p.run_as_of(&next, &[Some(AsOf::of(&first, 0))]).unwrap().0;
        close(&flat(&got), &flat(&want), 1e-6);
        // And the stale scores are not the fresh ones (the test can tell them apart).
        let f = fresh(&m, &mut p, &[b]);
        assert!(flat(&got).iter().zip(&f).any(|(x, y)| x != y));
        let st = c.stats();
        assert_eq!((st.hits, st.misses, st.inserts, st.entries), (1, 1, 2, 1));
    }
}

#[test]
fn exact_reuse_of_a_repeat_is_the_fresh_pass() {
    let m = model();
    let mut s = UserStream::new(m.config(), 2, 9);
    let mut p = HstuPredictor::new(m.clone(), 2).unwrap();
    let c = cache(Reuse::Exact);
    let a = s.user(0, 64, 8);
    let batch = m.check_users(std::slice::from_ref(&a), 0).unwrap();
    p.run_cached(&batch, &c).unwrap();
    // The same history and query time, other candidates of the same count.
    let mut b = a.clone();
    for v in b.candidates.get_mut("item_candidate_id").unwrap() {
        *v = (*v + 3) % 100;
    }
    let again = m.check_users(std::slice::from_ref(&b), 0).unwrap();
    let (got, _, used) = p.run_cached(&again, &c).unwrap();
    assert_eq!(used.hits, 1);
    close(&flat(&got), &fresh(&m, &mut p, &[b]), 1e-6);
    // A grown history is not exact: recomputed.
    let grown = s.user(0, 66, 8);
    let batch = m.check_users(std::slice::from_ref(&grown), 0).unwrap();
    let (got, _, used) = p.run_cached(&batch, &c).unwrap();
    assert_eq!(used.hits, 0);
    close(&flat(&got), &fresh(&m, &mut p, &[grown]), 1e-6);
    assert_eq!(c.stats().refused, 1);
}

#[test]
fn a_changed_history_or_one_past_the_bound_is_recomputed() {
    let m = model();
    let mut s = UserStream::new(m.config(), 2, 13);
    let mut p = HstuPredictor::new(m.clone(), 1).unwrap();
    let bound = Reuse::Stale {
        max_appended: 10,
        max_age_s: i64::MAX,
    };
    let c = cache(bound);
    let a = s.user(0, 40, 4);
    p.run_cached(&m.check_users(std::slice::from_ref(&a), 0).unwrap(), &c)
        .unwrap();
    // A sliding window: the oldest item dropped, so the entry's tokens are not a prefix.
    let slid = s.user(0, 40, 4);
    let mut changed = slid.clone();
    changed.uih.get_mut("item_id").unwrap()[3] ^= 1;
    for u in [changed, s.user(0, 40 + 11, 5)] {
        let batch = m.check_users(std::slice::from_ref(&u), 0).unwrap();
        let (got, _, used) = p.run_cached(&batch, &c).unwrap();
        assert_eq!(used.hits, 0);
        close(&flat(&got), &fresh(&m, &mut p, &[u]), 1e-6);
    }
    assert_eq!(c.stats().refused, 2);
}

#[test]
fn a_damaged_entry_is_recomputed_never_read() {
    let m = model();
    let mut s = UserStream::new(m.config(), 1, 17);
    let mut p = HstuPredictor::new(m.clone(), 1).unwrap();
    let c = cache(Reuse::DEFAULT);
    let (a, b) = two_requests(&mut s, 0, 30, 3);
    let first = m.check_users(std::slice::from_ref(&a), 0).unwrap();
    p.run_cached(&first, &c).unwrap();
    // The right key and fingerprint, but values missing from its segment.
    let key = user_key(&first, 0).unwrap();
    let fp = ember_model::hstu::cache::fingerprint(&first, 0, 30);
    let bad = Entry {
        history: 30,
        fingerprint: fp,
        epochs: Vec::new(),
        segments: vec![Arc::new(Segment {
            tokens: 31,
            as_of: AsOf::of(&first, 0),
            kv: vec![0.5; 10],
        })],
    };
    c.insert(key, bad);
    let next = m.check_users(std::slice::from_ref(&b), 0).unwrap();
    let (got, _, used) = p.run_cached(&next, &c).unwrap();
    assert_eq!(used.hits, 0);
    close(&flat(&got), &fresh(&m, &mut p, &[b]), 1e-6);
}

#[test]
fn a_mixed_batch_scores_each_user_as_alone() {
    let m = model();
    let mut s = UserStream::new(m.config(), 3, 21);
    let mut p = HstuPredictor::new(m.clone(), 2).unwrap();
    let c = cache(Reuse::DEFAULT);
    let (a0, b0) = two_requests(&mut s, 0, 45, 5);
    p.run_cached(&m.check_users(std::slice::from_ref(&a0), 0).unwrap(), &c)
        .unwrap();
    let first = m.check_users(std::slice::from_ref(&a0), 0).unwrap();
    let new_user = s.user(1, 33, 7);
    // No contextual id: never cached.
    let mut anonymous = s.user(2, 25, 3);
    anonymous.uih.remove("user_id");
    let users = vec![new_user.clone(), b0.clone(), anonymous.clone()];
    let batch = m.check_users(&users, 0).unwrap();
    let (got, _, used) = p.run_cached(&batch, &c).unwrap();
    assert_eq!(used.hits, 1);
    let mut want = fresh(&m, &mut p, &[new_user]);
    let one = m.check_users(std::slice::from_ref(&b0), 0).unwrap();
    want.extend(flat(
        &p.run_as_of(&one, &[Some(AsOf::of(&first, 0))]).unwrap().0,
    ));
    want.extend(fresh(&m, &mut p, &[anonymous]));
    // Scores are task-major over the batch: compare per task and user.
    let tasks = got.tasks.len();
    let per_user: Vec<usize> = users
        .iter()
        .map(|u| u.candidates["item_candidate_id"].len())
        .collect();
    let total: usize = per_user.iter().sum();
    let mut reordered = vec![0.0; want.len()];
    let mut at = 0;
    for (u, &n) in per_user.iter().enumerate() {
        let before: usize = per_user[..u].iter().sum();
        for t in 0..tasks {
            for j in 0..n {
                reordered[t * total + before + j] = want[at + t * n + j];
            }
        }
        at += tasks * n;
    }
    close(&flat(&got), &reordered, 1e-6);
    let st = c.stats();
    assert_eq!((st.uncached, st.entries), (1, 2));
}

#[test]
fn entries_grow_by_segments_and_the_batch_max_norm_is_refused() {
    let m = model();
    let mut s = UserStream::new(m.config(), 1, 25);
    let mut p = HstuPredictor::new(m.clone(), 1).unwrap();
    let c = cache(Reuse::DEFAULT);
    let mut fresh_err = Vec::new();
    for (k, h) in [20, 23, 30, 31].into_iter().enumerate() {
        let u = s.user(0, h, 5);
        let batch = m.check_users(std::slice::from_ref(&u), 0).unwrap();
        let (got, _, used) = p.run_cached(&batch, &c).unwrap();
        assert_eq!(used.hits, (k > 0) as usize);
        let f = fresh(&m, &mut p, &[u]);
        fresh_err.push(
            (flat(&got).iter().zip(&f))
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max),
        );
    }
    // Four requests, one user: one entry (extended three times).
    assert_eq!(c.stats().entries, 1);
    assert!(fresh_err.iter().all(|e| *e < 0.05), "{fresh_err:?}");
    assert_eq!(fresh_err[0], 0.0);
    p.set_attention_norm(AttentionNorm::BatchMax);
    let u = s.user(0, 31, 5);
    let err = p
        .run_cached(&m.check_users(&[u], 0).unwrap(), &c)
        .unwrap_err();
    assert!(err.to_string().contains("attention_norm alone"), "{err}");
}

#[test]
fn a_row_update_retires_the_entries_that_read_the_row_and_no_other() {
    let cfg = preset("hstu-small", 1e-2, DType::F32).unwrap();
    let mut m = HstuModel::random(cfg, 7, 1).unwrap();
    m.make_tables_live().unwrap();
    let m = Arc::new(m);
    let mut s = UserStream::new(m.config(), 1, 29);
    let mut p = HstuPredictor::new(m.clone(), 1).unwrap();
    // No age bound: the stream's gaps of a week would retire entries too.
    let c = cache(Reuse::Stale {
        max_appended: 1000,
        max_age_s: i64::MAX,
    });
    let a = s.user(0, 40, 5);
    p.run_cached(&m.check_users(std::slice::from_ref(&a), 0).unwrap(), &c)
        .unwrap();
    let coll = m.embeddings();
    let t = (coll.tables().iter())
        .position(|t| t.name() == "item_id")
        .unwrap();
    let table = &coll.tables()[t];
    let row = vec![0x3fu8; table.stride()];
    // A row no held token read: the entry stands.
    let held: Vec<i64> = a.uih["item_id"].clone();
    let other = (0..table.rows() as u64)
        .find(|r| !held.contains(&(*r as i64)))
        .unwrap();
    table.write_rows(&[other], &row).unwrap();
    let b = s.user(0, 43, 5);
    let batch = m.check_users(std::slice::from_ref(&b), 0).unwrap();
    assert_eq!(p.run_cached(&batch, &c).unwrap().2.hits, 1);
    // A row the 10th held item read: recomputed whole, with the new row.
    table.write_rows(&[held[9] as u64], &row).unwrap();
    let u = s.user(0, 45, 5);
    let batch = m.check_users(std::slice::from_ref(&u), 0).unwrap();
    let (got, _, used) = p.run_cached(&batch, &c).unwrap();
    assert_eq!(used.hits, 0);
    close(&flat(&got), &fresh(&m, &mut p, &[u]), 1e-6);
    let st = c.stats();
    assert_eq!((st.refused, st.updated), (1, 1));
    // The entry computed after the update stands again.
    let again = s.user(0, 47, 5);
    let batch = m.check_users(std::slice::from_ref(&again), 0).unwrap();
    assert_eq!(p.run_cached(&batch, &c).unwrap().2.hits, 1);
}

#[test]
fn an_entry_spilled_to_disk_reads_back_and_a_damaged_one_is_recomputed() {
    let m = model();
    let mut s = UserStream::new(m.config(), 2, 31);
    let mut p = HstuPredictor::new(m.clone(), 1).unwrap();
    let parent = std::env::temp_dir().join(format!("ember-spill-test-{}", std::process::id()));
    // DRAM for one entry: the second user's evicts the first's to disk.
    let first = s.user(0, 40, 4);
    let batch = m.check_users(std::slice::from_ref(&first), 0).unwrap();
    let c = cache(Reuse::Exact);
    p.run_cached(&batch, &c).unwrap();
    let one = c.stats().bytes as usize;
    let c = HistoryCache::new(HistoryCacheConfig {
        bytes: one + one / 2,
        eviction: Eviction::Lru,
        reuse: Reuse::Stale {
            max_appended: 1000,
            max_age_s: i64::MAX,
        },
        spill: Some(ember_model::hstu::SpillConfig {
            dir: parent.clone(),
            bytes: 1 << 30,
        }),
        share: None,
    })
    .unwrap();
    p.run_cached(&batch, &c).unwrap();
    p.run_cached(&m.check_users(&[s.user(1, 40, 4)], 0).unwrap(), &c)
        .unwrap();
    let st = c.stats();
    assert_eq!((st.evictions, st.spilled, st.entries), (1, 1, 1));
    assert!(st.disk_bytes > 0);
    // The first user returns: its entry comes back from disk, scored as of its first request.
    let back = s.user(0, 44, 5);
    let next = m.check_users(std::slice::from_ref(&back), 0).unwrap();
    let (got, _, used) = p.run_cached(&next, &c).unwrap();
    assert_eq!(used.hits, 1);
    let want = p.run_as_of(&next, &[Some(AsOf::of(&batch, 0))]).unwrap().0;
    close(&flat(&got), &flat(&want), 1e-6);
    assert_eq!(c.stats().disk_hits, 1);
    // Now the second user's entry is on disk: damage its file; its return is recomputed.
    let files: Vec<_> = walk(&parent);
    assert_eq!(files.len(), 1, "{files:?}");
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&files[0], bytes).unwrap();
    let u = s.user(1, 43, 4);
    let (got, _, used) = p
        .run_cached(&m.check_users(std::slice::from_ref(&u), 0).unwrap(), &c)
        .unwrap();
    assert_eq!(used.hits, 0);
    close(&flat(&got), &fresh(&m, &mut p, &[u]), 1e-6);
    assert_eq!(c.stats().damaged, 1);
    drop(c);
    assert!(walk(&parent).is_empty(), "the cache's files go with it");
    let _ = std::fs::remove_dir_all(&parent);
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        match e.file_type().unwrap().is_dir() {
            true => out.extend(walk(&e.path())),
            false => out.push(e.path()),
        }
    }
    out
}
