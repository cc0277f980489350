//! The last step of the HSTU forward pass: the candidates' rows of the transducer's output,
//! the postprocessor (the reference's `TimestampLayerNormPostprocessor`: the time of day and of
//! the week as (cos, sin), a linear layer, a layer norm; or a layer norm; or an L2 norm), times
//! the item MLP of the candidates' item rows, into the prediction head, and a sigmoid per binary
//! task.

use super::config::TaskType;
use super::layers::{DenseCtx, sigmoid};
use super::request::HstuBatch;
use super::{HstuModel, Postprocessor, TIME_FEATURES};

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

/// Step 5: the candidates' scores.
pub(crate) fn head(
    model: &HstuModel,
    dense: &mut DenseCtx,
    x: &[f32],
    emb: &[f32],
    batch: &HstuBatch,
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
    let mut offsets = vec![0];
    for u in batch.users() {
        let c0 = u.start + batch.slots() + u.history;
        for t in c0..c0 + u.candidates {
            s.cand.extend_from_slice(&x[t * d..(t + 1) * d]);
            qtimes.push(batch.times[t]);
            let row = &emb[t * total..(t + 1) * total];
            for c in &item_cols {
                s.item.extend_from_slice(&row[c.clone()]);
            }
        }
        offsets.push(offsets.last().unwrap() + u.candidates);
    }
    let mut user = vec![0.0f32; n * d];
    match &w.post {
        Postprocessor::Timestamp { combiner, norm } => {
            let k = d + 2 * TIME_FEATURES.len();
            let mut feats = Vec::with_capacity(n * k);
            for (c, &ts) in s.cand.chunks_exact(d).zip(&qtimes) {
                feats.extend_from_slice(c);
                for (period, units) in TIME_FEATURES {
                    let a = time_angle(ts, period, units);
                    feats.push(a.cos());
                    feats.push(a.sin());
                }
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
    let mut scores = vec![Vec::with_capacity(n); tasks];
    for (k, task) in model.config.hstu.multitask_configs.iter().enumerate() {
        let sig = task.task_type == TaskType::BinaryClassification;
        scores[k].extend(
            s.logits
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

/// The reference's angle of `ts` within a period (`TimestampLayerNormPostprocessor`): in f32,
/// `(remainder(floor(ts / unit), units) / units) * 2 * 3.14`, with PyTorch's floor division
/// and remainder. (3.14, not pi: the reference's constant.)
#[allow(clippy::approx_constant)]
pub fn time_angle(ts: i64, unit: f32, units: f32) -> f32 {
    let since = torch_div_floor(ts as f32, unit);
    (torch_remainder(since, units) / units) * 2.0 * 3.14
}

/// `torch.div(a, b, rounding_mode="floor")` on f32, as ATen computes it.
fn torch_div_floor(a: f32, b: f32) -> f32 {
    let m = a % b;
    let mut div = (a - m) / b;
    if m != 0.0 && ((b < 0.0) != (m < 0.0)) {
        div -= 1.0;
    }
    if div != 0.0 {
        let mut f = div.floor();
        if div - f > 0.5 {
            f += 1.0;
        }
        f
    } else {
        0.0f32.copysign(a / b)
    }
}

/// `torch.remainder(a, b)` on f32.
fn torch_remainder(a: f32, b: f32) -> f32 {
    let mut m = a % b;
    if m != 0.0 && ((b < 0.0) != (m < 0.0)) {
        m += b;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::approx_constant)]
    fn time_angles_use_floor_division_and_remainder() {
        // 3 hours and a bit after the epoch: hour 3 of 24, day 0 of 7.
        let a = time_angle(3 * 3600 + 5, 3600.0, 24.0);
        assert!((a - 3.0 / 24.0 * 2.0 * 3.14).abs() < 1e-6);
        // Before the epoch the floor goes down and the remainder stays positive.
        let b = time_angle(-1, 3600.0, 24.0);
        assert!((b - 23.0 / 24.0 * 2.0 * 3.14).abs() < 1e-5);
        assert_eq!(torch_div_floor(-7.0, 2.0), -4.0);
        assert_eq!(torch_remainder(-7.0, 2.0), 1.0);
    }
}
