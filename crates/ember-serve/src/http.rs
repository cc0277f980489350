//! The HTTP front end: KServe v2 routes, `/v1/score`, `/metrics`.

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ember_model::serving::Request;
use serde::Deserialize;
use serde_json::json;

use crate::conn::{OverBudget, SlowBody};
use crate::error::{Result, ServeError};
use crate::kserve::json::{InferRequest, InferResponse, OutputTensor};
use crate::kserve::{self, fastjson, json as kjson};
use crate::metrics::{self as m, Tracked};
use crate::repo::Served;
use crate::spec::ModelSpec;
use crate::state::App;
use crate::v1;

mod repository;
mod triton;
use repository as repo;

/// The server's routes; `/metrics` among them unless it has an address of its own.
pub fn router(app: App, metrics_here: bool) -> Router {
    let page = match metrics_here {
        true => get(metrics_page),
        false => get(metrics_elsewhere),
    };
    Router::new()
        .route("/v2/health/live", get(live))
        .route("/v2/health/ready", get(ready))
        .route("/v2", get(server_metadata))
        .route("/v2/models/stats", get(triton::stats_all))
        .route("/v2/models/{name}", get(model_metadata))
        .route("/v2/models/{name}/stats", get(triton::stats_model))
        .route("/v2/models/{name}/config", get(triton::config_model))
        .route(
            "/v2/models/{name}/versions/{version}/stats",
            get(triton::stats_version),
        )
        .route(
            "/v2/models/{name}/versions/{version}/config",
            get(triton::config_version),
        )
        .route("/v2/models/{name}/ready", get(model_ready))
        .route(
            "/v2/models/{name}/versions/{version}",
            get(version_metadata),
        )
        .route(
            "/v2/models/{name}/versions/{version}/ready",
            get(version_ready),
        )
        .route("/v2/models/{name}/infer", post(infer))
        .route(
            "/v2/models/{name}/versions/{version}/infer",
            post(infer_version),
        )
        .route("/v2/repository/index", post(repo::index))
        .route("/v2/repository/models/{name}/load", post(repo::load))
        .route("/v2/repository/models/{name}/unload", post(repo::unload))
        .route("/v1/score", post(score_route))
        .route("/metrics", page)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Bodies are read by `read_body`, which answers 400 naming the limit.
        .layer(DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn(crate::access::http))
        .with_state(app)
}

/// Counts the request, times it, and turns errors into JSON bodies.
fn finish(t: Tracked, r: Result<Response>) -> Response {
    t.finish(r.as_ref().err());
    r.unwrap_or_else(IntoResponse::into_response)
}

/// Reads a request body of at most `limit` bytes: over it, 400 naming the limit; arriving
/// below the minimum rate, 408 (the connection closes); past the in-flight budget, 503. A body
/// of declared length is read into one buffer of that size (no copy from a list of chunks: a
/// large body costs its size once, not twice); a body of one chunk is kept as it came.
async fn read_body(mut body: Body, limit: usize) -> Result<axum::body::Bytes> {
    use http_body::Body as _;
    use http_body_util::BodyExt;
    let over = || {
        ServeError::bad(format!(
            "request body is over the server's limit of {limit} bytes (--max-body-bytes)"
        ))
    };
    let declared = body.size_hint().exact();
    if declared.is_some_and(|d| d > limit as u64) {
        return Err(over());
    }
    let mut buf: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|e| body_error(&e))?.into_data() else {
            continue;
        };
        if buf.is_empty() && body.is_end_stream() {
            if data.len() > limit {
                return Err(over());
            }
            return Ok(data);
        }
        if buf.len() + data.len() > limit {
            return Err(over());
        }
        if buf.capacity() == 0 {
            buf.reserve_exact(declared.map_or(data.len(), |d| d as usize));
        }
        buf.extend_from_slice(&data);
    }
    Ok(buf.into())
}

/// Why a body could not be read: too slow (408), past the in-flight budget (503), or broken.
fn body_error(e: &axum::Error) -> ServeError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if let Some(slow) = s.downcast_ref::<SlowBody>() {
            metrics::counter!(m::REQUESTS_REFUSED, "reason" => "slow_body").increment(1);
            return ServeError::RequestTimeout(slow.to_string());
        }
        if let Some(over) = s.downcast_ref::<OverBudget>() {
            metrics::counter!(m::REQUESTS_REFUSED, "reason" => "inflight_bytes").increment(1);
            return ServeError::Overloaded(over.to_string());
        }
        source = s.source();
    }
    ServeError::bad(format!("the request body could not be read: {e}"))
}

async fn live() -> Response {
    axum::Json(json!({ "live": true })).into_response()
}

async fn ready(State(app): State<App>) -> Response {
    let r = app.is_ready();
    let code = if r {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, axum::Json(json!({ "ready": r }))).into_response()
}

async fn server_metadata() -> Response {
    axum::Json(json!({
        "name": "ember",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": kserve::EXTENSIONS,
    }))
    .into_response()
}

fn metadata(app: &App, name: &str, version: &str) -> Response {
    match app.model(name, version) {
        Ok(s) => axum::Json(kserve::metadata(&s.spec, &s.version_str)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn model_metadata(State(app): State<App>, Path(name): Path<String>) -> Response {
    metadata(&app, &name, "")
}

async fn version_metadata(
    State(app): State<App>,
    Path((name, version)): Path<(String, String)>,
) -> Response {
    metadata(&app, &name, &version)
}

/// Whether a model's version takes requests: 200 when ready, else 503 (and 404 for a model or
/// version the server does not know), as Triton answers.
fn model_readiness(app: &App, name: &str, version: &str) -> Response {
    let ready = match app.model_ready(name, version) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, axum::Json(json!({ "name": name, "ready": ready }))).into_response()
}

async fn model_ready(State(app): State<App>, Path(name): Path<String>) -> Response {
    model_readiness(&app, &name, "")
}

async fn version_ready(
    State(app): State<App>,
    Path((name, version)): Path<(String, String)>,
) -> Response {
    model_readiness(&app, &name, &version)
}

async fn infer(
    State(app): State<App>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let t = Tracked::new("http");
    finish(t, run_infer(&app, &name, None, &headers, body).await)
}

async fn infer_version(
    State(app): State<App>,
    Path((name, version)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let t = Tracked::new("http");
    finish(
        t,
        run_infer(&app, &name, Some(&version), &headers, body).await,
    )
}

/// The header of Triton's binary tensor data extension: the JSON's length in the body.
const JSON_LENGTH: &str = "inference-header-content-length";

async fn run_infer(
    app: &App,
    name: &str,
    version: Option<&str>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response> {
    let served = app.model(name, version.unwrap_or(""))?;
    let r = infer_on(app, &served, headers, body).await;
    served.count_request(r.as_ref().err());
    r.map(|(n, mut resp)| {
        resp.extensions_mut().insert(crate::access::Access {
            model: served.spec.name.clone(),
            samples: n,
        });
        resp
    })
}

/// Runs a KServe request on `served`: its samples and the response.
async fn infer_on(
    app: &App,
    served: &Served,
    headers: &HeaderMap,
    body: Body,
) -> Result<(usize, Response)> {
    // Admitted before its body is read: a server already past its queue bound refuses it
    // (503) at once, and the connection layer closes the connection after the answer
    // (`Connection: close`), so that a refusal costs the head, not the body (reading refused
    // bodies was what an overload spent the server's core on: docs/serving.md). The batcher
    // decides again, exactly, when the decoded request is submitted.
    served.batcher.admit(None)?;
    let bytes = read_body(body, app.max_body_bytes).await?;
    let t0 = std::time::Instant::now();
    let d = decode_infer(&served.spec, headers, &bytes)?;
    crate::metrics::decoded("http", t0);
    // The body and its parsed values are not needed while the samples wait and run.
    drop(bytes);
    let n = d.samples.len();
    let scored = served.batcher.submit(d.samples, d.timeout).await?;
    let (id, binary_out) = (d.id, d.binary_out);
    let outs = kserve::requested(kserve::outputs(&served.spec, &scored), &d.requested);
    let mut resp = InferResponse {
        model_name: served.spec.name.clone(),
        model_version: served.version_str.clone(),
        id,
        outputs: outs
            .iter()
            .map(|o| OutputTensor {
                name: o.name.into(),
                datatype: o.values.datatype(),
                shape: vec![o.values.len()],
                parameters: None,
                data: None,
            })
            .collect(),
    };
    if !binary_out {
        for (t, o) in resp.outputs.iter_mut().zip(&outs) {
            t.data = Some(&o.values);
        }
        return Ok((n, axum::Json(resp).into_response()));
    }
    for (t, o) in resp.outputs.iter_mut().zip(&outs) {
        t.parameters = Some(json!({ "binary_data_size": o.values.byte_len() }));
    }
    let mut out = serde_json::to_vec(&resp)
        .map_err(|e| ServeError::Internal(format!("encoding the response: {e}")))?;
    let header_len = out.len();
    out.reserve(outs.iter().map(|o| o.values.byte_len()).sum());
    for o in &outs {
        o.values.write_le(&mut out);
    }
    let headers = [
        (header::CONTENT_TYPE, "application/octet-stream".to_string()),
        (
            header::HeaderName::from_static(JSON_LENGTH),
            header_len.to_string(),
        ),
    ];
    Ok((n, (headers, out).into_response()))
}

/// What a KServe request asks, decoded from its body.
struct Decoded {
    samples: Request,
    timeout: Option<u64>,
    id: Option<String>,
    binary_out: bool,
    /// The outputs asked for (empty: every output).
    requested: Vec<String>,
}

/// Decodes a KServe request body: JSON, then its binary tensor data if any.
fn decode_infer(spec: &ModelSpec, headers: &HeaderMap, bytes: &[u8]) -> Result<Decoded> {
    let json_len = match headers.get(JSON_LENGTH) {
        None => bytes.len(),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&l| l <= bytes.len())
            .ok_or_else(|| {
                ServeError::bad(format!(
                    "header Inference-Header-Content-Length is {v:?}; it must be the length of \
                     the JSON at the start of the {}-byte body",
                    bytes.len()
                ))
            })?,
    };
    let (json_part, binary) = bytes.split_at(json_len);
    let req: InferRequest = match fastjson::parse_infer(json_part) {
        Some(r) => r,
        None => serde_json::from_slice(json_part)
            .map_err(|e| ServeError::bad(format!("malformed inference request JSON: {e}")))?,
    };
    Ok(Decoded {
        timeout: kjson::timeout_us(&req)?,
        samples: kjson::decode_with_binary(spec, &req, binary)?,
        binary_out: kjson::binary_output(&req),
        requested: req
            .outputs
            .iter()
            .flatten()
            .map(|o| o.name.to_string())
            .collect(),
        id: req.id,
    })
}

#[derive(Debug, Deserialize)]
struct ScoreQuery {
    /// Whether TSV lines start with the label column (default true).
    labels: Option<bool>,
    /// A deadline, in milliseconds from arrival.
    timeout_ms: Option<u64>,
    /// The model to score with (needed when the server serves more than one).
    model: Option<String>,
}

async fn score_route(
    State(app): State<App>,
    Query(q): Query<ScoreQuery>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let t = Tracked::new("http");
    let r = match app.repo.get_default(q.model.as_deref()) {
        Ok(served) => {
            let r = score_on(&app, &served, &q, &headers, body).await;
            // Counted per model as KServe's requests are (a request naming no model is not).
            served.count_request(r.as_ref().err());
            r
        }
        Err(e) => Err(e),
    };
    finish(t, r)
}

/// `/v1/score` on the model `served`: the body decoded, scored, written as text or JSON.
async fn score_on(
    app: &App,
    served: &Served,
    q: &ScoreQuery,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response> {
    let timeout = q.timeout_ms.map(|ms| ms.saturating_mul(1000));
    // Admitted before its body is read, as in `infer_on`.
    served.batcher.admit(timeout)?;
    let bytes = read_body(body, app.max_body_bytes).await?;
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let labels = q.labels.unwrap_or(true);
    let samples = decode_score(&served.spec, headers, &bytes, json, labels)?;
    drop(bytes);
    let scored = served.batcher.submit(samples, timeout).await?;
    let access = crate::access::Access {
        model: served.spec.name.clone(),
        samples: scored.outputs.items(),
    };
    let mut resp = score_response(&served.spec, &scored, json);
    resp.extensions_mut().insert(access);
    Ok(resp)
}

/// The answer to an empty `/v1/score` body.
const EMPTY_SCORE_BODY: &str = concat!(
    "the request body is empty: send Criteo TSV lines (text/tab-separated-values), or ",
    r#"JSON samples ({"dense": [...], "sparse": {...}} or an array of them) with "#,
    "Content-Type: application/json"
);

/// Decodes a `/v1/score` body: JSON samples when it came as `json`, else Criteo TSV lines
/// (`labels`: whether they start with the label column). A body that looks like JSON but did
/// not come as JSON is refused, naming its Content-Type.
fn decode_score(
    spec: &ModelSpec,
    headers: &HeaderMap,
    bytes: &[u8],
    json: bool,
    labels: bool,
) -> Result<Request> {
    if bytes.trim_ascii().is_empty() {
        return Err(ServeError::bad(EMPTY_SCORE_BODY));
    }
    if json {
        return v1::decode_json_any(spec, bytes);
    }
    if matches!(bytes.trim_ascii_start().first(), Some(b'{' | b'[')) {
        // Criteo TSV lines start with a label or a number, never a bracket.
        let ctype = headers
            .get(header::CONTENT_TYPE)
            .map_or("no Content-Type".into(), |v| {
                format!("Content-Type {}", String::from_utf8_lossy(v.as_bytes()))
            });
        return Err(ServeError::bad(format!(
            "the body looks like JSON, but it came with {ctype}, so it would be read as \
             Criteo TSV: send it with the header Content-Type: application/json"
        )));
    }
    v1::decode_tsv(spec, bytes, labels)
}

/// `/v1/score`'s answer: `{"scores": [...]}` to a JSON request, else one score per line. A
/// model of several outputs answers JSON `{"scores": [{"<output>": value, ...} per item]}`
/// (a multi-task graph model), and one of a run of values per item `{"scores":
/// [{"<output>": [...], ...} per item]}` (an HSTU model's candidates).
fn score_response(spec: &ModelSpec, reply: &crate::Reply, json: bool) -> Response {
    let sig = &spec.signature;
    if sig.outputs.len() != 1 || sig.offsets.is_some() {
        let o = &reply.outputs;
        let offsets = o.offsets();
        let items: Vec<serde_json::Value> = offsets
            .windows(2)
            .map(|w| {
                let (a, b) = (w[0] as usize, w[1] as usize);
                let m: serde_json::Map<String, serde_json::Value> = sig
                    .outputs
                    .iter()
                    .zip(&o.values)
                    .map(|(name, v)| {
                        let value = match sig.offsets {
                            Some(_) => json!(&v[a..b]),
                            None => json!(v[a]),
                        };
                        (name.clone(), value)
                    })
                    .collect();
                serde_json::Value::Object(m)
            })
            .collect();
        return axum::Json(json!({ "scores": items })).into_response();
    }
    let scores = reply.scores();
    if json {
        return axum::Json(json!({ "scores": scores })).into_response();
    }
    let mut text = String::with_capacity(scores.len() * 12);
    for s in scores {
        text.push_str(&s.to_string());
        text.push('\n');
    }
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
}

async fn metrics_page(State(app): State<App>) -> Response {
    metrics::gauge!(m::INFLIGHT_BYTES).set(app.budget.used() as f64);
    let remote: Vec<_> = app
        .repo
        .served()
        .into_iter()
        .filter(|s| s.spec.servable().tier().has_remote())
        .collect();
    if !remote.is_empty() {
        // Off the async workers: it may wait for a batch's fetch to release the tier.
        let _ = tokio::task::spawn_blocking(move || {
            for s in remote {
                m::record_store(s.name(), s.spec.servable().tier());
            }
        })
        .await;
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        m::handle().render(),
    )
        .into_response()
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let allowed = match uri.path() {
        p if p.ends_with("/infer") || p == "/v1/score" || p.starts_with("/v2/repository") => "POST",
        _ => "GET",
    };
    let e = ServeError::MethodNotAllowed(format!(
        "{method} is not allowed on {}: use {allowed}",
        uri.path()
    ));
    ([(header::ALLOW, allowed)], e).into_response()
}

/// The routes of `--metrics-addr`'s listener: `/metrics` alone.
pub fn metrics_router(app: App) -> Router {
    Router::new()
        .route("/metrics", get(metrics_page))
        .fallback(|| async {
            ServeError::NotFound("this address serves GET /metrics only".into()).into_response()
        })
        .with_state(app)
}

async fn metrics_elsewhere() -> Response {
    ServeError::NotFound(
        "/metrics is served on its own address on this server (--metrics-addr)".into(),
    )
    .into_response()
}

async fn not_found() -> Response {
    ServeError::NotFound(
        "no such route: see GET /v2/models/<name> for the model's inputs; routes are /v2/..., \
         /v1/score and /metrics"
            .into(),
    )
    .into_response()
}
