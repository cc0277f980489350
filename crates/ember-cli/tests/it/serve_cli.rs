//! `ember serve` as a user runs it: the binary on a free port, scored over HTTP, stopped with
//! SIGTERM while requests are in flight (they are answered; the exit code is 0).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStderr, Command, Stdio};

use crate::common;

use common::{get, post, post_with};
use std::time::{Duration, Instant};

/// Polls `ready` until it holds; panics naming `what` after `limit`.
fn wait_until(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !ready() {
        assert!(Instant::now() < end, "no {what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The value of `series` (`name{labels}` as printed) in a `/metrics` page, 0 if absent.
fn metric_in(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0.0)
}

#[test]
fn serve_scores_tsv_and_stops_cleanly_on_sigterm() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let Started {
        mut child,
        addr,
        mut err,
        line,
        ..
    } = start_server(&["--max-delay-us", "300000"]);
    assert!(line.contains("model 'default'"), "{line}");
    let rows = std::fs::read_to_string(root.join("data/sample.tsv")).unwrap();
    let rows: Vec<String> = rows.lines().take(3).map(String::from).collect();
    // Three requests that wait in a forming batch (max delay 300 ms) when SIGTERM arrives.
    let inflight: Vec<_> = rows
        .iter()
        .map(|r| {
            let (a, r) = (addr.clone(), r.clone());
            std::thread::spawn(move || post(&a, "/v1/score", &r))
        })
        .collect();
    // Received: queued in the forming batch (or, on a machine slow enough to miss its 300 ms,
    // answered already).
    wait_until("three requests received", Duration::from_secs(30), || {
        let page = get(&addr, "/metrics");
        metric_in(&page, "ember_queue_depth")
            + metric_in(
                &page,
                "ember_requests_total{protocol=\"http\",status=\"ok\"}",
            )
            >= 3.0
    });
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    for t in inflight {
        let (status, body) = t.join().unwrap();
        assert_eq!(status, 200, "{body}");
        let score: f32 = body.trim().parse().unwrap();
        assert!((0.0..=1.0).contains(&score));
    }
    let code = child.wait().unwrap();
    assert!(code.success(), "exit status {code}");
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("stopped"), "{rest}");
}

/// A server started by [`start_server`].
pub(crate) struct Started {
    pub(crate) child: Child,
    /// The HTTP address.
    pub(crate) addr: String,
    /// The gRPC address.
    pub(crate) grpc: String,
    /// The rest of its stderr.
    pub(crate) err: BufReader<ChildStderr>,
    /// The line that named the HTTP address.
    pub(crate) line: String,
    /// The lines before it (the load's log).
    pub(crate) before: Vec<String>,
}

/// Starts `ember serve` on free ports (from a directory other than the repository's).
pub(crate) fn start_server(extra: &[&str]) -> Started {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .args(extra)
        .current_dir(std::env::temp_dir())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    // "serving model 'default' v1 on http://127.0.0.1:PORT  (...", after a repository's
    // "ember: loading model ..." lines.
    let (addr, line, before) = common::address_line(&mut err);
    // "gRPC (inference.GRPCInferenceService) on 127.0.0.1:PORT"
    let mut gline = String::new();
    err.read_line(&mut gline).unwrap();
    let grpc = gline
        .trim()
        .rsplit(' ')
        .next()
        .filter(|a| gline.starts_with("gRPC") && a.contains(':'))
        .unwrap_or_else(|| panic!("no gRPC address in {gline:?}"))
        .to_string();
    Started {
        child,
        addr,
        grpc,
        err,
        line,
        before,
    }
}

#[test]
fn loadgen_measures_a_live_server_over_http_and_grpc() {
    let Started {
        mut child,
        addr,
        grpc,
        ..
    } = start_server(&[]);
    // gRPC by both clients: the lean one (h2, the default) and tonic's.
    for (protocol, format, url, client) in [
        ("http", "kserve", format!("http://{addr}"), "lean"),
        ("http", "tsv", format!("http://{addr}"), "lean"),
        ("http", "binary", format!("http://{addr}"), "lean"),
        ("grpc", "kserve", format!("grpc://{grpc}"), "lean"),
        ("grpc", "kserve", format!("grpc://{grpc}"), "tonic"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(["loadgen", "--url", &url, "--qps", "200"])
            .args(["--grpc-client", client])
            .args([
                "--duration",
                "1",
                "--warmup",
                "0.2",
                "--protocol",
                protocol,
                "--format",
                format,
                "--json",
            ])
            .args(["--samples-per-request", "2", "--pooling", "2"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        assert_eq!(v["errors"], 0, "{protocol} {format} {client}: {v}");
        let ok = v["ok"].as_u64().unwrap();
        // Poisson arrivals at 200/s for 1 s: far from 0, and none lost.
        assert!(
            (120..=280).contains(&ok),
            "{protocol} {format}: {ok} answered"
        );
        assert_eq!(
            v["samples_per_s"].as_f64().unwrap(),
            2.0 * v["achieved_qps"].as_f64().unwrap()
        );
        assert!(v["p50_ms"].as_f64().unwrap() <= v["p99_ms"].as_f64().unwrap());
    }
    // find-max stops at the first rate over the objective and reports the steps.
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args([
            "loadgen",
            "--url",
            &format!("http://{addr}"),
            "--qps",
            "100",
            "--duration",
            "0.5",
        ])
        .args([
            "--warmup",
            "0.1",
            "--find-max",
            "--slo-p99-ms",
            "0.001",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(v["mode"], "find_max");
    assert!(v["max_qps"].is_null(), "no rate keeps p99 under 1 us: {v}");
    assert!(!v["steps"].as_array().unwrap().is_empty());
    // A server that is not there: a clear error, not a hang.
    child.kill().unwrap();
    child.wait().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args([
            "loadgen",
            "--url",
            &format!("http://{addr}"),
            "--duration",
            "0.5",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("asking"));
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args([
            "loadgen",
            "--protocol",
            "grpc",
            "--url",
            &format!("grpc://{grpc}"),
        ])
        .args(["--duration", "0.5"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("asking") && err.contains("connecting"),
        "{err}"
    );
}

/// `serve --placement ssd` on a converted copy of the shipped model: the same scores as in DRAM,
/// and the tier's counters on /metrics.
#[test]
fn serve_with_tables_on_the_ssd_tier_reports_the_cache_on_metrics() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::env::temp_dir().join(format!("ember-serve-tier-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(root.join("models/default").join(f), dir.join(f)).unwrap();
    }
    let d = dir.to_str().unwrap();
    let st = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["convert", "--model", d])
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let rows: String = std::fs::read_to_string(root.join("data/sample.tsv"))
        .unwrap()
        .lines()
        .take(20)
        .map(|l| format!("{l}\n"))
        .collect();
    let mut scores = Vec::new();
    for extra in [
        vec!["--model", d],
        vec![
            "--model",
            d,
            "--placement",
            "ssd",
            "--cache-mb",
            "1",
            "--cache-policy",
            "lfu",
        ],
    ] {
        let Started {
            mut child, addr, ..
        } = start_server(&extra);
        let (status, body) = post(&addr, "/v1/score", &rows);
        assert_eq!(status, 200, "{body}");
        scores.push(body);
        let metrics = get(&addr, "/metrics");
        let tier = extra.contains(&"ssd");
        for name in [
            "ember_tier_cache_hit_ratio",
            "ember_tier_cache_lookups_total",
            "ember_tier_store_read_bytes_total",
            "ember_tier_store_reads_total",
            "ember_tier_ssd_read_bytes_total",
            "ember_tier_ssd_reads_total",
            "ember_tier_stall_seconds",
            "ember_tier_cache_bytes",
        ] {
            assert_eq!(
                metrics.contains(name),
                tier,
                "{name} with {extra:?}:\n{metrics}"
            );
        }
        if tier {
            let value = |name: &str| -> f64 {
                metrics
                    .lines()
                    .find(|l| l.starts_with(&format!("{name}{{")))
                    .and_then(|l| l.split_whitespace().last())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("no {name} in:\n{metrics}"))
            };
            assert!(
                value("ember_tier_store_read_bytes_total") >= 4096.0,
                "{metrics}"
            );
            assert!(value("ember_tier_store_reads_total") >= 1.0, "{metrics}");
            // The old names stay for one release as deprecated aliases, with the same values.
            for (new, old) in [
                (
                    "ember_tier_store_read_bytes_total",
                    "ember_tier_ssd_read_bytes_total",
                ),
                ("ember_tier_store_reads_total", "ember_tier_ssd_reads_total"),
            ] {
                assert_eq!(value(new), value(old), "{new} vs {old}:\n{metrics}");
            }
            assert!(
                metrics.contains("Deprecated: use ember_tier_store_reads_total"),
                "{metrics}"
            );
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
    assert_eq!(
        scores[0], scores[1],
        "scores from the SSD tier differ from DRAM"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Writes a repository of two models (`ctr` at versions 1 and 2, `small` at 1), each version a
/// copy of the shipped model.
fn repository(tag: &str) -> std::path::PathBuf {
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default");
    let root = std::env::temp_dir().join(format!("ember-cli-repo-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for v in ["ctr/1", "ctr/2", "small/1"] {
        let d = root.join(v);
        std::fs::create_dir_all(&d).unwrap();
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(shipped.join(f), d.join(f)).unwrap();
        }
    }
    root
}

/// `ember predict` of JSON lines scores a model that is not Criteo-shaped exactly as a server of
/// it scores the same samples; a bad line is named by its number, TSV for such a model is
/// refused naming the format to use.
#[test]
fn predict_scores_json_lines_of_any_model_as_the_server_does() {
    use rand::{Rng, SeedableRng};
    let dir = std::env::temp_dir().join(format!("ember-predict-jsonl-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let model = dir.join("small");
    let ember = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(args)
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    };
    let m = model.to_str().unwrap();
    let (ok, _, err) = ember(&[
        "data", "model", "--preset", "small", "--seed", "3", "--out", m,
    ]);
    assert!(ok, "{err}");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    let dense_in = config["dense_in"].as_u64().unwrap() as usize;
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let samples: Vec<serde_json::Value> = (0..11)
        .map(|_| {
            let sparse: serde_json::Map<String, serde_json::Value> = config["tables"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| {
                    let rows = t["rows"].as_u64().unwrap();
                    let n = rng.random_range(0..4);
                    let ids: Vec<u64> = (0..n).map(|_| rng.random_range(0..rows)).collect();
                    (
                        t["name"].as_str().unwrap().to_string(),
                        serde_json::json!(ids),
                    )
                })
                .collect();
            let dense: Vec<f32> = (0..dense_in).map(|_| rng.random_range(-1.0..1.0)).collect();
            serde_json::json!({ "dense": dense, "sparse": sparse })
        })
        .collect();
    let lines: String = samples
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut s = s.clone();
            s["label"] = serde_json::json!(i % 2);
            format!("{s}\n")
        })
        .collect();
    let data = dir.join("samples.jsonl");
    std::fs::write(&data, lines).unwrap();
    let out = dir.join("scores.txt");
    let (ok, stdout, err) = ember(&[
        "predict",
        "--model",
        m,
        "--data",
        data.to_str().unwrap(),
        "--batch",
        "4",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(
        stdout.contains("rows          11") && stdout.contains("AUC"),
        "{stdout}"
    );
    let got: Vec<f32> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    let Started {
        mut child, addr, ..
    } = start_server(&["--model", m]);
    let body = serde_json::Value::Array(samples).to_string();
    let (status, answer) = post_with(
        &addr,
        "/v1/score",
        "Content-Type: application/json\r\n",
        &body,
    );
    assert_eq!(status, 200, "{answer}");
    child.kill().unwrap();
    let _ = child.wait();
    let want: Vec<f32> = serde_json::from_str::<serde_json::Value>(&answer).unwrap()["scores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5, "predict {g} vs server {w}");
    }
    // A bad third line: named, with what is wrong.
    let bad = dir.join("bad.jsonl");
    let first: String = std::fs::read_to_string(&data)
        .unwrap()
        .lines()
        .take(2)
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&bad, format!("{first}{{\"dense\": [1]}}\n")).unwrap();
    let (ok, _, err) = ember(&["predict", "--model", m, "--data", bad.to_str().unwrap()]);
    assert!(
        !ok && err.contains("bad.jsonl, line 3") && err.contains("'dense' has 1 values"),
        "{err}"
    );
    // Criteo TSV for this model: refused, naming --format jsonl.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/sample.tsv");
    let (ok, _, err) = ember(&["predict", "--model", m, "--data", root.to_str().unwrap()]);
    assert!(!ok && err.contains("--format jsonl"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--access-log --log-format json` writes one JSON line per request naming its route, model,
/// status and samples; a bad `--log-level` stops the server at start, naming it.
#[test]
fn the_access_log_writes_a_json_line_per_request() {
    let Started {
        mut child,
        addr,
        err,
        ..
    } = start_server(&["--access-log", "--log-format", "json"]);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in err.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let rows: String = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/sample.tsv"),
    )
    .unwrap()
    .lines()
    .take(3)
    .map(|l| format!("{l}\n"))
    .collect();
    assert_eq!(post(&addr, "/v1/score", &rows).0, 200);
    assert_eq!(post(&addr, "/v2/models/nope/infer", "{}").0, 404);
    let mut seen = Vec::new();
    let mut banner = None;
    while seen.len() < 2 {
        let line = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("an access log line within 10 s");
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if v["target"] == "ember_access" {
            seen.push(v);
        } else if v["message"]
            .as_str()
            .is_some_and(|m| m.contains("forward thread"))
        {
            banner = v["message"].as_str().map(String::from);
        }
    }
    // The start-up banner (a JSON line too): placement, cache, threads, kernels, device.
    let banner = banner.expect("the start-up banner");
    assert!(
        banner.contains("tables 26 dram")
            && banner.contains("no row cache")
            && banner.contains("kernels ")
            && banner.contains("device cpu"),
        "{banner}"
    );
    let want = [
        ("POST /v1/score", "default", 200, 3),
        ("POST /v2/models/nope/infer", "", 404, 0),
    ];
    for (v, (route, model, status, samples)) in seen.iter().zip(want) {
        assert_eq!(v["route"], route, "{v}");
        assert_eq!(v["model"], model, "{v}");
        assert_eq!(v["status"], status, "{v}");
        assert_eq!(v["samples"], samples, "{v}");
        assert_eq!(v["protocol"], "http", "{v}");
        assert!(v["latency_ms"].as_f64().unwrap() > 0.0, "{v}");
    }
    child.kill().unwrap();
    let _ = child.wait();
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "off",
            "--log-level",
            "loud=x=y",
        ])
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && e.contains("'loud=x=y' is not a level"),
        "{e}"
    );
}

/// Two models of a repository on the SSD tier keep their tier series apart on /metrics (each
/// labelled with its name): scoring only one of them moves only its lookups.
#[test]
fn the_tier_metrics_of_two_served_models_are_labelled_apart() {
    let root = repository("tier");
    for v in ["ctr/2", "small/1"] {
        let st = Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(["convert", "--model"])
            .arg(root.join(v))
            .output()
            .unwrap();
        assert!(
            st.status.success(),
            "{}",
            String::from_utf8_lossy(&st.stderr)
        );
    }
    std::fs::remove_dir_all(root.join("ctr/1")).unwrap();
    let Started {
        mut child, addr, ..
    } = start_server(&[
        "--model-repository",
        root.to_str().unwrap(),
        "--placement",
        "ssd",
        "--cache-mb",
        "1",
    ]);
    let rows = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/sample.tsv"),
    )
    .unwrap();
    let body: String = rows.lines().take(20).map(|l| format!("{l}\n")).collect();
    let lookups = |model: &str| -> f64 {
        let series = format!("ember_tier_cache_lookups_total{{model=\"{model}\"}} ");
        get(&addr, "/metrics")
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str())?.trim().parse().ok())
            .unwrap_or(0.0)
    };
    let (status, out) = post(&addr, "/v1/score?model=ctr", &body);
    assert_eq!(status, 200, "{out}");
    let (ctr, small) = (lookups("ctr"), lookups("small"));
    assert!(ctr > 0.0, "ctr's lookups are not on /metrics");
    for _ in 0..3 {
        let (status, out) = post(&addr, "/v1/score?model=small", &body);
        assert_eq!(status, 200, "{out}");
    }
    assert_eq!(lookups("ctr"), ctr, "scoring small moved ctr's series");
    assert!(lookups("small") > small, "small's lookups did not move");
    child.kill().unwrap();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&root);
}

/// `loadgen` pointed at a server of another model says what the server serves, over HTTP and
/// gRPC, and names the flag to change; `--http PORT` alone listens on 127.0.0.1.
#[test]
fn loadgen_for_the_wrong_model_repeats_the_servers_answer() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["serve", "--name", "dcn", "--grpc", "127.0.0.1:0", "--http"])
        .arg(port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut grpc = None;
    let mut line = String::new();
    while grpc.is_none() {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "the server stopped");
        if let Some(rest) = line.strip_prefix("gRPC (inference.GRPCInferenceService) on ") {
            grpc = rest.split_whitespace().next().map(str::to_string);
        }
    }
    let addr = format!("127.0.0.1:{port}");
    let _drain = std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    for url in [
        format!("http://{addr}"),
        format!("grpc://{}", grpc.unwrap()),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(["loadgen", "--duration", "1", "--url", &url])
            .args(if url.starts_with("grpc") {
                &["--protocol", "grpc"][..]
            } else {
                &[]
            })
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{e}");
        assert!(
            e.contains("this server serves 'dcn'") && e.contains("--model"),
            "{url}: {e}"
        );
    }
    child.kill().unwrap();
    let _ = child.wait();
}

/// `ember serve --model-repository ROOT` with `extra` arguments: the child, its HTTP address,
/// and its log read to the end on a thread (a closed pipe would fail the server's next log
/// line).
fn serve_repository(
    root: &std::path::Path,
    extra: &[&str],
) -> (std::process::Child, String, std::thread::JoinHandle<String>) {
    let mut args = vec!["--model-repository", root.to_str().unwrap()];
    args.extend_from_slice(extra);
    let Started {
        child, addr, err, ..
    } = start_server(&args);
    let log = std::thread::spawn(move || std::io::read_to_string(err).unwrap_or_default());
    (child, addr, log)
}

#[test]
fn serve_a_model_repository() {
    let root = repository("ok");
    let (mut child, addr, log) = serve_repository(&root, &["--poll-secs", "0.1"]);
    let rows = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/sample.tsv"),
    )
    .unwrap();
    let row = rows.lines().next().unwrap();
    // Two models: /v1/score must be told which.
    let (status, body) = post(&addr, "/v1/score", row);
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("'ctr', 'small'") && body.contains("?model="),
        "{body}"
    );
    let (status, a) = post(&addr, "/v1/score?model=ctr", row);
    assert_eq!(status, 200, "{a}");
    let (status, b) = post(&addr, "/v1/score?model=small", row);
    assert_eq!((status, &a), (200, &b));
    let meta = get(&addr, "/v2/models/ctr");
    assert!(meta.contains("\"versions\":[\"2\"]"), "{meta}");
    // Model control is off unless asked for: no client unloads a model.
    let (status, body) = post(&addr, "/v2/repository/models/ctr/unload", "");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("--model-control explicit"), "{body}");
    let (status, _) = post(&addr, "/v1/score?model=ctr", row);
    assert_eq!(status, 200);
    // A new version on disk is picked up by the poller.
    let d = root.join(".ctr-3");
    std::fs::create_dir_all(&d).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(root.join("ctr/2").join(f), d.join(f)).unwrap();
    }
    std::fs::rename(&d, root.join("ctr/3")).unwrap();
    wait_until("pick-up of version 3", Duration::from_secs(20), || {
        get(&addr, "/v2/models/ctr").contains("\"versions\":[\"3\"]")
    });
    // The old version is UNLOADING until its requests are answered and its memory is freed
    // (on an idle-class thread), then UNAVAILABLE with the reason.
    let end = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, index) = post(&addr, "/v2/repository/index", "");
        assert_eq!(status, 200, "{index}");
        if index.contains("replaced by version 3") {
            break;
        }
        assert!(std::time::Instant::now() < end, "{index}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    assert!(child.wait().unwrap().success());
    let log = log.join().unwrap();
    assert!(log.contains("model 'ctr' version 3 serving"), "{log}");

    // A repository with a bad model does not start, and names the file.
    std::fs::write(root.join("small/1/config.json"), "{").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "off",
            "--model-repository",
        ])
        .arg(&root)
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{e}");
    assert!(e.contains("small/1/config.json"), "{e}");
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn serve_records_its_lookups_as_profiles_that_convert_lays_rows_out_by() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let work = std::env::temp_dir().join(format!("ember-serve-profile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let profiles = work.join("profiles");
    // The interval is long: the files come from the write at stop.
    let Started {
        mut child,
        addr,
        mut err,
        ..
    } = start_server(&[
        "--profile-dir",
        profiles.to_str().unwrap(),
        "--profile-interval-s",
        "3600",
    ]);
    let text = std::fs::read_to_string(root.join("data/sample.tsv")).unwrap();
    let rows: Vec<&str> = text.lines().take(3).collect();
    // One request at a time, so batches (and the recorded ids) follow this order.
    let sent = [rows[0], rows[1], rows[0], rows[2]];
    for r in sent {
        let (status, body) = post(&addr, "/v1/score", r);
        assert_eq!(status, 200, "{body}");
    }
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let code = child.wait().unwrap();
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert!(code.success(), "exit status {code}: {rest}");
    // Each table's file has the ids of its feature in the order sent: the categorical's hex
    // value mod the table's rows (how a batch is built from Criteo TSV).
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("models/default/config.json")).unwrap(),
    )
    .unwrap();
    let tables = config["tables"].as_array().unwrap();
    for (k, t) in tables.iter().enumerate() {
        let (name, rows) = (t["name"].as_str().unwrap(), t["rows"].as_u64().unwrap());
        let want: Vec<u64> = sent
            .iter()
            .map(|r| {
                let hex = r.split('\t').nth(14 + k).unwrap_or("");
                u64::from_str_radix(if hex.is_empty() { "0" } else { hex }, 16).unwrap() % rows
            })
            .collect();
        let file = profiles.join("default").join(format!("{name}.ids"));
        let got: Vec<u64> = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()))
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        assert_eq!(got, want, "{name}");
    }
    // A copy of the model laid out by them: every table from its own file.
    let model = work.join("model");
    std::fs::create_dir_all(&model).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(root.join("models/default").join(f), model.join(f)).unwrap();
    }
    let convert = |profile: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_ember"))
            .args([
                "convert",
                "--model",
                model.to_str().unwrap(),
                "--placement",
                "ssd",
            ])
            .args(["--layout-profile", profile.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let out = convert(&profiles.join("default"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "t0: laid out by {}",
            profiles.join("default/t0.ids").display()
        )),
        "{err}"
    );
    let f = ember_embed::rowfile::RowFile::open(&model.join("rows/t0.rows")).unwrap();
    assert!(f.layout().is_some_and(|l| !l.is_identity()));
    // A table without a profile is named, with the way out.
    std::fs::remove_file(profiles.join("default/t5.ids")).unwrap();
    let out = convert(&profiles.join("default"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("no profile of table 't5'")
            && err.contains("--tables"),
        "{err}"
    );
    std::fs::remove_dir_all(&work).unwrap();
}

/// `ember serve --dense-dtype bf16`: the load's accuracy check is logged, the start-up banner
/// names the dense dtype and its kernels, and scores over HTTP are finite probabilities within
/// bf16's distance of an f32 server's, not identical to them (the bf16 layers ran).
#[test]
fn serve_with_dense_layers_in_bf16_scores_close_to_f32() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let rows: String = std::fs::read_to_string(root.join("data/sample.tsv"))
        .unwrap()
        .lines()
        .take(50)
        .map(|l| format!("{l}\n"))
        .collect();
    let mut scores = Vec::new();
    for dtype in ["f32", "bf16"] {
        let Started {
            mut child,
            addr,
            err,
            before,
            ..
        } = start_server(&["--dense-dtype", dtype]);
        // The banner follows the address lines; the log is read to its end on a thread (a
        // closed pipe would fail the server's next line).
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in err.lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let end = std::time::Instant::now() + Duration::from_secs(20);
        let banner = loop {
            let left = end.saturating_duration_since(std::time::Instant::now());
            let line = rx
                .recv_timeout(left)
                .expect("the start-up banner within 20 s");
            if line.contains("forward thread") {
                break line;
            }
        };
        assert!(
            banner.contains(&format!("dense {dtype} (")) && !banner.contains("(?)"),
            "{dtype}: {banner}"
        );
        // The check at load: "model 'default': bf16 dense layers (amx-bf16 tiles) keep
        // 100.00x% of f32's AUC on 4096 random samples ..."; none for f32.
        let check: Vec<&String> = before
            .iter()
            .filter(|l| l.contains("dense layers"))
            .collect();
        match dtype {
            "f32" => assert!(check.is_empty(), "{check:?}"),
            _ => assert!(
                check.len() == 1
                    && check[0].contains("bf16 dense layers")
                    && check[0].contains("keep")
                    && check[0].contains("% of f32's AUC")
                    && !check[0].contains("WARN"),
                "{before:?}"
            ),
        }
        let (status, body) = post(&addr, "/v1/score", &rows);
        assert_eq!(status, 200, "{body}");
        let s: Vec<f32> = body.lines().map(|l| l.parse().unwrap()).collect();
        assert_eq!(s.len(), 50, "{body}");
        assert!(s.iter().all(|v| (0.0..=1.0).contains(v)), "{body}");
        scores.push(s);
        child.kill().unwrap();
        child.wait().unwrap();
    }
    // Measured on these 50 rows: 4.6e-3 at most (the model crate's tests/dense_dtype.rs hold
    // bf16 to 0.015 too).
    let max = scores[0]
        .iter()
        .zip(&scores[1])
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(max <= 0.015, "bf16 scores {max:e} from f32's");
    assert_ne!(scores[0], scores[1], "bf16 scores identical to f32's");
}

/// `serve --dense-dtype int8 --calibrate FILE`: the int8 layers are calibrated on the file's
/// inputs before serving (a log line says on how many samples), the banner says int8, and its
/// scores stay close to f32's while differing from plain int8's. `--calibrate` without int8,
/// or a file that does not fit the model, is refused by name.
#[test]
fn serve_calibrates_int8_layers_on_a_file_of_inputs() {
    use safetensors::Dtype;
    use safetensors::tensor::TensorView;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("models/default/config.json")).unwrap(),
    )
    .unwrap();
    // Inputs like the served ones: rows 200-399 of data/sample.tsv (the scored rows are 0-199),
    // decoded as model-format.md says (dense ln(x + 1), ids hex mod rows); calibrating on
    // inputs unlike the served ones makes int8 worse, not better.
    let tsv = std::fs::read_to_string(root.join("data/sample.tsv")).unwrap();
    let cal: Vec<Vec<&str>> = tsv
        .lines()
        .skip(200)
        .take(200)
        .map(|l| l.split('\t').collect())
        .collect();
    let n = cal.len();
    let dense: Vec<u8> = cal
        .iter()
        .flat_map(|r| {
            (1..14).flat_map(|c| {
                let x: f32 = r.get(c).and_then(|v| v.parse().ok()).unwrap_or(0.0);
                x.max(0.0).ln_1p().to_le_bytes()
            })
        })
        .collect();
    let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> =
        vec![("dense".into(), Dtype::F32, vec![n, 13], dense)];
    for (k, (f, t)) in config["features"]
        .as_array()
        .unwrap()
        .iter()
        .zip(config["tables"].as_array().unwrap())
        .enumerate()
    {
        let rows = t["rows"].as_u64().unwrap();
        let name = f["name"].as_str().unwrap();
        let lengths: Vec<u8> = (0..n).flat_map(|_| 1i64.to_le_bytes()).collect();
        let ids: Vec<u8> = cal
            .iter()
            .flat_map(|r| {
                let v = r.get(14 + k).copied().unwrap_or("");
                let id = u64::from_str_radix(v, 16).map_or(0, |h| h % rows);
                (id as i64).to_le_bytes()
            })
            .collect();
        owned.push((format!("{name}_lengths"), Dtype::I64, vec![n], lengths));
        owned.push((format!("{name}_ids"), Dtype::I64, vec![n], ids));
    }
    let file = std::env::temp_dir().join(format!(
        "ember-calibrate-{}.safetensors",
        std::process::id()
    ));
    let views: Vec<(String, TensorView)> = owned
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &file).unwrap();
    let f = file.to_str().unwrap();
    let rows: String = std::fs::read_to_string(root.join("data/sample.tsv"))
        .unwrap()
        .lines()
        .take(200)
        .map(|l| format!("{l}\n"))
        .collect();
    let mut scores = Vec::new();
    for extra in [
        &["--dense-dtype", "f32"][..],
        &["--dense-dtype", "int8"],
        &["--dense-dtype", "int8", "--calibrate", f],
    ] {
        let Started {
            mut child,
            addr,
            before,
            ..
        } = start_server(extra);
        let calibrated: Vec<&String> = before
            .iter()
            .filter(|l| l.contains("int8 layers calibrated on 200 samples"))
            .collect();
        assert_eq!(calibrated.len(), extra.len() / 4, "{extra:?}: {before:?}");
        let (status, body) = post(&addr, "/v1/score", &rows);
        assert_eq!(status, 200, "{body}");
        let s: Vec<f32> = body.lines().map(|l| l.parse().unwrap()).collect();
        assert_eq!(s.len(), 200, "{body}");
        scores.push(s);
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let max_diff = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    };
    // int8's error on the shipped model: 4.6e-2 at most on data/sample.tsv (dense-precision.md).
    assert!(
        max_diff(&scores[2], &scores[0]) <= 0.1,
        "calibrated int8 vs f32"
    );
    assert!(
        max_diff(&scores[2], &scores[1]) > 0.0,
        "calibration changed nothing"
    );
    // Refused, by name.
    for (args, what) in [
        (vec!["--calibrate", f], "--dense-dtype int8"),
        (
            vec!["--dense-dtype", "int8", "--calibrate", "/nonexistent/x.npz"],
            "/nonexistent/x.npz",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(["serve", "--http", "127.0.0.1:0", "--grpc", "off"])
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(what),
            "{args:?}: {err}"
        );
    }
    let _ = std::fs::remove_file(&file);
}

/// A port already taken stops `ember serve` at start with exit code 1 and an error naming the
/// listener (its protocol and address) and the cause, once: not a model error, not a hang.
#[test]
fn a_taken_port_is_refused_naming_the_listener_and_its_cause() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["serve", "--http", "127.0.0.1:0", "--grpc", &port])
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line in {err}"));
    let named = format!("listening on {port} (gRPC): ");
    assert!(line.contains(&named), "{line}");
    // The OS's words for EADDRINUSE ("Address already in use (os error 98)" on Linux), once.
    assert_eq!(line.to_lowercase().matches("in use").count(), 1, "{line}");
    assert!(line.contains("os error"), "{line}");
}

/// `--model-control explicit` lets a client unload and load a model again.
#[test]
fn serve_with_model_control_explicit_unloads_and_loads_on_request() {
    let root = repository("control");
    let (mut child, addr, log) = serve_repository(&root, &["--model-control", "explicit"]);
    let (status, body) = post(&addr, "/v2/repository/models/small/unload", "");
    assert_eq!(status, 200, "{body}");
    let (status, index) = post(&addr, "/v2/repository/index", "");
    assert_eq!(status, 200, "{index}");
    assert!(index.contains("\"unloaded\""), "{index}");
    let (status, body) = post(&addr, "/v2/repository/models/small/load", "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"version\":\"1\""), "{body}");
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    assert!(child.wait().unwrap().success());
    let _ = log.join();
    std::fs::remove_dir_all(&root).unwrap();
}
