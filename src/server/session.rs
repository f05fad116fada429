//! `POST /runs/{id}/continue`: a follow-up of a finished run in its session (`runs::session`
//! says what carries over), recorded as the run's child and driven by this server. The caller
//! needs the `submit` role and must be able to read the run it continues (else 404, as for a
//! run that does not exist); the follow-up is the caller's, and it may touch what this server
//! grants, as for `POST /runs`.
//!
//! Deliberately not here: what a follow-up is made of, and the serialisation of a session's
//! runs (`runs::session` and the store).

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
use crate::runs::{Carry, Continue, Next, RunOptions, RunsError};
use crate::store::RunStore;

/// The body: `{"text": WORDS}` or `{"goal": GOAL}`, with `carry` and `wait`.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ContinueRequest {
    /// The follow-up's instruction: the run's goal with this as its goal text.
    #[serde(default)]
    text: Option<String>,
    /// A goal document for the follow-up instead (checked as `POST /runs` checks one).
    #[serde(default)]
    #[schema(value_type = Object)]
    goal: Option<Value>,
    /// What carries over from the run: `state`, `history` or `both` (the default).
    #[serde(default)]
    carry: Carry,
    /// Wait while a run of the session has not finished (default: refuse at once with 409
    /// `session.busy`).
    #[serde(default)]
    wait: bool,
    /// The model (default: the run's).
    #[serde(default)]
    model: Option<String>,
}

/// Continues a finished run in its session and starts the follow-up; follow it with
/// `/runs/{new id}/events`. Its description's `session` names the session and the run it
/// follows; `GET /runs?session={id}` lists the session's runs.
#[utoipa::path(post, path = "/runs/{id}/continue", tag = "runs",
    params(("id" = String, Path, description = "The run to continue")),
    request_body(content = ContinueRequest, description = "{text} or {goal}, with carry?, wait?, model?"),
    responses(
        (status = 201, description = "The follow-up was created and started: {id, status, session}", body = Object),
        (status = 400, description = "Not {text} or {goal}; a goal the schema or loader refuses; something this server does not grant (`grant.*`)", body = ApiError),
        (status = 403, description = "The caller may not submit runs, or asks a published agent's follow-up for a model its operator does not list (`server.agent_model`)", body = ApiError),
        (status = 404, description = "No such run (or not one the caller may read)", body = ApiError),
        (status = 409, description = "A run of the session has not finished and `wait` was not asked (`session.busy`)", body = ApiError),
        (status = 415, description = "Not application/json", body = ApiError),
        (status = 429, description = "The caller already has as many active (not ended) runs as one principal may (`server.too_many_runs`)", body = ApiError)))]
pub(super) async fn continue_run(
    State(st): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    b: Result<Json<Value>, JsonRejection>,
) -> Result<Response, ApiError> {
    if !who.may(Role::Submit) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "auth.forbidden",
            "this principal's roles do not allow it to continue runs",
        ));
    }
    st.readable(&who, &id).await?;
    let bad = |message: String| {
        let mut err = ApiError::new(
            StatusCode::BAD_REQUEST,
            "http.bad_body",
            format!(
                "expected {{\"text\": WORDS}} or {{\"goal\": GOAL}}, with \"carry\"?, \"wait\"?, \"model\"?: {message}"
            ),
        );
        err.errors.push(Problem {
            pointer: String::new(),
            message,
        });
        err
    };
    let req: ContinueRequest = serde_json::from_value(body(b)?).map_err(|e| bad(e.to_string()))?;
    let next = match (req.text, req.goal) {
        (Some(t), None) if !t.trim().is_empty() => Next::Text(t),
        (None, Some(doc)) => Next::Goal(Box::new(check_goal(&doc, &st.base_dir)?)),
        _ => {
            return Err(bad(
                "give exactly one of `text` (not empty) or `goal`".into()
            ));
        }
    };
    let store = st.store.clone();
    let run = id.clone();
    // A compacted run is followed too (its result and kept description).
    let stored = tokio::task::spawn_blocking(move || crate::runs::Parent::load(&*store, &run))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server.internal", e))?
        .map_err(session_error)?;
    let original = RunOptions::from_stored(&stored.record().options).map_err(runs_error)?;
    if let (Some(agent), Some(model)) = (&original.agent, &req.model) {
        let own = stored.record().goal.get("model").and_then(Value::as_str);
        st.check_agent_model(agent, model, own)?;
    }
    // The server's grants and the caller, as for `POST /runs`; the policy, the operator's floor
    // (the run's, else the server's) and the mode go on.
    let opts = RunOptions {
        model: req.model.or(original.model),
        approve: original.approve,
        mode: original.mode,
        allow_shell: st.grants.allows_shell(),
        server: true,
        submitted_by: Some(who.name.clone()),
        floor: original.floor.or_else(|| st.floor.for_run(None)),
        agent: original.agent,
        ..RunOptions::default()
    };
    let how = Continue {
        next,
        carry: req.carry,
        wait: req.wait,
    };
    let mut def = None;
    let grants = st.grants.clone();
    let mut check = |f: &crate::runs::Fork| {
        def = Some(crate::runs::define(
            f.goal.clone(),
            f.options.clone(),
            grants.clone(),
        )?);
        Ok(())
    };
    let _slot = st.run_slot(&who).await?;
    let (fork, seeded) = crate::runs::continue_run(&*st.store, &id, &how, opts, &mut check)
        .await
        .map_err(session_error)?;
    let Some(def) = def else {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server.internal",
            "the follow-up was recorded without a definition",
        ));
    };
    let new_id = fork.record.id.clone();
    if let Err(e) = st
        .launch_defined(&def, Some((new_id.clone(), seeded.journal)))
        .await
    {
        let _ = st.store.release(&new_id);
        return Err(runs_error(e));
    }
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "id": new_id,
            "status": "running",
            "session": fork.options.session,
        })),
    )
        .into_response())
}

/// A follow-up that could not be recorded: the store's refusals with their own statuses (409
/// `session.busy`, 404, 410), the rest as any run that could not be defined.
fn session_error(e: RunsError) -> ApiError {
    match e {
        RunsError::Store(s) => ApiError::from_store(&s),
        other => runs_error(other),
    }
}
