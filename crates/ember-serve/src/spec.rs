//! What a request must match: the served model's name, its inputs, and where each KServe input
//! goes. Decoders (KServe JSON, the binary extension, protobuf, `/v1/score`) turn a request into
//! plain values and hand them to [`ModelSpec::check`], the one check of a request's samples
//! against the model ([`ember_model::Model::check_samples`]), so that a bad request is refused
//! alone and never fails the batch it would have joined.

use std::collections::HashMap;
use std::sync::Arc;

use ember_model::{Ids, Inputs, Lengths, Model, Samples};

use crate::error::Result;

/// The served model as requests see it.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// The name clients address the model by.
    pub name: String,
    /// Dense width, sparse features and their tables' sizes.
    pub inputs: Inputs,
    /// KServe input names to their slot: 0 is `dense`, `1 + 2f` feature f's `_lengths`,
    /// `2 + 2f` its `_ids`.
    pub input_slots: HashMap<String, usize>,
    /// Sparse feature names to their index.
    pub feature_index: HashMap<String, usize>,
    model: Arc<Model>,
}

impl ModelSpec {
    /// The model served.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The spec of `model`, served as `name`.
    pub fn of(model: Arc<Model>, name: &str) -> Self {
        let inputs = model.inputs();
        let mut input_slots = HashMap::new();
        input_slots.insert("dense".to_string(), 0);
        for (f, name) in inputs.features.iter().enumerate() {
            input_slots.insert(format!("{name}_lengths"), 1 + 2 * f);
            input_slots.insert(format!("{name}_ids"), 2 + 2 * f);
        }
        let feature_index = inputs
            .features
            .iter()
            .enumerate()
            .map(|(f, name)| (name.clone(), f))
            .collect();
        ModelSpec {
            name: name.to_string(),
            inputs,
            input_slots,
            feature_index,
            model,
        }
    }

    /// Dense features per sample.
    pub fn dense_in(&self) -> usize {
        self.inputs.dense_in
    }

    /// Sparse feature names, in the model's order.
    pub fn features(&self) -> &[String] {
        &self.inputs.features
    }

    /// Checks a request's `n` samples against the model: dense `[n, dense_in]` and finite; for
    /// feature `f`, sample `s`, `lengths[f * n + s]` ids stored feature-major in `ids`, each in
    /// range. Errors name the input and the sample.
    pub fn check(
        &self,
        n: usize,
        dense: Vec<f32>,
        lengths: impl Into<Lengths>,
        ids: impl Into<Ids>,
    ) -> Result<Samples> {
        Ok(self.model.check_samples(n, dense, lengths, ids)?)
    }

    /// An empty id list with room for `capacity`, as the checked samples keep them (32-bit when
    /// every table fits): decoders that build it need no conversion.
    pub fn new_ids(&self, capacity: usize) -> Ids {
        Ids::with_capacity(self.inputs.narrow_ids, capacity)
    }
}
