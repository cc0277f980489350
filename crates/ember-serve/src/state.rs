//! What the HTTP and gRPC handlers share: the served models, whether the server is ready, the
//! request size limit and the in-flight byte budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::conn::Budget;
use crate::error::{Result, ServeError};
use crate::repo::{Repository, Served};

/// The server's shared state (cloned into every handler).
#[derive(Debug, Clone)]
pub struct App {
    pub repo: Arc<Repository>,
    pub ready: Arc<AtomicBool>,
    pub max_body_bytes: usize,
    /// Bytes of request bodies in flight, across connections.
    pub(crate) budget: Arc<Budget>,
    /// Whether clients may load and unload models.
    pub model_control: crate::ModelControl,
}

impl App {
    /// Whether the server takes requests: false once it is stopping, and while a store a served
    /// model reads rows from (a Redis Cluster) does not answer.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed) && self.repo.served().iter().all(|s| s.is_ready())
    }

    /// The version a request for model `name` runs on (`version` `""`: the served one), held
    /// by the request until it is answered.
    pub fn model(&self, name: &str, version: &str) -> Result<Arc<Served>> {
        self.repo.get(name, version)
    }

    /// Whether a model's version takes requests now: false while it loads, while the server
    /// stops or its store does not answer; an error for a model or version it does not know.
    pub fn model_ready(&self, name: &str, version: &str) -> Result<bool> {
        match self.model(name, version) {
            Ok(s) => Ok(self.ready.load(Ordering::Relaxed) && s.is_ready()),
            Err(ServeError::Unavailable(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Runs `f` on the repository off the async workers (a load reads and copies a model).
    /// Whether a client may `what` (load or unload) a model with these request `parameters`
    /// (their names): a 403 unless the server runs with `--model-control explicit`, a 400
    /// naming any parameter (Triton's `config` and `file:` overrides load a model Ember's
    /// repository does not hold; taking them silently would load something else than asked).
    pub fn may_control(&self, what: &str, parameters: &[String]) -> Result<()> {
        if self.model_control != crate::ModelControl::Explicit {
            return Err(ServeError::Forbidden(format!(
                "model control is off on this server: {what} needs `ember serve --model-control \
                 explicit` (repository polling, `--poll-secs`, loads and unloads versions without it)"
            )));
        }
        if !parameters.is_empty() {
            let mut names = parameters.to_vec();
            names.sort();
            return Err(ServeError::bad(format!(
                "{what}: parameters {} are not supported (Ember loads the newest version in the \
                 model's repository directory; Triton's `config` and `file:` overrides are not \
                 taken)",
                names.join(", ")
            )));
        }
        Ok(())
    }

    pub async fn on_repository<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Repository) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let repo = self.repo.clone();
        tokio::task::spawn_blocking(move || f(&repo))
            .await
            .map_err(|e| ServeError::Internal(format!("the repository task failed: {e}")))?
    }
}
