//! `--device cuda` and its companions on `predict`, `serve` and `bench model`.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use ember_model::Model;

use crate::device::Device;

#[cfg(feature = "cuda")]
pub use ember_cuda::GpuPredictor;

/// A batch in page-locked memory; none exists in a build without CUDA.
#[cfg(not(feature = "cuda"))]
#[derive(Debug)]
pub enum PinnedBatch {}

/// The GPU predictor's place in a build without CUDA: a type with no values, so that callers
/// have one code path and [`GpuArgs::predictor`] is what refuses `--device cuda`.
#[cfg(not(feature = "cuda"))]
#[derive(Debug)]
pub enum GpuPredictor {}

#[cfg(not(feature = "cuda"))]
impl GpuPredictor {
    pub fn submit(&mut self, _: &[f32], _: &ember_embed::KeyedJagged) -> anyhow::Result<()> {
        match *self {}
    }

    pub fn capacity(&self) -> usize {
        match *self {}
    }

    pub fn set_capacity(&mut self, _: usize) -> anyhow::Result<()> {
        match *self {}
    }

    pub fn sibling(&self) -> anyhow::Result<GpuPredictor> {
        match *self {}
    }

    pub fn pin(&self, _: &[f32], _: &ember_embed::KeyedJagged) -> anyhow::Result<PinnedBatch> {
        match *self {}
    }

    pub fn submit_pinned(&mut self, _: &PinnedBatch) -> anyhow::Result<()> {
        match *self {}
    }

    pub fn collect(&mut self, _: &mut [f32]) -> anyhow::Result<ember_model::StageTimes> {
        match *self {}
    }

    pub fn in_flight(&self) -> usize {
        match *self {}
    }
}

#[cfg(not(feature = "cuda"))]
impl ember_model::Engine for GpuPredictor {
    fn model(&self) -> &Arc<Model> {
        match *self {}
    }

    fn run(
        &mut self,
        _: &ember_model::Prepared<'_>,
        _: &mut [f32],
    ) -> ember_model::Result<ember_model::StageTimes> {
        match *self {}
    }

    fn device(&self) -> String {
        match *self {}
    }
}

#[derive(Debug, Args)]
pub struct GpuArgs {
    /// Where the forward pass runs: cpu, or cuda (a binary built with --features cuda).
    #[arg(long, value_enum, default_value_t = Device::Cpu)]
    pub device: Device,
    /// GPU ordinal (--device cuda).
    #[arg(long, default_value_t = 0)]
    pub gpu: usize,
    /// Embedding kernel on the GPU: baseline, tuned, prefetch, l2pin, combined or dedup. The
    /// pinning variants (l2pin, combined) need --gpu-profile.
    #[arg(long, default_value = "tuned")]
    pub gpu_variant: String,
    /// A Criteo-format file whose ids (its first 100,000 rows) profile the rows pinned in L2.
    #[arg(long)]
    pub gpu_profile: Option<PathBuf>,
    /// Bytes of hot rows to pin, in MiB [default: the device's persisting-L2 maximum].
    #[arg(long)]
    pub pin_mb: Option<usize>,
    /// The autotuner's cache file [default: $EMBER_TUNE_CACHE or ~/.cache/ember/cuda-tune.json].
    #[arg(long)]
    pub tune_cache: Option<PathBuf>,
}

impl GpuArgs {
    /// The flags of a run on the CPU.
    pub fn cpu() -> GpuArgs {
        GpuArgs {
            device: Device::Cpu,
            gpu: 0,
            gpu_variant: "tuned".into(),
            gpu_profile: None,
            pin_mb: None,
            tune_cache: None,
        }
    }

    pub fn is_cuda(&self) -> bool {
        self.device == Device::Cuda
    }

    /// `serve`'s engines on the GPU: `instances` predictors of `model` in its dense precision,
    /// sharing one copy of it on the device, tuned at start-up on a batch of `max_batch` samples
    /// of 20-id bags (choices cached on disk).
    pub fn engines(
        &self,
        model: &Arc<Model>,
        instances: usize,
        max_batch: usize,
    ) -> anyhow::Result<Vec<Box<dyn ember_model::Engine>>> {
        let first = self.predictor(model.clone(), model.dense_dtype(), max_batch, 20, None)?;
        let mut v: Vec<Box<dyn ember_model::Engine>> = Vec::with_capacity(instances);
        for _ in 1..instances {
            v.push(Box::new(first.sibling()?));
        }
        v.push(Box::new(first));
        Ok(v)
    }

    /// A GPU predictor of `model`, its dense layers in `dense` (f32 or bf16), tuned (choices
    /// cached on disk) on a synthetic batch of `tune_batch` samples with `tune_pooling` ids per
    /// bag. `profile` (else `--gpu-profile`) gives the hot rows of the pinning variants.
    #[cfg(not(feature = "cuda"))]
    pub fn predictor(
        &self,
        _model: Arc<Model>,
        _dense: ember_model::DenseDType,
        _tune_batch: usize,
        _tune_pooling: usize,
        _profile: Option<&[&ember_embed::KeyedJagged]>,
    ) -> anyhow::Result<GpuPredictor> {
        Err(crate::device::no_cuda())
    }

    /// A GPU predictor of `model`, its dense layers in `dense` (f32 or bf16), tuned (choices
    /// cached on disk) on a synthetic batch of `tune_batch` samples with `tune_pooling` ids per
    /// bag.
    #[cfg(feature = "cuda")]
    pub fn predictor(
        &self,
        model: Arc<Model>,
        dense: ember_model::DenseDType,
        tune_batch: usize,
        tune_pooling: usize,
        profile: Option<&[&ember_embed::KeyedJagged]>,
    ) -> anyhow::Result<GpuPredictor> {
        use anyhow::{Context, bail};
        use ember_cuda::{GpuModel, HotPlan, TuneCache, Variant};
        let variant: Variant = self.gpu_variant.parse()?;
        let gpu = crate::device::open_gpu(self.gpu)?;
        let budget = self
            .pin_mb
            .map_or(gpu.info().max_persisting_l2_bytes, |mb| mb << 20);
        let loaded;
        let loaded_refs: Vec<&ember_embed::KeyedJagged>;
        let profile = match (profile, &self.gpu_profile) {
            (Some(p), _) => Some(p),
            (None, Some(path)) => {
                loaded = criteo_profile(&model, path)?;
                loaded_refs = loaded.iter().collect();
                Some(loaded_refs.as_slice())
            }
            (None, None) => None,
        };
        let plan = match (variant.pins_l2(), profile) {
            (false, _) => None,
            (true, Some(batches)) => Some(HotPlan::profile(
                model.embeddings(),
                batches.iter().copied(),
                budget,
            )?),
            (true, None) => bail!(
                "--gpu-variant {variant} pins hot rows in L2 and needs a profile: --gpu-profile FILE"
            ),
        };
        let gm = Arc::new(GpuModel::upload_dense(
            &gpu,
            model.clone(),
            plan.as_ref(),
            dense,
        )?);
        let mut gp = GpuPredictor::new(gm, variant)?;
        let mut cache = match self.tune_cache.clone().or_else(TuneCache::default_path) {
            Some(p) => TuneCache::load(&p)?,
            None => TuneCache::in_memory(),
        };
        let (dense, kj) = ember_model::presets::random_batch(
            model.config(),
            tune_batch.max(1),
            tune_pooling.max(1),
            0x7e57,
        );
        gp.tune(&dense, &kj, &mut cache)
            .context("tuning the embedding kernels")?;
        Ok(gp)
    }
}

/// Up to 100,000 rows of a Criteo file as batches of the model's features (for a hot-row
/// profile).
#[cfg(feature = "cuda")]
fn criteo_profile(
    model: &Model,
    path: &std::path::Path,
) -> anyhow::Result<Vec<ember_embed::KeyedJagged>> {
    use anyhow::Context;
    use ember_model::criteo::{CriteoBatch, CriteoReader};
    let f = ember_embed::files::open_regular(path, "profile data file")
        .with_context(|| format!("cannot open profile {}", path.display()))?;
    let mut reader = CriteoReader::new(std::io::BufReader::new(f), path.display().to_string());
    let names = model.feature_names();
    let rows: Vec<usize> = (0..names.len())
        .map(|f| model.embeddings().table_of(f).rows())
        .collect();
    let mut out = Vec::new();
    let mut batch = CriteoBatch::default();
    let mut total = 0;
    while total < 100_000 {
        let n = reader.next_batch(4096, &mut batch)?;
        if n == 0 {
            break;
        }
        total += n;
        out.push(batch.sparse(&names, &rows)?);
    }
    Ok(out)
}
