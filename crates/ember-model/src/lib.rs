//! Ember's models: DLRM (facebookresearch/dlrm and TorchRec `DLRM`) and DCNv2 (TorchRec
//! `DLRM_DCN`), loaded from a model directory (`config.json` + `model.safetensors`, see
//! `docs/model-format.md`), run by a [`Predictor`]: the embedding stage of `ember-embed`, MLPs on
//! `faer` with a GEMV path for single samples, the interactions, and the sigmoid. Also Criteo TSV
//! data, a synthetic Criteo generator, and the metrics (AUC, log loss).

pub mod config;
pub mod criteo;
pub mod error;
#[cfg(target_arch = "x86_64")]
pub mod gemm;
pub mod interaction;
pub mod metrics;
pub mod mlp;
pub mod model;
pub mod presets;
pub mod random;
pub mod simd;
pub mod synth;
pub mod weights;

pub use config::{InteractionConfig, ModelConfig, PairOrder};
pub use error::{ModelError, Result};
pub use model::{LoadOptions, Model, Predictor, Scorer, StageTimes, sigmoid};
