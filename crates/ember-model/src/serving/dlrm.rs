//! The DLRM family (DLRM, DCNv2) behind the seam: a request is [`Samples`] (`dense` and a bag
//! per sparse feature), a batch a [`Prepared`] one, run by any [`Engine`] (the CPU
//! [`crate::Predictor`], the CUDA backend's) through [`EngineRunner`].

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use super::{
    Batched, InputColumns, InputKind, InputSpec, Items, Outputs, Request, Runner, Servable,
    Signature, Times, Workload,
};
use crate::dense::{DenseDType, DenseIsa};
use crate::engine::{Engine, LayerTime, StageTimes};
use crate::error::{ModelError, Result};
use crate::inputs::{Inputs, Prepared, Samples};
use crate::model::{Model, Spare};
use crate::tier::Tier;

/// The output's name.
pub use crate::config::SCORES;

/// Samples a synthetic request holds unless asked otherwise.
const DEFAULT_SAMPLES: usize = 64;

/// The stages of [`StageTimes`].
const STAGES: [&str; 4] = ["embedding", "bottom_mlp", "interaction", "top_mlp"];
/// A graph model's stages.
const GRAPH_STAGES: [&str; 2] = ["embedding", "graph"];

impl Items for Samples {
    fn len(&self) -> usize {
        Samples::len(self)
    }
    fn pieces(&self, max: usize) -> Box<dyn Iterator<Item = Request> + Send + '_> {
        Box::new(Samples::pieces(self, max).map(|s| Box::new(s) as Request))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// The samples of a request of a DLRM-family model (`None` for another family's).
pub fn into_samples(r: Request) -> Option<Samples> {
    r.into_any().downcast::<Samples>().ok().map(|b| *b)
}

/// The signature of a model taking `inputs`: `dense` FP32 `[n, dense_in]`, then per sparse
/// feature `F`, `F_lengths` and `F_ids`; one output, `scores` (a graph model: its named
/// outputs, one value per sample each, and its own stages, [`with_outputs`]).
pub(crate) fn signature(inputs: &Inputs) -> Signature {
    let mut v = vec![InputSpec {
        name: "dense".into(),
        kind: InputKind::Floats {
            width: inputs.dense_in,
        },
        required: true,
    }];
    for (f, (name, &rows)) in inputs.features.iter().zip(&inputs.rows).enumerate() {
        v.push(InputSpec {
            name: format!("{name}_lengths"),
            kind: InputKind::Lengths,
            required: true,
        });
        v.push(InputSpec {
            name: format!("{name}_ids"),
            kind: InputKind::Values {
                lengths: 1 + 2 * f,
                rows: Some(rows as u64),
            },
            required: true,
        });
    }
    Signature {
        inputs: v,
        outputs: vec![SCORES.into()],
        offsets: None,
        item: "sample",
        stages: STAGES.to_vec(),
        narrow_values: inputs.narrow_ids,
    }
}

/// `sig` with `model`'s outputs and stages.
fn with_outputs(mut sig: Signature, model: &Model) -> Signature {
    if model.graph().is_some() {
        sig.outputs = model.config().output_names();
        sig.stages = GRAPH_STAGES.to_vec();
    }
    sig
}

impl Servable for Model {
    fn signature(&self) -> Signature {
        with_outputs(signature(&self.inputs()), self)
    }

    fn check(&self, c: InputColumns) -> Result<Request> {
        Ok(Box::new(
            self.check_samples(c.n, c.floats, c.lengths, c.values)?,
        ))
    }

    fn bags(&self) -> Option<Inputs> {
        Some(self.inputs())
    }

    fn prepare(&self, parts: &[&dyn Items]) -> Result<Batched> {
        let samples = parts
            .iter()
            .map(|p| {
                p.as_any()
                    .downcast_ref::<Samples>()
                    .ok_or_else(|| ModelError::Input("a request of another model's family".into()))
            })
            .collect::<Result<Vec<&Samples>>>()?;
        let reuse = self.spare().take();
        let prepared = Model::prepare(self, self.merge_reusing(&samples, reuse)?)?;
        Ok(Box::new(PreparedBatch {
            prepared: Some(prepared),
            spare: self.spare().clone(),
        }))
    }

    fn prefetch_depth(&self) -> usize {
        Model::prefetch_depth(self)
    }

    fn warm_request(&self, most: usize, seed: u64) -> Request {
        let config = self.config();
        let features = config.features().len();
        let (n, per_bag) = warm_shape(most, features);
        let samples = random_samples(self, n, &vec![per_bag; features], seed)
            .expect("random samples of the model's own tables check");
        Box::new(samples)
    }

    fn synthetic(&self, w: &Workload, seed: u64) -> Result<Request> {
        for (set, option) in [
            (w.history.is_some(), "history"),
            (w.candidates.is_some(), "candidates"),
        ] {
            if set {
                return Err(Workload::unused(option, "sample"));
            }
        }
        let config = self.config();
        let features = config.features().len();
        let pooling = match w.pooling.as_deref() {
            None => vec![1; features],
            Some(&[n]) => vec![n; features],
            Some(p) if p.len() == features => p.to_vec(),
            Some(p) => {
                return Err(ModelError::BadOption {
                    option: "pooling",
                    reason: format!(
                        "{} sizes for a model of {features} sparse features (give one for all, \
                         or one each)",
                        p.len()
                    ),
                });
            }
        };
        let n = w.items.unwrap_or(DEFAULT_SAMPLES);
        Ok(Box::new(random_samples(self, n, &pooling, seed)?))
    }

    fn flops(&self, items: &dyn Items) -> Vec<(&'static str, f64)> {
        if self.graph().is_some() {
            return Vec::new();
        }
        let n = items.len() as f64;
        let macs = crate::presets::stage_macs(self.config());
        STAGES[1..]
            .iter()
            .zip(macs)
            .map(|(&stage, m)| (stage, 2.0 * m as f64 * n))
            .collect()
    }

    fn tier(&self) -> Tier<'_> {
        Model::tier(self)
    }

    fn parameters(&self) -> Vec<(&'static str, String)> {
        let dtype = self.dense_dtype();
        let kernels = DenseIsa::selected(dtype).map_or("?", |i| i.describe(dtype));
        let mut v = vec![
            ("dense_dtype", dtype.name().to_string()),
            ("dense_kernels", kernels.to_string()),
        ];
        if let Some(g) = self.graph() {
            let (linear, ops) = g.steps();
            v.push((
                "dense_graph",
                format!("{linear} linear layers on Ember's kernels, {ops} other ops"),
            ));
        }
        v
    }

    fn placements(&self) -> Vec<&'static str> {
        self.config()
            .tables
            .iter()
            .map(|t| t.placement.name())
            .collect()
    }

    fn dense_dtype(&self) -> DenseDType {
        Model::dense_dtype(self)
    }

    fn records_lookups(&self) -> bool {
        true
    }

    fn record_accesses(&self, opts: crate::model::RecordOptions) -> Result<()> {
        Model::record_accesses(self, opts)
    }

    fn write_profile(&self, dir: &std::path::Path) -> Result<Vec<std::path::PathBuf>> {
        Model::write_profile(self, dir)
    }

    fn cpu_runner(self: Arc<Self>, threads: usize) -> Result<Box<dyn Runner>> {
        let p = crate::Predictor::new(self, threads.max(1))?;
        Ok(Box::new(EngineRunner::new(Box::new(p))))
    }

    fn release(self: Arc<Self>, pause: Duration) -> Option<Arc<dyn Servable>> {
        match Arc::try_unwrap(self) {
            Ok(m) => {
                m.release(pause);
                None
            }
            Err(held) => Some(held),
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn into_any_arc(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

/// Ids a warm batch looks up at most: a model of a million features (a config the server
/// takes) warmed with full batches of 8 ids per bag looked up 4 billion ids, 150 s before it
/// served.
const WARM_IDS: usize = 1 << 20;

/// The samples and ids per bag of a warm batch of a model of `features` sparse features: up to
/// `n` random samples of `model`, `pooling[f]` ids in each bag of feature `f`, checked.
fn random_samples(model: &Model, n: usize, pooling: &[usize], seed: u64) -> Result<Samples> {
    let (dense, sparse) = crate::presets::random_batch_pooled(model.config(), n, pooling, seed);
    let lengths: Vec<u32> = sparse
        .offsets()
        .windows(2)
        .map(|w| (w[1] - w[0]) as u32)
        .collect();
    model.check_samples(n, dense, lengths, sparse.ids().clone())
}

/// `n` samples of 8 ids per bag, fewer where that passes [`WARM_IDS`] (at least one sample of
/// one id per bag).
fn warm_shape(n: usize, features: usize) -> (usize, usize) {
    let per_bag = if features * 8 <= WARM_IDS { 8 } else { 1 };
    let samples = (WARM_IDS / (features * per_bag).max(1)).clamp(1, n.max(1));
    (samples, per_bag)
}

/// A batch as [`Servable::prepare`] made it: when it is dropped, its buffers go to the model's
/// [`Spare`] for a later merge.
struct PreparedBatch {
    prepared: Option<Prepared<'static>>,
    spare: Spare,
}

impl Drop for PreparedBatch {
    fn drop(&mut self) {
        if let Some(b) = self
            .prepared
            .take()
            .and_then(|p| p.into_batch().into_buffers())
        {
            self.spare.keep(b);
        }
    }
}

/// Any [`Engine`] of a DLRM-family model as a [`Runner`].
pub struct EngineRunner {
    engine: Box<dyn Engine>,
    servable: Arc<dyn Servable>,
    depth: usize,
    /// Whether the model is a graph model (its times in [`GRAPH_STAGES`]).
    graph: bool,
}

impl std::fmt::Debug for EngineRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineRunner")
            .field("device", &self.engine.device())
            .finish()
    }
}

impl EngineRunner {
    pub fn new(engine: Box<dyn Engine>) -> Self {
        let model = engine.model().clone();
        let depth = model.prefetch_depth();
        let graph = model.graph().is_some();
        EngineRunner {
            engine,
            servable: model,
            depth,
            graph,
        }
    }
}

impl Runner for EngineRunner {
    fn servable(&self) -> &Arc<dyn Servable> {
        &self.servable
    }

    fn run(&mut self, batch: &Batched, out: &mut Outputs) -> Result<Times> {
        let p = batch
            .downcast_ref::<PreparedBatch>()
            .and_then(|b| b.prepared.as_ref())
            .ok_or_else(|| ModelError::Input("a batch of another model's family".into()))?;
        let times = self.engine.run_outputs(p, out)?;
        // Staged on this thread (no prefetch): staging is part of the embedding stage.
        let times = match self.depth {
            0 => self.engine.model().staged_inline(p, times),
            _ => times,
        };
        Ok(match self.graph {
            true => graph_times(times),
            false => times.into(),
        })
    }

    fn time_layers(&mut self) {
        self.engine.time_layers();
    }

    fn layer_times(&self) -> Vec<LayerTime> {
        self.engine.layer_times()
    }

    fn device(&self) -> String {
        self.engine.device()
    }
}

impl From<StageTimes> for Times {
    fn from(t: StageTimes) -> Times {
        Times {
            wall: t.wall,
            embedding: t.embedding,
            dense: t.dense(),
            copy_in: t.copy_in,
            copy_out: t.copy_out,
            stages: STAGES
                .into_iter()
                .zip([t.embedding, t.bottom_mlp, t.interaction, t.top_mlp])
                .collect(),
            overlapped: match t.bottom_overlapped {
                true => vec![STAGES[1]],
                false => Vec::new(),
            },
        }
    }
}

/// A graph model's times: the embedding stage, then its graph.
fn graph_times(t: StageTimes) -> Times {
    Times {
        wall: t.wall,
        embedding: t.embedding,
        dense: t.dense(),
        copy_in: t.copy_in,
        copy_out: t.copy_out,
        stages: GRAPH_STAGES
            .into_iter()
            .zip([t.embedding, t.graph])
            .collect(),
        overlapped: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warm_batch_looks_up_a_bounded_number_of_ids() {
        // The shipped model: 128 samples of 8 ids per bag.
        assert_eq!(warm_shape(128, 26), (128, 8));
        assert_eq!(warm_shape(16, 26), (16, 8));
        for features in [
            0, 1, 26, 1000, 100_000, 131_072, 131_073, 1_000_000, 5_000_000,
        ] {
            let (samples, per_bag) = warm_shape(128, features);
            assert!((1..=128).contains(&samples), "{features}: {samples}");
            assert!(per_bag == 1 || per_bag == 8, "{features}: {per_bag}");
            // Within the bound, or one sample of one id per bag where even that passes it.
            assert!(
                samples * features * per_bag <= WARM_IDS || (samples, per_bag) == (1, 1),
                "{features}: {samples} x {per_bag}"
            );
        }
        assert_eq!(warm_shape(128, 1_000_000), (1, 1));
        assert_eq!(warm_shape(0, 26), (1, 8));
    }
}
