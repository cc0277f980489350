//! `POST /v1/score`, for people and scripts: Criteo TSV lines, or JSON samples, in; one score per
//! sample out.
//!
//! - TSV (any content type but JSON): lines of the Criteo format (`ember predict`'s input), label
//!   first; the label may be empty and is ignored. `?labels=false` reads rows without the label
//!   column (Criteo's test files). Needs a Criteo-shaped model (13 dense, 26 sparse features).
//!   Answers `text/plain`, one score per line.
//! - JSON (`Content-Type: application/json`): one sample or an array of samples, each
//!   `{"dense": [..dense_in numbers..], "sparse": {"<feature>": [ids...], ...}}` with the model's
//!   inputs as they are (no Criteo transform, no hashing: ids must be in range). Every feature
//!   must be present; `[]` is an empty bag. Answers `{"scores": [...]}`.

use std::collections::HashMap;

use ember_model::ModelError;
use ember_model::criteo::{self, CriteoBatch};
use serde::Deserialize;

use crate::error::{Result, ServeError};
use crate::spec::ModelSpec;
use ember_model::Samples;

/// One JSON sample.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonSample {
    dense: Vec<f64>,
    sparse: HashMap<String, Vec<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum JsonBody {
    One(JsonSample),
    Many(Vec<JsonSample>),
}

/// Decodes a JSON body.
pub fn decode_json(spec: &ModelSpec, body: &[u8]) -> Result<Samples> {
    let samples = match serde_json::from_slice::<JsonBody>(body) {
        Ok(JsonBody::One(s)) => vec![s],
        Ok(JsonBody::Many(v)) => v,
        Err(e) => {
            // The untagged error says nothing useful; parse as the array form to name the field.
            let detail = match serde_json::from_slice::<Vec<JsonSample>>(body) {
                Err(e2) if !e2.is_syntax() && !e2.is_eof() => e2.to_string(),
                _ => match serde_json::from_slice::<JsonSample>(body) {
                    Err(e1) => e1.to_string(),
                    Ok(_) => e.to_string(),
                },
            };
            return Err(ServeError::bad(format!(
                "body is not a sample or an array of samples ({{\"dense\": [...], \"sparse\": \
                 {{\"<feature>\": [ids]}}}}): {detail}"
            )));
        }
    };
    let n = samples.len();
    let nf = spec.features().len();
    let mut dense = Vec::with_capacity(n * spec.dense_in());
    for (s, x) in samples.iter().enumerate() {
        if x.dense.len() != spec.dense_in() {
            return Err(ServeError::bad(format!(
                "sample {s}: 'dense' has {} values; the model takes {}",
                x.dense.len(),
                spec.dense_in()
            )));
        }
        if let Some(f) = x.sparse.keys().find(|k| !spec.features().contains(k)) {
            return Err(ServeError::bad(format!(
                "sample {s}: unknown sparse feature '{f}' (the model's are {})",
                spec.features().join(", ")
            )));
        }
        dense.extend(x.dense.iter().map(|&v| v as f32));
    }
    let mut lengths = Vec::with_capacity(n * nf);
    let mut ids = Vec::new();
    for f in spec.features() {
        for (s, x) in samples.iter().enumerate() {
            let bag = x.sparse.get(f).ok_or_else(|| {
                ServeError::bad(format!(
                    "sample {s}: sparse feature '{f}' is missing (send [] for an empty bag)"
                ))
            })?;
            lengths.push(u32::try_from(bag.len()).map_err(|_| ServeError::bad("bag too long"))?);
            ids.extend_from_slice(bag);
        }
    }
    spec.check(n, dense, lengths, ids)
}

/// Decodes Criteo TSV lines (`labels`: whether each line starts with the label column).
pub fn decode_tsv(spec: &ModelSpec, body: &[u8], labels: bool) -> Result<Samples> {
    if !spec.inputs.is_criteo() {
        return Err(ServeError::bad(format!(
            "TSV input needs a Criteo-shaped model ({} dense, {} sparse features); model '{}' \
             has {} and {}: send JSON instead",
            criteo::DENSE,
            criteo::SPARSE,
            spec.name,
            spec.dense_in(),
            spec.features().len()
        )));
    }
    let text = std::str::from_utf8(body)
        .map_err(|e| ServeError::bad(format!("body is not UTF-8 text: {e}")))?;
    let mut batch = CriteoBatch::default();
    let mut line_buf = String::new();
    for (k, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        // The label is ignored: an empty one, or none at all, reads as 0.
        let line = if labels && !line.starts_with('\t') {
            line
        } else {
            line_buf.clear();
            line_buf.push('0');
            if !labels {
                line_buf.push('\t');
            }
            line_buf.push_str(line);
            &line_buf
        };
        criteo::parse_line(line, "body", k as u64 + 1, &mut batch).map_err(|e| match e {
            // Columns as the client counts them, without the label we added.
            ModelError::Criteo {
                source_name,
                line,
                column,
                reason,
            } if !labels => ServeError::bad(
                ModelError::Criteo {
                    source_name,
                    line,
                    column: column.saturating_sub(1).max(1),
                    reason,
                }
                .to_string(),
            ),
            e => ServeError::bad(e.to_string()),
        })?;
    }
    let n = batch.len();
    let kj = batch
        .sparse(spec.features(), &spec.inputs.rows)
        .map_err(|e| ServeError::bad(e.to_string()))?;
    let ids: Vec<i64> = (0..kj.num_ids()).map(|i| kj.ids().get(i)).collect();
    spec.check(n, batch.dense, vec![1; criteo::SPARSE * n], ids)
}
