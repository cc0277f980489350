//! `ember loadgen`: open-loop load on a KServe v2 endpoint, over HTTP or gRPC. Requests leave at Poisson
//! arrival times whatever the server's pace (an open loop), and each latency is measured from
//! the request's scheduled time, so a server that falls behind shows it in the tail rather than
//! slowing the load down (no coordinated omission).
//!
//! Inputs are random and valid for the model: the model's metadata gives the dense width, the
//! features and each table's size (`parameters.rows` of `<feature>_ids`). Over HTTP,
//! `--format kserve` (the default) sends KServe v2 JSON to `/v2/models/{name}/infer`,
//! `--format binary` the same with the values after the JSON as bytes (Triton's binary tensor
//! data extension, what Triton's HTTP client sends), and `--format tsv` Criteo TSV rows to
//! `/v1/score` (Criteo-shaped models only), and `--format users` an HSTU model's users from
//! `--users` (JSON lines) to `/v1/score`, in the file's order. Over gRPC
//! (`--protocol grpc`), `ModelInfer` calls carry their tensors in `raw_input_contents`, as
//! Triton's clients send them, over a few HTTP/2 connections.
//!
//! Arrivals are timed by a thread of their own (`std::thread::sleep`, ~0.1 ms precision; tokio's
//! timer has 1 ms), and requests go over a small HTTP/1.1 client (persistent connections, one
//! request in flight on each, a new connection when none is idle): a general-purpose client
//! (reqwest) cost about as much CPU per request as the server it measured, on the same two cores.

mod h2grpc;
mod http1;
mod measure;
mod report;
mod requests;
mod target;
mod tls;

use measure::run_at;
use target::{Target, grpc_target, http_target};

use std::sync::Arc;

use anyhow::bail;
use clap::Args;
use serde_json::json;

#[derive(Debug, Args)]
pub struct LoadgenArgs {
    /// The server's base URL, or several comma-separated (stateless replicas: requests are spread
    /// over them in turn) [default: http://127.0.0.1:8080, or :8081 with --protocol grpc].
    /// `https://` (gRPC: `https://` or `grpcs://`) speaks TLS, trusting --tls-ca.
    #[arg(long)]
    url: Option<String>,
    #[command(flatten)]
    tls: tls::TlsArgs,
    /// http (KServe v2 over HTTP/1.1) or grpc (KServe v2 / Triton's GRPCInferenceService).
    #[arg(long, default_value = "http")]
    protocol: String,
    /// HTTP/2 connections of --protocol grpc (requests are spread over them).
    #[arg(long, default_value_t = 4)]
    grpc_connections: usize,
    /// The client of --protocol grpc: lean (requests encoded once, many calls at once on each
    /// connection over h2; cheaper per call than the server) or tonic (tonic's generated client,
    /// as an application would call; it costs about as much CPU per call as the server).
    #[arg(long, default_value = "lean")]
    grpc_client: String,
    /// The model's name on the server.
    #[arg(long, default_value = "default")]
    model: String,
    /// Requests per second (mean of the Poisson arrivals); with --find-max, the first rate tried.
    #[arg(long, default_value_t = 1000.0)]
    qps: f64,
    /// Seconds of load per measurement.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds of load before each measurement, not counted.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Samples in each request.
    #[arg(long, default_value_t = 1)]
    samples_per_request: usize,
    /// Ids per bag (pooling factor) of every sparse feature.
    #[arg(long, default_value_t = 1)]
    pooling: usize,
    /// Search for the highest rate whose p99 latency stays within --slo-p99-ms.
    #[arg(long)]
    find_max: bool,
    /// The p99 latency objective of --find-max, in milliseconds.
    #[arg(long, default_value_t = 10.0)]
    slo_p99_ms: f64,
    /// --find-max: a rate fails only when this many runs of it in a row fail (a shared machine's
    /// noise can fail one run far below the real limit, and the search would never go back up).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=5))]
    tries: u32,
    /// Most requests outstanding; arrivals beyond it count as errors (protects the client).
    #[arg(long, default_value_t = 20_000)]
    max_outstanding: usize,
    /// Client threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// HTTP request format: kserve (JSON to /v2/models/NAME/infer), binary (the same with
    /// Triton's binary tensor data extension, as Triton's HTTP client sends by default), tsv
    /// (Criteo rows to /v1/score) or users (an HSTU model's users of --users to /v1/score, in
    /// the file's order: a streaming replay from `ember data users --returns`).
    #[arg(long, default_value = "kserve")]
    format: String,
    /// --format users: the users file (JSON lines). Requests go in its order, from its start
    /// again when the run outlasts it.
    #[arg(long, value_name = "FILE")]
    users: Option<std::path::PathBuf>,
    /// Rates one after the other instead of --qps / --duration: `RATE:SECONDS,...` (e.g.
    /// `20000:60,4000:10`: an overload, then the normal rate). All of them are measured.
    #[arg(long, conflicts_with = "find_max")]
    phases: Option<String>,
    /// Also report every SECONDS of the measurement on its own: offered, answered, refused,
    /// errors, p50 / p99 of the answered (by scheduled time).
    #[arg(long)]
    timeline: Option<f64>,
    /// Print one JSON object as the last line.
    #[arg(long)]
    json: bool,
    /// Write an HTML page of plots (the latency histogram; the p99 / rate curve of --find-max;
    /// the timeline; the phases) to this file.
    #[arg(long, value_name = "FILE.html")]
    report: Option<std::path::PathBuf>,
    /// Check every answer: each request is first sent once to every server and its answer kept
    /// (all must be 200 and alike); during the measurement an answer with scores whose body
    /// differs from that is counted `wrong`, and loadgen then exits with an error. HTTP only.
    #[arg(long)]
    verify: bool,
    /// Check every answer against reference servers instead (comma-separated URLs): each
    /// request is first sent once to each reference and every answer kept; during the
    /// measurement an answer is `wrong` when one of its numbers (a sample's score) matches that
    /// number of no reference's answer. For rows that change while measured (row updates): give
    /// a reference per state a row may be in (DRAM servers of the rows before and after), with
    /// at most one changing row per sample. Implies --verify; HTTP only.
    #[arg(long, value_name = "URLS")]
    verify_against: Option<String>,
}

/// `--phases`: (requests per second, seconds) pairs.
fn parse_phases(s: &str) -> anyhow::Result<Vec<(f64, f64)>> {
    s.split(',')
        .map(|p| {
            let (r, d) = p
                .split_once(':')
                .ok_or_else(|| anyhow::anyhow!("--phases: '{p}' is not RATE:SECONDS"))?;
            let (r, d): (f64, f64) = (r.trim().parse()?, d.trim().parse()?);
            if !(r > 0.0 && d > 0.0 && r.is_finite() && d.is_finite()) {
                bail!("--phases: '{p}' needs a positive rate and duration");
            }
            Ok((r, d))
        })
        .collect()
}

/// One measurement at one offered rate (or one schedule of rates). Latencies are those of the
/// requests answered with scores; refused ones (503 / RESOURCE_EXHAUSTED) are counted and timed
/// apart, and are not errors.
#[derive(Debug, Clone, serde::Serialize)]
struct Run {
    offered_qps: f64,
    achieved_qps: f64,
    samples_per_s: f64,
    sent: usize,
    ok: usize,
    refused: usize,
    errors: usize,
    /// With --verify: answers with scores other than the request's recorded answer.
    wrong: usize,
    /// Wall clock at the start of the measurement (after the warm-up), ms since the Unix epoch:
    /// to line the timeline up with events outside loadgen (a fault injected at a known time).
    start_unix_ms: u64,
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    max_ms: f64,
    /// Time to the refusal, of the refused requests.
    refused_p99_ms: f64,
    refused_max_ms: f64,
    /// Latencies of the answered requests: `[lo, hi, count]`, 8 buckets a decade.
    latency_histogram_ms: Vec<(f64, f64, u64)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeline: Option<Vec<Bucket>>,
    /// With --phases, each phase on its own.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    phases: Vec<Phase>,
}

/// One `--phases` phase, by the requests' scheduled times.
#[derive(Debug, Clone, serde::Serialize)]
struct Phase {
    offered_qps: f64,
    secs: f64,
    sent: usize,
    ok: usize,
    refused: usize,
    errors: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    refused_p50_ms: f64,
    refused_p99_ms: f64,
}

/// One `--timeline` interval, by the requests' scheduled times.
#[derive(Debug, Clone, serde::Serialize)]
struct Bucket {
    /// Start of the interval, seconds into the measurement.
    t: f64,
    sent: usize,
    ok: usize,
    refused: usize,
    errors: usize,
    wrong: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

pub fn run(a: LoadgenArgs) -> anyhow::Result<()> {
    if a.qps <= 0.0 || a.duration <= 0.0 || a.samples_per_request == 0 || a.threads == 0 {
        bail!("--qps, --duration, --samples-per-request and --threads must be positive");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.threads)
        .enable_all()
        .build()?;
    rt.block_on(main(a))
}

/// Connects to the target (recording its answers with `--verify`), then measures once, or
/// searches with `--find-max`.
async fn main(a: LoadgenArgs) -> anyhow::Result<()> {
    let mut target = match a.protocol.as_str() {
        "http" => http_target(&a).await?,
        "grpc" => grpc_target(&a).await?,
        p => bail!("unknown --protocol '{p}' (http or grpc)"),
    };
    if let Some(refs) = &a.verify_against {
        target.record_references(&a, refs).await?;
    } else if a.verify {
        target.record_answers().await?;
    }
    let target = Arc::new(target);
    if !a.find_max {
        return measure_once(&target, &a).await;
    }
    let steps = find_max(&target, &a).await?;
    report_max(&a, &steps)
}

/// One measurement at `--qps` (or of `--phases`), printed (`--json`, `--report` too); an
/// error when an answer was wrong.
async fn measure_once(target: &Arc<Target>, a: &LoadgenArgs) -> anyhow::Result<()> {
    let phases = match &a.phases {
        Some(p) => parse_phases(p)?,
        None => vec![(a.qps, a.duration)],
    };
    let r = run_at(target, phases, a).await?;
    print_run(&r);
    print_timeline(&r);
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    }
    if let Some(path) = &a.report {
        report::page(a, std::slice::from_ref(&r), None).write(path)?;
    }
    if r.wrong > 0 {
        bail!(
            "{} of {} answers had scores other than the same request got before",
            r.wrong,
            r.sent
        );
    }
    Ok(())
}

/// Whether a run meets `--find-max`'s objective: p99 within `slo` ms, no wrong answer, and at
/// most 1% of the requests refused or failed.
fn passes(r: &Run, slo: f64) -> bool {
    r.p99_ms <= slo && r.wrong == 0 && (r.errors + r.refused) * 100 <= r.sent
}

/// `--find-max`: doubles the rate from `--qps` until the objective fails, then bisects between
/// the last pass and the first failure; returns every run.
async fn find_max(target: &Arc<Target>, a: &LoadgenArgs) -> anyhow::Result<Vec<Run>> {
    let mut steps = Vec::new();
    let (mut lo, mut hi) = (0.0f64, None::<f64>);
    let mut rate = a.qps;
    for _ in 0..12 {
        if attempt(target, a, rate, &mut steps).await? {
            lo = rate;
            rate *= 2.0;
        } else {
            hi = Some(rate);
            break;
        }
    }
    if let Some(mut h) = hi {
        for _ in 0..4 {
            let mid = (lo + h) / 2.0;
            if lo > 0.0 && (h - lo) / lo < 0.05 {
                break;
            }
            if attempt(target, a, mid, &mut steps).await? {
                lo = mid;
            } else {
                h = mid;
            }
        }
    }
    Ok(steps)
}

/// Runs `rate` up to `--tries` times, until one passes, each run printed and added to
/// `steps`; whether one passed.
async fn attempt(
    target: &Arc<Target>,
    a: &LoadgenArgs,
    rate: f64,
    steps: &mut Vec<Run>,
) -> anyhow::Result<bool> {
    for k in 0..a.tries {
        if k > 0 {
            println!("    (failed: once more, as a shared machine's noise can fail one run)");
        }
        let r = run_at(target, vec![(rate, a.duration)], a).await?;
        print_run(&r);
        let ok = passes(&r, a.slo_p99_ms);
        steps.push(r);
        if ok {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Prints the highest rate of a `--find-max` search that met the objective (`--report` and
/// `--json` too); an error when an answer was wrong.
fn report_max(a: &LoadgenArgs, steps: &[Run]) -> anyhow::Result<()> {
    let slo = a.slo_p99_ms;
    let best = steps
        .iter()
        .filter(|r| passes(r, slo))
        .max_by(|x, y| x.achieved_qps.total_cmp(&y.achieved_qps))
        .cloned();
    match &best {
        Some(b) => println!(
            "highest rate with p99 <= {slo} ms: {:.0} requests/s ({:.0} samples/s), p99 {:.2} ms",
            b.achieved_qps, b.samples_per_s, b.p99_ms
        ),
        None => println!("no rate tried kept p99 <= {slo} ms (lower --qps)"),
    }
    let wrong: usize = steps.iter().map(|r| r.wrong).sum();
    if let Some(path) = &a.report {
        report::page(a, steps, Some(best.as_ref())).write(path)?;
    }
    if a.json {
        println!(
            "{}",
            json!({
                "mode": "find_max",
                "slo_p99_ms": slo,
                "max_qps": best.as_ref().map(|b| b.achieved_qps),
                "max_samples_per_s": best.as_ref().map(|b| b.samples_per_s),
                "best": best,
                "steps": steps,
            })
        );
    }
    if wrong > 0 {
        bail!("{wrong} answers had scores other than the same request got before");
    }
    Ok(())
}

fn print_run(r: &Run) {
    println!(
        "offered {:>8.0}/s  achieved {:>8.0}/s ({:>8.0} samples/s)  p50 {:>7.2}  p90 {:>7.2}  \
         p99 {:>7.2}  p999 {:>7.2} ms  refused {}/{} (p99 {:.2} ms)  errors {}/{}{}",
        r.offered_qps,
        r.achieved_qps,
        r.samples_per_s,
        r.p50_ms,
        r.p90_ms,
        r.p99_ms,
        r.p999_ms,
        r.refused,
        r.sent,
        r.refused_p99_ms,
        r.errors,
        r.sent,
        match r.wrong {
            0 => String::new(),
            n => format!("  WRONG {n}"),
        }
    );
}

fn print_timeline(r: &Run) {
    for p in &r.phases {
        println!(
            "  phase {:>8.0}/s x {:>5.0} s: ok {:>7}  refused {:>7} (p50 {:.2}, p99 {:.2} ms)  \
             errors {:>5}  p50 {:>7.2}  p99 {:>7.2}  max {:>7.2} ms",
            p.offered_qps,
            p.secs,
            p.ok,
            p.refused,
            p.refused_p50_ms,
            p.refused_p99_ms,
            p.errors,
            p.p50_ms,
            p.p99_ms,
            p.max_ms
        );
    }
    for b in r.timeline.iter().flatten() {
        println!(
            "  t {:>7.1} s  sent {:>7}  ok {:>7}  refused {:>7}  errors {:>5}  wrong {:>3}  \
             p50 {:>7.2}  p99 {:>7.2}  max {:>7.2} ms",
            b.t, b.sent, b.ok, b.refused, b.errors, b.wrong, b.p50_ms, b.p99_ms, b.max_ms
        );
    }
}
