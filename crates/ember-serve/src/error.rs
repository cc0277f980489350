//! The server's errors, and the one place they become answers: an HTTP status with a JSON body,
//! a gRPC status code, and the `status` label of `ember_requests_total`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// Why a request was not answered with scores.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ServeError {
    /// The request is malformed or does not fit the model (400 / INVALID_ARGUMENT).
    #[error("{0}")]
    BadRequest(String),
    /// No such model or route (404 / NOT_FOUND).
    #[error("{0}")]
    NotFound(String),
    /// The route is off on this server (403 / PERMISSION_DENIED): model control without
    /// `--model-control explicit`. The message says how to turn it on.
    #[error("{0}")]
    Forbidden(String),
    /// The route exists but not for this method (405 / UNIMPLEMENTED).
    #[error("{0}")]
    MethodNotAllowed(String),
    /// The request body arrived too slowly (408, and the connection closes / DEADLINE_EXCEEDED).
    #[error("{0}")]
    RequestTimeout(String),
    /// The server is at capacity (503 / RESOURCE_EXHAUSTED): the queue is full, or the request's
    /// expected wait is over its deadline or the queue-delay bound. Says which; retry later.
    #[error("the server is at capacity: {0}; retry later")]
    Overloaded(String),
    /// The request's deadline passed before it was scored (504 / DEADLINE_EXCEEDED).
    #[error("the request's deadline of {0} us passed before it was scored")]
    DeadlineExceeded(u64),
    /// The server is shutting down (503 / UNAVAILABLE).
    #[error("the server is shutting down")]
    ShuttingDown,
    /// A store the model reads rows from did not answer in time (503 / UNAVAILABLE); the message
    /// names it. Retry later (on another replica).
    #[error("{0}")]
    Unavailable(String),
    /// A bug or an unexpected failure of the model (500 / INTERNAL).
    #[error("internal error: {0}")]
    Internal(String),
}

impl ServeError {
    /// A 400 error.
    pub fn bad(msg: impl Into<String>) -> Self {
        ServeError::BadRequest(msg.into())
    }

    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ServeError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ServeError::NotFound(_) => StatusCode::NOT_FOUND,
            ServeError::Forbidden(_) => StatusCode::FORBIDDEN,
            ServeError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ServeError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ServeError::Overloaded(_) | ServeError::ShuttingDown | ServeError::Unavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ServeError::DeadlineExceeded(_) => StatusCode::GATEWAY_TIMEOUT,
            ServeError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The gRPC status code of this error.
    pub fn grpc_code(&self) -> tonic::Code {
        match self {
            ServeError::BadRequest(_) => tonic::Code::InvalidArgument,
            ServeError::NotFound(_) => tonic::Code::NotFound,
            ServeError::Forbidden(_) => tonic::Code::PermissionDenied,
            ServeError::MethodNotAllowed(_) => tonic::Code::Unimplemented,
            ServeError::RequestTimeout(_) => tonic::Code::DeadlineExceeded,
            ServeError::Overloaded(_) => tonic::Code::ResourceExhausted,
            ServeError::DeadlineExceeded(_) => tonic::Code::DeadlineExceeded,
            ServeError::ShuttingDown | ServeError::Unavailable(_) => tonic::Code::Unavailable,
            ServeError::Internal(_) => tonic::Code::Internal,
        }
    }

    /// The label of the `status` dimension of `ember_requests_total`.
    pub fn label(&self) -> &'static str {
        match self {
            ServeError::BadRequest(_) => "invalid_argument",
            ServeError::NotFound(_) => "not_found",
            ServeError::Forbidden(_) => "permission_denied",
            ServeError::MethodNotAllowed(_) => "method_not_allowed",
            ServeError::RequestTimeout(_) => "request_timeout",
            ServeError::Overloaded(_) => "resource_exhausted",
            ServeError::DeadlineExceeded(_) => "deadline_exceeded",
            ServeError::ShuttingDown | ServeError::Unavailable(_) => "unavailable",
            ServeError::Internal(_) => "internal",
        }
    }
}

/// `{"error": "..."}` with the error's status. A body that arrived too slowly also closes the
/// connection (the rest of it is not read).
impl IntoResponse for ServeError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.to_string() });
        let mut resp = (self.status(), axum::Json(body)).into_response();
        if let ServeError::RequestTimeout(_) = self {
            resp.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        resp
    }
}

impl From<ServeError> for tonic::Status {
    fn from(e: ServeError) -> tonic::Status {
        tonic::Status::new(e.grpc_code(), e.to_string())
    }
}

/// A model's refusal of a request: the caller's mistake (a 400 naming the input, the sample and
/// the value) or the model's own failure (a 500).
impl From<ember_model::ModelError> for ServeError {
    fn from(e: ember_model::ModelError) -> ServeError {
        match e.kind() {
            ember_model::ErrorKind::Input => ServeError::BadRequest(e.message()),
            ember_model::ErrorKind::Internal => ServeError::Internal(e.to_string()),
            ember_model::ErrorKind::Unavailable => ServeError::Unavailable(e.to_string()),
        }
    }
}

/// `Result` with [`ServeError`].
pub type Result<T> = std::result::Result<T, ServeError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_maps_alike_over_http_and_grpc() {
        let all = [
            (ServeError::bad("x"), 400, tonic::Code::InvalidArgument),
            (ServeError::NotFound("x".into()), 404, tonic::Code::NotFound),
            (
                ServeError::Forbidden("x".into()),
                403,
                tonic::Code::PermissionDenied,
            ),
            (
                ServeError::MethodNotAllowed("x".into()),
                405,
                tonic::Code::Unimplemented,
            ),
            (
                ServeError::RequestTimeout("x".into()),
                408,
                tonic::Code::DeadlineExceeded,
            ),
            (
                ServeError::Overloaded("3 requests are queued".into()),
                503,
                tonic::Code::ResourceExhausted,
            ),
            (
                ServeError::DeadlineExceeded(5),
                504,
                tonic::Code::DeadlineExceeded,
            ),
            (ServeError::ShuttingDown, 503, tonic::Code::Unavailable),
            (
                ServeError::Unavailable("redis cluster at x is unavailable".into()),
                503,
                tonic::Code::Unavailable,
            ),
            (ServeError::Internal("x".into()), 500, tonic::Code::Internal),
        ];
        for (e, http, grpc) in all {
            assert_eq!(e.status().as_u16(), http, "{e:?}");
            let s = tonic::Status::from(e.clone());
            assert_eq!((s.code(), s.message()), (grpc, e.to_string().as_str()));
            assert_eq!(e.clone().into_response().status().as_u16(), http);
        }
    }

    #[test]
    fn the_model_says_whose_fault_an_error_is() {
        use ember_model::ModelError;
        let input = ServeError::from(ModelError::Input(
            "dense feature 2 of sample 0 is NaN".into(),
        ));
        assert_eq!(
            input,
            ServeError::BadRequest("dense feature 2 of sample 0 is NaN".into())
        );
        let device = ServeError::from(ModelError::Device {
            device: "cuda:0".into(),
            source: "launch failed".into(),
        });
        assert_eq!(device, ServeError::Internal("cuda:0: launch failed".into()));
        assert_eq!(device.status().as_u16(), 500);
    }
}
