//! The server's errors and the HTTP status each maps to.

use axum::http::StatusCode;

/// Why a request was not answered with scores.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ServeError {
    /// The request is malformed or does not fit the model (400 / INVALID_ARGUMENT).
    #[error("{0}")]
    BadRequest(String),
    /// No such model or route (404 / NOT_FOUND).
    #[error("{0}")]
    NotFound(String),
    /// The batching queue is full (503 / RESOURCE_EXHAUSTED); retry later.
    #[error("the server is at capacity: {0} requests are queued; retry later")]
    Overloaded(usize),
    /// The request's deadline passed before it was scored (504 / DEADLINE_EXCEEDED).
    #[error("the request's deadline of {0} us passed before it was scored")]
    DeadlineExceeded(u64),
    /// The server is shutting down (503 / UNAVAILABLE).
    #[error("the server is shutting down")]
    ShuttingDown,
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
            ServeError::Overloaded(_) | ServeError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            ServeError::DeadlineExceeded(_) => StatusCode::GATEWAY_TIMEOUT,
            ServeError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The label of the `status` dimension of `ember_requests_total`.
    pub fn label(&self) -> &'static str {
        match self {
            ServeError::BadRequest(_) => "invalid_argument",
            ServeError::NotFound(_) => "not_found",
            ServeError::Overloaded(_) => "resource_exhausted",
            ServeError::DeadlineExceeded(_) => "deadline_exceeded",
            ServeError::ShuttingDown => "unavailable",
            ServeError::Internal(_) => "internal",
        }
    }
}

/// `Result` with [`ServeError`].
pub type Result<T> = std::result::Result<T, ServeError>;
