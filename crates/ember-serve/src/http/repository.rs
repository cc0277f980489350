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

/// A load or unload request's body: `{"parameters": {...}}` (Triton's), optional.
#[derive(Debug, Default, Deserialize)]
struct ControlRequest {
    #[serde(default)]
    parameters: serde_json::Map<String, serde_json::Value>,
}

/// The names of a load or unload body's parameters; a malformed body is a 400.
fn parameters(body: &Bytes, what: &str) -> Result<Vec<String>, ServeError> {
    if body.trim_ascii().is_empty() {
        return Ok(Vec::new());
    }
    let r: ControlRequest = serde_json::from_slice(body).map_err(|e| {
        ServeError::bad(format!(
            "malformed {what} request: {e} (send {{}} or nothing)"
        ))
    })?;
    Ok(r.parameters.keys().cloned().collect())
}

/// Whether a client may `what` (load or unload) with this body: [`App::may_control`] on its
/// parameters.
fn control(app: &App, what: &str, body: &Bytes) -> Result<(), ServeError> {
    parameters(body, what).and_then(|p| app.may_control(what, &p))
}

pub(crate) async fn load(
    State(app): State<App>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    if let Err(e) = control(&app, &format!("loading model {name:?}"), &body) {
        return e.into_response();
    }
    let n = name.clone();
    match app.on_repository(move |r| r.load(&n)).await {
        Ok(v) => axum::Json(json!({ "name": name, "version": v.to_string() })).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(crate) async fn unload(
    State(app): State<App>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    if let Err(e) = control(&app, &format!("unloading model {name:?}"), &body) {
        return e.into_response();
    }
    let n = name.clone();
    match app.on_repository(move |r| r.unload(&n)).await {
        Ok(()) => axum::Json(json!({ "name": name })).into_response(),
        Err(e) => e.into_response(),
    }
}
