//! The repository extension's HTTP routes: `POST /v2/repository/index` (body `{"ready": bool}`,
//! optional), `POST /v2/repository/models/{name}/load` and `.../unload`. A load answers once
//! the new version serves (or why it did not load); an unload once the requests in flight on
//! the model are answered and it is freed.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use crate::error::ServeError;
use crate::state::App;

#[derive(Debug, Default, Deserialize)]
struct IndexRequest {
    #[serde(default)]
    ready: bool,
}

pub(crate) async fn index(State(app): State<App>, body: Bytes) -> Response {
    let req: IndexRequest = if body.trim_ascii().is_empty() {
        IndexRequest::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(e) => {
                return ServeError::bad(format!(
                    "malformed repository index request: {e} (send {{\"ready\": true}} or nothing)"
                ))
                .into_response();
            }
        }
    };
    axum::Json(app.repo.index(req.ready)).into_response()
}

pub(crate) async fn load(State(app): State<App>, Path(name): Path<String>) -> Response {
    let n = name.clone();
    match app.on_repository(move |r| r.load(&n)).await {
        Ok(v) => axum::Json(json!({ "name": name, "version": v.to_string() })).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(crate) async fn unload(State(app): State<App>, Path(name): Path<String>) -> Response {
    let n = name.clone();
    match app.on_repository(move |r| r.unload(&n)).await {
        Ok(()) => axum::Json(json!({ "name": name })).into_response(),
        Err(e) => e.into_response(),
    }
}
