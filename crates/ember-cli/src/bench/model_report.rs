//! `bench model`'s report: what the timed batches measured, on the CPU or the GPU.

use ember_embed::KeyedJagged;
use ember_model::StageTimes;
use std::time::Duration;

/// One input batch: dense values and sparse ids.
pub(super) type Inputs = (Vec<f32>, KeyedJagged);

/// What the timed batches measured.
#[derive(Debug)]
pub(super) struct Report {
    /// Milliseconds of each timed batch.
    pub(super) lat_ms: Vec<f64>,
    /// Samples in the timed batches.
    pub(super) samples: usize,
    /// The stages' times summed over the timed batches.
    pub(super) stages: StageTimes,
    /// Wall seconds of the timed batches.
    pub(super) total: f64,
    /// On a GPU, the host's part of the timed batches.
    pub(super) host: Option<HostTimes>,
    /// bf16 / int8 dense layers: each layer's time and its share of the ceiling.
    pub(super) layers: Option<super::dense_layers::LayerReport>,
    /// `--accuracy`: the dense dtype's scores against f32's.
    pub(super) accuracy: Option<ember_model::accuracy::DenseAccuracy>,
}

/// Where the host thread spent a GPU loop's time, summed over the timed batches.
#[derive(Debug, Default)]
pub(super) struct HostTimes {
    /// `submit`: dense values and ids checked as they are staged in page-locked memory (one
    /// pass), the copy and forward pass enqueued.
    pub(super) submit: Duration,
    /// `collect`: waiting for the oldest batch's logits.
    pub(super) wait: Duration,
}
