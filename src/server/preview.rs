//! `POST /runs/{id}/approvals/{call}/preview`: what a call awaiting a decision would do with
//! other params (an edit the reviewer is typing): its action, described by the function the
//! card's own `action` comes from (`runs::action_of`), so the page's preview follows the edit.
//!
//! Deliberately not here: deciding, checking the params against the tool's schema or resolving
//! references typed in them (the decision does both, by the run's rules).

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde_json::{Value, json};

use super::api::body;
use super::error::ApiError;
use super::principals::Principal;
use super::state::AppState;

/// `POST /runs/{id}/approvals/{call}/preview`'s body.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[allow(dead_code)] // describes what `preview` reads from the JSON body
pub(super) struct PreviewRequest {
    /// The params the call would run with.
    params: serde_json::Map<String, Value>,
}

/// What the call would do with these params: `{action}` (the same description as the card's
/// `action`: method and URL, command line, MCP server and tool; never a header's value).
/// Performs nothing. Any principal that may read the run may ask.
#[utoipa::path(post, path = "/runs/{id}/approvals/{call}/preview", tag = "approvals",
    params(("id" = String, Path, description = "The run id"), ("call" = u64, Path, description = "The call id")),
    request_body(content = PreviewRequest, description = "{params}: the params to describe the call with"),
    responses(
        (status = 200, description = "{action}: what the call would do with these params", body = Object),
        (status = 400, description = "The body is not {params: {...}}", body = ApiError),
        (status = 404, description = "No such run (or not one the caller may read)", body = ApiError),
        (status = 409, description = "The call is not awaiting a decision", body = ApiError)))]
pub(super) async fn preview(
    State(st): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    Path((id, call)): Path<(String, u64)>,
    b: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    st.readable(&who, &id).await?;
    let params = match body(b)?.get_mut("params").map(Value::take) {
        Some(Value::Object(m)) => m,
        _ => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "http.bad_body",
                "the body is {\"params\": {...}}: the params to describe the call with",
            ));
        }
    };
    let action = st
        .with_rebuilt(&id, move |rb| {
            let awaiting = rb.machine.awaiting();
            let (_, c) = awaiting.iter().find(|(c, _)| c.0 == call)?;
            Some(crate::runs::action_of(rb, &c.tool, &params))
        })
        .await?;
    match action {
        Some(action) => Ok(Json(json!({ "action": action }))),
        None => Err(ApiError::new(
            StatusCode::CONFLICT,
            "op.not_awaiting",
            format!("call {call} of run {id} is not awaiting a decision"),
        )),
    }
}
