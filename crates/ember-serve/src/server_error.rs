//! Why a server did not start or stop cleanly ([`ServerError`]): the step that failed, with the
//! error it met kept as its source (a model's [`ModelError`] keeps its kind, a socket's
//! `io::Error` its `ErrorKind`). A request's errors are [`crate::ServeError`], not these.

use std::net::SocketAddr;

use ember_model::ModelError;

use crate::ServeError;

/// Why [`crate::Server::start`] (and its siblings) or [`crate::Server::shutdown`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A model's runner (its predictor and threads) could not be made.
    #[error("building the predictor: {0}")]
    Predictor(#[source] ModelError),
    /// There was nothing to serve with: no engine, no runner.
    #[error("no engine to serve with")]
    NoEngine,
    /// The warm-up batches, run before the server listens, failed.
    #[error("warming the model: {0}")]
    Warm(#[source] ModelError),
    /// A model of the repository did not load (the error names each model and file).
    #[error(transparent)]
    Repository(ServeError),
    /// A listener could not be bound (the address is taken, or not this machine's).
    #[error("listening on {addr} ({protocol}): {source}")]
    Listen {
        protocol: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// `--tls-cert`, `--tls-key` or `--tls-client-ca`: a file could not be read or used (the
    /// message names the flag and the file).
    #[error("TLS: {0}")]
    Tls(String),
    /// `--profile-dir`: the profile writer could not start.
    #[error("starting the profile writer: {0}")]
    Profiles(#[source] std::io::Error),
    /// A listener stopped with an error while the server shut down.
    #[error("a listener failed: {0}")]
    Listener(#[source] std::io::Error),
    /// A task of the server (`what` names it) panicked or was cancelled.
    #[error("{what}: the task did not finish: {source}")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

impl ServerError {
    /// A task's [`tokio::task::JoinError`] as the failure of step `what`.
    pub(crate) fn task(what: &'static str) -> impl FnOnce(tokio::task::JoinError) -> Self {
        move |source| ServerError::Task { what, source }
    }
}

/// Why a model version did not load into the repository ([`crate::Loader`] and the steps
/// around it). Its message is the version's status reason and the load request's answer.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Reading the model (its config, weights, tables) failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A loader of the caller's own failed (its error, whatever its type).
    #[error("{0}")]
    Loader(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A runner of the loaded model could not be made.
    #[error("building the predictor: {0}")]
    Predictor(#[source] ModelError),
    /// The warm-up batches failed.
    #[error("warming it up: {0}")]
    Warm(#[source] ModelError),
    /// The loading thread could not start.
    #[error("starting the loading thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The loading thread panicked (a bug).
    #[error("the loading thread panicked")]
    Panicked,
    /// The server began stopping while the version loaded.
    #[error("the server is stopping")]
    Stopping,
}

impl LoadError {
    /// The answer to a load request that failed with this error, saying `message`: a store the
    /// model reads from did not answer (503, as a request it fails would be), the server is
    /// stopping (503), else the model cannot be served (400, as Triton answers a failed load).
    pub(crate) fn answer(&self, message: String) -> ServeError {
        match self {
            LoadError::Model(e) | LoadError::Predictor(e) | LoadError::Warm(e)
                if e.kind() == ember_model::ErrorKind::Unavailable =>
            {
                ServeError::Unavailable(message)
            }
            LoadError::Stopping => ServeError::ShuttingDown,
            _ => ServeError::BadRequest(message),
        }
    }
}

/// `Result` with [`ServerError`].
pub type ServerResult<T> = std::result::Result<T, ServerError>;

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_start_error_keeps_the_kind_of_what_it_met() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let source = std::net::TcpListener::bind(addr).unwrap_err();
        let e = ServerError::Listen {
            protocol: "HTTP",
            addr,
            source,
        };
        let io = e
            .source()
            .unwrap()
            .downcast_ref::<std::io::Error>()
            .unwrap();
        assert_eq!(io.kind(), std::io::ErrorKind::AddrInUse);
        assert!(
            e.to_string()
                .starts_with(&format!("listening on {addr} (HTTP): "))
        );
        let warm = ServerError::Warm(ModelError::Input("sample 0 is empty".into()));
        let model = warm.source().unwrap().downcast_ref::<ModelError>().unwrap();
        assert_eq!(model.kind(), ember_model::ErrorKind::Input);
    }

    #[test]
    fn a_load_that_met_an_unavailable_store_answers_503() {
        let down = || {
            ModelError::store_unavailable("redis://127.0.0.1:1", "connect", "connection refused")
        };
        for e in [
            LoadError::Model(down()),
            LoadError::Predictor(down()),
            LoadError::Warm(down()),
        ] {
            let a = e.answer(format!("m failed to load: {e}"));
            assert_eq!(a.status().as_u16(), 503, "{a}");
            assert!(a.to_string().contains("connection refused"), "{a}");
        }
        let bad = LoadError::Model(ModelError::Input("no tables".into()));
        assert_eq!(bad.answer("m failed".into()).status().as_u16(), 400);
        assert_eq!(
            LoadError::Stopping.answer("m".into()),
            ServeError::ShuttingDown
        );
        assert_eq!(
            LoadError::Panicked.answer("m".into()).status().as_u16(),
            400
        );
    }
}
