//! Memory per request and after a burst: a request at the body limit, in every format and in
//! its most expensive shape (every bag empty, or every id "1"), raises the server's peak memory
//! by at most 8x its body; the memory returns after; and a large request, run in `--max-batch`
//! pieces, lets small requests through while it runs.

use std::time::{Duration, Instant};

use ember_serve::grpc::pb;
use ember_serve::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient as GrpcClient;
use serde_json::{Value, json};

use crate::server::{PATIENCE, Server, metric_in, request, tsv_rows, wait_until};

/// The shipped model's sparse features, from its metadata.
pub fn features(s: &Server) -> Vec<String> {
    let (_, meta) = s.request("GET", "/v2/models/default", "", b"").unwrap();
    let meta: Value = serde_json::from_str(&meta).unwrap();
    meta["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["name"].as_str()?.strip_suffix("_ids").map(String::from))
        .collect()
}

/// Waits until the server is done with its requests (none in flight, no body held, at most
/// `conns` connections open, the scrape's own included) and its resident memory has stopped
/// falling: the level a request leaves.
pub fn settle(s: &Server, conns: f64) {
    wait_until("end of the requests", PATIENCE, || {
        let Some((200, page)) = s.request("GET", "/metrics", "", b"") else {
            return false;
        };
        metric_in(&page, "ember_requests_in_flight") == 0.0
            && metric_in(&page, "ember_inflight_body_bytes") == 0.0
            && metric_in(&page, "ember_connections_open") <= conns
    });
    // Memory freed goes back at once (mimalloc's purge delay is 0), the last of it as the
    // threads that freed it run again: settled when it has not fallen by 1 MiB in 200 ms.
    let mut seen = vec![(Instant::now(), s.rss().0)];
    wait_until("steady resident memory", PATIENCE, || {
        let (now, rss) = (Instant::now(), s.rss().0);
        seen.push((now, rss));
        let window = Duration::from_millis(200);
        let from = seen.iter().rposition(|&(t, _)| now - t >= window);
        from.is_some_and(|i| seen[i..].iter().all(|&(_, r)| r <= rss + (1 << 20)))
    });
}

/// A request body of `n` samples: (path, content type, extra header, body).
pub type Made = (&'static str, &'static str, String, Vec<u8>);

/// The request shapes that cost the most memory per body byte.
pub fn shapes() -> Vec<&'static str> {
    vec![
        "kserve-empty-bags",
        "kserve-ids",
        "v1-empty-bags",
        "v1-ids",
        "tsv-empty-fields",
        "binary-empty-bags",
    ]
}

/// `n` samples in `shape` (`pool` ids per bag where the shape has ids).
pub fn make(shape: &str, feats: &[String], n: usize) -> Made {
    const POOL: usize = 20;
    let infer = "/v2/models/default/infer";
    match shape {
        "kserve-empty-bags" | "kserve-ids" => {
            let ids = shape == "kserve-ids";
            let mut inputs = vec![
                json!({"name": "dense", "shape": [n, 13], "datatype": "FP32", "data": vec![0; n * 13]}),
            ];
            for f in feats {
                let l = if ids { POOL } else { 0 };
                inputs.push(json!({"name": format!("{f}_lengths"), "shape": [n], "datatype": "INT64", "data": vec![l; n]}));
                inputs.push(json!({"name": format!("{f}_ids"), "shape": [n * l], "datatype": "INT64", "data": vec![1; n * l]}));
            }
            let body = json!({ "inputs": inputs }).to_string().into_bytes();
            (infer, "application/json", String::new(), body)
        }
        "v1-empty-bags" | "v1-ids" => {
            let bag = if shape == "v1-ids" {
                vec![1; POOL]
            } else {
                vec![]
            };
            let sparse: serde_json::Map<String, Value> =
                feats.iter().map(|f| (f.clone(), json!(bag))).collect();
            let one = json!({"dense": vec![0; 13], "sparse": sparse}).to_string();
            let mut body = String::from("[");
            for i in 0..n {
                if i > 0 {
                    body.push(',');
                }
                body.push_str(&one);
            }
            body.push(']');
            (
                "/v1/score",
                "application/json",
                String::new(),
                body.into_bytes(),
            )
        }
        "tsv-empty-fields" => {
            let line = format!("0{}\n", "\t".repeat(39));
            (
                "/v1/score",
                "text/plain",
                String::new(),
                line.repeat(n).into_bytes(),
            )
        }
        "binary-empty-bags" => {
            let mut inputs = vec![
                json!({"name": "dense", "shape": [n, 13], "datatype": "FP32", "parameters": {"binary_data_size": n * 52}}),
            ];
            for f in feats {
                inputs.push(json!({"name": format!("{f}_lengths"), "shape": [n], "datatype": "INT32", "parameters": {"binary_data_size": n * 4}}));
                inputs.push(json!({"name": format!("{f}_ids"), "shape": [0], "datatype": "INT64", "parameters": {"binary_data_size": 0}}));
            }
            let mut body = json!({ "inputs": inputs }).to_string().into_bytes();
            let head = format!("Inference-Header-Content-Length: {}\r\n", body.len());
            body.resize(body.len() + n * 52 + feats.len() * n * 4, 0);
            (infer, "application/octet-stream", head, body)
        }
        s => panic!("unknown shape {s}"),
    }
}

/// The most samples of `shape` within `limit` bytes, and their body.
pub fn fill(shape: &str, feats: &[String], limit: usize) -> (usize, Made) {
    let per = make(shape, feats, 101).3.len() - make(shape, feats, 100).3.len();
    let mut n = limit / per.max(1);
    loop {
        let m = make(shape, feats, n);
        if m.3.len() <= limit {
            return (n, m);
        }
        n -= n / 50 + 1;
    }
}

/// Sends `made` on a new connection; its status.
pub fn send(s: &Server, made: &Made) -> u16 {
    let (path, ctype, extra, body) = made;
    let mut c = std::net::TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {ctype}\r\n{extra}Content-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    use std::io::{Read, Write};
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(body).unwrap();
    let mut resp = Vec::new();
    let _ = c.read_to_end(&mut resp);
    String::from_utf8_lossy(&resp[..12.min(resp.len())])
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// What one request of a shape costs: the peak memory it adds over the server's level before
/// it, for the first such request (which also pays the process's one-time costs: thread heaps,
/// lazily built state) and for the next ones; and the server's level after each, settled.
pub struct Peak {
    pub shape: &'static str,
    pub body: usize,
    /// Peak added by each request in turn.
    pub added: Vec<u64>,
    /// The level after each.
    pub levels: Vec<u64>,
    /// The level before the first.
    pub idle: u64,
}

impl Peak {
    /// The highest level after a request, over the level before the first.
    pub fn kept(&self) -> u64 {
        self.levels.iter().max().unwrap().saturating_sub(self.idle)
    }
}

/// What a server keeps once it has handled large requests: each thread's allocator caches pages
/// it used (a plateau of ~20-30 MiB measured, whatever the size or number of the requests; the
/// requests themselves are gone).
pub const CACHES: u64 = 40 << 20;

/// [`Peak`] of each shape at `limit`-byte bodies, each on a fresh server, over `bursts`
/// requests one after the other.
pub fn peaks(limit: usize, bursts: usize) -> Vec<Peak> {
    let lim = limit.to_string();
    let args = ["--grpc", "off", "--max-body-bytes", lim.as_str()];
    let feats = features(&Server::start(&args));
    let mut out = Vec::new();
    for shape in shapes() {
        let (n, made) = fill(shape, &feats, limit);
        let s = Server::start(&args);
        assert_eq!(
            s.request("POST", "/v1/score", "text/plain", &tsv_rows(2, 1))
                .unwrap()
                .0,
            200
        );
        settle(&s, 1.0);
        let idle = s.rss().0;
        let (mut added, mut levels) = (Vec::new(), Vec::new());
        for _ in 0..bursts {
            let base = s.rss().0;
            s.reset_peak();
            assert_eq!(send(&s, &made), 200, "{shape}");
            added.push(s.rss().1.saturating_sub(base));
            settle(&s, 1.0);
            levels.push(s.rss().0);
        }
        let p = Peak {
            shape,
            body: made.3.len(),
            added,
            levels,
            idle,
        };
        let mb = |b: u64| b as f64 / 1048576.0;
        let x: Vec<String> = p
            .added
            .iter()
            .map(|&a| format!("{:.1}x", a as f64 / p.body as f64))
            .collect();
        let levels: Vec<String> = p.levels.iter().map(|&l| format!("{:.1}", mb(l))).collect();
        eprintln!(
            "{shape:18} {n:7} samples, body {:5.2} MiB: peak over the level before, per request: \
             {} (first: +{:.1} MiB); levels after, MiB: {} (from {:.1} before)",
            mb(p.body as u64),
            x.join(" "),
            mb(p.added[0]),
            levels.join(" "),
            mb(p.idle),
        );
        out.push(p);
    }
    out
}

#[test]
fn a_request_at_the_body_limit_costs_at_most_8x_its_body_and_memory_returns_after() {
    for p in peaks(8 << 20, 4) {
        let (shape, body) = (p.shape, p.body as u64);
        let worst = p.added.iter().max().unwrap();
        assert!(
            *worst <= 8 * body,
            "{shape}: +{worst} bytes for a {body}-byte body"
        );
        // Nothing of a request stays: only the allocator's caches (a bounded plateau).
        assert!(
            p.kept() <= CACHES,
            "{shape}: levels {:?} from {}",
            p.levels,
            p.idle
        );
    }
}

#[test]
fn a_large_request_runs_in_pieces_and_small_ones_pass_it() {
    // No queue-delay bound: this is about interleaving, and in a debug build one piece can take
    // longer than the default bound (a small request behind it would be refused, rightly).
    let s = Server::start(&[
        "--grpc",
        "off",
        "--max-batch",
        "256",
        "--threads",
        "1",
        "--max-queue-delay-ms",
        "0",
    ]);
    let big = tsv_rows(40_000, 5);
    let batches = s.metric("ember_batch_size_count");
    let addr = s.addr;
    let t = Instant::now();
    let large = std::thread::spawn(move || {
        let r = request(
            addr,
            "POST",
            "/v1/score",
            "text/plain",
            &big,
            Duration::from_secs(60),
        );
        (r, t.elapsed())
    });
    // Small requests while it runs (a piece of it has: a batch more): each answered before it.
    s.wait_metric("ember_batch_size_count", "past the batches before", |n| {
        n > batches
    });
    let mut small = Vec::new();
    while !large.is_finished() && small.len() < 20 {
        let t = Instant::now();
        let (status, _) = s
            .request("POST", "/v1/score", "text/plain", &tsv_rows(1, 9))
            .unwrap();
        assert_eq!(status, 200);
        small.push(t.elapsed());
    }
    let (r, large_took) = large.join().unwrap();
    let (status, body) = r.unwrap();
    assert_eq!(status, 200);
    assert_eq!(body.lines().count(), 40_000);
    small.sort();
    eprintln!(
        "large request {large_took:?}; small ones meanwhile: {} (max {:?})",
        small.len(),
        small.last()
    );
    assert!(
        small.len() >= 2,
        "small requests waited for the large one ({large_took:?})"
    );
    assert!(*small.last().unwrap() < large_took / 2);
}

/// A `ModelInfer` of `n` samples with every bag empty: values as raw bytes (as Triton's clients
/// send them) or as typed `contents` (a packed varint of 1 byte per 0, 8 bytes once decoded).
fn grpc_request(feats: &[String], n: usize, typed: bool) -> pb::ModelInferRequest {
    use pb::model_infer_request::InferInputTensor;
    let tensor = |name: String, datatype: &str, shape: Vec<i64>, contents| InferInputTensor {
        name,
        datatype: datatype.into(),
        shape,
        contents,
        ..Default::default()
    };
    let typed_of = |ints: Vec<i64>, floats: Vec<f32>| {
        typed.then(|| pb::InferTensorContents {
            int64_contents: ints,
            fp32_contents: floats,
            ..Default::default()
        })
    };
    let mut inputs = vec![tensor(
        "dense".into(),
        "FP32",
        vec![n as i64, 13],
        typed_of(vec![], vec![0.0; n * 13]),
    )];
    let mut raw = vec![ember_serve::grpc::raw_bytes(
        &vec![0f32; n * 13],
        f32::to_le_bytes,
    )];
    for f in feats {
        inputs.push(tensor(
            format!("{f}_lengths"),
            "INT64",
            vec![n as i64],
            typed_of(vec![0; n], vec![]),
        ));
        inputs.push(tensor(
            format!("{f}_ids"),
            "INT64",
            vec![0],
            typed_of(vec![], vec![]),
        ));
        raw.push(ember_serve::grpc::raw_bytes(
            &vec![0i64; n],
            i64::to_le_bytes,
        ));
        raw.push(ember_serve::grpc::raw_bytes::<i64, 8>(
            &[],
            i64::to_le_bytes,
        ));
    }
    pb::ModelInferRequest {
        model_name: "default".into(),
        inputs,
        raw_input_contents: if typed { vec![] } else { raw },
        ..Default::default()
    }
}

/// The peak memory one `ModelInfer` at the body limit adds (first and second time), typed or
/// raw; printed.
pub fn grpc_peaks(limit: usize) -> Vec<(&'static str, usize, u64)> {
    use prost::Message;
    let lim = limit.to_string();
    let s = Server::start(&["--max-body-bytes", lim.as_str()]);
    let feats = features(&s);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let url = format!("http://{}", s.grpc.unwrap());
    let mut client = rt
        .block_on(GrpcClient::connect(url))
        .unwrap()
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX);
    let mut out = Vec::new();
    for (shape, typed) in [
        ("grpc-raw-empty-bags", false),
        ("grpc-typed-empty-bags", true),
    ] {
        let per = grpc_request(&feats, 101, typed).encoded_len()
            - grpc_request(&feats, 100, typed).encoded_len();
        let mut n = limit / per;
        while grpc_request(&feats, n, typed).encoded_len() > limit {
            n -= n / 50 + 1;
        }
        let req = grpc_request(&feats, n, typed);
        let body = req.encoded_len();
        let mut added = Vec::new();
        for _ in 0..3 {
            // Its gRPC connection stays open.
            settle(&s, 2.0);
            let base = s.rss().0;
            s.reset_peak();
            let r = rt.block_on(client.model_infer(req.clone()));
            assert!(r.is_ok(), "{shape}: {r:?}");
            added.push(s.rss().1.saturating_sub(base));
        }
        let x: Vec<String> = added
            .iter()
            .map(|&a| format!("{:.1}x", a as f64 / body as f64))
            .collect();
        eprintln!(
            "{shape:22} {n:7} samples, message {:5.2} MiB: peak over the level before, per request: {}",
            body as f64 / 1048576.0,
            x.join(" ")
        );
        out.push((shape, body, *added.iter().max().unwrap()));
    }
    out
}

#[test]
fn a_grpc_message_at_the_limit_costs_at_most_8x_its_size_raw_and_10x_typed() {
    for (shape, body, worst) in grpc_peaks(8 << 20) {
        // Typed int64 `contents` are varints of 1 byte per 0 that tonic's generated decoder
        // turns into 8 bytes each before Ember sees them: 7.1x-8.4x measured. Below 8x needs a
        // decoder of the message of Ember's own (not done: README, known limits).
        let bound = if shape.contains("typed") { 10 } else { 8 };
        assert!(
            worst <= bound * body as u64,
            "{shape}: +{worst} bytes for a {body}-byte message (bound {bound}x)"
        );
    }
}
