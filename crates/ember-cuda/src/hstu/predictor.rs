//! [`GpuHstuPredictor`]: the kernels compiled for a model, the buffers a batch grows, and one
//! batch's run: lookups through the GPU embedding stage, the pass (`forward.rs`), the logits
//! back, the stages' times from events.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaEvent, CudaFunction, CudaSlice};
use ember_embed::Pooling;
use ember_model::DenseDType;
use ember_model::hstu::{AttentionNorm, HstuBatch, HstuScores, HstuTimes, TokenPlan};

use super::sel::Sel;

use super::GpuHstu;
use crate::device::{Gpu, TIMED};
use crate::embed::{EmbedRun, Variant};
use crate::error::{CudaError, DriverCtx, Result};
use crate::kernels::hstu_source;
use crate::model::lt::Lt;

/// The kernels of `kernels/hstu.cu` (and `model.cu`'s cast and bias), compiled for one model's
/// attention widths.
#[derive(Debug)]
pub(super) struct Kernels {
    pub(super) norm: CudaFunction,
    pub(super) gather: CudaFunction,
    pub(super) contextual: CudaFunction,
    pub(super) encode: CudaFunction,
    pub(super) silu_u: CudaFunction,
    pub(super) assemble: CudaFunction,
    pub(super) residual: CudaFunction,
    pub(super) rows: CudaFunction,
    pub(super) l2: CudaFunction,
    pub(super) mul: CudaFunction,
    pub(super) add: CudaFunction,
    pub(super) attn_f32: CudaFunction,
    pub(super) attn_bf16: Option<CudaFunction>,
    pub(super) attn_bf16_v2: Option<CudaFunction>,
    pub(super) to_bf16: CudaFunction,
    pub(super) bias: CudaFunction,
    pub(super) scatter: CudaFunction,
    pub(super) kv: CudaFunction,
}

impl Kernels {
    fn new(gpu: &Gpu, qk: usize, hid: usize) -> Result<Kernels> {
        let (src, name) = hstu_source(qk, hid);
        let f = |func: &str| gpu.function(&name, || src.clone(), &[], func);
        let tensor_cores = qk.is_multiple_of(16) && hid.is_multiple_of(8);
        Ok(Kernels {
            norm: f("hstu_norm")?,
            gather: f("hstu_gather")?,
            contextual: f("hstu_contextual")?,
            encode: f("hstu_encode")?,
            silu_u: f("hstu_silu_u")?,
            assemble: f("hstu_assemble")?,
            residual: f("hstu_residual")?,
            rows: f("hstu_rows")?,
            l2: f("hstu_l2")?,
            mul: f("hstu_mul")?,
            add: f("hstu_add")?,
            attn_f32: f("hstu_attn_f32")?,
            attn_bf16: if tensor_cores {
                Some(f("hstu_attn_bf16")?)
            } else {
                None
            },
            attn_bf16_v2: if tensor_cores {
                Some(f("hstu_attn_bf16_v2")?)
            } else {
                None
            },
            to_bf16: f("ember_to_bf16")?,
            bias: f("ember_bias_act")?,
            scatter: f("hstu_scatter")?,
            kv: f("hstu_kv")?,
        })
    }
}

/// Device buffers, grown as batches need.
#[derive(Debug, Default)]
pub(super) struct Bufs {
    pub(super) input: Option<CudaSlice<f32>>,
    pub(super) hidden: Option<CudaSlice<f32>>,
    pub(super) x: Option<CudaSlice<f32>>,
    pub(super) tmp: Option<CudaSlice<f32>>,
    pub(super) xn: Option<CudaSlice<f32>>,
    pub(super) uvqk: Option<CudaSlice<f32>>,
    pub(super) uvqk16: Option<CudaSlice<u16>>,
    pub(super) attn: Option<CudaSlice<f32>>,
    pub(super) y: Option<CudaSlice<f32>>,
    pub(super) x16: Option<CudaSlice<u16>>,
    pub(super) user: Option<CudaSlice<f32>>,
    pub(super) item: Option<CudaSlice<f32>>,
    pub(super) logits: Option<CudaSlice<f32>>,
    pub(super) pos: Option<CudaSlice<i32>>,
    pub(super) bucket: Option<CudaSlice<i32>>,
    pub(super) ctx: Option<CudaSlice<i32>>,
    pub(super) seq: Option<CudaSlice<i32>>,
    pub(super) norms: Option<CudaSlice<f32>>,
    pub(super) tiles: Option<CudaSlice<i32>>,
    pub(super) cand: Option<CudaSlice<i32>>,
    pub(super) tf: Option<CudaSlice<f32>>,
    // A pass with a cache of histories (`cached.rs`).
    pub(super) uvqk_c: Option<CudaSlice<f32>>,
    pub(super) y_full: Option<CudaSlice<f32>>,
    pub(super) sel_rows: Option<CudaSlice<i32>>,
    pub(super) held_segs: Option<CudaSlice<u64>>,
    pub(super) held_meta: Option<CudaSlice<i32>>,
    pub(super) kept_segs: Option<CudaSlice<u64>>,
    pub(super) kept_meta: Option<CudaSlice<i32>>,
}

/// Which kernel runs bf16 attention on tensor cores (`kernels/hstu.cu`, `kernels/hstu_attn2.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKernel {
    /// `hstu_attn_bf16`: 64-key tiles copied to shared memory by the threads' loads, fragments
    /// read with 2- and 4-byte shared loads (measured on an H200, 2026-11-28).
    V1,
    /// `hstu_attn_bf16_v2`: 32-key tiles in two buffers filled by `cp.async` under the math,
    /// fragments through `ldmatrix` (built 2026-11-30, not yet run on a GPU).
    V2,
}

impl AttentionKernel {
    /// The variable that chooses it for a process, read when a predictor is made.
    pub const ENV: &'static str = "EMBER_HSTU_ATTENTION";

    /// `$EMBER_HSTU_ATTENTION` (`v1` or `v2`), else `V1`.
    pub fn from_env() -> Result<AttentionKernel> {
        match std::env::var(Self::ENV).as_deref() {
            Err(_) | Ok("") | Ok("v1") => Ok(AttentionKernel::V1),
            Ok("v2") => Ok(AttentionKernel::V2),
            Ok(other) => Err(CudaError::Input(format!(
                "{}={other}: the bf16 attention kernels are v1 and v2",
                Self::ENV
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            AttentionKernel::V1 => "v1",
            AttentionKernel::V2 => "v2",
        }
    }
}

/// Which [`HstuTimes`] field the time up to an event goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    Lookups,
    Preprocess,
    Projections,
    Attention,
    Pointwise,
    Head,
}

/// Runs a [`GpuHstu`]: one batch of users at a time, on the device's compute stream.
#[derive(Debug)]
pub struct GpuHstuPredictor {
    pub(super) m: Arc<GpuHstu>,
    pub(super) run: EmbedRun,
    pub(super) blas: CudaBlas,
    pub(super) lt: Option<Lt>,
    pub(super) k: Kernels,
    pub(super) b: Bufs,
    pub(super) norm: AttentionNorm,
    pub(super) events: Vec<CudaEvent>,
    pub(super) marks: Vec<Stage>,
    /// Tensor cores for bf16 attention (the default where the widths allow).
    pub(super) tensor_core_attention: bool,
    /// Which kernel runs it there.
    pub(super) attention_kernel: AttentionKernel,
}

impl GpuHstuPredictor {
    /// A predictor whose lookups pool with `variant`, attention divided as the model's config
    /// says.
    pub fn new(m: Arc<GpuHstu>, variant: Variant) -> Result<GpuHstuPredictor> {
        let gpu = m.gpu.clone();
        let h = &m.model.config().hstu;
        let k = Kernels::new(&gpu, h.hstu_attn_qk_dim, h.hstu_attn_linear_dim)?;
        let blas = CudaBlas::new(gpu.compute().clone()).map_err(|source| CudaError::Blas {
            what: "creating a handle",
            source,
        })?;
        let lt = match m.dense {
            DenseDType::Bf16 => Some(Lt::new(&gpu)?),
            _ => None,
        };
        let run = m.emb.runner(variant, Pooling::Sum)?;
        Ok(GpuHstuPredictor {
            tensor_core_attention: k.attn_bf16.is_some(),
            attention_kernel: AttentionKernel::from_env()?,
            run,
            blas,
            lt,
            k,
            b: Bufs::default(),
            norm: m.model.config().attention_norm,
            events: Vec::new(),
            marks: Vec::new(),
            m,
        })
    }

    /// What attention is divided by from now on.
    pub fn set_attention_norm(&mut self, norm: AttentionNorm) {
        self.norm = norm;
    }

    /// Whether bf16 attention runs on tensor cores (else on CUDA cores in f32).
    pub fn tensor_core_attention(&self) -> bool {
        self.m.dense == DenseDType::Bf16 && self.tensor_core_attention
    }

    /// Runs bf16 attention on CUDA cores in f32 even where tensor cores could (for comparison).
    pub fn set_tensor_core_attention(&mut self, on: bool) {
        self.tensor_core_attention = on && self.k.attn_bf16.is_some();
    }

    /// Which kernel runs bf16 attention on tensor cores from now on.
    pub fn set_attention_kernel(&mut self, kernel: AttentionKernel) {
        self.attention_kernel = kernel;
    }

    pub fn attention_kernel(&self) -> AttentionKernel {
        self.attention_kernel
    }

    pub fn gpu_model(&self) -> &Arc<GpuHstu> {
        &self.m
    }

    /// Scores `batch` (users checked by [`HstuModel::check_users`] on this model): its ids and
    /// host tables go up, the pass runs, the logits come back. Times are the device's, per
    /// stage, from events; `wall` is the host's whole call. With a cache of users' histories on
    /// the model, its users' held tokens are read from it ([`GpuHstuPredictor::run_cached`]).
    pub fn run(&mut self, batch: &HstuBatch) -> Result<(HstuScores, HstuTimes)> {
        if let Some(cache) = self.m.model.history_cache().cloned() {
            return self.run_cached(batch, &cache).map(|(s, t, _)| (s, t));
        }
        let plan = self.m.model.token_plan(batch, self.norm);
        self.pass(batch, &plan, None)
    }

    /// One pass over `plan`'s tokens: every token of `batch`, or with `sel` the computed ones
    /// (`plan` then their compact plan).
    pub(super) fn pass(
        &mut self,
        batch: &HstuBatch,
        plan: &TokenPlan,
        sel: Option<&Sel>,
    ) -> Result<(HstuScores, HstuTimes)> {
        let start = Instant::now();
        let model = self.m.model.clone();
        if plan.positions.is_empty() {
            let scores = HstuScores::from_logits(&model, &[], plan.offsets.clone());
            let times = HstuTimes {
                wall: start.elapsed(),
                ..HstuTimes::default()
            };
            return Ok((scores, times));
        }
        self.marks.clear();
        self.mark(None)?;
        match sel {
            // Some tokens held: the computed ones' lookups alone.
            Some(sel) if sel.tokens.len() < batch.tokens() => {
                let lookups = batch.lookups().select(&sel.tokens);
                self.run.upload_valid(&self.m.emb, lookups.view())?;
            }
            _ => self.run.upload_valid(&self.m.emb, batch.lookups().view())?,
        }
        self.run.launch(&self.m.emb)?;
        self.mark(Some(Stage::Lookups))?;
        let n = self.forward(batch, plan, sel)?;
        let tasks = model.config().hstu.multitask_configs.len();
        let mut logits = vec![0.0f32; n * tasks];
        let stream = self.m.gpu.compute().clone();
        if n > 0 {
            let dev = self.b.logits.as_ref().expect("allocated in head");
            stream
                .memcpy_dtoh(&dev.slice(..n * tasks), &mut logits)
                .ctx("downloading logits")?;
        }
        stream.synchronize().ctx("running the hstu pass")?;
        let mut times = HstuTimes::default();
        for (k, stage) in self.marks.iter().enumerate() {
            let ms = self.events[k]
                .elapsed_ms(&self.events[k + 1])
                .ctx("timing a stage")?;
            let d = Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3);
            match stage {
                Stage::Lookups => times.lookups += d,
                Stage::Preprocess => times.preprocess += d,
                Stage::Projections => times.projections += d,
                Stage::Attention => times.attention += d,
                Stage::Pointwise => times.pointwise += d,
                Stage::Head => times.head += d,
            }
        }
        times.wall = start.elapsed();
        Ok((
            HstuScores::from_logits(&model, &logits, plan.offsets.clone()),
            times,
        ))
    }

    /// Records the next event; the time since the one before goes to `stage`.
    pub(super) fn mark(&mut self, stage: Option<Stage>) -> Result<()> {
        let k = self.marks.len() + usize::from(stage.is_some());
        while self.events.len() <= k {
            let e = self
                .m
                .gpu
                .context()
                .new_event(Some(TIMED))
                .ctx("creating an event")?;
            self.events.push(e);
        }
        if let Some(s) = stage {
            self.marks.push(s);
        }
        self.events[k]
            .record(self.m.gpu.compute())
            .ctx("recording an event")
    }
}
