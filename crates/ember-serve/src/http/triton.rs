//! Triton's statistics and model configuration extensions over HTTP:
//! `GET /v2/models[/{m}[/versions/{v}]]/stats` and `GET /v2/models/{m}[/versions/{v}]/config`.
//! Statistics are those of the versions serving now (a replaced version's go with it).

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::repo::Served;
use crate::state::App;
use crate::triton;

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

pub(crate) async fn config_model(State(app): State<App>, Path(name): Path<String>) -> Response {
    match app.model(&name, "") {
        Ok(s) => axum::Json(triton::config(&s).to_json()).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(crate) async fn config_version(
    State(app): State<App>,
    Path((name, version)): Path<(String, String)>,
) -> Response {
    match app.model(&name, &version) {
        Ok(s) => axum::Json(triton::config(&s).to_json()).into_response(),
        Err(e) => e.into_response(),
    }
}
