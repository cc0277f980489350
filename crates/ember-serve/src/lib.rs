//! Ember's inference server: the KServe v2 (Triton) inference protocol over HTTP and gRPC, a
//! `/v1/score` route for TSV or JSON samples (or a family's own JSON items), dynamic batching in
//! front of each served model's [`ember_model::serving::Runner`] (a CPU predictor, or a GPU's),
//! a model repository
//! whose versions load and swap while it serves, Prometheus metrics, and a graceful stop.
//!
//! | file | what |
//! |---|---|
//! | `http.rs` | the HTTP routes (KServe v2, `/v1/score`, `/metrics`) |
//! | `grpc.rs` | KServe v2 / Triton's `GRPCInferenceService` |
//! | `kserve/` | the protocol core (`mod.rs`), its JSON form (`json.rs`) and fast path (`fastjson.rs`) |
//! | `v1/` | `/v1/score`'s TSV and JSON decoders |
//! | `spec.rs` | what a request must match, and its one check against the model |
//! | `batcher.rs` | the queue and the batching loop: form -> prepare -> run -> answer |
//! | `repo/` | the served models and versions: load, warm, swap, retire; the repository API and poller |
//! | `state.rs` | what the handlers share |
//! | `error.rs` | errors, and their HTTP / gRPC statuses and metric labels |
//! | `metrics.rs` | Prometheus names and the request tracker |
//!
//! It sees the model only through `ember-model`'s family-neutral seam,
//! [`ember_model::serving`]: a [`ember_model::serving::Servable`] declares its inputs, outputs
//! and stages ([`ember_model::serving::Signature`]), checks requests, merges and stages batches
//! and tells the tier's counters and its remote store's health; a
//! [`ember_model::serving::Runner`] runs the batches. It names no model family. Of the
//! embedding stage's types it names only the seam's input columns, [`ember_model::Ids`] and
//! [`ember_model::Lengths`] (`crates/ember-cli/tests/it/architecture.rs` checks it).
//!
//! ```no_run
//! # async fn run(model: std::sync::Arc<ember_model::Model>) -> ember_serve::ServerResult<()> {
//! let server = ember_serve::Server::start(model, ember_serve::ServeConfig::default()).await?;
//! println!("serving on http://{}", server.addr());
//! ember_serve::shutdown_signal().await;
//! server.shutdown().await?;
//! # Ok(())
//! # }
//! ```

pub mod access;
mod batcher;
mod conn;
mod error;
pub mod grpc;
mod http;
pub mod kserve;
mod metrics;
mod profile;
mod proto;
pub mod repo;
pub mod restrict;
mod server_error;
mod spec;
mod state;
pub mod tls;
mod triton;
pub mod v1;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ember_model::serving::{EngineRunner, Runner, Servable};
use ember_model::{Engine, Model, Predictor};
use tokio::sync::watch;

pub use batcher::{BatchConfig, Batcher, Reply};
pub use conn::{ConnConfig, OverBudget, SlowBody};
pub use error::ServeError;
pub use profile::ProfileConfig;
pub use repo::{
    DiskLoader, IndexEntry, Loader, RegistryFollow, Repository, RepositoryConfig, Served,
};
pub use restrict::Restrictions;
pub use server_error::{LoadError, ServerError, ServerResult};
pub use spec::ModelSpec;
pub use state::App;
pub use tls::TlsConfig;

/// Installs the server's metrics recorder (once per process; later calls do nothing). A model
/// registers the handles it records into when it is built, and a handle registered before the
/// recorder counts nothing: a program that builds its models before it starts the server
/// calls this first. The `Server::start*` functions call it too.
pub fn install_metrics() {
    metrics::handle();
}

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Address of the HTTP listener (port 0 picks a free port).
    pub http: SocketAddr,
    /// Address of the gRPC listener, if any (port 0 picks a free port).
    pub grpc: Option<SocketAddr>,
    /// The name clients address the model by.
    pub model_name: String,
    /// Threads of the model's forward pass.
    pub threads: usize,
    pub batch: BatchConfig,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// Connection timeouts, the connection cap, the stop's grace period.
    pub conn: ConnConfig,
    /// Record the served models' lookups as layout profiles (`--profile-dir`).
    pub profile: Option<ProfileConfig>,
    /// Whether clients may load and unload models (`--model-control`): off unless asked for.
    pub model_control: ModelControl,
    /// TLS on every listener (`--tls-cert`, `--tls-key`, `--tls-client-ca`); `None`: plain TCP.
    pub tls: Option<TlsConfig>,
    /// API groups restricted to requests carrying a header, on every listener
    /// (`--restricted-api`).
    pub restricted: Restrictions,
    /// Serve `/metrics` on this address alone (`--metrics-addr`); `None`: on the HTTP listener.
    pub metrics: Option<SocketAddr>,
}

/// Who loads and unloads a repository's models: the server alone (its repository polling, if
/// on), or also any client that reaches the port (`POST /v2/repository/models/NAME/load` and
/// `unload`, and their gRPC methods), as Triton's `--model-control-mode none` / `explicit`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ModelControl {
    /// Load and unload requests answer 403 / PERMISSION_DENIED, saying how to turn them on.
    #[default]
    None,
    /// Clients may load and unload models.
    Explicit,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            http: SocketAddr::from(([127, 0, 0, 1], 8080)),
            grpc: None,
            model_name: "default".into(),
            threads: 1,
            batch: BatchConfig::default(),
            max_body_bytes: 16 << 20,
            conn: ConnConfig::default(),
            profile: None,
            model_control: ModelControl::None,
            tls: None,
            restricted: Restrictions::default(),
            metrics: None,
        }
    }
}

/// A running server.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    grpc_addr: Option<SocketAddr>,
    metrics_addr: Option<SocketAddr>,
    repo: Arc<Repository>,
    ready: Arc<AtomicBool>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<std::io::Result<()>>>,
    open_conns: Arc<conn::OpenConns>,
    grace: std::time::Duration,
    profile: Option<profile::ProfileWriter>,
}

/// Asks the remote store of each served model whether it answers every second, so that
/// readiness follows it while no request does (a failed batch marks it down at once; this brings
/// it back). Stops with the server.
fn spawn_store_probe(repo: std::sync::Weak<Repository>, ready: Arc<AtomicBool>) {
    let spawned = std::thread::Builder::new()
        .name("ember-store-probe".into())
        .spawn(move || {
            while ready.load(Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_secs(1));
                let Some(repo) = repo.upgrade() else { return };
                for s in repo.served() {
                    let tier = s.spec.servable().tier();
                    if tier.has_remote() {
                        let _ = tier.probe_store();
                        metrics::record_store(s.name(), tier);
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("could not start the store probe ({e}); readiness follows requests only");
    }
}

/// A listener for `protocol` bound to `addr`, and the address it got (the port where `addr`
/// asked for any).
fn listen(
    protocol: &'static str,
    addr: SocketAddr,
) -> ServerResult<(tokio::net::TcpListener, SocketAddr)> {
    let failed = |source| ServerError::Listen {
        protocol,
        addr,
        source,
    };
    let l = conn::listen(addr).map_err(failed)?;
    let bound = l.local_addr().map_err(failed)?;
    Ok((l, bound))
}

impl Server {
    /// Binds the listeners and starts serving `model` on the CPU with `cfg.threads` threads
    /// (call inside a tokio runtime).
    pub async fn start(model: Arc<Model>, cfg: ServeConfig) -> ServerResult<Server> {
        let mut engines: Vec<Box<dyn Engine>> = Vec::new();
        for _ in 0..cfg.batch.instances.max(1) {
            let predictor = Predictor::new(model.clone(), cfg.threads.max(1))
                .map_err(ServerError::Predictor)?;
            engines.push(Box::new(predictor));
        }
        Self::start_engines(engines, cfg).await
    }

    /// [`Server::start`] with the batches run by `engine` (a CPU predictor with a sharding plan,
    /// a GPU predictor).
    pub async fn start_engine(engine: Box<dyn Engine>, cfg: ServeConfig) -> ServerResult<Server> {
        Self::start_engines(vec![engine], cfg).await
    }

    /// [`Server::start_engine`] with one engine per model instance (`cfg.batch.instances` is
    /// their count): batches run side by side, one per instance.
    pub async fn start_engines(
        engines: Vec<Box<dyn Engine>>,
        cfg: ServeConfig,
    ) -> ServerResult<Server> {
        let runners = engines
            .into_iter()
            .map(|e| Box::new(EngineRunner::new(e)) as Box<dyn Runner>)
            .collect();
        Self::start_runners(runners, cfg).await
    }

    /// Serves a model of any family on the CPU with `cfg.threads` threads, one runner per
    /// model instance.
    pub async fn start_servable(
        model: Arc<dyn Servable>,
        cfg: ServeConfig,
    ) -> ServerResult<Server> {
        let mut runners = Vec::new();
        for _ in 0..cfg.batch.instances.max(1) {
            let r = model
                .clone()
                .cpu_runner(cfg.threads.max(1))
                .map_err(ServerError::Predictor)?;
            runners.push(r);
        }
        Self::start_runners(runners, cfg).await
    }

    /// [`Server::start_engines`] for runners of a model of any family.
    pub async fn start_runners(
        engines: Vec<Box<dyn Runner>>,
        cfg: ServeConfig,
    ) -> ServerResult<Server> {
        if engines.is_empty() {
            return Err(ServerError::NoEngine);
        }
        // The recorder first: a served model registers its counters when it is made, and a
        // counter registered before the recorder counts nothing.
        metrics::handle();
        // Warmed before it serves, as a repository's versions are: the first requests meet a
        // model whose pages are in and an admission model that knows its speed.
        let batch = cfg.batch;
        let (engines, took) = tokio::task::spawn_blocking(move || {
            let mut engines = engines;
            let took = repo::warm_all(&mut engines, &batch, repo::WARM_BATCHES)?;
            Ok::<_, ember_model::ModelError>((engines, took))
        })
        .await
        .map_err(ServerError::task("warming the model"))?
        .map_err(ServerError::Warm)?;
        let repo = Repository::single(&cfg.model_name, engines, cfg.batch);
        for s in repo.served() {
            s.batcher.prime(&took);
        }
        Self::serve(Arc::new(repo), cfg).await
    }

    /// Serves the newest version of every model under `source.root` (Triton's layout,
    /// `ROOT/<name>/<version>/`), each with its own batcher; with `source.poll`, new versions
    /// found on disk load and swap in while it serves. Fails, naming each model and file, when a
    /// model does not load. `cfg.model_name` is not used.
    pub async fn start_repository(
        source: RepositoryConfig,
        cfg: ServeConfig,
    ) -> ServerResult<Server> {
        let poll = source.poll;
        let follows_registry = source.registry.is_some();
        metrics::handle(); // before any model registers its counters (see start_engines)
        let repo = Arc::new(Repository::open(source, cfg.batch));
        let r = repo.clone();
        tokio::task::spawn_blocking(move || r.load_all())
            .await
            .map_err(ServerError::task("loading the repository"))?
            .map_err(ServerError::Repository)?;
        match (poll, follows_registry) {
            (Some(every), true) => repo::spawn_registry_follower(&repo, every),
            (Some(every), false) => repo::spawn_poller(&repo, every),
            (None, _) => {}
        }
        Self::serve(repo, cfg).await
    }

    async fn serve(repo: Arc<Repository>, cfg: ServeConfig) -> ServerResult<Server> {
        metrics::handle();
        // The connection cap, not the OS, decides when connections are refused.
        let fd_limit = conn::raise_fd_limit();
        let open_conns = Arc::new(conn::OpenConns::new(conn::connection_cap(
            cfg.conn.max_connections,
            fd_limit,
        )));
        let (listener, addr) = listen("HTTP", cfg.http)?;
        let (grpc_listener, grpc_addr) = match cfg.grpc {
            Some(a) => {
                let (l, bound) = listen("gRPC", a)?;
                (Some(l), Some(bound))
            }
            None => (None, None),
        };
        let (metrics_listener, metrics_addr) = match cfg.metrics {
            Some(a) => {
                let (l, bound) = listen("metrics", a)?;
                (Some(l), Some(bound))
            }
            None => (None, None),
        };
        let (http_tls, grpc_tls) = match &cfg.tls {
            Some(t) => t.server_configs().map(|(h, g)| (Some(h), Some(g)))?,
            None => (None, None),
        };
        let ready = Arc::new(AtomicBool::new(true));
        let budget = Arc::new(conn::Budget::new(cfg.conn.max_inflight_bytes));
        let app = App {
            repo: repo.clone(),
            ready: ready.clone(),
            max_body_bytes: cfg.max_body_bytes,
            budget: budget.clone(),
            model_control: cfg.model_control,
        };
        let (stop, stopped) = watch::channel(false);
        spawn_store_probe(Arc::downgrade(&repo), ready.clone());
        let profile = match cfg.profile.clone() {
            Some(p) => Some(profile::start(&repo, p).map_err(ServerError::Profiles)?),
            None => None,
        };
        let conn_cfg = Arc::new(cfg.conn.clone());
        let restricted = Arc::new(cfg.restricted.clone());
        let http = conn::Listener {
            router: http::router(app.clone(), metrics_listener.is_none()),
            cfg: conn_cfg.clone(),
            open_conns: open_conns.clone(),
            max_body_bytes: Some(cfg.max_body_bytes),
            budget: budget.clone(),
            grpc: false,
            tls: http_tls.clone(),
            restricted: restricted.clone(),
        };
        let mut tasks = vec![http.clone().spawn(listener, stopped.clone())];
        if let Some(l) = metrics_listener {
            let metrics = conn::Listener {
                router: http::metrics_router(app.clone()),
                ..http
            };
            tasks.push(metrics.spawn(l, stopped.clone()));
        }
        if let Some(l) = grpc_listener {
            let grpc = conn::Listener {
                router: grpc::router(app),
                cfg: conn_cfg,
                open_conns: open_conns.clone(),
                max_body_bytes: None,
                budget,
                grpc: true,
                tls: grpc_tls,
                restricted,
            };
            tasks.push(grpc.spawn(l, stopped));
        }
        Ok(Server {
            addr,
            grpc_addr,
            metrics_addr,
            repo,
            ready,
            stop,
            tasks,
            open_conns,
            grace: cfg.conn.shutdown_grace,
            profile,
        })
    }

    /// The served models.
    pub fn repository(&self) -> &Arc<Repository> {
        &self.repo
    }

    /// The address the HTTP listener is bound to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address the gRPC listener is bound to, if there is one.
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.grpc_addr
    }

    /// The address of the metrics listener, if `/metrics` has one of its own.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The most connections it holds open (the configured cap within the descriptors the
    /// process has).
    pub fn connection_cap(&self) -> usize {
        self.open_conns.cap()
    }

    /// Stops: refuses new connections, closes idle ones and those still sending a request,
    /// answers every request already received (queued ones included), and returns when all are
    /// answered or the grace period has run out (what is left then is dropped).
    pub async fn shutdown(self) -> ServerResult<()> {
        let end = std::time::Instant::now() + self.grace;
        self.ready.store(false, Ordering::Relaxed);
        let _ = self.stop.send(true);
        let mut result = Ok(());
        for t in self.tasks {
            let r = t
                .await
                .map_err(ServerError::task("a listener"))
                .and_then(|r| r.map_err(ServerError::Listener));
            if result.is_ok() {
                result = r;
            }
        }
        self.open_conns.stop_all();
        self.open_conns.drain(self.grace).await;
        let repo = self.repo.clone();
        tokio::task::spawn_blocking(move || repo.shutdown_by(end))
            .await
            .map_err(ServerError::task("stopping the batcher"))?;
        // Every batch answered is recorded: the profiles' last write.
        if let Some(p) = self.profile {
            tokio::task::spawn_blocking(move || p.stop())
                .await
                .map_err(ServerError::task("writing the profiles"))?;
        }
        result
    }
}

/// A signal that stops the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGTERM.
    Terminate,
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGHUP (the terminal closed): stops the server the same way (there is nothing to
    /// reload).
    Hangup,
}

impl StopSignal {
    /// The signal's name.
    pub fn name(self) -> &'static str {
        match self {
            StopSignal::Terminate => "SIGTERM",
            StopSignal::Interrupt => "SIGINT",
            StopSignal::Hangup => "SIGHUP",
        }
    }

    /// The signal's number (an exit status of `128 + number` says a process died of it).
    pub fn number(self) -> i32 {
        match self {
            StopSignal::Terminate => 15,
            StopSignal::Interrupt => 2,
            StopSignal::Hangup => 1,
        }
    }
}

/// Resolves on SIGTERM, SIGINT (Ctrl-C) or SIGHUP, saying which.
pub async fn shutdown_signal() -> StopSignal {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("install a SIGTERM handler");
        let mut hup = signal(SignalKind::hangup()).expect("install a SIGHUP handler");
        tokio::select! {
            _ = term.recv() => StopSignal::Terminate,
            _ = hup.recv() => StopSignal::Hangup,
            _ = tokio::signal::ctrl_c() => StopSignal::Interrupt,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        StopSignal::Interrupt
    }
}
