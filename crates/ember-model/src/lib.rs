//! Ember's models: DLRM (facebookresearch/dlrm and TorchRec `DLRM`) and DCNv2 (TorchRec
//! `DLRM_DCN`), loaded from a model directory (`config.json` + `model.safetensors`, see
//! `docs/model-format.md`), run by a [`Predictor`]: the embedding stage of `ember-embed`, MLPs on
//! `faer` with a GEMV path for single samples, the interactions, and the sigmoid. Also Criteo TSV
//! data, a synthetic Criteo generator, and the evaluation metrics (AUC, log loss).
//!
//! The seam a server or a tool uses is small: [`Model::check_samples`] / [`Model::merge`] /
//! [`Model::batch`] check inputs once, [`Model::prepare`] stages tier rows, and an [`Engine`]
//! ([`Predictor`] on CPU, the CUDA backend's `GpuPredictor`) runs the prepared batch;
//! [`Model::tier`] tells a server the tier's counters and its remote store's health. See
//! `docs/architecture.md` for the path of a request through it.

pub mod accuracy;
pub mod config;
pub mod criteo;
pub mod dense;
mod engine;
mod error;
pub mod eval;
pub mod family;
#[cfg(target_arch = "x86_64")]
mod gemm;
pub mod graph;
pub mod history;
pub mod hstu;
mod inputs;
pub mod interaction;
pub mod lowp;
pub mod mlp;
mod model;
mod outputs;
mod predictor;
pub mod presets;
pub mod random;
pub mod registry;
pub mod sequence;
pub mod serving;
mod simd;
pub mod synth;
mod tier;
pub mod weights;

pub use config::{InteractionConfig, ModelConfig, PairOrder};
pub use dense::{DenseDType, DenseIsa};
/// How many times ids were checked against a model's tables in this process: tests use it to
/// prove that a served request is checked exactly once.
#[doc(hidden)]
pub use ember_embed::id_checks;
/// The embedding stage's types that appear in this crate's API for tools and engines
/// (`predict`, the benchmarks, the GPU engine), so that they need no other crate for them. A
/// server needs none: it sees the tier through [`Model::tier`].
pub use ember_embed::{DType, KeyedJagged, Placement, Shard, StagedBatch};
/// The seam's input columns: a request's ids (32-bit where every table allows,
/// [`Inputs::narrow_ids`]) and its lengths per (feature, sample), as a decoder builds them for
/// [`Model::check_samples`]. The only types of the embedding stage a server names (the
/// architecture test checks it).
pub use ember_embed::{Ids, Lengths};
pub use ember_tier::TierStats;
pub use engine::{Engine, LayerTime, StageTimes};
pub use error::{ErrorKind, Invalid, IsaError, ModelError, Result};
pub use family::{AnyConfig, AnyModel};
pub use inputs::{Batch, Inputs, Prepared, Samples};
pub use mlp::sigmoid;
pub use model::{
    BatchBuffers, LoadOptions, Model, NamedTensor, Pace, RecordOptions, RemoteOverride, dir_name,
    random_dense_tensors,
};
pub use predictor::Predictor;
pub use tier::{StoreNode, Tier, TierCounters};

/// Prepares items ahead of the thread that consumes them (the tier's next-batch prefetch):
/// `predict` and the server's batcher stage batch N+1's rows while batch N computes. See
/// [`ember_tier::run_ahead`].
pub use ember_tier::run_ahead;

/// The names of the metrics the embedding stage records, for a server to describe.
pub use ember_tier::metric_names;
