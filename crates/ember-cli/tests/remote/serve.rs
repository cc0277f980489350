//! `ember serve` with its tables in the cluster: scores identical to DRAM, several replicas, and
//! what a killed primary, a paused node and a whole cluster down cost.

use crate::server::{PATIENCE, Server, request, tsv_rows, wait_until};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Request bodies and the scores a DRAM server gives them.
fn references(n: usize) -> (Vec<Vec<u8>>, Vec<String>) {
    let dram = Server::start(&["--grpc", "off"]);
    let bodies: Vec<Vec<u8>> = (0..n as u64).map(|s| tsv_rows(16, 100 + s)).collect();
    let scores = bodies
        .iter()
        .map(|b| {
            let (code, body) = dram.request("POST", "/v1/score", "text/plain", b).unwrap();
            assert_eq!(code, 200, "{body}");
            body
        })
        .collect();
    (bodies, scores)
}

pub fn remote_server(url: &str, extra: &[&str]) -> Server {
    let mut args = vec!["--grpc", "off", "--placement", "remote", "--redis", url];
    args.extend(extra);
    Server::start(&args)
}

#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn replicas_on_one_cluster_score_exactly_as_dram() {
    let Some(c) = super::cluster(1) else { return };
    super::push_default(&c);
    let (bodies, want) = references(12);
    // Two replicas: one with a cache too small to hold much, one with the default cache.
    let a = remote_server(&c.url(), &["--cache-mb", "1", "--cache-policy", "lru"]);
    let b = remote_server(&c.url(), &["--cache-policy", "lfu", "--read-from-replicas"]);
    for _ in 0..2 {
        for (body, want) in bodies.iter().zip(&want) {
            for s in [&a, &b] {
                let (code, got) = s.request("POST", "/v1/score", "text/plain", body).unwrap();
                assert_eq!((code, &got), (200, want));
            }
        }
    }
    for s in [&a, &b] {
        assert_eq!(
            s.request("GET", "/v2/health/ready", "text/plain", b"")
                .unwrap()
                .0,
            200
        );
        let metrics = s.request("GET", "/metrics", "text/plain", b"").unwrap().1;
        assert!(
            metrics.contains("ember_remote_rows_total{model=\"default\",node=\"127.0.0.1:"),
            "{metrics}"
        );
        let fetches = crate::server::metric_in(
            &metrics,
            "ember_remote_fetch_seconds_count{model=\"default\"}",
        );
        assert!(fetches > 0.0, "no fetch recorded: {metrics}");
        assert!(metrics.contains("ember_remote_up{model=\"default\"} 1"));
    }
}

#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn a_model_missing_from_the_store_is_refused_at_start_with_its_name() {
    let Some(c) = super::cluster(0) else { return };
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
        .args([
            "serve",
            "--grpc",
            "off",
            "--http",
            "127.0.0.1:0",
            "--placement",
            "remote",
        ])
        .args(["--redis", &c.url(), "--registry-model", "nope"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("'nope'") && err.contains("no ready version"),
        "{err}"
    );
}

/// A model repository of remote models (Triton's layout, `<root>/<name>/<version>/`) reads
/// each model from the store under its own name, not its version directory's: two models pushed
/// under their names score exactly as DRAM, and each one's rows are read from the cluster.
#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn a_repository_serves_each_remote_model_under_its_own_name() {
    let Some(c) = super::cluster(0) else { return };
    let root = std::env::temp_dir().join(format!(
        "ember-repo-remote-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    for name in ["left", "right"] {
        let dir = root.join(name).join("1");
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(super::default_model().join(f), dir.join(f)).unwrap();
        }
        let dir = dir.to_string_lossy().to_string();
        let args = ["registry", "push", "--redis", &c.url(), "--model", &dir];
        super::ok(&[&args[..], &["--name", name, "--replicas", "0"]].concat());
    }
    let (bodies, want) = references(2);
    let repo = root.to_string_lossy().to_string();
    let s = Server::start(&[
        "--grpc",
        "off",
        "--model-repository",
        &repo,
        "--placement",
        "remote",
        "--redis",
        &c.url(),
        "--cache-mb",
        "0",
    ]);
    for name in ["left", "right"] {
        for (body, want) in bodies.iter().zip(&want) {
            let path = format!("/v1/score?model={name}");
            let got = s.request("POST", &path, "text/plain", body).unwrap();
            assert_eq!((got.0, &got.1), (200, want), "model {name}");
        }
    }
    let metrics = s.request("GET", "/metrics", "text/plain", b"").unwrap().1;
    for name in ["left", "right"] {
        let rows = format!("ember_remote_rows_total{{model=\"{name}\"");
        assert!(
            metrics.contains(&rows),
            "no rows read for {name}: {metrics}"
        );
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// What a load of sequential requests saw: `(sent at, took, status, scores matched, the body of
/// an answer other than 200)`.
type Log = Arc<Mutex<Vec<(Duration, Duration, u16, bool, String)>>>;

/// Sends the bodies in turn to `addr` until `stop`, from `threads` threads, logging each answer.
/// A 200 whose scores differ from the reference is logged as not matching; any other status
/// must name the store.
fn load(
    s: &Server,
    bodies: Arc<Vec<Vec<u8>>>,
    want: Arc<Vec<String>>,
    threads: usize,
    stop: Arc<AtomicBool>,
    t0: Instant,
) -> (Log, Vec<std::thread::JoinHandle<()>>) {
    let log: Log = Arc::default();
    let handles = (0..threads)
        .map(|k| {
            let (bodies, want, stop, log, addr) = (
                bodies.clone(),
                want.clone(),
                stop.clone(),
                log.clone(),
                s.addr,
            );
            std::thread::spawn(move || {
                let mut i = k;
                while !stop.load(Ordering::Relaxed) {
                    let j = i % bodies.len();
                    i += threads;
                    let sent = t0.elapsed();
                    let r = request(
                        addr,
                        "POST",
                        "/v1/score",
                        "text/plain",
                        &bodies[j],
                        Duration::from_secs(10),
                    );
                    let took = t0.elapsed() - sent;
                    let (code, body) = r.unwrap_or((0, String::new()));
                    if code != 200 {
                        assert!(
                            code == 503 && body.contains("redis cluster at"),
                            "{code}: {body}"
                        );
                    }
                    log.lock().unwrap().push(if code == 200 {
                        (sent, took, code, body == want[j], String::new())
                    } else {
                        (sent, took, code, true, body)
                    });
                    // The load's pace (a client's think time), not a wait for a state.
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        })
        .collect();
    (log, handles)
}

/// Waits until the load has `n` answers to requests sent at `from` (since its `t0`) or later,
/// of any status, or only 200s where `ok_only`.
fn wait_answers(log: &Log, from: Duration, n: usize, ok_only: bool, what: &str) {
    wait_until(what, PATIENCE, || {
        let log = log.lock().unwrap();
        log.iter()
            .filter(|e| e.0 >= from && (!ok_only || e.2 == 200))
            .count()
            >= n
    });
}

fn finish(stop: &AtomicBool, handles: Vec<std::thread::JoinHandle<()>>) {
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().expect("a load thread failed");
    }
}

#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn a_killed_primary_costs_no_wrong_score_and_serving_recovers_by_itself() {
    let Some(mut c) = super::cluster(1) else {
        return;
    };
    super::push_default(&c);
    let (bodies, want) = references(8);
    // No cache: every batch reads the cluster.
    let s = remote_server(&c.url(), &["--cache-mb", "0"]);
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let (log, handles) = load(&s, Arc::new(bodies), Arc::new(want), 2, stop.clone(), t0);
    wait_answers(&log, Duration::ZERO, 20, true, "20 scores before the kill");
    let victim = c.index(c.primaries().unwrap()[0]).unwrap();
    let killed_at = t0.elapsed();
    c.kill(victim).unwrap();
    // Failover: a replica takes over after the node timeout.
    c.wait_healthy(Duration::from_secs(20)).unwrap();
    let healthy_at = t0.elapsed();
    let settled = healthy_at + Duration::from_millis(500);
    wait_answers(
        &log,
        settled,
        50,
        false,
        "50 answers 500 ms after the failover",
    );
    finish(&stop, handles);
    let log = log.lock().unwrap();
    assert!(log.iter().all(|e| e.3), "a 200 answer with wrong scores");
    // A request fails only while the kill can reach it: answered after the kill began, and
    // sent before the failover window closed.
    let window_end = killed_at + Duration::from_millis(c.node_timeout_ms + 2000);
    let late: Vec<_> = log
        .iter()
        .filter(|e| e.2 != 200 && (e.0 + e.1 < killed_at || e.0 > window_end))
        .collect();
    assert!(
        late.is_empty(),
        "failures outside the failover window (killed at {killed_at:?}, window to \
         {window_end:?}): {late:?}"
    );
    let after: Vec<_> = log
        .iter()
        .filter(|e| e.0 > healthy_at + Duration::from_millis(500))
        .collect();
    assert!(
        after.len() > 10 && after.iter().all(|e| e.2 == 200),
        "not back to serving: {after:?}"
    );
    let failed = log.iter().filter(|e| e.2 != 200).count();
    eprintln!(
        "killed primary: {} requests, {failed} answered 503, failover after {:?}",
        log.len(),
        healthy_at - killed_at
    );
}

#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn a_paused_node_delays_no_request_past_its_deadline() {
    let Some(mut c) = super::cluster(1) else {
        return;
    };
    super::push_default(&c);
    let (bodies, want) = references(8);
    let s = remote_server(&c.url(), &["--cache-mb", "0", "--redis-timeout-ms", "100"]);
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let (log, handles) = load(&s, Arc::new(bodies), Arc::new(want), 2, stop.clone(), t0);
    wait_answers(&log, Duration::ZERO, 20, true, "20 scores before the pause");
    let victim = c.index(c.primaries().unwrap()[1]).unwrap();
    c.pause(victim);
    // The pause's length is what is tested (no request may wait it out), not a wait.
    std::thread::sleep(Duration::from_millis(1500));
    c.resume(victim);
    let resumed_at = t0.elapsed();
    wait_answers(&log, resumed_at, 20, false, "20 answers after the resume");
    finish(&stop, handles);
    let log = log.lock().unwrap();
    assert!(log.iter().all(|e| e.3), "a 200 answer with wrong scores");
    // A request waits for at most one batch's fetch deadline (100 ms) plus its own queueing and
    // compute; a paused node must never hold a request for seconds.
    let slowest = log.iter().map(|e| e.1).max().unwrap();
    assert!(
        slowest < Duration::from_millis(800),
        "a request took {slowest:?}"
    );
    let failed = log.iter().filter(|e| e.2 != 200).count();
    eprintln!(
        "paused node: {} requests, {failed} answered 503, slowest {slowest:?}",
        log.len()
    );
}

#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn the_whole_cluster_down_answers_503_naming_it_and_readiness_follows() {
    let Some(mut c) = super::cluster(1) else {
        return;
    };
    super::push_default(&c);
    let (bodies, want) = references(2);
    let s = remote_server(&c.url(), &["--cache-mb", "0"]);
    // Ready once a read or a probe answered (on a busy host the first may miss its 100 ms).
    wait_until("ready", PATIENCE, || ready(&s) == 200);
    // Every node paused: nothing answers.
    for i in 0..c.nodes.len() {
        c.pause(i);
    }
    let t = Instant::now();
    let (code, body) = s
        .request("POST", "/v1/score", "text/plain", &bodies[0])
        .unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("redis cluster at") && body.contains("unavailable"),
        "{body}"
    );
    assert!(
        t.elapsed() < Duration::from_millis(800),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(ready(&s), 503);
    // Back: serving and readiness return by themselves.
    for i in 0..c.nodes.len() {
        c.resume(i);
    }
    let back = ember_bench::redis_cluster::wait_for(Duration::from_secs(10), || {
        let r = s
            .request("POST", "/v1/score", "text/plain", &bodies[1])
            .unwrap();
        Ok(r.0 == 200 && r.1 == want[1])
    });
    assert!(back.is_ok(), "serving did not come back");
    ember_bench::redis_cluster::wait_for(Duration::from_secs(5), || Ok(ready(&s) == 200)).unwrap();
    // Killed for good: still a clear 503, fast.
    for i in 0..c.nodes.len() {
        c.kill(i).unwrap();
    }
    let t = Instant::now();
    let (code, body) = s
        .request("POST", "/v1/score", "text/plain", &bodies[0])
        .unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(
        t.elapsed() < Duration::from_millis(800),
        "took {:?}",
        t.elapsed()
    );
}

/// The shipped model copied to a fresh `.../default` with its row files written by `ember
/// convert` (the local copy of `--remote-fallback`); the same name and rows as `push_default`.
pub fn model_with_row_files() -> std::path::PathBuf {
    let dir = std::env::temp_dir()
        .join(format!(
            "ember-fallback-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ))
        .join("default");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(super::default_model().join(f), dir.join(f)).unwrap();
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["convert", "--model"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ember convert: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// Failed reads of the cluster `s` counted, over every node and kind.
fn remote_errors(s: &Server) -> f64 {
    let text = s.request("GET", "/metrics", "text/plain", b"").unwrap().1;
    text.lines()
        .filter(|l| l.starts_with("ember_remote_errors_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The status of `/v2/health/ready`.
fn ready(s: &Server) -> u16 {
    s.request("GET", "/v2/health/ready", "text/plain", b"")
        .unwrap()
        .0
}

#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn with_a_local_copy_a_killed_primary_and_the_whole_cluster_paused_fail_no_request() {
    let Some(mut c) = super::cluster(1) else {
        return;
    };
    super::push_default(&c);
    let dir = model_with_row_files();
    let (bodies, want) = references(8);
    let model = dir.to_string_lossy().to_string();
    // A deadline of 1 s, not 100 ms: a debug build on a loaded 2-core machine (CI, the tests
    // beside this one) can pass 100 ms with the cluster whole, and such a batch is rightly read
    // from the copy, which is not what this test asks about.
    let s = remote_server(
        &c.url(),
        &[
            "--model",
            &model,
            "--cache-mb",
            "0",
            "--remote-fallback",
            "--redis-timeout-ms",
            "1000",
        ],
    );
    // The warm batches read before the server listens; the requests' own batches, with the
    // cluster whole, must not be read from the copy.
    let warmed = s.metric("ember_remote_fallback_rows_total{model=\"default\"}");
    eprintln!("rows read from the copy while warming: {warmed}");
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let (log, handles) = load(&s, Arc::new(bodies), Arc::new(want), 2, stop.clone(), t0);
    wait_answers(&log, Duration::ZERO, 20, true, "20 scores before the kill");
    assert_eq!(
        s.metric("ember_remote_fallback_rows_total{model=\"default\"}"),
        warmed,
        "rows read from the copy with the cluster whole"
    );
    let victim = c.index(c.primaries().unwrap()[0]).unwrap();
    let errors = remote_errors(&s);
    let killed_at = t0.elapsed();
    c.kill(victim).unwrap();
    // The kill reaches the server: its reads of the killed primary fail.
    wait_until("a remote error after the kill", PATIENCE, || {
        remote_errors(&s) > errors
    });
    wait_answers(&log, killed_at, 20, false, "20 answers after the kill");
    // Now every node left paused: nothing answers at all.
    let live: Vec<usize> = (0..c.nodes.len()).filter(|&i| i != victim).collect();
    let paused_at = t0.elapsed();
    for &i in &live {
        c.pause(i);
    }
    wait_until(
        "the local copy serving with the cluster paused",
        PATIENCE,
        || s.metric("ember_remote_fallback_active{model=\"default\"}") == 1.0,
    );
    wait_answers(
        &log,
        paused_at,
        20,
        false,
        "20 answers with the cluster paused",
    );
    assert_eq!(ready(&s), 200, "ready while the local copy serves");
    assert_eq!(
        s.metric("ember_remote_fallback_active{model=\"default\"}"),
        1.0
    );
    for &i in &live {
        c.resume(i);
    }
    // The cluster fails over and answers again: serving goes back to it by itself.
    c.wait_healthy(Duration::from_secs(20)).unwrap();
    let back = ember_bench::redis_cluster::wait_for(Duration::from_secs(10), || {
        Ok(s.metric("ember_remote_fallback_active{model=\"default\"}") == 0.0)
    });
    let back_at = t0.elapsed();
    wait_answers(
        &log,
        back_at,
        20,
        false,
        "20 answers after the cluster came back",
    );
    finish(&stop, handles);
    let log = log.lock().unwrap();
    let failed: Vec<_> = log.iter().filter(|e| e.2 != 200).collect();
    assert!(failed.is_empty(), "failed requests: {failed:?}");
    assert!(log.iter().all(|e| e.3), "a 200 answer with wrong scores");
    assert!(back.is_ok(), "serving did not go back to the cluster");
    let rows = s.metric("ember_remote_fallback_rows_total{model=\"default\"}");
    assert!(rows > warmed, "the local copy was never read");
    eprintln!(
        "with a local copy: {} requests, 0 failed, {rows} rows read locally",
        log.len()
    );
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}
