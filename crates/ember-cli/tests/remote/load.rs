//! `ember loadgen` under a fault, for the figures: one run at a rate with a fault injected at a
//! known time, and what loadgen saw, its timeline shifted so that t = 0 is the fault.

use crate::server::{PATIENCE, Server, wait_until};
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// `ember loadgen --json` against `urls` (comma-separated) with `args`, started.
pub fn loadgen(urls: &str, args: &[String]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_ember"))
        .args(["loadgen", "--url", urls, "--json"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting ember loadgen")
}

/// The last line of loadgen's output that is JSON, parsed.
pub fn last_json(out: std::process::Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().rev().find(|l| l.starts_with('{'));
    serde_json::from_str(line.unwrap_or("null")).unwrap_or_else(|_| {
        panic!(
            "loadgen printed no JSON: {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The highest rate over `urls` with p99 <= 10 ms.
pub fn find_max(urls: &str, first: f64) -> f64 {
    let args: Vec<String> = vec![
        "--find-max".into(),
        "--qps".into(),
        first.to_string(),
        "--duration".into(),
        "3".into(),
    ];
    let out = loadgen(urls, &args).wait_with_output().unwrap();
    last_json(out)["max_qps"]
        .as_f64()
        .expect("find-max found a rate")
}

/// One 0.5 s bucket of a run, by the requests' scheduled times.
#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    /// Its start, seconds from the fault.
    pub t: f64,
    pub sent: u64,
    pub ok: u64,
    pub refused: u64,
    pub errors: u64,
    pub wrong: u64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// What one run under a fault saw.
#[derive(Debug)]
pub struct Seen {
    pub ok: u64,
    pub refused: u64,
    pub errors: u64,
    pub wrong: u64,
    pub buckets: Vec<Bucket>,
}

/// Runs loadgen over `servers` at `rate` for `secs` (after a 1 s warm-up) with `extra` args
/// (`--verify` or `--verify-against`), calls `fault` four seconds into the measurement, and
/// returns what loadgen saw with its timeline shifted to the time `fault` was called.
pub fn under_load(
    servers: &[&Server],
    rate: f64,
    secs: f64,
    extra: &[String],
    fault: impl FnOnce(),
) -> Seen {
    let mut args: Vec<String> = vec![
        "--qps".into(),
        format!("{rate:.0}"),
        "--duration".into(),
        secs.to_string(),
        "--warmup".into(),
        "1".into(),
        "--timeline".into(),
        "0.5".into(),
    ];
    args.extend_from_slice(extra);
    let urls: Vec<String> = servers
        .iter()
        .map(|s| format!("http://{}", s.addr))
        .collect();
    let before: Vec<f64> = servers.iter().map(|s| answered(s)).collect();
    let child = loadgen(&urls.join(","), &args);
    wait_until("loadgen's first requests at the servers", PATIENCE, || {
        servers.iter().zip(&before).all(|(s, b)| answered(s) > *b)
    });
    // The fault's place in the run, not a wait: the verify pass and the warm-up take a second or
    // so, then four seconds of the measurement; the exact time is read back from loadgen's start.
    std::thread::sleep(Duration::from_millis(5000));
    let at = now_ms();
    fault();
    let r = last_json(child.wait_with_output().unwrap());
    let start = r["start_unix_ms"].as_u64().unwrap();
    let shift = (at as f64 - start as f64) / 1e3;
    let n = |v: &Value, k: &str| v[k].as_u64().unwrap_or(0);
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    Seen {
        ok: n(&r, "ok"),
        refused: n(&r, "refused"),
        errors: n(&r, "errors"),
        wrong: n(&r, "wrong"),
        buckets: r["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| Bucket {
                t: f(b, "t") - shift,
                sent: n(b, "sent"),
                ok: n(b, "ok"),
                refused: n(b, "refused"),
                errors: n(b, "errors"),
                wrong: n(b, "wrong"),
                p99_ms: f(b, "p99_ms"),
                max_ms: f(b, "max_ms"),
            })
            .collect(),
    }
}

/// Requests the model `default` of `s` has answered, whatever their version and status.
pub fn answered(s: &Server) -> f64 {
    let text = s
        .request("GET", "/metrics", "text/plain", b"")
        .map(|r| r.1)
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("ember_model_requests_total{") && l.contains("model=\"default\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Prints the counts and the timeline of a run.
pub fn report(name: &str, seen: &Seen) {
    eprintln!(
        "{name}: ok {}  refused (503) {}  errors {}  wrong {}",
        seen.ok, seen.refused, seen.errors, seen.wrong
    );
    eprintln!("  t from the fault (s)   sent     ok  503  err wrong   p99 ms   max ms");
    for b in &seen.buckets {
        eprintln!(
            "  {:>+19.1} {:>6} {:>6} {:>4} {:>4} {:>5} {:>8.2} {:>8.2}",
            b.t, b.sent, b.ok, b.refused, b.errors, b.wrong, b.p99_ms, b.max_ms
        );
    }
}
