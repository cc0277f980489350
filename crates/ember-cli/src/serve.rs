//! `ember serve`: the inference server (see `ember_serve`). With no arguments it serves the
//! shipped default model on 127.0.0.1:8080.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use ember_embed::DType;
use ember_model::{Engine, Model};
use ember_serve::{BatchConfig, ServeConfig, Server};

use crate::gpu_args::GpuArgs;
use crate::paths::{DEFAULT_MODEL, shipped};
use crate::tier_args::TierArgs;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Model directory (config.json + model.safetensors) [default: the shipped models/default].
    #[arg(long, conflicts_with = "preset")]
    model: Option<PathBuf>,
    /// Serve a benchmark shape with random weights instead (rm1, small).
    #[arg(long)]
    preset: Option<String>,
    /// Name clients address the model by [default: the directory's name, or the preset's].
    #[arg(long)]
    name: Option<String>,
    /// HTTP listen address (KServe v2 under /v2, /v1/score, /metrics).
    #[arg(long, default_value = "127.0.0.1:8080")]
    http: SocketAddr,
    /// gRPC listen address (KServe v2 / Triton's GRPCInferenceService), or `off`.
    #[arg(long, default_value = "127.0.0.1:8081", value_parser = parse_grpc)]
    grpc: GrpcAddr,
    /// Threads of the model's forward pass.
    #[arg(long, default_value_t = 1)]
    threads: usize,
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
    /// Largest request body, in bytes; larger ones get 400.
    #[arg(long, default_value_t = 16 << 20)]
    max_body_bytes: usize,
    /// Re-encode the tables at load: f32, f16, bf16, int8 or int4.
    #[arg(long)]
    dtype: Option<DType>,
    #[command(flatten)]
    tier: TierArgs,
    #[command(flatten)]
    gpu: GpuArgs,
    #[command(flatten)]
    plan: crate::plan::PlanArgs,
}

/// `--grpc`: an address, or none.
#[derive(Debug, Clone, Copy)]
pub struct GrpcAddr(Option<SocketAddr>);

fn parse_grpc(s: &str) -> Result<GrpcAddr, String> {
    if s == "off" {
        return Ok(GrpcAddr(None));
    }
    s.parse()
        .map(|a| GrpcAddr(Some(a)))
        .map_err(|e| format!("'{s}' is neither an address (host:port) nor 'off': {e}"))
}

pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    let io_threads = a
        .io_threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if a.threads == 0 || io_threads == 0 || a.max_batch == 0 || a.queue == 0 {
        bail!("--threads, --io-threads, --max-batch and --queue must be at least 1");
    }
    let (model, name) = match &a.preset {
        Some(p) => {
            let preset = ember_model::presets::preset(p, a.dtype.unwrap_or(DType::F32))?;
            eprintln!("building {p} with random weights...");
            (Model::random(preset.config, 42, a.threads)?, p.clone())
        }
        None => {
            let dir = a.model.clone().unwrap_or_else(|| shipped(DEFAULT_MODEL));
            let mut model = Model::load(&dir, a.tier.load_options(a.dtype))
                .with_context(|| format!("loading model {}", dir.display()))?;
            a.tier.apply(&mut model, &dir)?;
            let name = dir
                .canonicalize()
                .ok()
                .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| "default".into());
            (model, name)
        }
    };
    let cfg = ServeConfig {
        http: a.http,
        grpc: a.grpc.0,
        model_name: a.name.clone().unwrap_or(name),
        threads: a.threads,
        batch: BatchConfig {
            max_batch: a.max_batch,
            max_delay: Duration::from_micros(a.max_delay_us),
            queue: a.queue,
        },
        max_body_bytes: a.max_body_bytes,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(io_threads)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let model = Arc::new(model);
    if a.gpu.is_cuda() && a.plan.plan.is_some() {
        bail!("--plan runs on CPU worker pools; with --device cuda the model runs on one GPU");
    }
    let engine: Box<dyn Engine> = if a.gpu.is_cuda() {
        // Tuned at start-up on a full batch of 20-id bags (choices cached on disk).
        Box::new(a.gpu.predictor(model, a.max_batch, 20, None)?)
    } else {
        Box::new(a.plan.predictor(model, a.threads)?)
    };
    rt.block_on(async move {
        let model_name = cfg.model_name.clone();
        let server = Server::start_engine(engine, cfg)
            .await
            .with_context(|| match a.grpc.0 {
                Some(g) => format!("listening on {} (HTTP) and {g} (gRPC)", a.http),
                None => format!("listening on {}", a.http),
            })?;
        let addr = server.addr();
        eprintln!(
            "serving model '{model_name}' on http://{addr}  (POST /v2/models/{model_name}/infer, \
             POST /v1/score, GET /metrics; Ctrl-C or SIGTERM stops)"
        );
        if let Some(g) = server.grpc_addr() {
            eprintln!("gRPC (inference.GRPCInferenceService) on {g}");
        }
        ember_serve::shutdown_signal().await;
        eprintln!("stopping: finishing requests in flight...");
        server.shutdown().await.context("stopping the server")?;
        eprintln!("stopped");
        Ok(())
    })
}
