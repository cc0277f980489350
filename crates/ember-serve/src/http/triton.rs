//! Triton's statistics and model configuration extensions over HTTP:
//! `GET /v2/models[/{m}[/versions/{v}]]/stats` and `GET /v2/models/{m}[/versions/{v}]/config`.
//! Statistics are those of the versions serving now (a replaced version's go with it).

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::kserve;
use crate::repo::Served;
use crate::state::App;

fn stats_of(served: &[std::sync::Arc<Served>]) -> Response {
    let model_stats: Vec<_> = served
        .iter()
        .map(|s| s.batcher.stats(s.name(), s.version))
        .collect();
    axum::Json(json!({ "model_stats": model_stats })).into_response()
}

/// Every model served, by name (`served` is in name order).
pub(crate) async fn stats_all(State(app): State<App>) -> Response {
    stats_of(&app.repo.served())
}

pub(crate) async fn stats_model(State(app): State<App>, Path(name): Path<String>) -> Response {
    match app.model(&name, "") {
        Ok(s) => stats_of(&[s]),
        Err(e) => e.into_response(),
    }
}

pub(crate) async fn stats_version(
    State(app): State<App>,
    Path((name, version)): Path<(String, String)>,
) -> Response {
    match app.model(&name, &version) {
        Ok(s) => stats_of(&[s]),
        Err(e) => e.into_response(),
    }
}

/// Triton's model configuration of a served version: its inputs and output (dims without the
/// batch dimension; a feature's `_ids` are all of a batch's ids, so `-1`), the batcher's
/// limits as `max_batch_size` and `dynamic_batching`.
pub(crate) fn config(s: &Served) -> Value {
    let meta = kserve::metadata(&s.spec, &s.version_str);
    let tensor = |t: &kserve::TensorMeta| {
        let dims: Vec<i64> = match t.shape.as_slice() {
            [_, rest @ ..] if !rest.is_empty() => rest.to_vec(),
            _ if t.name.ends_with("_lengths") => vec![1],
            _ => vec![-1],
        };
        json!({ "name": t.name, "data_type": format!("TYPE_{}", t.datatype), "dims": dims })
    };
    let cfg = s.batcher.config();
    json!({
        "name": s.name(),
        "platform": "ember",
        "backend": "ember",
        "max_batch_size": cfg.max_batch,
        "input": meta.inputs.iter().map(tensor).collect::<Vec<_>>(),
        "output": meta.outputs.iter().map(tensor).collect::<Vec<_>>(),
        "dynamic_batching": {
            "max_queue_delay_microseconds": cfg.max_delay.as_micros() as u64,
        },
        "version_policy": { "specific": { "versions": [s.version] } },
    })
}

pub(crate) async fn config_model(State(app): State<App>, Path(name): Path<String>) -> Response {
    match app.model(&name, "") {
        Ok(s) => axum::Json(config(&s)).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(crate) async fn config_version(
    State(app): State<App>,
    Path((name, version)): Path<(String, String)>,
) -> Response {
    match app.model(&name, &version) {
        Ok(s) => axum::Json(config(&s)).into_response(),
        Err(e) => e.into_response(),
    }
}
