//! The reviewer's desk over HTTP: standing approvals (give, list, revoke) and the audit trail
//! of a run. The routes are `/runs/{id}/standing`; `/runs/{id}/grants`, their name before a
//! reviewer's standing approval stopped being called a grant, still answer (undocumented).
//!
//! A standing approval is an op like a decision: checked against the run, journaled, applied on resume and
//! recorded with its principal. Needs the `review` role to give or revoke; reading needs what
//! reading the run needs.
//!
//! Deliberately not here: what a standing approval covers (`approval::standing`), the page.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde_json::Value;

use super::api::{actor, body, forbidden, submit};
use super::error::ApiError;
use super::principals::{Principal, Role};
use super::state::AppState;
use super::wire::OpStatus;
use crate::protocol::Op;
use crate::runs::StandingRequest;

type ApiResult<T> = Result<T, ApiError>;

/// The run's standing approvals, each with the calls it approved: `[{id, covers, by, at, revoked, calls}]`.
#[utoipa::path(get, path = "/runs/{id}/standing", tag = "approvals",
    params(("id" = String, Path, description = "The run id")),
    responses((status = 200, description = "The run's standing approvals", body = [Object]),
              (status = 404, description = "No such run (or not one the caller may read)", body = ApiError)))]
pub(super) async fn list_standing(
    State(st): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    st.readable(&who, &id).await?;
    let v = st
        .rebuilt_or_kept(&id, "standing", |rb| {
            crate::runs::audit::standing(&rb.events)
        })
        .await?;
    Ok(Json(v))
}

/// Gives a standing approval: `{"scope": "tool", "tool": NAME, "when"?: SCHEMA}` approves every call of the
/// tool (whose params satisfy `when`) while the run lasts, those awaiting included;
/// `{"scope": "calls", "calls": [{"call": ID, "params_hash": HASH}...]}` approves exactly those
/// calls as presented (the hashes an awaiting call's `params_hash` and `downstream` show);
/// `{"scope": "subgraph", "call": ID, "presented"?: HASH}` is the calls approval of that
/// awaiting call and the calls waiting on it, as they stand now. The answer names it (`g1`...).
/// Needs the `review` role.
#[utoipa::path(post, path = "/runs/{id}/standing", tag = "approvals",
    params(("id" = String, Path, description = "The run id")),
    request_body(content = StandingRequest, description = "A standing approval: {scope: tool, tool, when?}, {scope: calls, calls: [{call, params_hash}]} or {scope: subgraph, call, presented?}"),
    responses(
        (status = 200, description = "Applied: {status: applied, standing: ID}", body = OpStatus),
        (status = 202, description = "Recorded for a run no process drives now: {status: recorded}", body = OpStatus),
        (status = 400, description = "Not a standing approval", body = ApiError),
        (status = 403, description = "The caller may not approve ahead, or submitted the run and the operator separates duties (`approval.own_run`)", body = ApiError),
        (status = 404, description = "No such run, or a listed call is unknown", body = ApiError),
        (status = 409, description = "The run has finished; a subgraph's call does not await a decision, or was presented with other params", body = ApiError),
        (status = 422, description = "The standing approval cannot apply (unknown tool, `when` not a schema)", body = ApiError)))]
pub(super) async fn create_standing(
    State(st): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    b: Result<Json<Value>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<OpStatus>)> {
    if !who.may(Role::Review) {
        return Err(forbidden("give standing approvals"));
    }
    st.readable(&who, &id).await?;
    st.check_duties(&who, &id).await?;
    let req: StandingRequest = serde_json::from_value(body(b)?).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "op.bad_standing_approval",
            format!("not a standing approval: {e}"),
        )
    })?;
    // One conversion for every front-end (`dagloop allow` calls it too).
    let by = actor(&who);
    let (before, op) = st
        .with_rebuilt(&id, move |rb| {
            (
                rb.machine.standing_approvals().len(),
                crate::runs::standing_op(&rb.machine, req, by),
            )
        })
        .await?;
    let op = op.map_err(|e| ApiError::from_op(&e))?;
    let (status, Json(mut v)) = submit(&st, &id, op).await?;
    // Standing approvals are numbered in the order the run takes them.
    let after = st
        .with_rebuilt(&id, |rb| {
            rb.machine.standing_approvals().last().map(|g| g.id.clone())
        })
        .await?;
    if status == StatusCode::OK
        && let Some(g) = after
    {
        v.standing = Some(g);
    } else {
        v.standing = Some(format!("g{}", before + 1));
    }
    v.grant.clone_from(&v.standing);
    Ok((status, Json(v)))
}

/// Revokes a standing approval: calls presented from now on are no longer covered by it (those it already
/// approved stay approved). Needs the `review` role.
#[utoipa::path(delete, path = "/runs/{id}/standing/{standing}", tag = "approvals",
    params(("id" = String, Path, description = "The run id"), ("standing" = String, Path, description = "The standing approval's id (g1...)")),
    responses(
        (status = 200, description = "Revoked: {status: applied}", body = OpStatus),
        (status = 202, description = "Recorded for a run no process drives now: {status: recorded}", body = OpStatus),
        (status = 403, description = "The caller may not revoke", body = ApiError),
        (status = 404, description = "No such run or standing approval in force", body = ApiError),
        (status = 409, description = "The run has finished", body = ApiError)))]
pub(super) async fn revoke_standing(
    State(st): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    Path((id, standing)): Path<(String, String)>,
) -> ApiResult<(StatusCode, Json<OpStatus>)> {
    if !who.may(Role::Review) {
        return Err(forbidden("revoke standing approvals"));
    }
    st.readable(&who, &id).await?;
    submit(
        &st,
        &id,
        Op::Revoke {
            standing,
            by: actor(&who),
        },
    )
    .await
}

/// The run's audit trail: every decision (who, channel, when, the rule or standing approval it
/// came from), standing approval given, revocation and cancellation, oldest first.
#[utoipa::path(get, path = "/runs/{id}/audit", tag = "runs",
    params(("id" = String, Path, description = "The run id")),
    responses((status = 200, description = "The audit entries", body = [Object]),
              (status = 404, description = "No such run (or not one the caller may read)", body = ApiError)))]
pub(super) async fn audit(
    State(st): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    st.readable(&who, &id).await?;
    let v = st
        .rebuilt_or_kept(&id, "audit", |rb| crate::runs::audit::audit(&rb.events))
        .await?;
    Ok(Json(v))
}
