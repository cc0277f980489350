//! What the HTTP and gRPC handlers share: the served model's spec, the batcher, whether the
//! server is ready, and the request size limit.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::batcher::Batcher;
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
}

impl App {
    /// Whether the server takes requests (false once it is stopping).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Checks that a request addresses the served model (and its one version, when it names
    /// one: `""` names none).
    pub fn check_model(&self, name: &str, version: &str) -> Result<()> {
        kserve::check_model(&self.spec, name, version)
    }
}
