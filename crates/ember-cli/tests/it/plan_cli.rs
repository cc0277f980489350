//! `ember plan` end to end: plans of the shipped model and of the MLPerf tables, `predict --plan`
//! against the unsharded model, a small `plan eval`, and bad input.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common;
use common::{ember, json_of};

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

/// This test's directory (one per test and run: each test removes its own).
fn test_dir() -> PathBuf {
    let test = std::thread::current()
        .name()
        .unwrap_or("t")
        .replace("::", "-");
    std::env::temp_dir().join(format!("ember-plan-cli-{}-{test}", std::process::id()))
}

/// `name` in this test's directory.
fn tmp(name: &str) -> PathBuf {
    let d = test_dir();
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// Removes this test's directory when dropped, whether the test passed or not.
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(test_dir());
    }
}

fn scores(path: &Path) -> Vec<f32> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect()
}

#[test]
fn plans_of_the_shipped_model_score_like_the_model() {
    let _cleanup = Cleanup;
    let model = repo("models/default");
    let m = model.to_str().unwrap();
    let (plan, torchrec) = (tmp("p.json"), tmp("tr.json"));
    let (ok, out, err) = ember(&[
        "plan",
        "make",
        "--model",
        m,
        "--devices",
        "3",
        "--memory",
        "8MiB",
        "--out",
        plan.to_str().unwrap(),
        "--torchrec",
        torchrec.to_str().unwrap(),
        "--json",
    ]);
    assert!(ok, "{err}");
    let j = json_of(&out);
    assert_eq!(j["predicted_us"].as_array().unwrap().len(), 3);
    let tr: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&torchrec).unwrap()).unwrap();
    assert_eq!(tr.as_object().unwrap().len(), 26);
    assert_eq!(tr["t0"]["sharding_type"], "table_wise");

    // A hand-written plan with a row split and a column split over three devices.
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    let tables: Vec<serde_json::Value> = cfg["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| serde_json::json!({"name": t["name"], "rows": t["rows"], "dim": t["dim"]}))
        .collect();
    let rows0 = tables[0]["rows"].as_u64().unwrap();
    let dim1 = tables[1]["dim"].as_u64().unwrap();
    let rows1 = tables[1]["rows"].as_u64().unwrap();
    let mut shards = vec![
        serde_json::json!({"table": 0, "rows": [0, rows0 / 3], "cols": [0, tables[0]["dim"]], "device": 0}),
        serde_json::json!({"table": 0, "rows": [rows0 / 3, rows0], "cols": [0, tables[0]["dim"]], "device": 1}),
        serde_json::json!({"table": 1, "rows": [0, rows1], "cols": [0, dim1 / 2], "device": 1}),
        serde_json::json!({"table": 1, "rows": [0, rows1], "cols": [dim1 / 2, dim1], "device": 2}),
    ];
    for (i, t) in tables.iter().enumerate().skip(2) {
        shards.push(serde_json::json!({"table": i, "rows": [0, t["rows"]], "cols": [0, t["dim"]], "device": i % 3}));
    }
    let grid = tmp("grid.json");
    std::fs::write(
        &grid,
        serde_json::json!({
            "tables": tables,
            "devices": {"count": 3, "memory_bytes": 1u64 << 30},
            "batch": 512,
            "shards": shards,
        })
        .to_string(),
    )
    .unwrap();
    let (plain, made, split) = (tmp("s0.txt"), tmp("s1.txt"), tmp("s2.txt"));
    for (extra, out) in [
        (vec![], &plain),
        (vec!["--plan", plan.to_str().unwrap()], &made),
        (
            vec!["--plan", grid.to_str().unwrap(), "--plan-threads", "2"],
            &split,
        ),
    ] {
        let mut args = vec!["predict", "--model", m, "--out", out.to_str().unwrap()];
        args.extend(extra);
        let (ok, _, err) = ember(&args);
        assert!(ok, "{args:?}: {err}");
    }
    let want = scores(&plain);
    assert!(want.len() > 100);
    for got in [scores(&made), scores(&split)] {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-5, "{g} vs {w}");
        }
    }

    // A plan that does not cover a table, and one of other tables, are refused by name.
    let mut broken: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&grid).unwrap()).unwrap();
    broken["shards"].as_array_mut().unwrap().remove(0);
    std::fs::write(&grid, broken.to_string()).unwrap();
    let (ok, _, err) = ember(&["predict", "--model", m, "--plan", grid.to_str().unwrap()]);
    assert!(!ok && err.contains("t0") && err.contains("cover"), "{err}");
    let other = tmp("other.csv");
    std::fs::write(&other, "name,rows,dim\nx,10,4\n").unwrap();
    let p3 = tmp("p3.json");
    let (ok, _, err) = ember(&[
        "plan",
        "make",
        "--tables",
        other.to_str().unwrap(),
        "--devices",
        "1",
        "--memory",
        "1KiB",
        "--out",
        p3.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let (ok, _, err) = ember(&["predict", "--model", m, "--plan", p3.to_str().unwrap()]);
    assert!(!ok && err.contains("t0 is not in the plan"), "{err}");
    let (ok, _, err) = ember(&[
        "plan",
        "make",
        "--tables",
        other.to_str().unwrap(),
        "--memory",
        "10 parsecs",
    ]);
    assert!(!ok && err.contains("parsecs"), "{err}");
    let (ok, _, err) = ember(&[
        "plan",
        "make",
        "--tables",
        other.to_str().unwrap(),
        "--devices",
        "2",
        "--memory",
        "16",
    ]);
    assert!(!ok && err.contains("do not fit"), "{err}");

    // Reuse from a trace: a hot trace predicts less work than the same table with no reuse.
    let trace = tmp("trace.txt");
    std::fs::write(
        &trace,
        (0..4000)
            .map(|i| format!("{}\n", (i * 7) % 13))
            .collect::<String>(),
    )
    .unwrap();
    let wide = tmp("wide.csv");
    std::fs::write(&wide, "name,rows,dim,pooling\nx,100000,32,20\n").unwrap();
    let mut predicted = Vec::new();
    for extra in [
        vec![],
        vec!["--trace".to_string(), format!("x={}", trace.display())],
    ] {
        let mut args = vec![
            "plan",
            "make",
            "--tables",
            wide.to_str().unwrap(),
            "--devices",
            "1",
            "--memory",
            "1GiB",
            "--batch",
            "256",
            "--json",
        ];
        args.extend(extra.iter().map(String::as_str));
        let (ok, out, err) = ember(&args);
        assert!(ok, "{err}");
        let j = json_of(&out);
        predicted.push(j["predicted_us"][0].as_f64().unwrap());
    }
    assert!(predicted[1] < predicted[0], "{predicted:?}");
    let (ok, _, err) = ember(&[
        "plan",
        "make",
        "--tables",
        other.to_str().unwrap(),
        "--trace",
        &format!("nope={}", trace.display()),
    ]);
    assert!(!ok && err.contains("no table named nope"), "{err}");
}

#[test]
#[cfg_attr(
    not(ember_shared),
    ignore = "needs ../shared/data beside the repository (not here when built)"
)]
fn the_mlperf_tables_plan_on_eight_16gib_devices_where_present() {
    let _cleanup = Cleanup;
    let csv = repo("../shared/data/tables/mlperf_dlrm_dcnv2_tables.csv");
    assert!(
        csv.exists(),
        "{} not found: this test reads ../shared/data beside the repository (it is built as ignored where that is absent; --include-ignored runs it anyway)",
        csv.display()
    );
    let plan = tmp("mlperf.json");
    let (ok, out, err) = ember(&[
        "plan",
        "make",
        "--tables",
        csv.to_str().unwrap(),
        "--devices",
        "8",
        "--memory",
        "16GiB",
        "--batch",
        "65536",
        "--out",
        plan.to_str().unwrap(),
        "--json",
    ]);
    assert!(ok, "{err}");
    let j = json_of(&out);
    let bytes: Vec<u64> = j["device_bytes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap())
        .collect();
    assert_eq!(bytes.len(), 8);
    assert!(bytes.iter().all(|&b| b <= 16 << 30), "{bytes:?}");
    // ~104 GB of tables: the 40M-row tables (20 GB each) must be split by rows.
    assert!(bytes.iter().sum::<u64>() > 100_000_000_000);
    let f: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    let t0_shards = f["shards"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["table"] == 0)
        .count();
    assert!(t0_shards >= 2, "{t0_shards}");
    assert!(j["seconds"].as_f64().unwrap() < 5.0);
}

#[test]
#[cfg_attr(
    not(ember_shared),
    ignore = "needs ../shared/data beside the repository (not here when built)"
)]
fn a_small_eval_compares_with_every_baseline_where_the_stats_are_present() {
    let _cleanup = Cleanup;
    let stats = repo("../shared/data/tables/dlrm_datasets_2021_locality_stats.txt");
    assert!(
        stats.exists(),
        "{} not found: this test reads ../shared/data beside the repository (it is built as ignored where that is absent; --include-ignored runs it anyway)",
        stats.display()
    );
    let (ok, out, err) = ember(&[
        "plan",
        "eval",
        "--tasks",
        "2",
        "--max-tables",
        "14",
        "--max-rows",
        "20000",
        "--rounds",
        "1",
        "--batch",
        "64",
        "--locality",
        stats.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("improvement over the best baseline"), "{out}");
    for b in [
        "random",
        "size-greedy",
        "dim-greedy",
        "lookup-greedy",
        "size-lookup-greedy",
    ] {
        assert!(out.contains(&format!("vs {b} ")), "{b}: {out}");
    }
    let (ok, _, err) = ember(&["plan", "eval", "--tasks", "1", "--locality", "/nonexistent"]);
    assert!(!ok && err.contains("/nonexistent"), "{err}");
}

#[test]
fn serve_with_a_plan_scores_like_predict() {
    let _cleanup = Cleanup;
    use std::io::{BufRead, BufReader};
    let model = repo("models/default");
    let m = model.to_str().unwrap();
    let plan = tmp("serve-plan.json");
    let (ok, _, err) = ember(&[
        "plan",
        "make",
        "--model",
        m,
        "--devices",
        "2",
        "--memory",
        "8MiB",
        "--out",
        plan.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let want_file = tmp("serve-want.txt");
    let (ok, _, err) = ember(&[
        "predict",
        "--model",
        m,
        "--out",
        want_file.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let want = scores(&want_file);
    let mut child = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args([
            "serve",
            "--model",
            m,
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "127.0.0.1:0",
        ])
        .args(["--plan", plan.to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let addr = loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            let _ = child.kill();
            panic!("server exited: {seen}");
        }
        seen += &line;
        if let Some(rest) = line.split("http://").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    assert!(seen.contains("2 devices"), "{seen}");
    let rows = std::fs::read_to_string(repo("data/sample.tsv")).unwrap();
    let body: String = rows.lines().take(5).map(|l| format!("{l}\n")).collect();
    let (status, resp) = common::post(&addr, "/v1/score", &body);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(status, 200, "{resp}");
    let got: Vec<f32> = resp.lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_eq!(got.len(), 5);
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-5, "{g} vs {w}");
    }
}
