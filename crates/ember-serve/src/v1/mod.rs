//! `POST /v1/score`, for people and scripts: Criteo TSV lines, or JSON samples, in; one score per
//! sample out. A model of another input form (an HSTU model's users) reads JSON of its own form
//! ([`ember_model::serving::Servable::check_json`]) and answers each item's outputs.
//!
//! - TSV (any content type but JSON): lines of the Criteo format (`ember predict`'s input), label
//!   first; the label may be empty and is ignored. `?labels=false` reads rows without the label
//!   column (Criteo's test files). Needs a Criteo-shaped model (13 dense, 26 sparse features).
//!   Answers `text/plain`, one score per line.
//! - JSON (`Content-Type: application/json`): one sample or an array of samples, each
//!   `{"dense": [..dense_in numbers..], "sparse": {"<feature>": [ids...], ...}}` with the model's
//!   inputs as they are (no Criteo transform, no hashing: ids must be in range). Every feature
//!   must be present; `[]` is an empty bag. Answers `{"scores": [...]}`.

mod json;

use ember_model::criteo::{self, CriteoBatch};
use ember_model::{Ids, Lengths, ModelError};

use crate::error::{Result, ServeError};
use crate::spec::ModelSpec;
use ember_model::serving::Request;

pub use json::decode as decode_json;

/// Decodes a JSON body of any model: the family's own form where it has one
/// ([`ember_model::serving::Servable::check_json`]: an HSTU model's users), else samples of the
/// bag form ([`decode_json`]).
pub fn decode_json_any(spec: &ModelSpec, body: &[u8]) -> Result<Request> {
    match spec.servable().check_json(body) {
        Some(r) => Ok(r?),
        None => decode_json(spec, body),
    }
}

/// Decodes Criteo TSV lines (`labels`: whether each line starts with the label column).
pub fn decode_tsv(spec: &ModelSpec, body: &[u8], labels: bool) -> Result<Request> {
    let Some(inputs) = &spec.bags else {
        return Err(ServeError::bad(format!(
            "model '{}' takes {}s as JSON, not TSV: send them with Content-Type: \
             application/json",
            spec.name, spec.signature.item
        )));
    };
    if !inputs.is_criteo() {
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
    // Read straight into the model's columns, feature-major (a Criteo row has one id per
    // feature), sized once by the number of rows.
    let n = text.lines().filter(|l| !l.trim().is_empty()).count();
    let rows = &inputs.rows;
    let mut dense = Vec::with_capacity(n * criteo::DENSE);
    let mut ids = match spec.new_ids(0) {
        Ids::U32(_) => Ids::U32(vec![0; n * criteo::SPARSE]),
        Ids::I64(_) => Ids::I64(vec![0; n * criteo::SPARSE]),
    };
    let mut row = CriteoBatch::default();
    let mut line_buf = String::new();
    let mut s = 0;
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
        row.clear();
        criteo::parse_line(line, "body", k as u64 + 1, &mut row).map_err(|e| match e {
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
        dense.extend_from_slice(&row.dense);
        for (f, (&cat, &r)) in row.cats.iter().zip(rows).enumerate() {
            // Hashed into the table, as `ember predict` reads the same rows.
            let id = cat % r as u64;
            match &mut ids {
                Ids::U32(v) => v[f * n + s] = id as u32,
                Ids::I64(v) => v[f * n + s] = id as i64,
            }
        }
        s += 1;
    }
    // One id per bag: no lengths to keep.
    spec.check(n, dense, Lengths::Ones, ids)
}

#[cfg(test)]
mod tests;
