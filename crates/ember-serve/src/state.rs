//! What the HTTP and gRPC handlers share: the served model's spec, the batcher, whether the
//! server is ready, the request size limit and the in-flight byte budget.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::batcher::Batcher;
use crate::conn::Budget;
use crate::error::Result;
use crate::kserve;
use crate::spec::ModelSpec;

/// The server's shared state (cloned into every handler).
#[derive(Debug, Clone)]
pub struct App {
    pub spec: Arc<ModelSpec>,
    pub batcher: Arc<Batcher>,
    pub ready: Arc<AtomicBool>,
    pub max_body_bytes: usize,
    /// Bytes of request bodies in flight, across connections.
    pub(crate) budget: Arc<Budget>,
}

impl App {
    /// Whether the server takes requests: false once it is stopping, and while a store the
    /// model reads rows from (a Redis Cluster) does not answer.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed) && self.spec.model().stager().store_healthy()
    }

    /// Checks that a request addresses the served model (and its one version, when it names
    /// one: `""` names none).
    pub fn check_model(&self, name: &str, version: &str) -> Result<()> {
        kserve::check_model(&self.spec, name, version)
    }
}
