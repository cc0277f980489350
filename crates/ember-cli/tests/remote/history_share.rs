//! The HSTU history cache's shared tier (`--history-share`) on a real Redis Cluster: replicas
//! of one model find a user's states whichever of them computed them (scored as of the request
//! that computed them), another version of the model never reads them, a damaged segment is
//! recomputed, never served, a dead cluster costs a request its deadline and a recompute, and
//! a model whose tables take row updates is refused.

use std::sync::Arc;
use std::time::Duration;

use ember_embed::DType;
use ember_model::hstu::presets::{UserStream, preset};
use ember_model::hstu::{
    AsOf, Eviction, HistoryCacheConfig, HstuModel, HstuPredictor, HstuScores, Reuse, ShareConfig,
    User,
};

const TIMEOUT: Duration = Duration::from_millis(300);

fn config(url: &str) -> HistoryCacheConfig {
    HistoryCacheConfig {
        bytes: 1 << 30,
        eviction: Eviction::Lru,
        reuse: Reuse::DEFAULT,
        spill: None,
        share: Some(ShareConfig {
            url: url.to_string(),
            ttl_s: 600,
            timeout: TIMEOUT,
        }),
    }
}

/// A replica: the model of `seed` (the same seed, the same model) with a cache shared there.
fn replica(url: &str, seed: u64) -> (Arc<HstuModel>, HstuPredictor) {
    let cfg = preset("hstu-small", 1e-2, DType::F32).unwrap();
    let mut m = HstuModel::random(cfg, seed, 1).unwrap();
    m.set_history_cache(Some(config(url))).unwrap();
    let m = Arc::new(m);
    let p = HstuPredictor::new(m.clone(), 1).unwrap();
    (m, p)
}

/// `u` scored with the replica's cache: its scores and how many users it reused.
fn served(r: &mut (Arc<HstuModel>, HstuPredictor), u: &User) -> (Vec<f32>, usize) {
    let batch = r.0.check_users(std::slice::from_ref(u), 0).unwrap();
    let cache = r.0.history_cache().unwrap().clone();
    let (s, _, used) = r.1.run_cached(&batch, &cache).unwrap();
    (flat(&s), used.hits)
}

fn flat(s: &HstuScores) -> Vec<f32> {
    s.scores.concat()
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    let worst = (a.iter().zip(b))
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    assert!(worst <= 1e-6, "worst {worst}");
}

/// The scores of `u` computed fresh by a model of `seed` without a cache.
fn fresh(seed: u64, u: &User) -> Vec<f32> {
    let cfg = preset("hstu-small", 1e-2, DType::F32).unwrap();
    let m = Arc::new(HstuModel::random(cfg, seed, 1).unwrap());
    let mut p = HstuPredictor::new(m.clone(), 1).unwrap();
    flat(
        &p.run(&m.check_users(std::slice::from_ref(u), 0).unwrap())
            .unwrap()
            .0,
    )
}

#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn replicas_share_users_states_through_the_cluster() {
    let Some(mut c) = super::cluster(0) else {
        return;
    };
    let url = c.url();
    let mut a = replica(&url, 7);
    let mut b = replica(&url, 7);
    let mut s = UserStream::new(a.0.config(), 2, 11);
    let first = s.user(0, 60, 5);
    let next = s.user(0, 66, 7);

    // Replica A computes the user's first request and writes its entry.
    let (got, hits) = served(&mut a, &first);
    assert_eq!(hits, 0);
    close(&got, &fresh(7, &first));
    let st = a.0.history_cache().unwrap().stats();
    assert_eq!((st.shared_writes, st.share_errors), (1, 0));

    // The user's return reaches replica B, which never saw it: read from the cluster, scored
    // as of the first request (the states A computed), not fresh.
    let (got, hits) = served(&mut b, &next);
    assert_eq!(hits, 1);
    let first_batch = a.0.check_users(std::slice::from_ref(&first), 0).unwrap();
    let next_batch = a.0.check_users(std::slice::from_ref(&next), 0).unwrap();
    let want = (a.1)
        .run_as_of(&next_batch, &[Some(AsOf::of(&first_batch, 0))])
        .unwrap()
        .0;
    close(&got, &flat(&want));
    assert_ne!(
        got,
        fresh(7, &next),
        "the shared states are the first request's"
    );
    let st = b.0.history_cache().unwrap().stats();
    assert_eq!((st.shared_hits, st.hits, st.misses), (1, 1, 0));
    // B wrote back only the return's new segment (and the head): two segments are there now.
    assert_eq!(st.shared_writes, 1);
    let keys = keys(&c);
    assert_eq!(
        keys.iter().filter(|k| k.contains(":s:")).count(),
        2,
        "{keys:?}"
    );
    assert_eq!(
        keys.iter().filter(|k| k.ends_with(":m")).count(),
        1,
        "{keys:?}"
    );

    // Another version of the model (other weights) never reads them.
    let mut other = replica(&url, 8);
    let later = s.user(0, 70, 4);
    let (got, hits) = served(&mut other, &later);
    assert_eq!(hits, 0);
    close(&got, &fresh(8, &later));
    assert_eq!(other.0.history_cache().unwrap().stats().shared_hits, 0);

    // A damaged segment: refused, the user recomputed, never served.
    let seg = keys.iter().find(|k| k.contains(":s:")).unwrap();
    let port = port_of(&c, seg);
    let flip = ember_redis::cmd("SETRANGE")
        .arg(seg.as_str())
        .arg(16)
        .arg("X")
        .clone();
    ember_bench::redis_cluster::query(port, &flip).unwrap();
    let mut d = replica(&url, 7);
    let (got, hits) = served(&mut d, &later);
    assert_eq!(hits, 0);
    close(&got, &fresh(7, &later));
    let st = d.0.history_cache().unwrap().stats();
    assert_eq!((st.damaged, st.shared_hits), (1, 0));

    // The cluster gone: each read and write costs at most its deadline (a few retries within
    // it), the user is recomputed and the failures counted.
    let mut e = replica(&url, 7);
    for i in 0..c.nodes.len() {
        c.kill(i).unwrap();
    }
    let u = s.user(1, 50, 3);
    let t = std::time::Instant::now();
    let (got, hits) = served(&mut e, &u);
    // A read and a write, each within its deadline, and a small model's pass.
    assert!(t.elapsed() < 3 * TIMEOUT, "{:?}", t.elapsed());
    assert_eq!(hits, 0);
    close(&got, &fresh(7, &u));
    let st = e.0.history_cache().unwrap().stats();
    assert_eq!(
        (st.share_errors, st.shared_hits, st.shared_writes),
        (2, 0, 0)
    );
    let bound = 2 * TIMEOUT.as_nanos() as u64;
    assert_eq!(
        st.share_read_ns, 0,
        "only reads that gave an entry are timed"
    );
    assert!(st.share_write_ns < bound, "write {} ns", st.share_write_ns);
}

#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn a_model_whose_tables_take_row_updates_is_refused_sharing() {
    let Some(c) = super::cluster(0) else { return };
    let cfg = preset("hstu-small", 1e-2, DType::F32).unwrap();
    let mut m = HstuModel::random(cfg.clone(), 7, 1).unwrap();
    m.make_tables_live().unwrap();
    let e = m
        .set_history_cache(Some(config(&c.url())))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("history_share") && e.contains("row updates"),
        "{e}"
    );
    // And the other way round: a shared cache, then live tables.
    let mut m = HstuModel::random(cfg, 7, 1).unwrap();
    m.set_history_cache(Some(config(&c.url()))).unwrap();
    let e = m.make_tables_live().unwrap_err().to_string();
    assert!(e.contains("history_share"), "{e}");
    // An address with no cluster behind it is an error at load naming it, not a hang.
    let cfg = preset("hstu-small", 1e-2, DType::F32).unwrap();
    let mut m = HstuModel::random(cfg, 7, 1).unwrap();
    let e = m
        .set_history_cache(Some(config("redis://127.0.0.1:1")))
        .unwrap_err()
        .to_string();
    assert!(e.contains("127.0.0.1:1"), "{e}");
}

/// Every shared-entry key on the cluster's primaries.
fn keys(c: &ember_bench::redis_cluster::LocalCluster) -> Vec<String> {
    let mut out = Vec::new();
    for port in c.primaries().unwrap() {
        let cmd = ember_redis::cmd("KEYS").arg("ember:hist:*").clone();
        if let ember_redis::Value::Array(v) = ember_bench::redis_cluster::query(port, &cmd).unwrap()
        {
            for k in v {
                if let ember_redis::Value::BulkString(b) = k {
                    out.push(String::from_utf8(b).unwrap());
                }
            }
        }
    }
    out
}

/// The primary's port that holds `key`.
fn port_of(c: &ember_bench::redis_cluster::LocalCluster, key: &str) -> u16 {
    let exists = ember_redis::cmd("EXISTS").arg(key).clone();
    (c.primaries().unwrap().into_iter())
        .find(|&p| {
            matches!(
                ember_bench::redis_cluster::query(p, &exists),
                Ok(ember_redis::Value::Int(1))
            )
        })
        .expect("a primary holds the key")
}
