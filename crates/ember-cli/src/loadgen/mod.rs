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
//! `/v1/score` (Criteo-shaped models only). Over gRPC
//! (`--protocol grpc`), `ModelInfer` calls carry their tensors in `raw_input_contents`, as
//! Triton's clients send them, over a few HTTP/2 connections.
//!
//! Arrivals are timed by a thread of their own (`std::thread::sleep`, ~0.1 ms precision; tokio's
//! timer has 1 ms), and requests go over a small HTTP/1.1 client (persistent connections, one
//! request in flight on each, a new connection when none is idle): a general-purpose client
//! (reqwest) cost about as much CPU per request as the server it measured, on the same two cores.

mod http1;
mod requests;
mod target;

use target::{Target, grpc_target, http_target};

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

#[derive(Debug, Args)]
pub struct LoadgenArgs {
    /// The server's base URL [default: http://127.0.0.1:8080, or :8081 with --protocol grpc].
    #[arg(long)]
    url: Option<String>,
    /// http (KServe v2 over HTTP/1.1) or grpc (KServe v2 / Triton's GRPCInferenceService).
    #[arg(long, default_value = "http")]
    protocol: String,
    /// HTTP/2 connections of --protocol grpc (requests are spread over them).
    #[arg(long, default_value_t = 4)]
    grpc_connections: usize,
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
    /// Most requests outstanding; arrivals beyond it count as errors (protects the client).
    #[arg(long, default_value_t = 20_000)]
    max_outstanding: usize,
    /// Client threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// HTTP request format: kserve (JSON to /v2/models/NAME/infer), binary (the same with
    /// Triton's binary tensor data extension, as Triton's HTTP client sends by default) or tsv
    /// (Criteo rows to /v1/score).
    #[arg(long, default_value = "kserve")]
    format: String,
    /// Print one JSON object as the last line.
    #[arg(long)]
    json: bool,
}

/// One measurement at one offered rate.
#[derive(Debug, Clone, serde::Serialize)]
struct Run {
    offered_qps: f64,
    achieved_qps: f64,
    samples_per_s: f64,
    sent: usize,
    ok: usize,
    errors: usize,
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
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

async fn main(a: LoadgenArgs) -> anyhow::Result<()> {
    let target = Arc::new(match a.protocol.as_str() {
        "http" => http_target(&a).await?,
        "grpc" => grpc_target(&a).await?,
        p => bail!("unknown --protocol '{p}' (http or grpc)"),
    });
    let go = |rate: f64| run_at(&target, rate, &a);
    if !a.find_max {
        let r = go(a.qps).await?;
        print_run(&r);
        if a.json {
            println!("{}", serde_json::to_string(&r)?);
        }
        return Ok(());
    }
    // Double until the objective fails, then bisect between the last pass and the first failure.
    let slo = a.slo_p99_ms;
    let passes = |r: &Run| r.p99_ms <= slo && r.errors * 100 <= r.sent;
    let mut steps = Vec::new();
    let (mut lo, mut hi) = (0.0f64, None::<f64>);
    let mut rate = a.qps;
    for _ in 0..12 {
        let r = go(rate).await?;
        print_run(&r);
        let ok = passes(&r);
        steps.push(r);
        if ok {
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
            let r = go(mid).await?;
            print_run(&r);
            if passes(&r) {
                lo = mid;
            } else {
                h = mid;
            }
            steps.push(r);
        }
    }
    let best = steps
        .iter()
        .filter(|r| passes(r))
        .max_by(|x, y| x.achieved_qps.total_cmp(&y.achieved_qps))
        .cloned();
    match &best {
        Some(b) => println!(
            "highest rate with p99 <= {slo} ms: {:.0} requests/s ({:.0} samples/s), p99 {:.2} ms",
            b.achieved_qps, b.samples_per_s, b.p99_ms
        ),
        None => println!("no rate tried kept p99 <= {slo} ms (lower --qps)"),
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
    Ok(())
}

fn print_run(r: &Run) {
    println!(
        "offered {:>8.0}/s  achieved {:>8.0}/s ({:>8.0} samples/s)  p50 {:>7.2}  p90 {:>7.2}  \
         p99 {:>7.2}  p999 {:>7.2} ms  errors {}/{}",
        r.offered_qps,
        r.achieved_qps,
        r.samples_per_s,
        r.p50_ms,
        r.p90_ms,
        r.p99_ms,
        r.p999_ms,
        r.errors,
        r.sent
    );
}

async fn run_at(target: &Arc<Target>, rate: f64, a: &LoadgenArgs) -> anyhow::Result<Run> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(bool, Option<Duration>)>();
    let outstanding = Arc::new(AtomicUsize::new(0));
    let handle = tokio::runtime::Handle::current();
    let target = target.clone();
    let (seed, warmup, duration, max_out) = (a.seed, a.warmup, a.duration, a.max_outstanding);
    // The arrival clock: its own thread, sleeping to each arrival (or sending at once when late).
    let clock = std::thread::spawn(move || {
        let mut rng = StdRng::seed_from_u64(seed ^ rate.to_bits());
        let start = Instant::now();
        let warm = Duration::from_secs_f64(warmup);
        let end = warm + Duration::from_secs_f64(duration);
        let (mut next, mut sent, mut refused, mut k) = (Duration::ZERO, 0usize, 0usize, 0usize);
        while next < end {
            let due = start + next;
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            let counted = next >= warm;
            if outstanding.load(Ordering::Relaxed) >= max_out {
                refused += usize::from(counted);
            } else {
                outstanding.fetch_add(1, Ordering::Relaxed);
                sent += usize::from(counted);
                let (target, tx, out) = (target.clone(), tx.clone(), outstanding.clone());
                handle.spawn(async move {
                    // A request unanswered for 10 s counts as an error.
                    let r = tokio::time::timeout(Duration::from_secs(10), target.send(k)).await;
                    let ok = matches!(r, Ok(true));
                    out.fetch_sub(1, Ordering::Relaxed);
                    let _ = tx.send((ok, counted.then(|| due.elapsed())));
                });
            }
            k += 1;
            // Exponential inter-arrival times: a Poisson process of the given rate, ramped up
            // from a tenth of it over the warm-up (uncounted) so that a cold server is not hit
            // by the full rate while its connections are still being set up.
            let ramp = if next < warm {
                0.1 + 0.9 * next.as_secs_f64() / warm.as_secs_f64()
            } else {
                1.0
            };
            let u: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
            next += Duration::from_secs_f64(-u.ln() / (rate * ramp));
        }
        (sent, refused)
    });
    let (sent, refused) = tokio::task::spawn_blocking(move || clock.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the arrival clock thread panicked"))?;

    let mut lat = Vec::with_capacity(sent);
    let mut errors = refused;
    let mut ok = 0usize;
    while let Some((good, d)) = rx.recv().await {
        if let Some(d) = d {
            if good {
                ok += 1;
                lat.push(d.as_secs_f64() * 1e3);
            } else {
                errors += 1;
            }
        }
    }
    lat.sort_by(f64::total_cmp);
    let q = |p: f64| -> f64 {
        if lat.is_empty() {
            return f64::NAN;
        }
        lat[((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1]
    };
    let secs = a.duration;
    Ok(Run {
        offered_qps: rate,
        achieved_qps: ok as f64 / secs,
        samples_per_s: (ok * a.samples_per_request) as f64 / secs,
        sent: sent + refused,
        ok,
        errors,
        p50_ms: q(0.5),
        p90_ms: q(0.9),
        p99_ms: q(0.99),
        p999_ms: q(0.999),
        max_ms: lat.last().copied().unwrap_or(f64::NAN),
    })
}
