//! `ember serve`: the inference server (see `ember_serve`). With no arguments it serves the
//! shipped default model on 127.0.0.1:8080.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use ember_embed::DType;
use ember_model::hstu::HstuModel;
use ember_model::{Engine, Model};
use ember_serve::{BatchConfig, ServeConfig, Server};

mod models;
mod security;

use models::{CliLoader, dir_name, placement_banner, run_hstu};

use crate::gpu_args::GpuArgs;
use crate::paths::{DEFAULT_MODEL, shipped};
use crate::tier_args::TierArgs;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Model directory (config.json + model.safetensors) [default: the shipped models/default].
    #[arg(long, conflicts_with = "preset")]
    model: Option<PathBuf>,
    /// Serve every model of a repository (Triton's layout: DIR/<name>/<version>/, each version
    /// a model directory), the newest version of each; POST /v2/repository/models/<name>/load
    /// reloads one (with --model-control explicit).
    #[arg(long, conflicts_with_all = ["model", "preset", "name"])]
    model_repository: Option<PathBuf>,
    /// Serve model NAME from the registry of --redis alone (tables, config and dense weights,
    /// pushed by `ember registry push`), following the version it says to serve: the one `ember
    /// registry promote` chose, else the newest ready one. A new version is fetched, loaded,
    /// warmed and swapped in without a pause. (--from-store: the old name, for one release.)
    #[arg(long, value_name = "NAME", requires = "redis", visible_alias = "from-store",
          conflicts_with_all = ["model", "model_repository", "preset", "registry_model", "registry_version", "placement", "remote_fallback"])]
    from_registry: Option<String>,
    /// With --from-registry: the directory versions are fetched into [default: a new directory
    /// under the system's temporary directory, removed at exit]. (--store-cache: the old name,
    /// for one release.)
    #[arg(long, requires = "from_registry", visible_alias = "store-cache")]
    registry_cache: Option<PathBuf>,
    /// With --model-repository: scan it every N seconds, loading new versions (swapped in
    /// without a pause) and new models, unloading models whose directory is gone [default: 0,
    /// never]. With --from-registry: read the version to serve every N seconds [default: 1; 0:
    /// never, only on POST /v2/repository/models/NAME/load].
    #[arg(long)]
    poll_secs: Option<f64>,
    /// With --model-repository or --from-registry: MB per second a new version's tables are
    /// copied at while other versions serve, so that loading leaves serving its memory
    /// bandwidth (0: as fast as it goes). Loads at start are not paced.
    #[arg(long, default_value_t = 0.0)]
    load_mb_per_s: f64,
    /// Serve a benchmark shape with random weights instead (rm1, small).
    #[arg(long)]
    preset: Option<String>,
    /// Name clients address the model by [default: the directory's name, or the preset's].
    #[arg(long)]
    name: Option<String>,
    /// HTTP listen address (KServe v2 under /v2, /v1/score, /metrics): PORT (on 127.0.0.1),
    /// HOST:PORT or IP:PORT (0.0.0.0:PORT listens on every interface).
    #[arg(long, default_value = "127.0.0.1:8080", value_parser = parse_listen)]
    http: SocketAddr,
    /// gRPC listen address (KServe v2 / Triton's GRPCInferenceService), as --http, or `off`.
    #[arg(long, default_value = "127.0.0.1:8081", value_parser = parse_grpc)]
    grpc: GrpcAddr,
    #[command(flatten)]
    log: crate::logging::LogArgs,
    /// Threads of the model's forward pass (of each instance's, with --instances).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Model instances (Triton's instance_group count): batches that run at once, each on a
    /// predictor of its own with --threads threads. On a CPU, N instances of 1 thread give
    /// more throughput than 1 instance of N threads when batches are large and many (MLPerf's
    /// Offline); 1 instance of N threads gives a lone batch the lowest latency. With --device
    /// cuda, N predictors share the GPU's one copy of the model: one batch's host work (check,
    /// staging) runs beside another's copy and compute.
    #[arg(long, default_value_t = 1)]
    instances: usize,
    /// Threads serving connections and decoding requests [default: one per core].
    #[arg(long)]
    io_threads: Option<usize>,
    /// Most samples in one batch.
    #[arg(long, default_value_t = 256)]
    max_batch: usize,
    /// Longest a request waits for others to join its batch, in microseconds.
    #[arg(long, default_value_t = 500)]
    max_delay_us: u64,
    /// Most requests waiting for a batch; more are refused with 503.
    #[arg(long, default_value_t = 4096)]
    queue: usize,
    /// Longest a request may be expected to wait for its batch, in milliseconds; one expected
    /// to wait longer (or past its own deadline) is refused at once with 503 /
    /// RESOURCE_EXHAUSTED. 0: no bound but the request's deadline.
    #[arg(long, default_value_t = 50.0)]
    max_queue_delay_ms: f64,
    /// Largest request body, in bytes; larger ones get 400 (from Content-Length, unread).
    #[arg(long, default_value_t = 16 << 20)]
    max_body_bytes: usize,
    /// Who may load and unload models: `none` (the default; POST
    /// /v2/repository/models/NAME/load and unload, and their gRPC methods, answer 403 /
    /// PERMISSION_DENIED; repository polling still loads new versions) or `explicit` (any client
    /// that reaches the port). Triton's --model-control-mode.
    #[arg(long, value_enum, default_value_t = ModelControlArg::None)]
    model_control: ModelControlArg,
    #[command(flatten)]
    conn: ConnArgs,
    #[command(flatten)]
    security: security::SecurityArgs,
    /// Re-encode the tables at load: f32, f16, bf16, int8 or int4.
    #[arg(long)]
    dtype: Option<DType>,
    /// Run the dense layers (MLPs, cross net) in f32, bf16 or int8 [default: config.json's
    /// `dense_dtype`, else f32]. bf16 and int8 run on AMX tiles, AVX-512 BF16 / VNNI, or an
    /// emulation, whichever the CPU has (`EMBER_DENSE_ISA` picks one).
    #[arg(long, value_name = "DTYPE")]
    dense_dtype: Option<ember_model::DenseDType>,
    /// With --dense-dtype int8: calibrate the int8 layers on these inputs before serving (a
    /// `.npz` or `.safetensors` file of the model's input arrays, as `predict` reads them; they
    /// should be like the served ones: SmoothQuant's per-column balance is set from each
    /// layer's input ranges on them). Without it int8 runs plain per-row activations.
    #[arg(long, value_name = "FILE")]
    calibrate: Option<PathBuf>,
    /// Record every served model's lookups and write them as DIR/<model>/<table>.ids (one id
    /// per line, rewritten every --profile-interval-s and at stop): the per-table profiles of
    /// `ember convert --layout-profile DIR/<model>`.
    #[arg(long)]
    profile_dir: Option<PathBuf>,
    /// Most recent ids kept per table for --profile-dir (8 bytes each).
    #[arg(long, default_value_t = 1 << 18, requires = "profile_dir")]
    profile_ids: usize,
    /// Record one batch in this many for --profile-dir (whole batches, so rows looked up
    /// together stay together).
    #[arg(long, default_value_t = 1, requires = "profile_dir")]
    profile_every: u64,
    /// Seconds between writes of --profile-dir's files.
    #[arg(long, default_value_t = 60.0, requires = "profile_dir")]
    profile_interval_s: f64,
    #[command(flatten)]
    tier: TierArgs,
    #[command(flatten)]
    gpu: GpuArgs,
    #[command(flatten)]
    plan: crate::plan::PlanArgs,
}

/// How connections are held (`ember_serve::ConnConfig`).
#[derive(Debug, Args)]
pub struct ConnArgs {
    /// Longest a request head (request line and headers) may take from its first byte, in
    /// seconds; slower ones are closed.
    #[arg(long, default_value_t = 10.0)]
    header_timeout_s: f64,
    /// Seconds a request body may take before it must keep up --min-body-rate; slower bodies
    /// get 408 and their connection closes.
    #[arg(long, default_value_t = 10.0)]
    body_timeout_s: f64,
    /// Bytes per second a request body must average after --body-timeout-s (0: no minimum).
    #[arg(long, default_value_t = 4096)]
    min_body_rate: u64,
    /// Seconds a connection with nothing in flight stays open (HTTP/1.1 keep-alive, HTTP/2).
    #[arg(long, default_value_t = 60.0)]
    idle_timeout_s: f64,
    /// Seconds between HTTP/2 keep-alive pings (0: none).
    #[arg(long, default_value_t = 30.0)]
    h2_ping_interval_s: f64,
    /// Seconds an HTTP/2 ping may go unanswered before the connection is closed.
    #[arg(long, default_value_t = 10.0)]
    h2_ping_timeout_s: f64,
    /// Most connections open at once (also kept within the process's descriptor limit, which
    /// is raised to its hard limit at start); at the cap the oldest idle one is closed, or the
    /// new one refused when none is idle.
    #[arg(long, default_value_t = 16_384)]
    max_connections: usize,
    /// Largest request head, in bytes; larger ones get 431.
    #[arg(long, default_value_t = 32 << 10)]
    max_header_bytes: usize,
    /// Seconds a stop (SIGTERM, SIGINT, SIGHUP) waits for requests already received before it
    /// drops what is left and exits; a second signal exits at once.
    #[arg(long, default_value_t = 5.0)]
    shutdown_grace_s: f64,
    /// Most bytes of request bodies held at once across connections (each until its request
    /// is answered; a decoded request costs at most ~7x its body); more get 503.
    #[arg(long, default_value_t = 256 << 20)]
    max_inflight_bytes: usize,
}

/// Seconds from a flag, which must be finite and at least 0.
fn secs(flag: &str, s: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| anyhow::anyhow!("{flag} must be a number of seconds >= 0, not {s}"))
}

impl ConnArgs {
    fn config(&self) -> anyhow::Result<ember_serve::ConnConfig> {
        let positive = |flag: &str, s: f64| match secs(flag, s)? {
            d if d.is_zero() => bail!("{flag} must be above 0"),
            d => Ok(d),
        };
        if self.max_connections == 0 || self.max_header_bytes < 1024 {
            bail!("--max-connections must be at least 1 and --max-header-bytes at least 1024");
        }
        let ping = secs("--h2-ping-interval-s", self.h2_ping_interval_s)?;
        Ok(ember_serve::ConnConfig {
            header_timeout: positive("--header-timeout-s", self.header_timeout_s)?,
            idle_timeout: positive("--idle-timeout-s", self.idle_timeout_s)?,
            body_timeout: secs("--body-timeout-s", self.body_timeout_s)?,
            min_body_rate: self.min_body_rate,
            h2_ping_interval: (!ping.is_zero()).then_some(ping),
            h2_ping_timeout: positive("--h2-ping-timeout-s", self.h2_ping_timeout_s)?,
            max_connections: self.max_connections,
            max_header_bytes: self.max_header_bytes,
            shutdown_grace: secs("--shutdown-grace-s", self.shutdown_grace_s)?,
            max_inflight_bytes: self.max_inflight_bytes,
        })
    }
}

/// `--grpc`: an address, or none.
#[derive(Debug, Clone, Copy)]
pub struct GrpcAddr(Option<SocketAddr>);

fn parse_grpc(s: &str) -> Result<GrpcAddr, String> {
    if s == "off" {
        return Ok(GrpcAddr(None));
    }
    parse_listen(s)
        .map(|a| GrpcAddr(Some(a)))
        .map_err(|e| format!("{e}, or 'off'"))
}

/// A listen address: a bare port listens on 127.0.0.1 (as the defaults do), else `IP:PORT` or
/// `HOST:PORT` (its first address).
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let bad = |why: String| {
        format!(
            "'{s}' is not a listen address ({why}): give PORT (on 127.0.0.1), IP:PORT or \
             HOST:PORT (0.0.0.0:PORT for every interface)"
        )
    };
    s.to_socket_addrs()
        .map_err(|e| bad(e.to_string()))?
        .next()
        .ok_or_else(|| bad("it resolves to no address".into()))
}

pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    crate::logging::init(&a.log)?;
    // Before any model is loaded: its remote store registers its metrics when it opens.
    ember_serve::install_metrics();
    let io_threads = a
        .io_threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if a.threads == 0 || a.instances == 0 || io_threads == 0 || a.max_batch == 0 || a.queue == 0 {
        bail!("--threads, --instances, --io-threads, --max-batch and --queue must be at least 1");
    }
    if a.instances > 1 && a.plan.plan.is_some() {
        bail!(
            "--instances runs predictors side by side; with --plan the model runs on the \
             plan's devices (leave --instances at 1)"
        );
    }
    if a.model_repository.is_none()
        && a.from_registry.is_none()
        && (a.poll_secs.is_some() || a.load_mb_per_s != 0.0)
    {
        bail!("--poll-secs and --load-mb-per-s take --model-repository or --from-registry");
    }
    let int8 = a.dense_dtype == Some(ember_model::DenseDType::Int8);
    if a.calibrate.is_some() && !int8 {
        bail!("--calibrate calibrates int8 dense layers: it takes --dense-dtype int8");
    }
    if a.calibrate.is_some() && (a.model_repository.is_some() || a.from_registry.is_some()) {
        bail!("--calibrate takes --model or --preset (one model), not a repository or a registry");
    }
    if let Some(root) = &a.model_repository {
        return run_repository(&a, root.clone(), None, io_threads);
    }
    if let Some(name) = &a.from_registry {
        return run_from_registry(&a, name, io_threads);
    }
    let (model, name) = match &a.preset {
        Some(p) => {
            let mut preset = ember_model::presets::preset(p, a.dtype.unwrap_or(DType::F32))?;
            if let Some(d) = a.dense_dtype.filter(|_| a.calibrate.is_none()) {
                preset.config.dense_dtype = d;
            }
            eprintln!("building {p} with random weights...");
            (Model::random(preset.config, 42, a.threads)?, p.clone())
        }
        None => {
            let dir = a.model.clone().unwrap_or_else(|| shipped(DEFAULT_MODEL));
            if HstuModel::is_hstu_dir(&dir) {
                return run_hstu(&a, &dir, io_threads);
            }
            // To be calibrated: loaded in f32, its int8 weights packed by the calibration.
            let dense = match a.calibrate {
                Some(_) => Some(ember_model::DenseDType::F32),
                None => a.dense_dtype,
            };
            let mut model = Model::load(&dir, a.tier.load_options(a.dtype, dense))
                .with_context(|| format!("loading model {}", dir.display()))?;
            a.tier.apply(&mut model, &dir)?;
            (model, dir_name(&dir))
        }
    };
    let cfg = serve_config(&a, a.name.clone().unwrap_or(name))?;
    let rt = runtime(io_threads)?;
    let mut model = Arc::new(model);
    if let Some(file) = &a.calibrate {
        let t = std::time::Instant::now();
        let samples = crate::predict::read_samples(&model, file, a.max_batch)?;
        let n: usize = samples.iter().map(|s| s.len()).sum();
        ember_model::Predictor::calibrate_int8_samples(&model, a.threads, &samples, a.max_batch)
            .with_context(|| format!("calibrating int8 on {}", file.display()))?;
        Arc::get_mut(&mut model)
            .context("the calibration kept the model")?
            .set_dense_dtype(ember_model::DenseDType::Int8)?;
        tracing::info!(
            "model '{}': int8 layers calibrated on {n} samples of {} in {:.1}s",
            cfg.model_name,
            file.display(),
            t.elapsed().as_secs_f64()
        );
    }
    if a.gpu.is_cuda() && a.plan.plan.is_some() {
        bail!("--plan runs on CPU worker pools; with --device cuda the model runs on one GPU");
    }
    if !a.gpu.is_cuda() {
        crate::dense::check_accuracy(&model, &cfg.model_name, a.threads);
    }
    let engines: Vec<Box<dyn Engine>> = if a.gpu.is_cuda() {
        a.gpu.engines(&model, a.instances, a.max_batch)?
    } else {
        let mut v: Vec<Box<dyn Engine>> = Vec::with_capacity(a.instances);
        for _ in 0..a.instances {
            v.push(Box::new(a.plan.predictor(model.clone(), a.threads)?));
        }
        v
    };
    let started = Server::start_engines(engines, cfg.clone());
    serve_until_stopped(rt, &a, cfg, started)
}

/// `--from-registry NAME`: one model from the registry, its versions fetched under a cache
/// directory.
fn run_from_registry(a: &ServeArgs, name: &str, io_threads: usize) -> anyhow::Result<()> {
    let redis = a.tier.redis().context("--from-registry needs --redis")?;
    let (root, temporary) = match &a.registry_cache {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("ember-registry-{name}-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&root)
        .with_context(|| format!("creating the registry cache {}", root.display()))?;
    let follow = ember_serve::RegistryFollow {
        redis: redis.to_string(),
        model: name.to_string(),
        name: a.name.clone().unwrap_or_else(|| name.to_string()),
    };
    let served = run_repository(a, root.clone(), Some(follow), io_threads);
    if temporary {
        let _ = std::fs::remove_dir_all(&root);
    }
    served
}

/// `--model-repository`: every model of the directory; or, with `registry`, the one model
/// followed in the registry, fetched under `root`.
fn run_repository(
    a: &ServeArgs,
    root: PathBuf,
    registry: Option<ember_serve::RegistryFollow>,
    io_threads: usize,
) -> anyhow::Result<()> {
    let what = match registry {
        Some(_) => "--from-registry",
        None => "--model-repository",
    };
    if a.gpu.is_cuda() || a.plan.plan.is_some() {
        bail!("{what} serves on the CPU without a plan (--device cuda and --plan take --model)");
    }
    if !root.is_dir() {
        bail!("--model-repository {}: not a directory", root.display());
    }
    let default_poll = if registry.is_some() { 1.0 } else { 0.0 };
    let poll = secs("--poll-secs", a.poll_secs.unwrap_or(default_poll))?;
    let source = ember_serve::RepositoryConfig {
        root,
        loader: Arc::new(CliLoader {
            tier: a.tier.clone(),
            dtype: a.dtype,
            dense_dtype: a.dense_dtype,
            threads: a.threads,
        }),
        poll: (!poll.is_zero()).then_some(poll),
        warm_batches: ember_serve::repo::WARM_BATCHES,
        pace_bytes_per_s: (a.load_mb_per_s > 0.0).then_some((a.load_mb_per_s * 1e6) as u64),
        registry,
    };
    let cfg = serve_config(a, String::new())?;
    let rt = runtime(io_threads)?;
    let started = Server::start_repository(source, cfg.clone());
    serve_until_stopped(rt, a, cfg, started)
}

fn runtime(io_threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(io_threads)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// `--model-control`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ModelControlArg {
    None,
    Explicit,
}

fn serve_config(a: &ServeArgs, model_name: String) -> anyhow::Result<ServeConfig> {
    Ok(ServeConfig {
        http: a.http,
        grpc: a.grpc.0,
        model_name,
        threads: a.threads,
        batch: BatchConfig {
            max_batch: a.max_batch,
            max_delay: Duration::from_micros(a.max_delay_us),
            queue: a.queue,
            max_queue_delay: match secs("--max-queue-delay-ms", a.max_queue_delay_ms / 1e3)? {
                d if d.is_zero() => None,
                d => Some(d),
            },
            instances: a.instances,
        },
        max_body_bytes: a.max_body_bytes,
        model_control: match a.model_control {
            ModelControlArg::None => ember_serve::ModelControl::None,
            ModelControlArg::Explicit => ember_serve::ModelControl::Explicit,
        },
        conn: a.conn.config()?,
        tls: a.security.tls()?,
        restricted: a.security.restricted()?,
        metrics: a.security.metrics_addr(),
        profile: match &a.profile_dir {
            Some(dir) => {
                let interval = secs("--profile-interval-s", a.profile_interval_s)?;
                if a.profile_ids == 0 || a.profile_every == 0 || interval.is_zero() {
                    bail!(
                        "--profile-ids, --profile-every and --profile-interval-s must be above 0"
                    );
                }
                Some(ember_serve::ProfileConfig {
                    dir: dir.clone(),
                    record: ember_model::RecordOptions {
                        ids_per_table: a.profile_ids,
                        every: a.profile_every,
                    },
                    interval,
                })
            }
            None => None,
        },
    })
}

/// Waits for the server `started` to listen, then for a stop signal; stops it.
fn serve_until_stopped(
    rt: tokio::runtime::Runtime,
    a: &ServeArgs,
    cfg: ServeConfig,
    started: impl std::future::Future<Output = ember_serve::ServerResult<Server>>,
) -> anyhow::Result<()> {
    let grace = cfg.conn.shutdown_grace;
    let cfg_tls = cfg.tls.is_some();
    let cfg_mutual = cfg.tls.as_ref().is_some_and(|t| t.client_ca.is_some());
    rt.block_on(async move {
        // The error names the step that failed (a listener names its address and protocol).
        let server = started.await.context("starting the server")?;
        let addr = server.addr();
        // Poll the stop signal once, which installs its handlers, before the address is printed:
        // a SIGHUP sent as soon as the line appears must stop the server, not kill it (a race the
        // reliability test lost under a loaded CI run).
        let mut stop = std::pin::pin!(ember_serve::shutdown_signal());
        let early = tokio::select! {
            biased;
            s = &mut stop => Some(s),
            _ = std::future::ready(()) => None,
        };
        let names: Vec<String> = server
            .repository()
            .served()
            .iter()
            .map(|s| format!("'{}' v{}", s.name(), s.version))
            .collect();
        let route = match names.len() {
            1 => format!(
                "POST /v2/models/{}/infer",
                server.repository().served()[0].name()
            ),
            _ => "POST /v2/models/<name>/infer".into(),
        };
        let (scheme, tls) = match (cfg_tls, cfg_mutual) {
            (false, _) => ("http", ""),
            (true, false) => ("https", ", over TLS"),
            (true, true) => ("https", ", over TLS, client certificates required"),
        };
        eprintln!(
            "serving {} on {scheme}://{addr}  ({route}, POST /v1/score, GET /metrics, \
             POST /v2/repository/index; up to {} connections; Ctrl-C, SIGTERM or SIGHUP \
             stops, a second signal exits at once)",
            match names.is_empty() {
                true => "no model yet".to_string(),
                false => format!("model {}", names.join(", ")),
            },
            server.connection_cap()
        );
        if let Some(g) = server.grpc_addr() {
            eprintln!("gRPC (inference.GRPCInferenceService{tls}) on {g}");
        }
        if let Some(m) = server.metrics_addr() {
            eprintln!("metrics (GET /metrics) on {scheme}://{m}");
        }
        for s in server.repository().served() {
            tracing::info!("{}", placement_banner(a, &s));
        }
        let signal = match early {
            Some(s) => s,
            None => stop.await,
        };
        eprintln!(
            "{}: stopping (answering the requests received, for up to {:.1} s)...",
            signal.name(),
            grace.as_secs_f64()
        );
        // A second signal does not wait for anything.
        tokio::spawn(async {
            let again = ember_serve::shutdown_signal().await;
            eprintln!("{}: exiting now", again.name());
            std::process::exit(128 + again.number());
        });
        server.shutdown().await.context("stopping the server")?;
        eprintln!("stopped");
        anyhow::Ok(())
    })?;
    // Nothing is left to wait for: the server answered or dropped every request.
    rt.shutdown_timeout(Duration::from_millis(200));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_take_a_port_an_ip_or_a_host() {
        assert_eq!(
            parse_listen("9300").unwrap(),
            "127.0.0.1:9300".parse().unwrap()
        );
        assert_eq!(
            parse_listen("0.0.0.0:80").unwrap(),
            "0.0.0.0:80".parse().unwrap()
        );
        assert_eq!(
            parse_listen("[::1]:81").unwrap(),
            "[::1]:81".parse().unwrap()
        );
        assert!(parse_listen("localhost:8082").unwrap().ip().is_loopback());
        for bad in ["70000", "host-with-no-port", ":"] {
            let e = parse_listen(bad).unwrap_err();
            assert!(e.contains(bad) && e.contains("give PORT"), "{e}");
        }
        assert!(parse_grpc("off").unwrap().0.is_none());
        assert!(parse_grpc("nope").unwrap_err().ends_with("or 'off'"));
    }
}
