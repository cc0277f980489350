//! `bench model`'s flags and what they make: the model timed ([`Built`]), the batches' sizes
//! ([`sizes`]), the runner's flags and, for a GPU engine that keeps batches in flight, its
//! loop's ([`GpuLoop`]).

use super::load::BatchSizes;
use crate::engines::RunnerArgs;
use crate::gpu_args::GpuArgs;
use clap::Args;
use ember_embed::DType;
use ember_model::DenseDType;
use ember_model::family::AnyPreset;
use ember_model::serving::Servable;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Debug, Args)]
pub struct ModelArgs {
    /// Model shape: rm1 (dense 2048 -> 256-64, 32 tables x 500K x 64, pooling 80, dot, top
    /// 768-384-1), small (the same with 8 tables x 10K rows) or dlrm-v2 (MLPerf DLRM-v2,
    /// TorchRec's DLRM_DCN: dense 13 -> 512-256-128, 26 tables x dim 128 with MLPerf's rows
    /// and multi-hot sizes, a 3-layer rank-512 cross net, top 1024-1024-512-256-1); or an HSTU
    /// ranking model: dlrm-v3 (MLPerf DLRMv3: 5 STU layers, 4 heads x 128, dim 512, tables 1e9 /
    /// 10M / 128 rows of 512, scaled by --rows-scale) or hstu-small (dims 64, 2 layers).
    #[arg(long, default_value = "rm1")]
    pub(super) preset: String,
    /// A model directory of any family to time instead of a preset (its tables in their own
    /// dtype unless --dtype is given).
    #[arg(long, value_name = "DIR")]
    pub(super) model: Option<PathBuf>,
    /// The requests to time, one JSON request a line as `/v1/score` takes it (an HSTU user, a
    /// DLRM sample), merged into batches of --batch items [default: synthetic items].
    #[arg(long, value_name = "FILE", visible_alias = "users")]
    pub(super) requests: Option<PathBuf>,
    /// Items per batch (samples, users) [default: 64 samples, 1 user (as MLPerf's Server
    /// scenario sends them)].
    #[arg(long, visible_alias = "users-per-batch")]
    pub(super) batch: Option<usize>,
    /// Batch sizes to cycle through instead of --batch: `mlperf` (MLPerf DLRM-v2's query
    /// sizes: 100 to 700 samples, 270 on average) or a list such as 100,200,700.
    #[arg(long, value_name = "mlperf|N,N,...", conflicts_with = "batch")]
    pub(super) batch_sizes: Option<BatchSizes>,
    /// Ids per bag of every feature of a synthetic sample [default: the preset's: 80 for rm1
    /// and small, MLPerf's multi-hot size of each feature (1 to 100, 214 a sample) for
    /// dlrm-v2; 1 for a model directory].
    #[arg(long)]
    pub(super) pooling: Option<usize>,
    /// History items of each synthetic user [default: 256].
    #[arg(long)]
    pub(super) history: Option<usize>,
    /// Candidates of each synthetic user [default: 64].
    #[arg(long)]
    pub(super) candidates: Option<usize>,
    /// What an HSTU model's attention is divided by, alone or batch_max [default: the model's].
    #[arg(long, value_name = "RULE")]
    pub(super) attention_norm: Option<String>,
    /// Worker threads.
    #[arg(long, default_value_t = 1)]
    pub(super) threads: usize,
    /// Timed batches.
    #[arg(long, default_value_t = 300)]
    pub(super) iters: usize,
    /// Untimed batches first.
    #[arg(long, default_value_t = 30)]
    pub(super) warmup: usize,
    /// Multiplies every table's rows by F (rounded up), before --max-rows.
    #[arg(long, value_name = "F", default_value_t = 1.0)]
    pub(super) rows_scale: f64,
    /// Caps each table's rows, 0 for no cap [default: 200000 for dlrm-v2, whose five 40M-row
    /// tables would be 102 GB; none for the others].
    #[arg(long, value_name = "N")]
    pub(super) max_rows: Option<usize>,
    /// Table dtype: f32, f16, bf16, int8, int4 [default: f32 for a preset, a model
    /// directory's own].
    #[arg(long)]
    pub(super) dtype: Option<DType>,
    /// Dense layers' precision: f32, bf16 or int8 (on AMX tiles, AVX-512 BF16 / VNNI or an
    /// emulation, whichever the CPU has; `EMBER_DENSE_ISA` picks one).
    #[arg(long, value_name = "DTYPE", default_value = "f32")]
    pub(super) dense_dtype: DenseDType,
    /// After timing, score this many more synthetic items with the dense layers in f32 (on
    /// the CPU) and as timed, draw each value's label from its f32 probability, and report
    /// the AUC and NE the timed precision keeps (MLPerf's targets: 99% / 99.9% of f32's) and
    /// the scores' errors.
    #[arg(long, value_name = "ITEMS", default_value_t = 0)]
    pub(super) accuracy: usize,
    /// Seed of weights and inputs.
    #[arg(long, default_value_t = 7)]
    pub(super) seed: u64,
    /// Print a JSON object as the last line.
    #[arg(long)]
    pub(super) json: bool,
    /// Write an HTML page of plots (where the time goes, the batch latency histogram).
    #[arg(long, value_name = "FILE.html")]
    pub(super) report: Option<PathBuf>,
    #[command(flatten)]
    pub(super) gpu: GpuArgs,
    /// With --device cuda and an engine that keeps batches in flight (a DLRM model's), where
    /// each batch starts. pinned: in page-locked memory made ahead and not timed (as PyTorch's
    /// side of bench/compare_torch_dlrm.py pins its inputs), copied as it is and checked on
    /// the device; staged: in ordinary memory, checked and staged by the host in one pass, as
    /// `serve` runs a batch [default: pinned].
    #[arg(long, value_enum)]
    pub(super) gpu_inputs: Option<GpuInputs>,
    /// With --device cuda and an engine that keeps batches in flight, batches in flight at
    /// most [default: 2 with pinned inputs (the copy engine is the limit: a third only waits),
    /// 3 with staged ones (the host stages one while another copies and a third computes)].
    #[arg(long, value_name = "N")]
    pub(super) in_flight: Option<usize>,
}

/// The model timed and how it was made.
pub(super) struct Built {
    pub model: Arc<dyn Servable>,
    /// Preset name or directory.
    pub name: String,
    pub preset: Option<AnyPreset>,
}

impl ModelArgs {
    /// The runner's flags, its dense layers in `dense`.
    pub(super) fn runner_args(&self, dense: DenseDType) -> RunnerArgs<'_> {
        RunnerArgs {
            gpu: &self.gpu,
            threads: self.threads,
            batch: sizes(self).into_iter().flatten().max().unwrap_or(64),
            plan: None,
            attention_norm: self.attention_norm.as_deref(),
            dense: Some(dense),
            check_dense: false,
        }
    }

    pub(super) fn gpu_loop(&self) -> GpuLoop<'_> {
        GpuLoop {
            gpu: &self.gpu,
            dense_dtype: self.dense_dtype,
            inputs: self.gpu_inputs.unwrap_or(GpuInputs::Pinned),
            in_flight: self.in_flight,
            warmup: self.warmup,
            iters: self.iters,
        }
    }

    pub(super) fn dtype_name(&self) -> String {
        match (self.dtype, &self.model) {
            (Some(d), _) => d.to_string(),
            (None, Some(_)) => "own".into(),
            (None, None) => DType::F32.to_string(),
        }
    }
}

/// The items of each batch, cycled (`None`: the family's default).
pub(super) fn sizes(a: &ModelArgs) -> Vec<Option<usize>> {
    match &a.batch_sizes {
        Some(b) => b.0.iter().map(|&n| Some(n)).collect(),
        None => vec![a.batch],
    }
}

/// Where a GPU batch's inputs start (`--gpu-inputs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GpuInputs {
    Pinned,
    Staged,
}

/// What the GPU loop needs of `bench model`'s flags.
pub(super) struct GpuLoop<'a> {
    pub gpu: &'a crate::gpu_args::GpuArgs,
    pub dense_dtype: ember_model::DenseDType,
    pub inputs: GpuInputs,
    pub in_flight: Option<usize>,
    pub warmup: usize,
    pub iters: usize,
}

impl GpuLoop<'_> {
    /// `--in-flight`, else 2 with pinned inputs (the copy engine is the limit: a third batch
    /// only waits) and 3 with staged ones (the host stages one while another copies and a
    /// third computes).
    pub fn in_flight(&self) -> usize {
        self.in_flight.unwrap_or(match self.inputs {
            GpuInputs::Pinned => 2,
            GpuInputs::Staged => 3,
        })
    }
}
