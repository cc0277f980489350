//! How a call fails: [`FailKind`] (for messages and the `kind` label of error metrics),
//! [`Failure`] (what, where, the node's or the socket's words) and [`RedisError`], the one error
//! type of this crate.

use thiserror::Error;

/// Why a call failed, for messages and the `kind` label of error metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailKind {
    /// No connection (refused, reset, unreachable).
    Connect,
    /// No answer within the time given.
    Timeout,
    /// The cluster is failing over or resharding (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, ...)
    /// past the retries.
    Redirect,
    /// The node answered an error that retrying will not fix.
    Server,
    /// A slot no node serves.
    Uncovered,
}

impl FailKind {
    pub fn name(self) -> &'static str {
        match self {
            FailKind::Connect => "connect",
            FailKind::Timeout => "timeout",
            FailKind::Redirect => "redirect",
            FailKind::Server => "server",
            FailKind::Uncovered => "uncovered",
        }
    }
}

/// A failed call: what, where, and the node's or the socket's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub kind: FailKind,
    /// `host:port`, or empty where no node is involved.
    pub node: String,
    pub detail: String,
}

impl Failure {
    pub(crate) fn new(kind: FailKind, node: &str, detail: impl Into<String>) -> Self {
        Failure {
            kind,
            node: node.into(),
            detail: detail.into(),
        }
    }

    /// The error of this failure, naming the store.
    pub fn into_error(self, store: &str) -> RedisError {
        RedisError::Unavailable {
            store: store.into(),
            failure: self,
        }
    }
}

/// Everything that can go wrong with a cluster.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RedisError {
    /// The cluster could not answer in time: a node is down, unreachable, paused, or failing
    /// over (`failure` says which, where and why; it is the cause itself, no error of its own).
    #[error(
        "{store} is unavailable ({kind}{at}): {detail}",
        kind = failure.kind.name(),
        at = if failure.node.is_empty() { String::new() } else { format!(" at {}", failure.node) },
        detail = failure.detail
    )]
    Unavailable { store: String, failure: Failure },
    /// A `redis://` URL that names no cluster.
    #[error("invalid option redis: {reason}")]
    BadUrl { reason: String },
}

/// A result of this crate.
pub type Result<T, E = RedisError> = std::result::Result<T, E>;
