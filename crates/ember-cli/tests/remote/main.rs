//! The remote tier on a real Redis Cluster (3 primaries + 3 replicas of Debian's `redis-server`,
//! started by each test on free loopback ports and torn down after): push, verify, list and
//! remove; rows read back bit for bit for every dtype; the server's scores against DRAM; several
//! replicas; and the faults (a killed primary, a paused node, the whole cluster down).
//!
//! Every test skips with a message where `redis-server` is not installed (`.ci/run` installs it).

mod acl;
mod cli;
mod fallback;
mod faults;
mod freshness;
mod graph;
mod history_share;
mod hstu;
mod live;
mod load;
mod pool;
mod promote;
#[path = "../reliability/sampler.rs"]
mod sampler;
mod serve;
#[allow(dead_code)]
#[path = "../reliability/server.rs"]
mod server;
mod soak;
mod store;
mod tls;
mod updates;

use ember_bench::redis_cluster::{self, LocalCluster};

/// A started cluster, held by one test at a time (each is 3 to 6 processes, and the fault tests
/// time requests: on a 2-core machine, several at once starve each other).
#[derive(Debug)]
pub struct Held {
    cluster: LocalCluster,
    _turn: std::sync::MutexGuard<'static, ()>,
}

impl std::ops::Deref for Held {
    type Target = LocalCluster;
    fn deref(&self) -> &LocalCluster {
        &self.cluster
    }
}

impl std::ops::DerefMut for Held {
    fn deref_mut(&mut self) -> &mut LocalCluster {
        &mut self.cluster
    }
}

/// A started cluster, or `None` (with the reason printed) where Redis is not installed.
pub fn cluster(replicas: usize) -> Option<Held> {
    hold(|| LocalCluster::start(3, replicas, 1000))
}

/// A started cluster of 3 primaries with `replicas` each whose nodes load the Ember module
/// (`EMBER.POOL`) but those in `without` (indices in start order: 0-2 are the primaries), or
/// `None` where Redis is not installed.
pub fn cluster_with_module(replicas: usize, without: &[usize]) -> Option<Held> {
    hold(|| {
        let module = redis_cluster::pool_module()?;
        LocalCluster::start_with_module(3, replicas, 1000, Some(&module), without)
    })
}

/// The cluster `start` makes, held for this test's turn, or `None` (with the reason printed)
/// where Redis is not installed.
///
/// The cluster is started before the turn is taken: a new cluster's primaries stay in the
/// `fail` state for their first 2 s (Redis's writable delay), idle time that overlaps the
/// previous test's run this way (about 2 s of every test here). Its nodes are idle while they
/// wait; once the turn is taken, a cluster that is no longer as it was started (unhealthy, or a
/// replica promoted while a loaded machine delayed its pings) is started again.
fn hold(start: impl Fn() -> anyhow::Result<LocalCluster>) -> Option<Held> {
    if let Err(why) = redis_cluster::available() {
        // Built where they were (build.rs), so not marked ignored: their absence now is a fault.
        if cfg!(ember_redis) {
            panic!("redis-server was on the PATH when this test was built, and now: {why}");
        }
        eprintln!("skipped: {why}");
        return None;
    }
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let early = start().expect("starting a local Redis Cluster");
    let turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let cluster = if as_started(&early) {
        early
    } else {
        drop(early);
        start().expect("starting a local Redis Cluster")
    };
    Some(Held {
        cluster,
        _turn: turn,
    })
}

/// Whether `c` is healthy with its first three nodes (in start order) as its primaries.
fn as_started(c: &LocalCluster) -> bool {
    let wait = std::time::Duration::from_secs(5);
    if c.wait_healthy(wait).is_err() || c.wait_replicated(wait).is_err() {
        return false;
    }
    let Ok(mut primaries) = c.primaries() else {
        return false;
    };
    primaries.sort_unstable();
    let mut first: Vec<u16> = c.nodes.iter().take(3).map(|n| n.port).collect();
    first.sort_unstable();
    primaries == first
}

/// The shipped model's directory.
pub fn default_model() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default")
}

/// `ember registry push` of the shipped model into `c` (name `default`); panics on failure.
pub fn push_default(c: &LocalCluster) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["registry", "push", "--redis", &c.url(), "--model"])
        .arg(default_model())
        .output()
        .expect("running ember registry push");
    assert!(
        out.status.success(),
        "ember registry push: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The fault tests kill nodes next: every replica must hold what was pushed first.
    c.wait_replicated(std::time::Duration::from_secs(20))
        .expect("replicas catching up after the push");
}

/// Polls `state` until it is `Ok` (see also [`server::wait_until`]); panics after `limit` naming
/// `what` and the last state seen (its `Err`).
pub fn wait_state(
    what: &str,
    limit: std::time::Duration,
    mut state: impl FnMut() -> Result<(), String>,
) {
    let end = std::time::Instant::now() + limit;
    loop {
        let seen = match state() {
            Ok(()) => return,
            Err(seen) => seen,
        };
        assert!(
            std::time::Instant::now() < end,
            "no {what} within {limit:?}; last seen: {seen}"
        );
        // The poll's interval inside a bounded wait for a state.
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `ember ARGS`: whether it succeeded, and what it printed (stdout, then stderr).
pub fn ember(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// `ember ARGS`, which must succeed; what it printed.
/// `ember predict` of the model directory's file `data` (JSON lines) with `extra` flags,
/// scores written to `out`: the scores file's text.
pub fn predict_file(
    model: &std::path::Path,
    data: &str,
    out: &std::path::Path,
    extra: &[&str],
) -> String {
    let data = model.join(data);
    let mut args = vec![
        "predict",
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    ok(&args);
    std::fs::read_to_string(out).unwrap()
}

pub fn ok(args: &[&str]) -> String {
    let (done, text) = ember(args);
    assert!(done, "ember {args:?}: {text}");
    text
}

/// `/v1/score` of each TSV body on `s`, each answered 200: the answers, one string per body.
pub(crate) fn scores(s: &server::Server, bodies: &[Vec<u8>]) -> Vec<String> {
    bodies
        .iter()
        .map(|b| {
            let (code, got) = s.request("POST", "/v1/score", "text/plain", b).unwrap();
            assert_eq!(code, 200, "{got}");
            got
        })
        .collect()
}
