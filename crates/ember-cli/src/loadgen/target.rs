//! Where `ember loadgen` sends its requests: pre-built HTTP/1.1 requests over a pool of
//! connections, or `ModelInfer` calls over a few HTTP/2 connections; each built from the model's
//! metadata.

use std::sync::Arc;

use anyhow::{Context, bail};
use ember_serve::grpc::pb::{
    self, grpc_inference_service_client::GrpcInferenceServiceClient as GrpcClient,
    infer_parameter::ParameterChoice, model_infer_request::InferInputTensor,
};
use ember_serve::grpc::raw_bytes;
use serde_json::Value;

use super::LoadgenArgs;
use super::h2grpc::{self, Lean};
use super::http1;
use super::requests::{Shape, binary_bodies, bodies, draws, json_shape, tsv_bodies, user_bodies};

/// Where requests go, and the requests.
pub(super) enum Target {
    /// Pre-built HTTP/1.1 requests (head and body) over a pool of connections per server
    /// (`--url A,B,...`: request k goes to server k mod n).
    Http {
        servers: Vec<(http1::Pool, Vec<Arc<[u8]>>)>,
        /// With `--verify`: per request, the numbers of the answers it may get: the one it got
        /// before the measurement (the same from every server), or with `--verify-against` the
        /// one each reference gave.
        expect: Option<Vec<Vec<Vec<f64>>>>,
    },
    /// `ModelInfer` requests over a few HTTP/2 connections, by tonic's client
    /// (`--grpc-client tonic`).
    Grpc {
        clients: Vec<Client>,
        requests: Vec<pb::ModelInferRequest>,
    },
    /// `ModelInfer` requests framed once, over h2 (`--grpc-client lean`, `h2grpc.rs`); call k
    /// goes to server k mod n.
    GrpcLean {
        servers: Vec<Lean>,
        bodies: Vec<bytes::Bytes>,
    },
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Answered with scores.
    Ok,
    /// Refused for load: 503 (HTTP) or RESOURCE_EXHAUSTED / UNAVAILABLE (gRPC).
    Refused,
    /// Anything else (another status, a transport error, no answer in time).
    Error,
    /// With `--verify`: answered with scores other than the same request got before.
    Wrong,
}

impl Target {
    /// Sends the `k`-th request.
    pub(super) async fn send(&self, k: usize) -> Outcome {
        match self {
            Target::Http { servers, expect } => {
                let (pool, requests) = &servers[k % servers.len()];
                let j = (k / servers.len()) % requests.len();
                let mut body = Vec::new();
                let keep = expect.as_ref().map(|_| &mut body);
                match pool.send(&requests[j], keep).await {
                    Ok(200) => match expect {
                        Some(e) if !any_scores(&e[j], &numbers(&body)) => Outcome::Wrong,
                        _ => Outcome::Ok,
                    },
                    Ok(503) => Outcome::Refused,
                    _ => Outcome::Error,
                }
            }
            Target::Grpc { clients, requests } => {
                let mut c = clients[k % clients.len()].clone();
                let req = requests[k % requests.len()].clone();
                match c.model_infer(req).await {
                    Ok(_) => Outcome::Ok,
                    Err(s) => match s.code() {
                        tonic::Code::ResourceExhausted | tonic::Code::Unavailable => {
                            Outcome::Refused
                        }
                        _ => Outcome::Error,
                    },
                }
            }
            Target::GrpcLean { servers, bodies } => {
                let s = &servers[k % servers.len()];
                grpc_outcome(s.call(k / servers.len(), &bodies[k % bodies.len()]).await)
            }
        }
    }

    /// `--verify`: sends every request once to every server and keeps the answer each gave;
    /// fails unless all are 200 and every server answers a request alike (stateless replicas of
    /// one model must).
    pub(super) async fn record_answers(&mut self) -> anyhow::Result<()> {
        let Target::Http { servers, expect } = self else {
            bail!("--verify needs --protocol http");
        };
        let n = servers[0].1.len();
        let mut want = Vec::with_capacity(n);
        let mut body = Vec::new();
        for j in 0..n {
            let mut first: Option<Vec<f64>> = None;
            for (s, (pool, requests)) in servers.iter().enumerate() {
                let status = pool
                    .send(&requests[j], Some(&mut body))
                    .await
                    .with_context(|| format!("--verify: request {j} to server {}", s + 1))?;
                if status != 200 {
                    bail!(
                        "--verify: server {} answered request {j} with {status}: {}",
                        s + 1,
                        String::from_utf8_lossy(&body)
                    );
                }
                let got = numbers(&body);
                match &first {
                    None => first = Some(got),
                    Some(f) if !same_scores(f, &got) => bail!(
                        "--verify: servers 1 and {} answer request {j} differently",
                        s + 1
                    ),
                    Some(_) => {}
                }
            }
            want.push(vec![first.expect("at least one server")]);
        }
        *expect = Some(want);
        Ok(())
    }

    /// `--verify-against`: sends every request once to each reference server (`refs`,
    /// comma-separated URLs) and keeps every answer; fails unless all are 200 and the references
    /// serve a model of the same inputs (so that they get the same requests).
    pub(super) async fn record_references(
        &mut self,
        a: &LoadgenArgs,
        refs: &str,
    ) -> anyhow::Result<()> {
        let Target::Http { servers, expect } = self else {
            bail!("--verify-against needs --protocol http");
        };
        let mut want: Vec<Vec<Vec<f64>>> = vec![Vec::new(); servers[0].1.len()];
        let mut body = Vec::new();
        for url in split_urls(refs) {
            let (pool, requests) = http_server(a, url.clone())
                .await
                .with_context(|| format!("--verify-against {url}"))?;
            let same = requests.len() == servers[0].1.len()
                && requests
                    .iter()
                    .zip(&servers[0].1)
                    .all(|(r, t)| body_of(r) == body_of(t));
            if !same {
                bail!(
                    "--verify-against {url}: its model's inputs differ from the served one's \
                     (the dense width, the features or their tables' rows)"
                );
            }
            for (j, r) in requests.iter().enumerate() {
                let status = pool
                    .send(r, Some(&mut body))
                    .await
                    .with_context(|| format!("--verify-against {url}: request {j}"))?;
                if status != 200 {
                    bail!(
                        "--verify-against {url}: request {j} answered {status}: {}",
                        String::from_utf8_lossy(&body)
                    );
                }
                want[j].push(numbers(&body));
            }
        }
        if want.first().is_none_or(Vec::is_empty) {
            bail!("--verify-against names no server");
        }
        *expect = Some(want);
        Ok(())
    }
}

/// The body of a pre-built HTTP/1.1 request (what follows its head).
fn body_of(request: &[u8]) -> &[u8] {
    request
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(request, |p| &request[p + 4..])
}

/// The outcome of a call that ended with gRPC status `code` (None: it failed, or had none): OK,
/// refused for load (RESOURCE_EXHAUSTED, UNAVAILABLE), or an error.
fn grpc_outcome(code: Option<u32>) -> Outcome {
    match code {
        Some(0) => Outcome::Ok,
        Some(8 | 14) => Outcome::Refused,
        _ => Outcome::Error,
    }
}

/// Every number in a text answer (KServe JSON or TSV scores), in order.
fn numbers(body: &[u8]) -> Vec<f64> {
    body.split(|b| !matches!(b, b'0'..=b'9' | b'.' | b'-' | b'+' | b'e' | b'E'))
        .filter_map(|t| std::str::from_utf8(t).ok()?.parse().ok())
        .collect()
}

/// Whether two answers carry the same scores. A sample's score may move in its last bits with
/// the batch the server happened to put it in (the matrix kernels block by batch size), so not
/// bit for bit: within 1e-5 relative (a wrong row moves a score by far more).
fn same_scores(want: &[f64], got: &[f64]) -> bool {
    want.len() == got.len()
        && want
            .iter()
            .zip(got)
            .all(|(a, b)| (a - b).abs() <= 1e-5 * a.abs().max(b.abs()) + 1e-7)
}

/// Whether an answer carries, number by number, a number of one of the answers in `want` (each
/// sample's score as one of the references gave it; the shape's numbers as all of them do).
fn any_scores(want: &[Vec<f64>], got: &[f64]) -> bool {
    match want {
        [one] => same_scores(one, got),
        _ => {
            want.iter().all(|w| w.len() == got.len())
                && got.iter().enumerate().all(|(i, &g)| {
                    want.iter()
                        .any(|w| same_scores(std::slice::from_ref(&w[i]), &[g]))
                })
        }
    }
}

/// The servers of `--url` (comma-separated), or `default`.
fn urls(a: &LoadgenArgs, default: &str) -> Vec<String> {
    split_urls(a.url.as_deref().unwrap_or(default))
}

/// Comma-separated URLs, each without its trailing `/`.
fn split_urls(list: &str) -> Vec<String> {
    list.split(',')
        .map(|u| u.trim().trim_end_matches('/').to_string())
        .filter(|u| !u.is_empty())
        .collect()
}

pub(super) async fn http_target(a: &LoadgenArgs) -> anyhow::Result<Target> {
    let mut servers = Vec::new();
    for base in urls(a, "http://127.0.0.1:8080") {
        servers.push(http_server(a, base).await?);
    }
    if servers.is_empty() {
        bail!("--url names no server");
    }
    Ok(Target::Http {
        servers,
        expect: None,
    })
}

/// One server's connection pool and requests.
async fn http_server(
    a: &LoadgenArgs,
    base: String,
) -> anyhow::Result<(http1::Pool, Vec<Arc<[u8]>>)> {
    let tls = a.tls.for_url(&base, b"http/1.1")?;
    let client = a.tls.reqwest()?;
    let r = client
        .get(format!("{base}/v2/models/{}", a.model))
        .send()
        .await
        .with_context(|| format!("asking {base} for model '{}'", a.model))?;
    let status = r.status();
    if !status.is_success() {
        // The server's own words (e.g. "this server serves 'dcn'"), and the flag to change.
        let body = r.text().await.unwrap_or_default();
        let said = serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or(body);
        bail!(
            "asking {base} for model '{}' (--model): {status}: {said}",
            a.model
        );
    }
    let meta: Value = r.json().await?;
    if !base.starts_with("http://") && !base.starts_with("https://") {
        bail!("--url {base} must start with http:// or https://");
    }
    let hostport = super::tls::split(&base).1.to_string();
    let addr = tokio::net::lookup_host(&hostport)
        .await
        .with_context(|| format!("resolving {hostport}"))?
        .next()
        .with_context(|| format!("{hostport} resolves to no address"))?;
    let infer = format!("/v2/models/{}/infer", a.model);
    let no_head = |b: Vec<Vec<u8>>| b.into_iter().map(|b| (b, None)).collect::<Vec<_>>();
    let shape = || json_shape(&meta);
    let (path, ctype, payloads) = match a.format.as_str() {
        "kserve" => (infer, "application/json", no_head(bodies(&shape()?, a))),
        "binary" => (
            infer,
            "application/octet-stream",
            binary_bodies(&shape()?, a)
                .into_iter()
                .map(|(b, h)| (b, Some(h)))
                .collect(),
        ),
        "tsv" => (
            "/v1/score".to_string(),
            "text/tab-separated-values",
            no_head(tsv_bodies(&shape()?, a)?),
        ),
        "users" => (
            "/v1/score".to_string(),
            "application/json",
            no_head(user_bodies(a)?),
        ),
        f => bail!("unknown --format '{f}' (kserve, binary, tsv or users)"),
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
    let pool = http1::Pool::new(addr, tls);
    pool.warm(64.min(a.max_outstanding))
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    Ok((pool, requests))
}

/// A tonic client of `ModelInfer` calls over one connection.
type Client = GrpcClient<tonic::transport::Channel>;

/// The gRPC target of `a`: its requests built from the model's metadata, sent by tonic's
/// client or framed once for the lean one (`--grpc-client`).
pub(super) async fn grpc_target(a: &LoadgenArgs) -> anyhow::Result<Target> {
    check_grpc_args(a)?;
    let endpoints = grpc_endpoints(a)?;
    let clients = grpc_connect(a, &endpoints).await?;
    let shape = grpc_shape(a, &clients[0], &endpoints[0].0).await?;
    let requests = grpc_requests(a, &shape);
    if a.grpc_client == "tonic" {
        return Ok(Target::Grpc { clients, requests });
    }
    drop(clients);
    let servers = lean_servers(a, &endpoints).await?;
    let bodies = requests.iter().map(h2grpc::frame).collect();
    Ok(Target::GrpcLean { servers, bodies })
}

/// Refuses the options gRPC does not take: an HTTP `--format`, no connection, an unknown
/// `--grpc-client`.
fn check_grpc_args(a: &LoadgenArgs) -> anyhow::Result<()> {
    if a.format != "kserve" {
        bail!(
            "--format {} is for HTTP; gRPC sends KServe v2 ModelInfer calls",
            a.format
        );
    }
    if a.grpc_connections == 0 {
        bail!("--grpc-connections must be at least 1");
    }
    if !matches!(a.grpc_client.as_str(), "lean" | "tonic") {
        bail!("unknown --grpc-client '{}' (lean or tonic)", a.grpc_client);
    }
    Ok(())
}

/// The servers of `--url` (`grpc://` read as `http://`), each with its endpoint; at least one.
fn grpc_endpoints(a: &LoadgenArgs) -> anyhow::Result<Vec<(String, tonic::transport::Endpoint)>> {
    let mut endpoints = Vec::new();
    for url in urls(a, "http://127.0.0.1:8081") {
        let url = match (url.strip_prefix("grpc://"), url.strip_prefix("grpcs://")) {
            (Some(rest), _) => format!("http://{rest}"),
            (_, Some(rest)) => format!("https://{rest}"),
            _ => url,
        };
        let e = tonic::transport::Endpoint::from_shared(url.clone())
            .with_context(|| format!("--url {url}"))?
            .tcp_nodelay(true);
        let e = a.tls.tonic(&url, e)?;
        endpoints.push((url, e));
    }
    if endpoints.is_empty() {
        bail!("--url names no server");
    }
    Ok(endpoints)
}

/// `--grpc-connections` connections (at least one per server), spread over the `endpoints`
/// in turn.
async fn grpc_connect(
    a: &LoadgenArgs,
    endpoints: &[(String, tonic::transport::Endpoint)],
) -> anyhow::Result<Vec<Client>> {
    let mut clients = Vec::with_capacity(a.grpc_connections.max(endpoints.len()));
    for k in 0..a.grpc_connections.max(endpoints.len()) {
        let (url, endpoint) = &endpoints[k % endpoints.len()];
        let ch = endpoint
            .connect()
            .await
            .with_context(|| format!("asking {url} for model '{}': connecting", a.model))?;
        clients.push(GrpcClient::new(ch).max_decoding_message_size(usize::MAX));
    }
    Ok(clients)
}

/// The model's inputs, from its metadata asked of the server at `url` by `client`: the dense
/// width and each feature's table rows (`parameters.rows` of `<feature>_ids`).
async fn grpc_shape(a: &LoadgenArgs, client: &Client, url: &str) -> anyhow::Result<Shape> {
    let meta = client
        .clone()
        .model_metadata(pb::ModelMetadataRequest {
            name: a.model.clone(),
            version: String::new(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("{}: {}", s.code(), s.message()))
        .with_context(|| format!("asking {url} for model '{}' (--model)", a.model))?
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
    Ok(Shape { dense_in, features })
}

/// The `ModelInfer` requests of random inputs for `shape`, their tensors in
/// `raw_input_contents`.
fn grpc_requests(a: &LoadgenArgs, shape: &Shape) -> Vec<pb::ModelInferRequest> {
    let n = a.samples_per_request;
    let lengths = raw_bytes(&vec![a.pooling as i64; n], i64::to_le_bytes);
    let tensor = |name: String, datatype: &str, shape: Vec<i64>| InferInputTensor {
        name,
        datatype: datatype.into(),
        shape,
        ..Default::default()
    };
    draws(shape, a)
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
        .collect()
}

/// The lean client's connections: `--grpc-connections` spread over the servers of
/// `endpoints`, each server's address resolved once.
async fn lean_servers(
    a: &LoadgenArgs,
    endpoints: &[(String, tonic::transport::Endpoint)],
) -> anyhow::Result<Vec<Lean>> {
    let per_server = a.grpc_connections.div_ceil(endpoints.len());
    let mut servers = Vec::with_capacity(endpoints.len());
    for (url, _) in endpoints {
        let hostport = super::tls::split(url).1;
        let tls = a.tls.for_url(url, b"h2")?;
        let addr = tokio::net::lookup_host(hostport)
            .await
            .with_context(|| format!("resolving {hostport}"))?
            .next()
            .with_context(|| format!("{hostport} resolves to no address"))?;
        servers.push(Lean::connect(addr, hostport, tls, per_server).await?);
    }
    Ok(servers)
}

#[cfg(test)]
mod tests {
    use super::{Outcome, any_scores, body_of, grpc_outcome, numbers, same_scores};

    #[test]
    fn grpc_statuses_map_to_outcomes() {
        assert_eq!(grpc_outcome(Some(0)), Outcome::Ok);
        assert_eq!(grpc_outcome(Some(8)), Outcome::Refused);
        assert_eq!(grpc_outcome(Some(14)), Outcome::Refused);
        assert_eq!(grpc_outcome(Some(3)), Outcome::Error);
        assert_eq!(grpc_outcome(None), Outcome::Error);
    }

    #[test]
    fn answers_compare_by_their_numbers_within_a_relative_tolerance() {
        let json = br#"{"model_name":"default","outputs":[{"name":"score","datatype":"FP32","shape":[2,1],"data":[0.25,1e-3]}]}"#;
        assert_eq!(numbers(json), vec![32.0, 2.0, 1.0, 0.25, 1e-3]);
        assert_eq!(numbers(b"0.5\n0.125\n"), vec![0.5, 0.125]);
        let want = numbers(json);
        let close = numbers(br#""FP32","shape":[2,1],"data":[0.2500001,0.001]"#);
        assert!(same_scores(&want, &close));
        // Another row's scores, a score missing, or a different shape are all wrong.
        let other = numbers(br#""FP32","shape":[2,1],"data":[0.2503,0.001]"#);
        assert!(!same_scores(&want, &other));
        assert!(!same_scores(&want, &want[..4]));
        let shape = numbers(br#""FP32","shape":[1,2],"data":[0.25,0.001]"#);
        assert!(!same_scores(&want, &shape));
    }

    #[test]
    fn each_sample_may_match_any_reference() {
        // Three samples; two references disagree on samples 0 and 2 (a row between two states).
        let a = numbers(b"0.5\n0.25\n0.125\n");
        let b = numbers(b"0.75\n0.25\n0.375\n");
        let refs = vec![a.clone(), b.clone()];
        for got in [
            &a,
            &b,
            &numbers(b"0.5\n0.25\n0.375\n"),
            &numbers(b"0.75\n0.25\n0.125\n"),
        ] {
            assert!(any_scores(&refs, got), "{got:?}");
        }
        // A score neither reference gave, one missing, and one too many are wrong.
        assert!(!any_scores(&refs, &numbers(b"0.5\n0.3\n0.125\n")));
        assert!(!any_scores(&refs, &numbers(b"0.5\n0.25\n")));
        assert!(!any_scores(&refs, &numbers(b"0.5\n0.25\n0.125\n0.1\n")));
        // One reference: the answer as a whole, as --verify compares it.
        assert!(any_scores(std::slice::from_ref(&a), &a));
        assert!(!any_scores(std::slice::from_ref(&a), &b));
        assert!(!any_scores(&[], &a));
    }

    #[test]
    fn a_request_body_is_what_follows_its_head() {
        assert_eq!(
            body_of(b"POST / HTTP/1.1\r\nHost: a\r\n\r\n{\"x\":1}"),
            b"{\"x\":1}"
        );
        assert_eq!(body_of(b"POST / HTTP/1.1\r\nHost: a\r\n\r\n"), b"");
    }
}
