//! `POST /runs/{id}/fork`: a new run from a stored run's state, plan and context after one of
//! its steps (`runs::fork` says what that means), recorded as its fork and driven by this
//! server — or, on Temporal, started as a workflow from the original's journal prefix, which
//! it replays and resumes (`RunSpec::of_fork`). The caller needs the `submit` role and must be able to read the original; the fork
//! is the caller's, and it may touch what this server grants — never more because of what the
//! original's record says (its `allow_shell`, its submitter are not carried over).

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};

use super::api::{body, check_goal, runs_error};
use super::error::{ApiError, Problem};
use super::principals::{Principal, Role};
use super::state::AppState;
use crate::runs::RunOptions;
use crate::store::{RunStore, StoredRun};

/// The body: `{"at_step": N, "model"?: SPEC, "input"?: JSON}`.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ForkRequest {
    /// The step to fork after (0: right after the run's start).
    at_step: u32,
    /// The model from step N+1 on (default: the original's).
    #[serde(default)]
    model: Option<String>,
    /// The input in place of the original's (steps 1..N stand as recorded).
    #[serde(default)]
    #[schema(value_type = Object)]
    input: Option<Value>,
}

/// Forks a run after step `at_step` and starts the fork; follow it with
/// `/runs/{new id}/events`. Its description (`GET /runs/{id}`) says `forked_from`.
#[utoipa::path(post, path = "/runs/{id}/fork", tag = "runs",
    params(("id" = String, Path, description = "The run to fork")),
    request_body(content = ForkRequest, description = "{at_step, model?, input?}"),
    responses(
        (status = 201, description = "The fork was created and started: {id, status, forked_from}", body = Object),
        (status = 400, description = "Not {at_step, model?, input?}; a step the run never went past (`fork.no_such_step`); an input the goal refuses; something this server does not grant (`grant.*`)", body = ApiError),
        (status = 403, description = "The caller may not submit runs, or asks a published agent's fork for a model its operator does not list (`server.agent_model`)", body = ApiError),
        (status = 404, description = "No such run (or not one the caller may read)", body = ApiError),
        (status = 410, description = "The run was compacted: its journal is gone (`store.compacted`)", body = ApiError),
        (status = 415, description = "Not application/json", body = ApiError),
        (status = 429, description = "The caller already has as many active (not ended) runs as one principal may (`server.too_many_runs`)", body = ApiError)))]
pub(super) async fn fork(
    State(st): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    b: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    if !who.may(Role::Submit) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "auth.forbidden",
            "this principal's roles do not allow it to fork runs",
        ));
    }
    st.readable(&who, &id).await?;
    let req: ForkRequest = serde_json::from_value(body(b)?).map_err(|e| {
        let mut err = ApiError::new(
            StatusCode::BAD_REQUEST,
            "http.bad_body",
            format!("expected {{\"at_step\": N, \"model\"?, \"input\"?}}: {e}"),
        );
        err.errors.push(Problem {
            pointer: String::new(),
            message: e.to_string(),
        });
        err
    })?;
    let stored = original(&st, &id).await?;
    let original = RunOptions::from_stored(&stored.record.options).map_err(runs_error)?;
    // A published agent's fork runs on the agent's models only, as the run did.
    if let (Some(agent), Some(model)) = (&original.agent, &req.model) {
        let own = stored.record.goal.get("model").and_then(Value::as_str);
        st.check_agent_model(agent, model, own)?;
    }
    // The server's grants and the caller, as for `POST /runs`; the policy, the operator's floor
    // (the run's, else the server's) and the mode go on.
    let opts = RunOptions {
        model: original.model,
        approve: original.approve,
        mode: original.mode,
        allow_shell: st.grants.allows_shell(),
        server: true,
        submitted_by: Some(who.name.clone()),
        floor: original.floor.or_else(|| st.floor.for_run(None)),
        agent: original.agent,
        ..RunOptions::default()
    };
    let fork = crate::runs::fork(
        &stored,
        req.at_step,
        req.model,
        req.input,
        opts,
        crate::runs::now_ms(),
    )
    .map_err(runs_error)?;
    // The goal as a submitted one is checked: the published schema, then the loader.
    check_goal(
        &fork.record.goal,
        std::path::Path::new(&fork.record.base_dir),
    )?;
    let def = crate::runs::define(fork.goal.clone(), fork.options.clone(), st.grants.clone())
        .map_err(runs_error)?;
    let _slot = st.run_slot(&who).await?;
    let created = Json(json!({
        "id": fork.record.id,
        "status": "running",
        "forked_from": {"run": id, "step": req.at_step},
    }));
    // On Temporal the fork is a workflow that replays the prefix and resumes (nothing stored).
    #[cfg(feature = "temporal")]
    if let Some(t) = st.temporal() {
        t.start_fork(&def, &fork, st.notify_page()).await?;
        return Ok((StatusCode::CREATED, created).into_response());
    }
    let seeded = crate::runs::seed(&*st.store, &fork)
        .await
        .map_err(runs_error)?;
    let new_id = fork.record.id.clone();
    if let Err(e) = st
        .launch_defined(&def, Some((new_id.clone(), seeded.journal)))
        .await
    {
        let _ = st.store.release(&new_id);
        return Err(runs_error(e));
    }
    Ok((StatusCode::CREATED, created).into_response())
}

/// The run to fork, as the store holds it, or as its workflow does on Temporal.
async fn original(st: &Arc<AppState>, id: &str) -> Result<StoredRun, ApiError> {
    #[cfg(feature = "temporal")]
    if let Some(t) = st.temporal() {
        let s = t.source(id).await?;
        return Ok(StoredRun {
            record: s.record,
            journal: s.journal,
            result: s.result,
            lease: None,
        });
    }
    let store = st.store.clone();
    let run = id.to_string();
    tokio::task::spawn_blocking(move || store.load(&run))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server.internal", e))?
        .map_err(|e| ApiError::from_store(&e))
}
