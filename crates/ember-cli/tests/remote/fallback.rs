//! The local copy of `--remote-fallback` under row updates: with the cluster down, rows updated
//! while a server followed the update stream are answered as updated; rows updated before it
//! started, and a table whose updates it missed (its stream trimmed past it), are refused with
//! a 503 naming them, never answered with the rows as pushed.

use crate::server::{PATIENCE, Server, tsv_rows, wait_until};
use crate::updates::{admin, overrun, update_file};
use ember_bench::redis_cluster::LocalCluster;
use rand::{Rng, SeedableRng};
use std::time::Duration;

/// Every body's `/v1/score` answer from `s`: (status, body).
fn scores(s: &Server, bodies: &[Vec<u8>]) -> Vec<(u16, String)> {
    bodies
        .iter()
        .map(|b| s.request("POST", "/v1/score", "text/plain", b).unwrap())
        .collect()
}

/// Waits up to [`PATIENCE`] for `done`.
fn until(what: &str, done: impl FnMut() -> bool) {
    wait_until(what, PATIENCE, done);
}

/// Pauses every node, runs `f`, resumes them and waits for the cluster to be healthy.
fn with_cluster_down(c: &mut LocalCluster, f: impl FnOnce()) {
    let n = c.nodes.len();
    (0..n).for_each(|i| c.pause(i));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    (0..n).for_each(|i| c.resume(i));
    c.wait_healthy(Duration::from_secs(20)).unwrap();
    if let Err(p) = r {
        std::panic::resume_unwind(p);
    }
}

#[test]
#[cfg_attr(
    not(ember_redis),
    ignore = "needs redis-server and redis-cli (apt-get install -y redis-server)"
)]
fn the_local_copy_answers_updated_rows_and_refuses_rows_it_cannot_know() {
    let Some(mut c) = super::cluster(1) else {
        return;
    };
    let url = c.url();
    super::push_default(&c);
    let dir = super::serve::model_with_row_files();
    let model = dir.to_string_lossy().to_string();
    // No cache: every row comes from the store, or from the copy when the store is down.
    let args = ["--model", &model, "--cache-mb", "0", "--remote-fallback"];
    let a = super::serve::remote_server(&url, &args);
    let bodies: Vec<Vec<u8>> = (0..4u64).map(|s| tsv_rows(16, 500 + s)).collect();
    let before = scores(&a, &bodies);
    assert!(before.iter().all(|(code, _)| *code == 200), "{before:?}");

    // Every row of t3 updated while `a` follows the stream.
    let file = dir.parent().unwrap().join("t3.safetensors");
    let ids: Vec<i64> = (0..2048).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let rows: Vec<f32> = (0..2048 * 16)
        .map(|_| rng.random_range(-3.0..3.0))
        .collect();
    update_file(&file, &ids, &rows, 16);
    let f = file.to_str().unwrap();
    super::ok(&[
        "registry", "update", "--redis", &url, "--model", "default", "--table", "t3", "--rows", f,
    ]);
    let want = scores(&super::serve::remote_server(&url, &[]), &bodies);
    assert!(
        want.iter()
            .zip(&before)
            .all(|(w, b)| w.0 == 200 && w.1 != b.1),
        "the update changed no score"
    );
    until("a serves the update", || scores(&a, &bodies) == want);
    // `b` starts after the update: its copy of t3 holds rows the store no longer has. On a busy
    // host its first reads may miss their deadline (100 ms): then it refuses (503) for a while,
    // and never answers the pushed rows.
    let b = super::serve::remote_server(&url, &args);
    until("b serves the update", || {
        let got = scores(&b, &bodies);
        for ((code, body), want) in got.iter().zip(&want) {
            assert!(
                (*code, body) == (200, &want.1)
                    || (*code == 503 && body.contains("stale local copy")),
                "b answered {code}: {body}"
            );
        }
        got == want
    });

    with_cluster_down(&mut c, || {
        assert_eq!(
            scores(&a, &bodies),
            want,
            "a's copy answers the rows it saw updated"
        );
        assert!(a.metric("ember_remote_fallback_rows_total{model=\"default\"}") > 0.0);
        for (code, msg) in scores(&b, &bodies) {
            assert_eq!(code, 503, "{msg}");
            assert!(
                msg.contains("stale local copy")
                    && msg.contains("table 't3'")
                    && msg.contains("updated in the store before this server followed"),
                "{msg}"
            );
        }
    });
    until("b back on the cluster", || scores(&b, &bodies) == want);

    // `a`'s stream of t3 trimmed past it: it cannot tell which rows it missed.
    let new: Vec<f32> = (0..10 * 16).map(|_| rng.random_range(-3.0..3.0)).collect();
    let bytes: Vec<u8> = new.iter().flat_map(|v| v.to_le_bytes()).collect();
    let missed: Vec<u64> = (0..10).collect();
    overrun(&mut admin(&url), "default", 1, "t3", &missed, &bytes);
    // Updates are applied between batches: score while waiting.
    until("a counts the reset", || {
        scores(&a, &bodies[..1]);
        a.metric("ember_update_resets_total{model=\"default\",table=\"t3\"}") > 0.0
    });
    with_cluster_down(&mut c, || {
        for (code, msg) in scores(&a, &bodies) {
            assert_eq!(code, 503, "{msg}");
            assert!(
                msg.contains("table 't3'") && msg.contains("trimmed past this server"),
                "{msg}"
            );
        }
    });
    assert_eq!(
        a.metric("ember_remote_fallback_stale_tables_total{model=\"default\"}"),
        1.0,
        "t3 of a"
    );
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}
