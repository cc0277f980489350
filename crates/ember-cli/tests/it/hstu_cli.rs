//! The `ember` commands on HSTU models: `predict` scores a users file as the reference did (the
//! parity fixtures of ember-model), refuses a bad user naming its line and feature and a DLRM
//! pipeline's flag; `data model
//! --preset hstu-small` writes a directory that `bench model --model` times and `predict` reads.

use crate::common;

use common::{ember, json_of};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../ember-model/tests/fixtures")
        .join(name)
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ember-hstu-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn predict_scores_users_as_the_reference_and_names_a_bad_one() {
    let fx = fixture("hstu_small");
    let dir = tmp("predict");
    let out = dir.join("scores.jsonl");
    let (model, users) = (fx.to_str().unwrap(), fx.join("users.jsonl"));
    let args = [
        "predict",
        "--model",
        model,
        "--data",
        users.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--batch",
        "3",
        "--json",
    ];
    let (ok, stdout, stderr) = ember(&args);
    assert!(ok, "{stderr}");
    let j = json_of(&stdout);
    assert_eq!(
        (&j["rows"], &j["item"]),
        (&8.into(), &"user".into()),
        "{stdout}"
    );
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fx.join("expected.json")).unwrap()).unwrap();
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 8);
    // Every user's candidates, counted once per output.
    let candidates: usize = lines
        .iter()
        .map(|l| l["scores"]["click"].as_array().unwrap().len())
        .sum();
    assert_eq!(j["values"], candidates, "{stdout}");
    for (u, line) in lines.iter().enumerate() {
        let (got, exp) = (
            line["scores"].as_object().unwrap(),
            want["alone"][u].as_object().unwrap(),
        );
        assert_eq!(got.len(), exp.len());
        for (task, e) in exp {
            for (g, e) in got[task]
                .as_array()
                .unwrap()
                .iter()
                .zip(e.as_array().unwrap())
            {
                let (g, e) = (g.as_f64().unwrap(), e.as_f64().unwrap());
                assert!(
                    (g - e).abs() <= 1e-5 * e.abs().max(1.0),
                    "user {u} {task}: {g} vs {e}"
                );
            }
        }
    }
    // A user whose history lengths disagree: refused naming its line and the feature.
    let text = std::fs::read_to_string(&users).unwrap();
    let mut bad: Vec<String> = text.lines().map(String::from).collect();
    let mut u: serde_json::Value = serde_json::from_str(&bad[2]).unwrap();
    u["uih"]["item_rating"]
        .as_array_mut()
        .unwrap()
        .push(3.into());
    bad[2] = u.to_string();
    let bad_path = dir.join("bad.jsonl");
    std::fs::write(&bad_path, bad.join("\n")).unwrap();
    let (ok, _, stderr) = ember(&[
        "predict",
        "--model",
        model,
        "--data",
        bad_path.to_str().unwrap(),
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("user 3") && stderr.contains("item_rating"),
        "{stderr}"
    );
    // A DLRM pipeline's flag is refused for an hstu model, not ignored.
    let (ok, _, stderr) = ember(&[
        "predict",
        "--model",
        model,
        "--data",
        users.to_str().unwrap(),
        "--prefetch-depth",
        "2",
    ]);
    assert!(!ok && stderr.contains("--prefetch-depth"), "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn data_model_writes_an_hstu_directory_that_bench_and_predict_read() {
    let dir = tmp("data");
    let model = dir.join("m");
    let m = model.to_str().unwrap();
    let (ok, _, stderr) = ember(&[
        "data",
        "model",
        "--preset",
        "hstu-small",
        "--rows-scale",
        "0.01",
        "--out",
        m,
        "--placement",
        "ssd",
        "--ssd-min-rows",
        "500",
    ]);
    assert!(ok, "{stderr}");
    assert!(model.join("rows/item_id.rows").is_file());
    let args = [
        "bench",
        "model",
        "--model",
        m,
        "--history",
        "30",
        "--candidates",
        "5",
        "--iters",
        "3",
        "--warmup",
        "1",
        "--json",
    ];
    let (ok, stdout, stderr) = ember(&args);
    assert!(ok, "{stderr}");
    let j = json_of(&stdout);
    assert_eq!(j["users"], 3, "{stdout}");
    assert_eq!(j["item"], "user", "{stdout}");
    assert_eq!(j["values"], 15, "{stdout}");
    assert!(j["p50_ms"].as_f64().unwrap() > 0.0);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn data_model_writes_the_model_bench_model_builds_in_memory() {
    use ember_model::hstu::presets::{preset, synthetic_users};
    use ember_model::hstu::{HstuModel, HstuPredictor};
    use std::sync::Arc;
    let dir = tmp("same");
    let model = dir.join("m");
    let args = [
        "data",
        "model",
        "--preset",
        "hstu-small",
        "--rows-scale",
        "0.01",
        "--seed",
        "5",
    ];
    let (ok, _, stderr) = ember(
        &[
            &args[..],
            &["--out", model.to_str().unwrap(), "--placement", "dram"],
        ]
        .concat(),
    );
    assert!(ok, "{stderr}");
    let cfg = preset("hstu-small", 0.01, ember_embed::DType::F32).unwrap();
    let built = Arc::new(HstuModel::random(cfg.clone(), 5, 2).unwrap());
    let read = Arc::new(HstuModel::load(&model, Default::default()).unwrap());
    let users = synthetic_users(&cfg, 4, 40, 6, 9);
    let a = HstuPredictor::new(built.clone(), 1)
        .unwrap()
        .run(&built.check_users(&users, 0).unwrap())
        .unwrap()
        .0;
    let b = HstuPredictor::new(read.clone(), 1)
        .unwrap()
        .run(&read.check_users(&users, 0).unwrap())
        .unwrap()
        .0;
    assert_eq!(a, b);
    std::fs::remove_dir_all(&dir).ok();
}

/// POSTs `body` as JSON to `path` on `addr`: (status, body).
fn post_json(addr: &str, path: &str, body: &str) -> (u16, String) {
    common::post_with(addr, path, "Content-Type: application/json\r\n", body)
}

#[test]
fn serve_scores_users_as_predict_does() {
    let fx = fixture("hstu_small");
    let dir = tmp("serve");
    let out = dir.join("scores.jsonl");
    let users = fx.join("users.jsonl");
    let (ok, _, stderr) = ember(&[
        "predict",
        "--model",
        fx.to_str().unwrap(),
        "--data",
        users.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    let server = common::serve(&["--model", fx.to_str().unwrap()]);
    let addr = server.addr.clone();
    // Each user of the file, one request each, as `predict` scored it.
    let want: Vec<serde_json::Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let lines = std::fs::read_to_string(&users).unwrap();
    let lines: Vec<&str> = lines.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), want.len());
    for (l, w) in lines.iter().zip(&want) {
        let (status, body) = post_json(&addr, "/v1/score", l);
        assert_eq!(status, 200, "{body}");
        let got: serde_json::Value = serde_json::from_str(&body).unwrap();
        let (got, w) = (&got["scores"][0], &w["scores"]);
        for (task, ws) in w.as_object().unwrap() {
            let (g, ws) = (got[task].as_array().unwrap(), ws.as_array().unwrap());
            assert_eq!(g.len(), ws.len(), "{task}");
            for (g, w) in g.iter().zip(ws) {
                let (g, w) = (g.as_f64().unwrap(), w.as_f64().unwrap());
                assert!((g - w).abs() <= 1e-6, "{task}: {g} vs {w}");
            }
        }
    }
    // A bad user names itself and the feature; the server serves on.
    let (status, body) = post_json(&addr, "/v1/score", r#"{"uih": {}, "candidates": {}}"#);
    assert_eq!(status, 400);
    assert!(
        body.contains("user 0") && body.contains("missing"),
        "{body}"
    );
    assert_eq!(post_json(&addr, "/v1/score", lines[0]).0, 200);
    drop(server);
    std::fs::remove_dir_all(&dir).ok();
}

/// `bench history-reuse` scores every request twice and reports how close stale came to
/// fresh; an unknown preset is refused by name.
#[test]
fn bench_history_reuse_reports_the_accuracy_kept() {
    let args = [
        "bench",
        "history-reuse",
        "--users",
        "2",
        "--requests",
        "3",
        "--history",
        "30",
        "--candidates",
        "5",
        "--threads",
        "1",
        "--json",
    ];
    let (ok, out, err) = ember(&args);
    assert!(ok, "{err}");
    let j = json_of(&out);
    assert_eq!(j["scores"], 15, "{j}");
    assert!(j["mean_appended"].as_f64().unwrap() >= 1.0, "{j}");
    let max = j["max_abs"].as_f64().unwrap();
    assert!(
        max.is_finite() && max >= j["mean_abs"].as_f64().unwrap(),
        "{j}"
    );
    for m in ["auc", "ne"] {
        let kept = j[m]["kept"].as_f64().unwrap();
        assert!(kept > 0.5 && kept < 2.0, "{m}: {j}");
    }
    let (ok, _, err) = ember(&["bench", "history-reuse", "--preset", "nope"]);
    assert!(!ok && err.contains("unknown --preset 'nope'"), "{err}");
}

/// `predict --history-cache-mb`: each user of a file given twice is served from its entry the
/// second time, with the scores of the pass without a cache (a repeat is exact, to f32
/// rounding); the report
/// counts it; a DLRM model is refused naming the flag.
#[test]
fn predict_with_a_history_cache_serves_repeats_from_their_entry() {
    let fx = fixture("hstu_small");
    let dir = tmp("history");
    let users = std::fs::read_to_string(fx.join("users.jsonl")).unwrap();
    let twice = dir.join("twice.jsonl");
    std::fs::write(&twice, format!("{users}{users}")).unwrap();
    let run = |out: &Path, cache: Option<&str>| {
        let mut args = vec![
            "predict",
            "--model",
            fx.to_str().unwrap(),
            "--data",
            twice.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--batch",
            "1",
            "--json",
        ];
        if let Some(mb) = cache {
            args.extend(["--history-cache-mb", mb]);
        }
        let (ok, stdout, stderr) = ember(&args);
        assert!(ok, "{stderr}");
        (json_of(&stdout), std::fs::read_to_string(out).unwrap())
    };
    let (plain, want) = run(&dir.join("plain.jsonl"), None);
    assert!(plain["history_cache"].is_null());
    let (j, got) = run(&dir.join("cached.jsonl"), Some("16"));
    // The same scores to f32 rounding (the projections run over fewer rows).
    let numbers = |text: &str| -> Vec<f64> {
        let mut out = Vec::new();
        for l in text.lines() {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            for task in v["scores"].as_object().unwrap().values() {
                out.extend(task.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()));
            }
        }
        out
    };
    let (got, want) = (numbers(&got), numbers(&want));
    assert_eq!(got.len(), want.len());
    let worst = (got.iter().zip(&want)).fold(0f64, |m, (a, b)| m.max((a - b).abs()));
    assert!(worst <= 1e-6, "scores differ by {worst}");
    // The fixture's 8 users have 7 ids: two users share id 35 with other histories, so each
    // of their 3 later requests finds the other's entry and is refused (and replaces it).
    let h = &j["history_cache"];
    let counts = |k: &str| h[k].as_u64().unwrap();
    assert_eq!(
        (counts("hits"), counts("misses"), counts("refused")),
        (6, 7, 3),
        "{j}"
    );
    assert_eq!(counts("entries"), 7);
    let dlrm = fixture("dlrm_dot");
    let (ok, _, stderr) = ember(&[
        "predict",
        "--model",
        dlrm.to_str().unwrap(),
        "--data",
        twice.to_str().unwrap(),
        "--history-cache-mb",
        "16",
    ]);
    assert!(!ok && stderr.contains("--history-cache-mb"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A streaming replay (`data users --returns`) sent by `loadgen --format users` to a server
/// with a history cache: every request answered, and returning users served from their
/// entries (`/metrics`).
#[test]
fn loadgen_replays_streaming_users_into_a_history_cache() {
    let fx = fixture("hstu_small");
    let dir = tmp("replay");
    let stream = dir.join("stream.jsonl");
    let (ok, _, stderr) = ember(&[
        "data",
        "users",
        "--model",
        fx.to_str().unwrap(),
        "--users",
        "4",
        "--history",
        "20",
        "--candidates",
        "3",
        "--returns",
        "60",
        "--out",
        stream.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&stream).unwrap().lines().count(),
        64
    );
    let server = common::serve(&["--history-cache-mb", "16", "--model", fx.to_str().unwrap()]);
    let addr = server.addr.clone();
    let url = format!("http://{addr}");
    let base = [
        "loadgen",
        "--url",
        &url,
        "--model",
        "hstu_small",
        "--format",
        "users",
    ];
    let mut args = base.to_vec();
    let path = stream.to_str().unwrap();
    args.extend(["--users", path, "--qps", "100", "--duration", "0.5"]);
    args.extend(["--warmup", "0.1", "--json"]);
    let (ok, stdout, stderr) = ember(&args);
    assert!(ok, "{stderr}");
    let v = json_of(&stdout);
    assert_eq!(v["errors"], 0, "{v}");
    assert!(v["ok"].as_u64().unwrap() > 10, "{v}");
    let page = common::get(&addr, "/metrics");
    let hits: f64 = page
        .lines()
        .find_map(|l| l.strip_prefix("ember_history_cache_hits_total{model=\"hstu_small\"} "))
        .unwrap_or_else(|| panic!("no history cache hits in /metrics"))
        .trim()
        .parse()
        .unwrap();
    assert!(hits > 0.0, "returning users were served from their entries");
    // --format users without --users: refused naming the flag.
    let (ok, _, stderr) = ember(&base);
    assert!(!ok && stderr.contains("--users"), "{stderr}");
    drop(server);
    std::fs::remove_dir_all(&dir).ok();
}

/// Runs `ember args`, killed and failed past `secs` (a start that should fail must not serve).
fn ember_within(args: &[&str], secs: u64) -> (bool, String) {
    use std::io::Read;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            child.kill().ok();
            child.wait().ok();
            panic!("{args:?} still running after {secs} s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).ok();
    (status.success(), err)
}

/// `serve --device cuda` of an hstu model in a build without CUDA fails at start saying what
/// is missing, with a history cache too; what an hstu model is not served with (a plan, a
/// calibration) is refused by name first, on any build. (With CUDA built, `bench/gpu/hstu_device.sh --steps
/// serve` checks the served scores against the CPU's on a GPU.)
#[test]
#[cfg_attr(
    feature = "cuda",
    ignore = "a CUDA build serves on a GPU where one is present: bench/gpu/hstu_device.sh checks it"
)]
fn serve_on_cuda_says_what_is_missing_or_what_it_cannot_take() {
    let fx = fixture("hstu_small");
    let base = [
        "serve",
        "--model",
        fx.to_str().unwrap(),
        "--http",
        "127.0.0.1:0",
        "--grpc",
        "off",
        "--device",
        "cuda",
    ];
    let (ok, err) = ember_within(&base, 120);
    assert!(!ok, "{err}");
    assert!(err.contains("--features cuda"), "{err}");
    let (ok, err) = ember_within(&[&base[..], &["--history-cache-mb", "64"]].concat(), 120);
    assert!(!ok, "{err}");
    assert!(err.contains("--features cuda"), "{err}");
    let plan = fx.join("no-such-plan.json");
    let (ok, err) = ember_within(
        &[&base[..], &["--plan", plan.to_str().unwrap()]].concat(),
        120,
    );
    assert!(!ok, "{err}");
    assert!(err.contains("without a plan"), "{err}");
}
