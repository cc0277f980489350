//! `ember loadgen`: open-loop load on a KServe v2 HTTP endpoint. Requests leave at Poisson
//! arrival times whatever the server's pace (an open loop), and each latency is measured from
//! the request's scheduled time, so a server that falls behind shows it in the tail rather than
//! slowing the load down (no coordinated omission).
//!
//! Inputs are random and valid for the model: `GET /v2/models/{name}` gives the dense width, the
//! features and each table's size (`parameters.rows` of `<feature>_ids`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

#[derive(Debug, Args)]
pub struct LoadgenArgs {
    /// The server's base URL.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
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
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(usize::MAX)
        .tcp_nodelay(true)
        .build()?;
    let base = a.url.trim_end_matches('/').to_string();
    let meta: Value = client
        .get(format!("{base}/v2/models/{}", a.model))
        .send()
        .await
        .with_context(|| format!("asking {base} for model '{}'", a.model))?
        .error_for_status()
        .with_context(|| format!("model '{}' on {base}", a.model))?
        .json()
        .await?;
    let bodies = Arc::new(bodies(&meta, &a)?);
    let infer = Arc::new(format!("{base}/v2/models/{}/infer", a.model));
    let go = |rate: f64| run_at(&client, &infer, &bodies, rate, &a);
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

/// A pool of distinct request bodies, valid for the model.
fn bodies(meta: &Value, a: &LoadgenArgs) -> anyhow::Result<Vec<bytes_body::Body>> {
    let inputs = meta["inputs"]
        .as_array()
        .context("model metadata has no 'inputs'")?;
    let dense_in = inputs
        .iter()
        .find(|i| i["name"] == "dense")
        .and_then(|i| i["shape"].get(1))
        .and_then(Value::as_u64)
        .context("model metadata has no 'dense' input of shape [-1, D]")?
        as usize;
    let feats: Vec<(String, u64)> = inputs
        .iter()
        .filter_map(|i| {
            let name = i["name"].as_str()?.strip_suffix("_ids")?;
            Some((name.to_string(), i["parameters"]["rows"].as_u64()?))
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(a.seed);
    let n = a.samples_per_request;
    let mut out = Vec::new();
    for _ in 0..64 {
        let dense: Vec<f32> = (0..n * dense_in)
            .map(|_| rng.random_range(0.0..4.0))
            .collect();
        let mut ins = vec![
            json!({"name": "dense", "shape": [n, dense_in], "datatype": "FP32", "data": dense}),
        ];
        for (f, rows) in &feats {
            let ids: Vec<u64> = (0..n * a.pooling)
                .map(|_| rng.random_range(0..*rows))
                .collect();
            ins.push(json!({"name": format!("{f}_lengths"), "shape": [n], "datatype": "INT64", "data": vec![a.pooling; n]}));
            ins.push(json!({"name": format!("{f}_ids"), "shape": [ids.len()], "datatype": "INT64", "data": ids}));
        }
        out.push(bytes_body::Body(
            json!({ "inputs": ins }).to_string().into(),
        ));
    }
    Ok(out)
}

mod bytes_body {
    /// A request body, cheap to clone.
    #[derive(Debug, Clone)]
    pub struct Body(pub bytes::Bytes);
}

async fn run_at(
    client: &reqwest::Client,
    url: &Arc<String>,
    bodies: &Arc<Vec<bytes_body::Body>>,
    rate: f64,
    a: &LoadgenArgs,
) -> anyhow::Result<Run> {
    let mut rng = StdRng::seed_from_u64(a.seed ^ rate.to_bits());
    let outstanding = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let warm = Duration::from_secs_f64(a.warmup);
    let end = warm + Duration::from_secs_f64(a.duration);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(bool, Option<Duration>)>();
    let mut next = Duration::ZERO;
    let mut sent = 0usize;
    let mut refused = 0usize;
    let mut k = 0usize;
    while next < end {
        let due = start + next;
        let now = Instant::now();
        if due > now {
            tokio::time::sleep_until(due.into()).await;
        }
        let counted = next >= warm;
        if outstanding.load(Ordering::Relaxed) >= a.max_outstanding {
            if counted {
                refused += 1;
            }
        } else {
            outstanding.fetch_add(1, Ordering::Relaxed);
            if counted {
                sent += 1;
            }
            let (client, url, body) = (
                client.clone(),
                url.clone(),
                bodies[k % bodies.len()].0.clone(),
            );
            let (tx, out) = (tx.clone(), outstanding.clone());
            tokio::spawn(async move {
                let r = client
                    .post(url.as_str())
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await;
                let ok = match r {
                    Ok(resp) if resp.status().is_success() => resp.bytes().await.is_ok(),
                    Ok(resp) => {
                        let _ = resp.bytes().await;
                        false
                    }
                    Err(_) => false,
                };
                out.fetch_sub(1, Ordering::Relaxed);
                let _ = tx.send((ok, counted.then(|| due.elapsed())));
            });
        }
        k += 1;
        // Exponential inter-arrival times: a Poisson process of the given rate.
        let u: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
        next += Duration::from_secs_f64(-u.ln() / rate);
    }
    drop(tx);
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
