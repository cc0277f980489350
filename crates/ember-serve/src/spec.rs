//! What a request must match: the served model's name, its [`Signature`] (inputs, outputs,
//! stages), and where each KServe input goes. Decoders (KServe JSON, the binary extension,
//! protobuf, `/v1/score`) turn a request into [`InputColumns`] and hand them to
//! [`ModelSpec::check_columns`], the one check of a request against the model
//! ([`Servable::check`]), so that a bad request is refused alone and never fails the batch it
//! would have joined. Nothing here knows which family the model is.

use std::collections::HashMap;
use std::sync::Arc;

use ember_model::serving::{InputColumns, Request, Servable, Signature};
use ember_model::{Ids, Inputs, Lengths};

use crate::error::Result;

/// The served model as requests see it.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// The name clients address the model by.
    pub name: String,
    /// Its inputs, outputs and stages.
    pub signature: Signature,
    /// KServe input names to their index in the signature's inputs.
    pub input_slots: HashMap<String, usize>,
    /// When its inputs are dense features and a bag of ids per sparse feature (the form
    /// `/v1/score` reads as Criteo TSV and JSON samples): their description.
    pub bags: Option<Inputs>,
    /// The bag form's sparse feature names to their index.
    pub feature_index: HashMap<String, usize>,
    model: Arc<dyn Servable>,
}

impl ModelSpec {
    /// The model served.
    pub fn servable(&self) -> &Arc<dyn Servable> {
        &self.model
    }

    /// The spec of `model`, served as `name`.
    pub fn of(model: Arc<dyn Servable>, name: &str) -> Self {
        let signature = model.signature();
        let input_slots = signature
            .inputs
            .iter()
            .enumerate()
            .map(|(k, i)| (i.name.clone(), k))
            .collect();
        let bags = model.bags();
        let feature_index = bags
            .iter()
            .flat_map(|b| b.features.iter().enumerate())
            .map(|(f, name)| (name.clone(), f))
            .collect();
        ModelSpec {
            name: name.to_string(),
            signature,
            input_slots,
            bags,
            feature_index,
            model,
        }
    }

    /// Dense features per sample of the bag form (0 for a model of another form).
    pub fn dense_in(&self) -> usize {
        self.bags.as_ref().map_or(0, |b| b.dense_in)
    }

    /// The bag form's sparse feature names, in the model's order (none for another form).
    pub fn features(&self) -> &[String] {
        self.bags.as_ref().map_or(&[], |b| &b.features)
    }

    /// Checks a request decoded by the signature (see [`InputColumns`]).
    pub fn check_columns(&self, columns: InputColumns) -> Result<Request> {
        Ok(self.model.check(columns)?)
    }

    /// Checks a request of the bag form: `n` samples, dense `[n, dense_in]` and finite; for
    /// feature `f`, sample `s`, `lengths[f * n + s]` ids stored feature-major in `ids`, each in
    /// range. Errors name the input and the sample.
    pub fn check(
        &self,
        n: usize,
        dense: Vec<f32>,
        lengths: impl Into<Lengths>,
        ids: impl Into<Ids>,
    ) -> Result<Request> {
        self.check_columns(InputColumns {
            n,
            floats: dense,
            lengths: lengths.into(),
            values: ids.into(),
            present: vec![true; self.signature.inputs.len()],
        })
    }

    /// An empty value column with room for `capacity`, as the checked requests keep them
    /// (32-bit when every value fits): decoders that build it need no conversion.
    pub fn new_ids(&self, capacity: usize) -> Ids {
        self.signature.new_values(capacity)
    }
}
