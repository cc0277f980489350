//! What a bf16 or int8 dense path keeps of the f32 model's accuracy, judged as MLPerf judges
//! it: the AUC of its scores must be at least 99% (or 99.9%, the high-accuracy target) of the
//! reference's. Without a labelled data set, the labels are drawn from the f32 model's own
//! probabilities (`label = u < p_f32`, `u` uniform): the f32 scores are then the best possible
//! ranking in expectation, and the AUC a lower precision loses is what its errors reorder.

use std::sync::Arc;

use ember_embed::KeyedJagged;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::dense::{DenseDType, DenseIsa};
use crate::engine::Engine;
use crate::error::{ModelError, Result};
use crate::eval::auc;
use crate::model::Model;
use crate::outputs::Outputs;
use crate::predictor::Predictor;

/// MLPerf's high-accuracy target: 99.9% of the reference AUC.
pub const HIGH_ACCURACY: f64 = 0.999;

/// Scores of one dense precision against f32 on the same samples.
#[derive(Debug, Clone)]
pub struct DenseAccuracy {
    pub dtype: DenseDType,
    /// The family the scores came from.
    pub isa: Option<DenseIsa>,
    pub samples: usize,
    /// AUC of the f32 scores against the drawn labels.
    pub auc_f32: f64,
    /// AUC of this precision's scores against the same labels.
    pub auc: f64,
    /// Largest and mean absolute difference of the probabilities from f32's.
    pub max_abs: f64,
    pub mean_abs: f64,
    /// A model of several outputs (a graph model's heads): the one these figures are of, the
    /// one that keeps the least of f32's AUC (`None`: the model's one output).
    pub output: Option<String>,
}

impl DenseAccuracy {
    /// `auc / auc_f32`.
    pub fn ratio(&self) -> f64 {
        self.auc / self.auc_f32
    }

    /// Whether the ratio reaches `target` (e.g. [`HIGH_ACCURACY`]).
    pub fn meets(&self, target: f64) -> bool {
        self.ratio() >= target
    }
}

/// Scores the batches `inputs(i)` (`i` in `0..batches`) with the dense layers in f32 and in
/// `dtype`, draws a label per sample from the f32 probability (seeded by `seed`), and compares.
pub fn dense_accuracy(
    model: &Arc<Model>,
    dtype: DenseDType,
    threads: usize,
    batches: usize,
    inputs: impl FnMut(usize) -> (Vec<f32>, KeyedJagged),
    seed: u64,
) -> Result<DenseAccuracy> {
    let mut low = Predictor::new(model.clone(), threads)?;
    low.set_dense_dtype(dtype)?;
    let isa = low.dense().1;
    let mut acc = dense_accuracy_of(model, &mut low, dtype, threads, batches, inputs, seed)?;
    acc.isa = isa;
    Ok(acc)
}

/// [`dense_accuracy`] of any engine of `model` whose dense layers run in `dtype` (a GPU's,
/// say), against the CPU's f32 scores on `threads` threads. `isa` is left `None`.
pub fn dense_accuracy_of(
    model: &Arc<Model>,
    low: &mut dyn Engine,
    dtype: DenseDType,
    threads: usize,
    batches: usize,
    mut inputs: impl FnMut(usize) -> (Vec<f32>, KeyedJagged),
    seed: u64,
) -> Result<DenseAccuracy> {
    let mut reference = Predictor::new(model.clone(), threads)?;
    reference.set_dense_dtype(DenseDType::F32)?;
    let names = model.config().output_names();
    let (mut f32s, mut lows) = (vec![Vec::new(); names.len()], vec![Vec::new(); names.len()]);
    let (mut a, mut b) = (Outputs::default(), Outputs::default());
    for i in 0..batches {
        let (dense, sparse) = inputs(i);
        reference.score_outputs(&dense, &sparse, &mut a)?;
        low.score_outputs(&dense, &sparse, &mut b)?;
        for k in 0..names.len() {
            f32s[k].extend_from_slice(&a.values[k]);
            lows[k].extend_from_slice(&b.values[k]);
        }
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let mut worst: Option<DenseAccuracy> = None;
    for (k, name) in names.iter().enumerate() {
        let mut acc = compare(&f32s[k], &lows[k], &mut rng)?;
        acc.dtype = dtype;
        acc.output = (names.len() > 1).then(|| name.clone());
        if worst.as_ref().is_none_or(|w| acc.ratio() < w.ratio()) {
            worst = Some(acc);
        }
    }
    worst.ok_or_else(|| ModelError::Input("the model gives no output".into()))
}

/// One output's scores in f32 and in the lower precision, against labels drawn from f32's
/// probabilities: the outputs themselves where they all lie in [0, 1], else their sigmoid (a
/// graph model's head may give a logit); the AUC compares ranks, so only the labels see it.
fn compare(f32s: &[f32], lows: &[f32], rng: &mut StdRng) -> Result<DenseAccuracy> {
    let logits = f32s.iter().any(|p| !(0.0..=1.0).contains(p));
    let labels: Vec<f32> = f32s
        .iter()
        .map(|&v| {
            let p = if logits { crate::mlp::sigmoid(v) } else { v };
            f32::from(rng.random::<f32>() < p)
        })
        .collect();
    let none = || ModelError::Input("the accuracy check drew labels of one class only".into());
    let auc_f32 = auc(&labels, f32s).ok_or_else(none)?;
    let auc_low = auc(&labels, lows).ok_or_else(none)?;
    let diffs = f32s.iter().zip(lows).map(|(a, b)| (a - b).abs() as f64);
    let (max_abs, sum) = diffs.fold((0f64, 0f64), |(m, s), d| (m.max(d), s + d));
    Ok(DenseAccuracy {
        dtype: DenseDType::F32,
        isa: None,
        samples: f32s.len(),
        auc_f32,
        auc: auc_low,
        max_abs,
        mean_abs: sum / f32s.len().max(1) as f64,
        output: None,
    })
}

/// Samples the check at load scores (16 batches of 256).
pub const LOAD_CHECK_SAMPLES: usize = 4096;

/// The check a model gets at load when its dense layers run in bf16 or int8: random inputs of
/// its shape (dense values uniform in [-1, 1), one uniform id per feature, `max_len` per
/// sequence feature), scored in f32 and in its dense dtype ([`dense_accuracy`]); `None` for f32.
pub fn check_at_load(model: &Arc<Model>, threads: usize) -> Result<Option<DenseAccuracy>> {
    let dtype = model.dense_dtype();
    if dtype == DenseDType::F32 {
        return Ok(None);
    }
    let cfg = model.config().clone();
    let batch = 256;
    let ids: Vec<usize> = cfg
        .features()
        .iter()
        .map(|f| f.max_len.unwrap_or(1))
        .collect();
    let inputs =
        |i: usize| crate::presets::random_batch_pooled(&cfg, batch, &ids, 0xacc0 + i as u64);
    dense_accuracy(
        model,
        dtype,
        threads,
        LOAD_CHECK_SAMPLES / batch,
        inputs,
        17,
    )
    .map(Some)
}
