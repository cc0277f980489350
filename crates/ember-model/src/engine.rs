//! The second half of the seam: an [`Engine`] runs prepared batches of a model, on the CPU
//! ([`crate::Predictor`]) or on a device (the CUDA backend's `GpuPredictor`). A server holds one
//! engine on its batching thread and sees nothing of the model below this trait and
//! [`crate::Model::prepare`].

use std::sync::Arc;
use std::time::Duration;

use ember_embed::KeyedJagged;

use crate::error::Result;
use crate::inputs::Prepared;
use crate::model::Model;
use crate::outputs::Outputs;

/// Runs a model's forward pass on prepared batches (see [`Model::prepare`] for how a batch is
/// checked and prepared). Errors are typed: [`crate::ModelError::kind`] tells a caller's mistake
/// from a failure of the engine.
pub trait Engine: Send {
    /// The model it runs.
    fn model(&self) -> &Arc<Model>;

    /// Runs `batch`: each sample's probability into `scores` (one per sample). The times are
    /// the forward pass's; staging the batch is not in them (see [`Engine::score`]).
    fn run(&mut self, batch: &Prepared<'_>, scores: &mut [f32]) -> Result<StageTimes>;

    /// Runs `batch`: each of the model's outputs ([`crate::ModelConfig::output_names`]), one
    /// value per sample, into `out`. By default the one output of [`Engine::run`].
    fn run_outputs(&mut self, batch: &Prepared<'_>, out: &mut Outputs) -> Result<StageTimes> {
        out.reset(1);
        out.values[0].resize(batch.len(), 0.0);
        self.run(batch, &mut out.values[0])
    }

    /// The device it runs on, for logs (`cpu (2 threads)`, `cuda:0 NVIDIA H100 ...`).
    fn device(&self) -> String;

    /// Starts timing each reduced-precision dense layer ([`Engine::layer_times`]).
    fn time_layers(&mut self) {}

    /// Each timed layer's time since [`Engine::time_layers`]; empty where the engine does not
    /// time its layers.
    fn layer_times(&self) -> Vec<LayerTime> {
        Vec::new()
    }

    /// Checks, prepares and runs one batch on the calling thread, for callers that score a
    /// batch at a time: staging the tier rows is part of the embedding stage's time, and all of
    /// it is a stall.
    fn score(
        &mut self,
        dense: &[f32],
        sparse: &KeyedJagged,
        scores: &mut [f32],
    ) -> Result<StageTimes> {
        let model = self.model().clone();
        let prepared = model.prepare(model.batch(dense, sparse)?)?;
        let times = self.run(&prepared, scores)?;
        Ok(model.staged_inline(&prepared, times))
    }

    /// [`Engine::score`] of every output ([`Engine::run_outputs`]).
    fn score_outputs(
        &mut self,
        dense: &[f32],
        sparse: &KeyedJagged,
        out: &mut Outputs,
    ) -> Result<StageTimes> {
        let model = self.model().clone();
        let prepared = model.prepare(model.batch(dense, sparse)?)?;
        let times = self.run_outputs(&prepared, out)?;
        Ok(model.staged_inline(&prepared, times))
    }
}

impl Model {
    /// The times of a batch whose rows were staged on the thread that then ran it: staging is
    /// added to the embedding stage and the wall time, and counted as a stall.
    pub fn staged_inline(&self, batch: &Prepared<'_>, mut times: StageTimes) -> StageTimes {
        if batch.staged().is_some() {
            let st = batch.staging_time();
            self.record_stall(st);
            times.embedding += st;
            times.wall += st;
        }
        times
    }
}

/// Where one forward pass spent its time. With more than one thread the bottom MLP runs on one
/// thread beside the embedding stage (`bottom_overlapped`): `embedding` is then the wall time of
/// both, `bottom_mlp` the part the MLP took on its thread, and the stages add up to more than
/// `wall`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageTimes {
    pub embedding: Duration,
    pub bottom_mlp: Duration,
    pub interaction: Duration,
    pub top_mlp: Duration,
    /// A graph model's dense part (its graph; the MLPs and the interaction are then zero).
    pub graph: Duration,
    /// The whole forward pass.
    pub wall: Duration,
    pub bottom_overlapped: bool,
    /// On a GPU: the batch's copy to the device and its logits' copy back (copy-stream times,
    /// outside `wall`); zero on the CPU.
    pub copy_in: Duration,
    pub copy_out: Duration,
}

impl StageTimes {
    /// The wall time of the forward pass.
    pub fn total(&self) -> Duration {
        self.wall
    }

    /// The dense layers' time on the critical path: the top of the network, plus the bottom
    /// MLP when it did not run beside the embedding stage.
    pub fn dense(&self) -> Duration {
        match self.bottom_overlapped {
            true => self.interaction + self.top_mlp + self.graph,
            false => self.bottom_mlp + self.interaction + self.top_mlp + self.graph,
        }
    }

    /// Field-wise sum.
    pub fn plus(self, o: StageTimes) -> StageTimes {
        StageTimes {
            embedding: self.embedding + o.embedding,
            bottom_mlp: self.bottom_mlp + o.bottom_mlp,
            interaction: self.interaction + o.interaction,
            top_mlp: self.top_mlp + o.top_mlp,
            graph: self.graph + o.graph,
            wall: self.wall + o.wall,
            bottom_overlapped: self.bottom_overlapped || o.bottom_overlapped,
            copy_in: self.copy_in + o.copy_in,
            copy_out: self.copy_out + o.copy_out,
        }
    }
}

/// One dense layer's time over the batches a predictor ran while timing.
#[derive(Debug, Clone)]
pub struct LayerTime {
    /// `bottom0`.., `cross0.V`, `cross0.W`.., `top0`..
    pub name: String,
    pub in_dim: usize,
    pub out_dim: usize,
    pub time: std::time::Duration,
}

impl LayerTime {
    /// Floating-point (or integer) operations per sample: two per multiply-add.
    pub fn ops_per_sample(&self) -> f64 {
        2.0 * self.in_dim as f64 * self.out_dim as f64
    }
}
