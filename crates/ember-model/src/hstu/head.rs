//! The last step of the HSTU forward pass: the candidates' rows of the transducer's output,
//! the postprocessor (the reference's `TimestampLayerNormPostprocessor`: the time of day and of
//! the week as (cos, sin), a linear layer, a layer norm; or a layer norm; or an L2 norm), times
//! the item MLP of the candidates' item rows, into the prediction head, and a sigmoid per binary
//! task.

use super::config::TaskType;
use super::layers::{DenseCtx, sigmoid};
use super::plan::{TIME_FEATURE_WIDTH, candidate_tokens, time_features};
use super::request::HstuBatch;
use super::{HstuModel, Postprocessor};

/// Scores of a batch: per task, one per candidate, users one after another.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HstuScores {
    /// Task names, in the model's order.
    pub tasks: Vec<String>,
    /// `scores[task][candidate]`.
    pub scores: Vec<Vec<f32>>,
    /// User `u`'s candidates are `offsets[u] .. offsets[u + 1]`.
    pub offsets: Vec<usize>,
}

impl HstuScores {
    /// User `u`'s scores of task `t`.
    pub fn user(&self, t: usize, u: usize) -> &[f32] {
        &self.scores[t][self.offsets[u]..self.offsets[u + 1]]
    }
}

/// The head's buffers, reused across batches.
#[derive(Debug, Default)]
pub(crate) struct HeadScratch {
    cand: Vec<f32>,
    item: Vec<f32>,
    logits: Vec<f32>,
}

/// Step 5: the candidates' scores (`x` and `emb` hold candidate token `t` at row `at(t)`).
pub(crate) fn head(
    model: &HstuModel,
    dense: &mut DenseCtx,
    x: &[f32],
    emb: &[f32],
    batch: &HstuBatch,
    at: &dyn Fn(usize) -> usize,
    s: &mut HeadScratch,
) -> HstuScores {
    let (roles, w) = (&model.roles, &model.weights);
    let d = model.config.dim();
    let td = model.config.hstu.hstu_embedding_table_dim;
    let total = model.embeddings().total_dim();
    let n = batch.candidates();
    // The candidates' rows of the transducer's output, their query times, their item rows.
    s.cand.clear();
    let items = roles.items.len() * td;
    s.item.clear();
    let item_cols: Vec<_> = roles.items.iter().map(|&f| model.cols(f)).collect();
    let mut qtimes = Vec::with_capacity(n);
    let offsets = candidate_tokens(batch, |t| {
        qtimes.push(batch.times[t]);
        let r = at(t);
        s.cand.extend_from_slice(&x[r * d..(r + 1) * d]);
        let row = &emb[r * total..(r + 1) * total];
        for c in &item_cols {
            s.item.extend_from_slice(&row[c.clone()]);
        }
    });
    let mut user = vec![0.0f32; n * d];
    match &w.post {
        Postprocessor::Timestamp { combiner, norm } => {
            let k = d + TIME_FEATURE_WIDTH;
            let mut feats = Vec::with_capacity(n * k);
            for (c, &ts) in s.cand.chunks_exact(d).zip(&qtimes) {
                feats.extend_from_slice(c);
                feats.extend_from_slice(&time_features(ts));
            }
            dense.linear(combiner, &feats, k, n, &mut user);
            norm.rows_in_place(&mut user);
        }
        Postprocessor::LayerNorm(norm) => {
            user.copy_from_slice(&s.cand);
            norm.rows_in_place(&mut user);
        }
        Postprocessor::L2 => {
            user.copy_from_slice(&s.cand);
            for r in user.chunks_exact_mut(d) {
                let norm = r
                    .iter()
                    .map(|v| (*v as f64).powi(2))
                    .sum::<f64>()
                    .sqrt()
                    .max(1e-6) as f32;
                r.iter_mut().for_each(|v| *v /= norm);
            }
        }
    }
    let mut item = vec![0.0f32; n * d];
    w.item.forward(dense, &s.item, items, n, &mut item);
    user.iter_mut().zip(&item).for_each(|(u, i)| *u *= i);
    let tasks = model.config.hstu.multitask_configs.len();
    s.logits.resize(n * tasks, 0.0);
    w.head.forward(dense, &user, d, n, &mut s.logits);
    HstuScores::from_logits(model, &s.logits, offsets)
}

impl HstuScores {
    /// The scores of the head's `logits` (`[candidates, tasks]`): a sigmoid for each binary
    /// task, the logit itself for a regression task.
    pub fn from_logits(model: &HstuModel, logits: &[f32], offsets: Vec<usize>) -> HstuScores {
        let configs = &model.config.hstu.multitask_configs;
        let tasks = configs.len().max(1);
        let n = logits.len() / tasks;
        let mut scores = vec![Vec::with_capacity(n); configs.len()];
        for (k, task) in configs.iter().enumerate() {
            let sig = task.task_type == TaskType::BinaryClassification;
            scores[k].extend(
                logits
                    .iter()
                    .skip(k)
                    .step_by(tasks)
                    .map(|&z| if sig { sigmoid(z) } else { z }),
            );
        }
        HstuScores {
            tasks: model.tasks(),
            scores,
            offsets,
        }
    }
}
