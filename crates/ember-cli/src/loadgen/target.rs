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
use super::http1;
use super::requests::{Shape, binary_bodies, bodies, draws, json_shape, tsv_bodies};

/// Where requests go, and the requests.
pub(super) enum Target {
    /// Pre-built HTTP/1.1 requests (head and body) over a pool of connections per server
    /// (`--url A,B,...`: request k goes to server k mod n).
    Http {
        servers: Vec<(http1::Pool, Vec<Arc<[u8]>>)>,
    },
    /// `ModelInfer` requests over a few HTTP/2 connections.
    Grpc {
        clients: Vec<GrpcClient<tonic::transport::Channel>>,
        requests: Vec<pb::ModelInferRequest>,
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
}

impl Target {
    /// Sends the `k`-th request.
    pub(super) async fn send(&self, k: usize) -> Outcome {
        match self {
            Target::Http { servers } => {
                let (pool, requests) = &servers[k % servers.len()];
                match pool
                    .send(&requests[(k / servers.len()) % requests.len()])
                    .await
                {
                    Ok(200) => Outcome::Ok,
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
        }
    }
}

/// The servers of `--url` (comma-separated), or `default`.
fn urls(a: &LoadgenArgs, default: &str) -> Vec<String> {
    a.url
        .as_deref()
        .unwrap_or(default)
        .split(',')
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
    Ok(Target::Http { servers })
}

/// One server's connection pool and requests.
async fn http_server(
    a: &LoadgenArgs,
    base: String,
) -> anyhow::Result<(http1::Pool, Vec<Arc<[u8]>>)> {
    let client = reqwest::Client::builder().tcp_nodelay(true).build()?;
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
    Ok((pool, requests))
}

pub(super) async fn grpc_target(a: &LoadgenArgs) -> anyhow::Result<Target> {
    if a.format != "kserve" {
        bail!(
            "--format {} is for HTTP; gRPC sends KServe v2 ModelInfer calls",
            a.format
        );
    }
    if a.grpc_connections == 0 {
        bail!("--grpc-connections must be at least 1");
    }
    // Connections spread over the servers of --url in turn.
    let mut endpoints = Vec::new();
    for url in urls(a, "http://127.0.0.1:8081") {
        let url = match url.strip_prefix("grpc://") {
            Some(rest) => format!("http://{rest}"),
            None => url,
        };
        let e = tonic::transport::Endpoint::from_shared(url.clone())
            .with_context(|| format!("--url {url}"))?
            .tcp_nodelay(true);
        endpoints.push((url, e));
    }
    if endpoints.is_empty() {
        bail!("--url names no server");
    }
    let url = endpoints[0].0.clone();
    let mut clients = Vec::with_capacity(a.grpc_connections.max(endpoints.len()));
    for k in 0..a.grpc_connections.max(endpoints.len()) {
        let (url, endpoint) = &endpoints[k % endpoints.len()];
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
