//! Ember's inference server: the KServe v2 (Triton) inference protocol over HTTP, a `/v1/score`
//! route for TSV or JSON samples, dynamic batching in front of one [`ember_model::Predictor`],
//! Prometheus metrics, and a graceful stop.
//!
//! ```no_run
//! # async fn run(model: std::sync::Arc<ember_model::Model>) -> std::io::Result<()> {
//! let server = ember_serve::Server::start(model, ember_serve::ServeConfig::default()).await?;
//! println!("serving on http://{}", server.addr());
//! ember_serve::shutdown_signal().await;
//! server.shutdown().await;
//! # Ok(())
//! # }
//! ```

pub mod batcher;
pub mod error;
pub mod http;
pub mod kserve;
pub mod metrics;
pub mod samples;
pub mod score;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ember_model::{Model, Predictor};
use tokio::sync::oneshot;

pub use batcher::{BatchConfig, Batcher};
pub use error::ServeError;
pub use samples::{ModelSpec, Samples};

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Address of the HTTP listener (port 0 picks a free port).
    pub http: SocketAddr,
    /// The name clients address the model by.
    pub model_name: String,
    /// Threads of the model's forward pass.
    pub threads: usize,
    pub batch: BatchConfig,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            http: SocketAddr::from(([127, 0, 0, 1], 8080)),
            model_name: "default".into(),
            threads: 1,
            batch: BatchConfig::default(),
            max_body_bytes: 16 << 20,
        }
    }
}

/// A running server.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    batcher: Arc<Batcher>,
    ready: Arc<AtomicBool>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// Binds the listener and starts serving `model` (call inside a tokio runtime).
    pub async fn start(model: Arc<Model>, cfg: ServeConfig) -> std::io::Result<Server> {
        metrics::handle();
        let spec = Arc::new(ModelSpec::of(&model, &cfg.model_name));
        let predictor = Predictor::new(model, cfg.threads.max(1))
            .map_err(|e| std::io::Error::other(format!("building the predictor: {e}")))?;
        let listener = tokio::net::TcpListener::bind(cfg.http).await?;
        let addr = listener.local_addr()?;
        let batcher = Arc::new(Batcher::start(predictor, spec.clone(), cfg.batch));
        let ready = Arc::new(AtomicBool::new(true));
        let app = http::App {
            spec,
            batcher: batcher.clone(),
            ready: ready.clone(),
            max_body_bytes: cfg.max_body_bytes,
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let router = http::router(app);
        let task = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        Ok(Server {
            addr,
            batcher,
            ready,
            stop: Some(stop),
            task,
        })
    }

    /// The address the HTTP listener is bound to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting connections, finishes the requests in flight and every queued batch, and
    /// returns when all are answered.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        self.ready.store(false, Ordering::Relaxed);
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let served = (&mut self.task)
            .await
            .map_err(|e| std::io::Error::other(format!("the HTTP task failed: {e}")))?;
        let b = self.batcher.clone();
        tokio::task::spawn_blocking(move || b.shutdown())
            .await
            .map_err(|e| std::io::Error::other(format!("stopping the batcher: {e}")))?;
        served
    }
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("install a SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {},
            _ = tokio::signal::ctrl_c() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}
