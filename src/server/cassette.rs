//! `GET /runs/{id}/cassette`: a run as a cassette, `{model, tools}`: the same two documents
//! `dagloop export RUN --cassette DIR` writes as `model.json` and `tools.json`
//! (spec/replay.md P5). A live run gives what its journal holds so far.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde_json::json;

use super::error::ApiError;
use super::principals::Principal;
use super::state::AppState;
use crate::store::RunStore;

/// The run's model turns (a scripted-model file) and tool results (a tools recording).
#[utoipa::path(get, path = "/runs/{id}/cassette", tag = "runs",
    params(("id" = String, Path, description = "The run id")),
    responses((status = 200, description = "{model, tools}: a scripted-model file of the run's own agent's turns and its tool results keyed by tool and resolved params (for `dagloop run --model scripted:... --tools-from ...`)", body = super::wire::Cassette),
              (status = 404, description = "No such run (or not one the caller may read)", body = ApiError),
              (status = 410, description = "The run was compacted: its journal is gone (`store.compacted`)", body = ApiError)))]
pub(super) async fn cassette(
    State(st): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<super::wire::Cassette>, ApiError> {
    // A run's model turns and tool results are as private as the run itself.
    st.readable(&who, &id).await?;
    // On Temporal the record and journal are the workflow's (its `snapshot` query).
    #[cfg(feature = "temporal")]
    if let Some(t) = st.temporal() {
        let src = t.source(&id).await?;
        return export(&src.record, &src.journal);
    }
    let internal =
        |e: String| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server.internal", e);
    tokio::task::spawn_blocking(move || {
        let (record, journal) = match st.live(&id) {
            Some(l) => (l.record.clone(), l.handle.journal()),
            None => {
                let s = st.store.load(&id).map_err(|e| ApiError::from_store(&e))?;
                (s.record, s.journal)
            }
        };
        export(&record, &journal)
    })
    .await
    .map_err(|e| internal(e.to_string()))?
}

/// The cassette of a run's record and journal (`runs::export`).
fn export(
    record: &crate::store::RunRecord,
    journal: &[crate::machine::JournalEntry],
) -> Result<Json<super::wire::Cassette>, ApiError> {
    let c = crate::runs::export(record, journal)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.code(), e))?;
    Ok(Json(super::wire::Cassette {
        model: json!(c.model),
        tools: json!(c.tools),
    }))
}
