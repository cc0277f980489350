//! The access log: one event per request on the target [`TARGET`] (level info), with the
//! protocol, the route (HTTP method and path, or the gRPC method), the model and the samples
//! scored (for inference routes), the status (HTTP status, or gRPC code) and the latency. Off
//! unless the subscriber enables the target (`ember serve --access-log`); when it is off a
//! request pays one check of the callsite's interest.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use std::time::Instant;

/// The target of the access log's events.
pub const TARGET: &str = "ember_access";

/// What an inference route tells the log: set as an extension of its response.
#[derive(Debug, Clone)]
pub(crate) struct Access {
    pub model: String,
    pub samples: usize,
}

/// Logs an HTTP request.
pub(crate) async fn http(req: Request, next: Next) -> Response {
    log("http", req, next).await
}

/// Logs a gRPC call.
pub(crate) async fn grpc(req: Request, next: Next) -> Response {
    log("grpc", req, next).await
}

async fn log(protocol: &'static str, req: Request, next: Next) -> Response {
    if !tracing::enabled!(target: TARGET, tracing::Level::INFO) {
        return next.run(req).await;
    }
    let route = match protocol {
        "grpc" => req
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string(),
        _ => format!("{} {}", req.method(), req.uri().path()),
    };
    let start = Instant::now();
    let r = next.run(req).await;
    let latency_ms = start.elapsed().as_secs_f64() * 1e3;
    let status = match protocol {
        // A call that failed answers its code in the headers (trailers-only); one that
        // succeeded, in trailers after the message: absent here, so 0 (OK).
        "grpc" => r
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0u16),
        _ => r.status().as_u16(),
    };
    let (model, samples) = match r.extensions().get::<Access>() {
        Some(a) => (a.model.as_str(), a.samples),
        None => ("", 0),
    };
    tracing::info!(
        target: TARGET,
        protocol,
        route,
        model,
        status,
        samples,
        latency_ms = (latency_ms * 1e3).round() / 1e3,
    );
    r
}
