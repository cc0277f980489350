//! The HTTP front end: KServe v2 routes, `/v1/score`, `/metrics`.

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;

use crate::error::{Result, ServeError};
use crate::kserve::json::{InferRequest, InferResponse, OutputTensor};
use crate::kserve::{self, fastjson, json as kjson};
use crate::metrics::{self as m, Tracked};
use crate::state::App;
use crate::v1;

/// The server's routes.
pub fn router(app: App) -> Router {
    Router::new()
        .route("/v2/health/live", get(live))
        .route("/v2/health/ready", get(ready))
        .route("/v2", get(server_metadata))
        .route("/v2/models/{name}", get(model_metadata))
        .route("/v2/models/{name}/ready", get(model_ready))
        .route("/v2/models/{name}/infer", post(infer))
        .route(
            "/v2/models/{name}/versions/{version}/infer",
            post(infer_version),
        )
        .route("/v1/score", post(score_route))
        .route("/metrics", get(metrics_page))
        .fallback(not_found)
        // Bodies are read by `read_body`, which answers 400 naming the limit.
        .layer(DefaultBodyLimit::disable())
        .with_state(app)
}

/// Counts the request, times it, and turns errors into JSON bodies.
fn finish(t: Tracked, r: Result<Response>) -> Response {
    t.finish(r.as_ref().err());
    r.unwrap_or_else(IntoResponse::into_response)
}

async fn read_body(body: Body, limit: usize) -> Result<axum::body::Bytes> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        ServeError::bad(format!(
            "request body is over the server's limit of {limit} bytes (--max-body-bytes), or \
             could not be read: {e}"
        ))
    })
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
        "extensions": [],
    }))
    .into_response()
}

async fn model_metadata(State(app): State<App>, Path(name): Path<String>) -> Response {
    match app.check_model(&name, "") {
        Ok(()) => axum::Json(kserve::metadata(&app.spec)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn model_ready(State(app): State<App>, Path(name): Path<String>) -> Response {
    match app.check_model(&name, "") {
        Ok(()) => axum::Json(json!({ "name": name, "ready": app.is_ready() })).into_response(),
        Err(e) => e.into_response(),
    }
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
    app.check_model(name, version.unwrap_or(""))?;
    let bytes = read_body(body, app.max_body_bytes).await?;
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
    let timeout = kjson::timeout_us(&req)?;
    let samples = kjson::decode_with_binary(&app.spec, &req, binary)?;
    let n = samples.len();
    let binary_out = kjson::binary_output(&req);
    let scored = app.batcher.submit(samples, timeout).await?;
    let mut resp = InferResponse {
        model_name: app.spec.name.clone(),
        model_version: kserve::VERSION.into(),
        id: req.id,
        outputs: vec![OutputTensor {
            name: kserve::SCORES.into(),
            datatype: "FP32",
            shape: vec![n],
            parameters: None,
            data: None,
        }],
    };
    if !binary_out {
        resp.outputs[0].data = Some(scored.scores);
        return Ok(axum::Json(resp).into_response());
    }
    resp.outputs[0].parameters = Some(json!({ "binary_data_size": 4 * n }));
    let mut out = serde_json::to_vec(&resp)
        .map_err(|e| ServeError::Internal(format!("encoding the response: {e}")))?;
    let header_len = out.len();
    out.reserve(4 * n);
    for s in &scored.scores {
        out.extend_from_slice(&s.to_le_bytes());
    }
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (
                header::HeaderName::from_static(JSON_LENGTH),
                header_len.to_string(),
            ),
        ],
        out,
    )
        .into_response())
}

#[derive(Debug, Deserialize)]
struct ScoreQuery {
    /// Whether TSV lines start with the label column (default true).
    labels: Option<bool>,
    /// A deadline, in milliseconds from arrival.
    timeout_ms: Option<u64>,
}

async fn score_route(
    State(app): State<App>,
    Query(q): Query<ScoreQuery>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let t = Tracked::new("http");
    let r = async {
        let bytes = read_body(body, app.max_body_bytes).await?;
        let json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        let samples = if json {
            v1::decode_json(&app.spec, &bytes)?
        } else {
            v1::decode_tsv(&app.spec, &bytes, q.labels.unwrap_or(true))?
        };
        let timeout = q.timeout_ms.map(|ms| ms.saturating_mul(1000));
        let scored = app.batcher.submit(samples, timeout).await?;
        Ok(if json {
            axum::Json(json!({ "scores": scored.scores })).into_response()
        } else {
            let mut text = String::with_capacity(scored.scores.len() * 12);
            for s in &scored.scores {
                text.push_str(&s.to_string());
                text.push('\n');
            }
            ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
        })
    }
    .await;
    finish(t, r)
}

async fn metrics_page() -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        m::handle().render(),
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
