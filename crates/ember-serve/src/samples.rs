//! A request's samples, decoded from any protocol and checked against the model before they are
//! queued, so that one bad request never fails the batch it would have joined.

use ember_model::Model;

use crate::error::{Result, ServeError};

/// What a request must match: the model's inputs.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// The name clients address the model by.
    pub name: String,
    /// Dense features per sample.
    pub dense_in: usize,
    /// Sparse feature names, in the model's order.
    pub features: Vec<String>,
    /// Rows of the table each feature reads.
    pub rows: Vec<usize>,
    /// KServe input names to their slot: 0 is `dense`, `1 + 2f` feature f's `_lengths`,
    /// `2 + 2f` its `_ids`.
    pub input_slots: std::collections::HashMap<String, usize>,
}

impl ModelSpec {
    /// The spec of `model`, served as `name`.
    pub fn of(model: &Model, name: &str) -> Self {
        let cfg = model.config();
        let tables = cfg
            .feature_tables()
            .expect("a loaded model's features name its tables");
        let features = model.feature_names();
        let mut input_slots = std::collections::HashMap::new();
        input_slots.insert("dense".to_string(), 0);
        for (f, name) in features.iter().enumerate() {
            input_slots.insert(format!("{name}_lengths"), 1 + 2 * f);
            input_slots.insert(format!("{name}_ids"), 2 + 2 * f);
        }
        ModelSpec {
            name: name.to_string(),
            dense_in: cfg.dense_in,
            features,
            rows: tables.iter().map(|&t| cfg.tables[t].rows).collect(),
            input_slots,
        }
    }

    /// Whether the model takes Criteo rows (13 dense, 26 sparse features).
    pub fn is_criteo(&self) -> bool {
        self.dense_in == ember_model::criteo::DENSE
            && self.features.len() == ember_model::criteo::SPARSE
    }
}

/// Samples ready to batch: `dense` is `[n, dense_in]`; for feature `f`, `lengths[f * n + s]` ids
/// of sample `s`, stored feature-major in `ids` (all of feature 0's, then feature 1's, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct Samples {
    pub n: usize,
    pub dense: Vec<f32>,
    pub lengths: Vec<u32>,
    pub ids: Vec<i64>,
}

impl Samples {
    /// Checks shapes, finiteness and id ranges against `spec`; errors name the input and sample.
    pub fn new(
        spec: &ModelSpec,
        n: usize,
        dense: Vec<f32>,
        lengths: Vec<u32>,
        ids: Vec<i64>,
    ) -> Result<Self> {
        let nf = spec.features.len();
        if dense.len() != n * spec.dense_in {
            return Err(ServeError::bad(format!(
                "dense has {} values; {n} samples of {} dense features need {}",
                dense.len(),
                spec.dense_in,
                n * spec.dense_in
            )));
        }
        if let Some(i) = dense.iter().position(|v| !v.is_finite()) {
            return Err(ServeError::bad(format!(
                "dense feature {} of sample {} is {} (must be finite)",
                i % spec.dense_in.max(1),
                i / spec.dense_in.max(1),
                dense[i]
            )));
        }
        if lengths.len() != n * nf {
            return Err(ServeError::bad(format!(
                "{} lengths for {n} samples of {nf} sparse features (need {})",
                lengths.len(),
                n * nf
            )));
        }
        let total: u64 = lengths.iter().map(|&l| l as u64).sum();
        if total != ids.len() as u64 {
            return Err(ServeError::bad(format!(
                "the lengths add up to {total} ids but {} ids were sent",
                ids.len()
            )));
        }
        let mut at = 0;
        for (f, name) in spec.features.iter().enumerate() {
            let rows = spec.rows[f] as u64;
            for s in 0..n {
                let len = lengths[f * n + s] as usize;
                if let Some(&id) = ids[at..at + len].iter().find(|&&id| id as u64 >= rows) {
                    return Err(ServeError::bad(format!(
                        "{name}: id {id} of sample {s} is out of range (the table has {rows} rows)"
                    )));
                }
                at += len;
            }
        }
        Ok(Samples {
            n,
            dense,
            lengths,
            ids,
        })
    }
}
