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

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use ember_serve::grpc::pb::{
    self, grpc_inference_service_client::GrpcInferenceServiceClient as GrpcClient,
    infer_parameter::ParameterChoice, model_infer_request::InferInputTensor,
};
use ember_serve::grpc::raw_bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

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

/// Where requests go, and the requests.
enum Target {
    /// Pre-built HTTP/1.1 requests (head and body) over a pool of connections.
    Http {
        pool: http1::Pool,
        requests: Vec<Arc<[u8]>>,
    },
    /// `ModelInfer` requests over a few HTTP/2 connections.
    Grpc {
        clients: Vec<GrpcClient<tonic::transport::Channel>>,
        requests: Vec<pb::ModelInferRequest>,
    },
}

impl Target {
    /// Sends the `k`-th request; true when it was answered with scores.
    async fn send(&self, k: usize) -> bool {
        match self {
            Target::Http { pool, requests } => {
                matches!(pool.send(&requests[k % requests.len()]).await, Ok(200))
            }
            Target::Grpc { clients, requests } => {
                let mut c = clients[k % clients.len()].clone();
                let req = requests[k % requests.len()].clone();
                c.model_infer(req).await.is_ok()
            }
        }
    }
}

async fn http_target(a: &LoadgenArgs) -> anyhow::Result<Target> {
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let url = a.url.as_deref().unwrap_or("http://127.0.0.1:8080");
    let base = url.trim_end_matches('/').to_string();
    let meta: Value = client
        .get(format!("{base}/v2/models/{}", a.model))
        .send()
        .await
        .with_context(|| format!("asking {base} for model '{}'", a.model))?
        .error_for_status()
        .with_context(|| format!("model '{}' on {base}", a.model))?
        .json()
        .await?;
    let shape = json_shape(&meta)?;
    let hostport = base
        .strip_prefix("http://")
        .context("--url must start with http://")?
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string();
    let addr = tokio::net::lookup_host(&hostport)
        .await
        .with_context(|| format!("resolving {hostport}"))?
        .next()
        .with_context(|| format!("{hostport} resolves to no address"))?;
    let infer = format!("/v2/models/{}/infer", a.model);
    let no_head = |b: Vec<Vec<u8>>| b.into_iter().map(|b| (b, None)).collect::<Vec<_>>();
    let (path, ctype, payloads) = match a.format.as_str() {
        "kserve" => (infer, "application/json", no_head(bodies(&shape, a))),
        "binary" => (
            infer,
            "application/octet-stream",
            binary_bodies(&shape, a)
                .into_iter()
                .map(|(b, h)| (b, Some(h)))
                .collect(),
        ),
        "tsv" => (
            "/v1/score".to_string(),
            "text/tab-separated-values",
            no_head(tsv_bodies(&shape, a)?),
        ),
        f => bail!("unknown --format '{f}' (kserve, binary or tsv)"),
    };
    let requests = payloads
        .iter()
        .map(|(b, head)| {
            let extra = head
                .map(|h| format!("Inference-Header-Content-Length: {h}\r\n"))
                .unwrap_or_default();
            let mut r = format!(
                "POST {path} HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: {ctype}\r\n\
                 {extra}Content-Length: {}\r\n\r\n",
                b.len()
            )
            .into_bytes();
            r.extend_from_slice(b);
            r.into()
        })
        .collect();
    let pool = http1::Pool::new(addr);
    pool.warm(64.min(a.max_outstanding))
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    Ok(Target::Http { pool, requests })
}

async fn grpc_target(a: &LoadgenArgs) -> anyhow::Result<Target> {
    if a.format != "kserve" {
        bail!(
            "--format {} is for HTTP; gRPC sends KServe v2 ModelInfer calls",
            a.format
        );
    }
    if a.grpc_connections == 0 {
        bail!("--grpc-connections must be at least 1");
    }
    let url = a.url.as_deref().unwrap_or("http://127.0.0.1:8081");
    let url = match url.strip_prefix("grpc://") {
        Some(rest) => format!("http://{rest}"),
        None => url.to_string(),
    };
    let endpoint = tonic::transport::Endpoint::from_shared(url.clone())
        .with_context(|| format!("--url {url}"))?
        .tcp_nodelay(true);
    let mut clients = Vec::with_capacity(a.grpc_connections);
    for _ in 0..a.grpc_connections {
        let ch = endpoint
            .connect()
            .await
            .with_context(|| format!("asking {url} for model '{}': connecting", a.model))?;
        clients.push(GrpcClient::new(ch).max_decoding_message_size(usize::MAX));
    }
    let meta = clients[0]
        .clone()
        .model_metadata(pb::ModelMetadataRequest {
            name: a.model.clone(),
            version: String::new(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("{}: {}", s.code(), s.message()))
        .with_context(|| format!("asking {url} for model '{}'", a.model))?
        .into_inner();
    let dense_in = meta
        .inputs
        .iter()
        .find(|i| i.name == "dense")
        .and_then(|i| i.shape.get(1))
        .and_then(|&d| usize::try_from(d).ok())
        .context("model metadata has no 'dense' input of shape [-1, D]")?;
    let features = meta
        .inputs
        .iter()
        .filter_map(|i| {
            let name = i.name.strip_suffix("_ids")?;
            match i.parameters.get("rows")?.parameter_choice {
                Some(ParameterChoice::Int64Param(r)) => Some((name.to_string(), r as u64)),
                _ => None,
            }
        })
        .collect();
    let shape = Shape { dense_in, features };
    let n = a.samples_per_request;
    let lengths = raw_bytes(&vec![a.pooling as i64; n], i64::to_le_bytes);
    let tensor = |name: String, datatype: &str, shape: Vec<i64>| InferInputTensor {
        name,
        datatype: datatype.into(),
        shape,
        ..Default::default()
    };
    let requests = draws(&shape, a)
        .into_iter()
        .map(|d| {
            let mut inputs = vec![tensor(
                "dense".into(),
                "FP32",
                vec![n as i64, shape.dense_in as i64],
            )];
            let mut raw = vec![raw_bytes(&d.dense, f32::to_le_bytes)];
            for ((f, _), ids) in shape.features.iter().zip(&d.ids) {
                inputs.push(tensor(format!("{f}_lengths"), "INT64", vec![n as i64]));
                raw.push(lengths.clone());
                inputs.push(tensor(format!("{f}_ids"), "INT64", vec![ids.len() as i64]));
                raw.push(raw_bytes(ids, i64::to_le_bytes));
            }
            pb::ModelInferRequest {
                model_name: a.model.clone(),
                inputs,
                raw_input_contents: raw,
                ..Default::default()
            }
        })
        .collect();
    Ok(Target::Grpc { clients, requests })
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

/// What requests must match: the dense width and each sparse feature's name and table size.
#[derive(Debug)]
struct Shape {
    dense_in: usize,
    features: Vec<(String, u64)>,
}

/// The shape of a model from its KServe v2 JSON metadata.
fn json_shape(meta: &Value) -> anyhow::Result<Shape> {
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
    let features = inputs
        .iter()
        .filter_map(|i| {
            let name = i["name"].as_str()?.strip_suffix("_ids")?;
            Some((name.to_string(), i["parameters"]["rows"].as_u64()?))
        })
        .collect();
    Ok(Shape { dense_in, features })
}

/// One request's random samples: dense `[n, dense_in]`, and per feature its ids (`pooling` per
/// sample).
struct Draw {
    dense: Vec<f32>,
    ids: Vec<Vec<i64>>,
}

/// 64 distinct random requests, valid for the model.
fn draws(shape: &Shape, a: &LoadgenArgs) -> Vec<Draw> {
    let mut rng = StdRng::seed_from_u64(a.seed);
    let n = a.samples_per_request;
    (0..64)
        .map(|_| Draw {
            dense: (0..n * shape.dense_in)
                .map(|_| rng.random_range(0.0..4.0))
                .collect(),
            ids: shape
                .features
                .iter()
                .map(|(_, rows)| {
                    (0..n * a.pooling)
                        .map(|_| rng.random_range(0..*rows) as i64)
                        .collect()
                })
                .collect(),
        })
        .collect()
}

/// KServe v2 JSON bodies.
fn bodies(shape: &Shape, a: &LoadgenArgs) -> Vec<Vec<u8>> {
    let n = a.samples_per_request;
    draws(shape, a)
        .into_iter()
        .map(|d| {
            let mut ins = vec![json!({
                "name": "dense", "shape": [n, shape.dense_in], "datatype": "FP32", "data": d.dense
            })];
            for ((f, _), ids) in shape.features.iter().zip(d.ids) {
                ins.push(json!({"name": format!("{f}_lengths"), "shape": [n], "datatype": "INT64", "data": vec![a.pooling; n]}));
                ins.push(json!({"name": format!("{f}_ids"), "shape": [ids.len()], "datatype": "INT64", "data": ids}));
            }
            json!({ "inputs": ins }).to_string().into_bytes()
        })
        .collect()
}

/// KServe v2 requests in Triton's binary tensor data extension, as Triton's HTTP client sends
/// them by default: a JSON head naming each input's `binary_data_size`, then the values as
/// little-endian bytes; scores asked back as binary. Returns each body and its JSON's length.
fn binary_bodies(shape: &Shape, a: &LoadgenArgs) -> Vec<(Vec<u8>, usize)> {
    let n = a.samples_per_request;
    let lengths = raw_bytes(&vec![a.pooling as i64; n], i64::to_le_bytes);
    draws(shape, a)
        .into_iter()
        .map(|d| {
            let dense = raw_bytes(&d.dense, f32::to_le_bytes);
            let mut ins = vec![json!({
                "name": "dense", "shape": [n, shape.dense_in], "datatype": "FP32",
                "parameters": {"binary_data_size": dense.len()}
            })];
            let mut bin = dense.to_vec();
            for ((f, _), ids) in shape.features.iter().zip(d.ids) {
                let ids = raw_bytes(&ids, i64::to_le_bytes);
                ins.push(json!({"name": format!("{f}_lengths"), "shape": [n], "datatype": "INT64",
                    "parameters": {"binary_data_size": lengths.len()}}));
                ins.push(json!({"name": format!("{f}_ids"), "shape": [ids.len() / 8], "datatype": "INT64",
                    "parameters": {"binary_data_size": ids.len()}}));
                bin.extend_from_slice(&lengths);
                bin.extend_from_slice(&ids);
            }
            let mut body = json!({ "inputs": ins, "parameters": {"binary_data_output": true} })
                .to_string()
                .into_bytes();
            let head = body.len();
            body.extend(bin);
            (body, head)
        })
        .collect()
}

/// Criteo TSV rows (label, 13 integers, 26 hex categoricals), `samples_per_request` per body.
fn tsv_bodies(shape: &Shape, a: &LoadgenArgs) -> anyhow::Result<Vec<Vec<u8>>> {
    if shape.dense_in != 13 || shape.features.len() != 26 {
        bail!("--format tsv needs a Criteo-shaped model (13 dense, 26 sparse features)");
    }
    let mut rng = StdRng::seed_from_u64(a.seed);
    let mut out = Vec::new();
    for _ in 0..64 {
        let mut body = String::new();
        for _ in 0..a.samples_per_request {
            body.push('0');
            for _ in 0..13 {
                body.push_str(&format!("\t{}", rng.random_range(0..200u32)));
            }
            for _ in 0..26 {
                body.push_str(&format!("\t{:08x}", rng.random::<u32>()));
            }
            body.push('\n');
        }
        out.push(body.into_bytes());
    }
    Ok(out)
}

/// A minimal HTTP/1.1 client: persistent connections to one address, one request at a time on
/// each, responses read by `Content-Length`.
mod http1 {
    use std::net::SocketAddr;
    use std::sync::Mutex;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    #[derive(Debug)]
    pub struct Pool {
        addr: SocketAddr,
        idle: Mutex<Vec<TcpStream>>,
    }

    impl Pool {
        pub fn new(addr: SocketAddr) -> Self {
            Pool {
                addr,
                idle: Mutex::new(Vec::new()),
            }
        }

        /// Opens `n` connections ahead of the load, so that the first arrivals do not all pay
        /// for a connect.
        pub async fn warm(&self, n: usize) -> std::io::Result<()> {
            let mut conns = Vec::with_capacity(n);
            for _ in 0..n {
                let c = TcpStream::connect(self.addr).await?;
                c.set_nodelay(true)?;
                conns.push(c);
            }
            self.idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(conns);
            Ok(())
        }

        /// Sends `request` (head and body) and returns the response's status code.
        pub async fn send(&self, request: &[u8]) -> std::io::Result<u16> {
            let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
            let mut conn = match idle {
                Some(c) => c,
                None => {
                    let c = TcpStream::connect(self.addr).await?;
                    c.set_nodelay(true)?;
                    c
                }
            };
            conn.write_all(request).await?;
            let (status, keep) = read_response(&mut conn).await?;
            if keep {
                self.idle
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(conn);
            }
            Ok(status)
        }
    }

    fn bad(msg: &str) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, msg.to_string())
    }

    /// Reads one response; returns its status and whether the connection stays open.
    async fn read_response(conn: &mut TcpStream) -> std::io::Result<(u16, bool)> {
        let mut buf = Vec::with_capacity(1024);
        let mut chunk = [0u8; 4096];
        let head_end = loop {
            let n = conn.read(&mut chunk).await?;
            if n == 0 {
                return Err(bad("connection closed before the response"));
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
            if buf.len() > 64 << 10 {
                return Err(bad("response head over 64 KB"));
            }
        };
        let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| bad("head is not UTF-8"))?;
        let status: u16 = head
            .get(9..12)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("no status code"))?;
        let mut len = None;
        let mut keep = true;
        for line in head.lines().skip(1) {
            if let Some((k, v)) = line.split_once(':') {
                let v = v.trim();
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.parse::<usize>().ok();
                } else if k.eq_ignore_ascii_case("connection") && v.eq_ignore_ascii_case("close") {
                    keep = false;
                } else if k.eq_ignore_ascii_case("transfer-encoding") {
                    return Err(bad("chunked responses are not supported"));
                }
            }
        }
        let len = len.ok_or_else(|| bad("no Content-Length"))?;
        let mut have = buf.len() - head_end;
        while have < len {
            let n = conn.read(&mut chunk).await?;
            if n == 0 {
                return Err(bad("connection closed inside the body"));
            }
            have += n;
        }
        Ok((status, keep && have == len))
    }
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
