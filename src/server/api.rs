//! The API's handlers: submit goals (with `Idempotency-Key`), list and describe runs, decide
//! calls, cancel runs; each checks the caller's role and which runs it may see
//! (`principals`). Decisions and cancellations carry their principal as their [`Actor`].
//!
//! Deliberately not here: who the caller is (`auth`), `Host` and content-type checks (`guard`).

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::Value;

use super::error::{ApiError, Problem};
use super::principals::{Principal, Role};
use super::result::{RunOutcome, outcome, wait_duration};
use super::state::AppState;
use super::wire::OpStatus;
use crate::approval::ModeName;
use crate::goal::Goal;
use crate::protocol::{Actor, CallId, Decision, Op};
use crate::runs::RunOptions;

type ApiResult<T> = Result<T, ApiError>;

/// A JSON body, or a coded 400 saying why it is not one.
pub(super) fn body(b: Result<Json<Value>, JsonRejection>) -> ApiResult<Value> {
    b.map(|Json(v)| v).map_err(|e| {
        let status = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            StatusCode::PAYLOAD_TOO_LARGE
        } else {
            StatusCode::BAD_REQUEST
        };
        ApiError::new(status, "http.bad_body", e.body_text())
    })
}

/// 403 `auth.forbidden`: the caller's roles do not allow this.
pub(super) fn forbidden(what: &str) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "auth.forbidden",
        format!("this principal's roles do not allow it to {what}"),
    )
}

/// The decision or cancellation's author: the principal, over HTTP.
pub(super) fn actor(who: &Principal) -> Option<Actor> {
    Some(Actor::new(who.name.clone(), Actor::HTTP))
}

/// Keys kept in memory at most; past that the memory is cleared and the store answers.
const MAX_KEYS_IN_MEMORY: usize = 10_000;

/// The longest `Idempotency-Key` accepted.
const MAX_IDEMPOTENCY_KEY: usize = 255;

/// The request's `Idempotency-Key`: None without one; 400 `http.bad_idempotency_key` when it is
/// empty, too long, or not printable ASCII.
fn idempotency_key(headers: &HeaderMap) -> ApiResult<Option<String>> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    match v.to_str() {
        Ok(k)
            if !k.is_empty()
                && k.len() <= MAX_IDEMPOTENCY_KEY
                && k.bytes().all(|b| b.is_ascii_graphic() || b == b' ') =>
        {
            Ok(Some(k.to_string()))
        }
        _ => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "http.bad_idempotency_key",
            format!(
                "Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters"
            ),
        )),
    }
}

/// Submits a goal: the goal document itself, `{"goal": {...}, "model", "approve", "mode"}`, or
/// an agent the operator publishes, `{"agent": NAME, "input": {...}, "model", "approve", "mode"}`.
/// What the goal may touch is what the server's operator grants; the run starts at once; follow
/// it with `/runs/{id}/events`. With an `Idempotency-Key` that the same principal already used,
/// no run starts: the answer is the first run's, with status 200 and `Idempotent-Replayed: true`.
/// With `"wait": SECONDS` the answer comes when the run ends (its result) or when the wait runs
/// out (its status and the calls awaiting a decision), whichever is first.
#[utoipa::path(post, path = "/runs", tag = "runs",
    params(("Idempotency-Key" = Option<String>, Header, description = "Repeating a key (same principal) returns the run the first request created instead of starting another")),
    request_body(content = super::wire::SubmitRun, description = "A goal document, {goal, model?, approve?, mode?, wait?}, or {agent, input?, model?, approve?, mode?, wait?}"),
    responses(
        (status = 201, description = "The run was created and started: {id, status, finished} (with `wait`: its result, or its status and the calls awaiting a decision)", body = RunOutcome),
        (status = 200, description = "The Idempotency-Key was used before: the first run's {id, status, finished}, with `Idempotent-Replayed: true`", body = RunOutcome),
        (status = 400, description = "The goal is invalid, or asks for something the operator does not grant (`grant.*`); `errors` lists each problem with its JSON pointer; `wait` is not a number of seconds from 0 to 300 (`http.bad_wait`)", body = ApiError),
        (status = 403, description = "The caller may not submit runs, or asks a published agent for a model its operator does not list (`server.agent_model`)", body = ApiError),
        (status = 404, description = "No agent of that name is published", body = ApiError),
        (status = 413, description = "The body is too large", body = ApiError),
        (status = 415, description = "Not application/json", body = ApiError),
        (status = 422, description = "The Idempotency-Key was used before with another body (`http.idempotency_key_reused`)", body = ApiError),
        (status = 429, description = "The caller already has as many active (not ended) runs as one principal may (`server.too_many_runs`, the server's `limits.active_runs`)", body = ApiError)))]
pub(super) async fn create_run(
    State(st): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    b: Result<Json<Value>, JsonRejection>,
) -> ApiResult<Response> {
    if !who.may(Role::Submit) {
        return Err(forbidden("submit runs"));
    }
    let key = idempotency_key(&headers)?;
    let mut v = body(b)?;
    let wait = match v.as_object_mut().and_then(|m| m.remove("wait")) {
        Some(w) => Some(wait_duration(&w)?),
        None => None,
    };
    let Some(key) = key else {
        let id = start_run(&st, &who, v).await?;
        return answer(&st, StatusCode::CREATED, id, wait).await;
    };
    // On Temporal the key names the workflow, so every server finds the key's run.
    #[cfg(feature = "temporal")]
    if st.temporal().is_some() {
        return keyed_on_temporal(&st, &who, v, &key, wait).await;
    }
    // One keyed creation at a time: the second of two concurrent requests with one key waits
    // for the first and then finds its run.
    let _one = st.idempotent_create.lock().await;
    let slot = (who.name.clone(), key.clone());
    // Beside the key, under names no header can spell (a line break): that a digest is kept
    // for it, and the key with this body's digest. Both name the run, as the key does.
    let marked = (who.name.clone(), format!("\nsha256 {key}"));
    let this_body = (
        who.name.clone(),
        format!("\nsha256 {key} {}", body_digest(&v)),
    );
    if let Some(id) = remembered(&st, &slot).await? {
        // A key kept before digests were (no mark) replays whatever the body.
        if remembered(&st, &this_body).await?.is_none() && remembered(&st, &marked).await?.is_some()
        {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "http.idempotency_key_reused",
                "this Idempotency-Key was used with another body; use a new key for a new run",
            ));
        }
        let mut r = answer(&st, StatusCode::OK, id, wait).await?;
        r.headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
        return Ok(r);
    }
    let id = start_run(&st, &who, v).await?;
    // The digest and its mark first: a key whose run is remembered has them.
    for slot in [this_body, marked, slot] {
        remember(&st, slot, id.clone()).await;
    }
    answer(&st, StatusCode::CREATED, id, wait).await
}

/// What a keyed `POST /runs` remembered under `slot` (principal, key), from memory or the store.
async fn remembered(st: &Arc<AppState>, slot: &(String, String)) -> ApiResult<Option<String>> {
    if let Some(v) = st.idempotent.lock().ok().and_then(|m| m.get(slot).cloned()) {
        return Ok(Some(v));
    }
    let store = st.store.clone();
    let (p, k) = slot.clone();
    tokio::task::spawn_blocking(move || store.idempotent_run(&p, &k))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server.internal", e))?
        .map_err(|e| ApiError::from_store(&e))
}

/// Remembers `value` under `slot`, in memory and in the store.
async fn remember(st: &Arc<AppState>, slot: (String, String), value: String) {
    if let Ok(mut m) = st.idempotent.lock() {
        if m.len() >= MAX_KEYS_IN_MEMORY {
            m.clear();
        }
        m.insert(slot.clone(), value.clone());
    }
    let store = st.store.clone();
    let kept =
        tokio::task::spawn_blocking(move || store.remember_idempotent(&slot.0, &slot.1, &value))
            .await;
    if !matches!(kept, Ok(Ok(()))) {
        tracing::warn!("an Idempotency-Key is kept in memory only: the store refused it");
    }
}

/// The SHA-256 of a submission's canonical JSON (keys sorted; `wait` already taken out: it
/// says how to answer, not what to run).
fn body_digest(v: &Value) -> String {
    let text = crate::protocol::canonical(v).to_string();
    ring::digest::digest(&ring::digest::SHA256, text.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `POST /runs`'s answer about the run `id`: `{id, status, finished}` at once, or with `wait`,
/// where the run stands once it ended or the wait ran out.
async fn answer(
    st: &Arc<AppState>,
    status: StatusCode,
    id: String,
    wait: Option<std::time::Duration>,
) -> ApiResult<Response> {
    let body = match wait {
        Some(w) => outcome(st, &id, w).await?,
        None => {
            let now = match st.describe_view(&id).await {
                Ok(d) => d.status,
                Err(_) => "unknown".to_string(),
            };
            RunOutcome::started(id, now)
        }
    };
    Ok((status, Json(body)).into_response())
}

/// Checks a submission and starts its run, recorded as `who`'s.
/// A keyed `POST /runs` on Temporal: the run's id is derived from (principal, key), so any
/// server that gets the key again finds the run; 422 when it was submitted with another body.
#[cfg(feature = "temporal")]
async fn keyed_on_temporal(
    st: &Arc<AppState>,
    who: &Principal,
    v: Value,
    key: &str,
    wait: Option<std::time::Duration>,
) -> ApiResult<Response> {
    use super::on_temporal::{Started, keyed_run_id};
    let keyed = (keyed_run_id(&who.name, key), body_digest(&v));
    let (id, started) = start_defined(st, who, v, Some(keyed)).await?;
    match started {
        Started::New => answer(st, StatusCode::CREATED, id, wait).await,
        Started::Same => {
            let mut r = answer(st, StatusCode::OK, id, wait).await?;
            r.headers_mut()
                .insert("idempotent-replayed", HeaderValue::from_static("true"));
            Ok(r)
        }
        Started::Other => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "http.idempotency_key_reused",
            "this Idempotency-Key was used with another body; use a new key for a new run",
        )),
    }
}

async fn start_run(st: &Arc<AppState>, who: &Principal, v: Value) -> ApiResult<String> {
    #[cfg(feature = "temporal")]
    return start_defined(st, who, v, None).await.map(|(id, _)| id);
    #[cfg(not(feature = "temporal"))]
    start_defined(st, who, v).await
}

/// Defines the submitted run and starts it (on Temporal, under the keyed id when given).
async fn start_defined(
    st: &Arc<AppState>,
    who: &Principal,
    v: Value,
    #[cfg(feature = "temporal")] keyed: Option<(String, String)>,
) -> ApiResult<StartedRun> {
    let (doc, mut opts) = envelope(v, st)?;
    opts.submitted_by = Some(who.name.clone());
    let (doc, base, agent) = match doc {
        Submitted::Goal(doc) => (doc, st.base_dir.clone(), None),
        Submitted::Agent { name, input } => {
            let (doc, base) = agent_goal(st, &name, input)?;
            (doc, base, Some(name))
        }
    };
    let goal = check_goal(&doc, &base)?;
    st.hold_to_floor(&mut opts, agent.as_deref(), &goal)?;
    // Kept until the run is started: it is then one of the caller's active runs in the store.
    let _slot = st.run_slot(who).await?;
    let def = crate::runs::define(goal, opts, st.grants.clone()).map_err(runs_error)?;
    #[cfg(feature = "temporal")]
    if let Some(t) = st.temporal() {
        crate::runs::RunDef::config(&def).map_err(runs_error)?;
        return t.start(&def, st.notify_page(), keyed).await;
    }
    let id = st.launch_defined(&def, None).await.map_err(runs_error)?;
    #[cfg(feature = "temporal")]
    return Ok((id, super::on_temporal::Started::New));
    #[cfg(not(feature = "temporal"))]
    Ok(id)
}

/// What [`start_defined`] answers: the run's id (on Temporal, with what a keyed start found).
#[cfg(feature = "temporal")]
type StartedRun = (String, super::on_temporal::Started);
#[cfg(not(feature = "temporal"))]
type StartedRun = String;

/// A run that could not be defined or started, as an API error (grants with their pointer).
pub(super) fn runs_error(e: crate::runs::RunsError) -> ApiError {
    use crate::runs::RunsError;
    let status = match e {
        RunsError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::BAD_REQUEST,
    };
    let mut err = ApiError::new(status, e.code(), &e);
    if let RunsError::Grant(g) = &e {
        err.errors.push(Problem {
            pointer: g.pointer().to_string(),
            message: g.to_string(),
        });
    }
    err
}

/// What a submission asks to run.
enum Submitted {
    /// A goal document.
    Goal(Value),
    /// A published agent, with the run's input.
    Agent { name: String, input: Option<Value> },
}

/// The goal document of a published agent with `input` as its input, and its folder.
fn agent_goal(
    st: &AppState,
    name: &str,
    input: Option<Value>,
) -> ApiResult<(Value, std::path::PathBuf)> {
    let Some(path) = st.agents.get(name) else {
        let known: Vec<&str> = st.agents.keys().map(String::as_str).collect();
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "server.unknown_agent",
            format!(
                "no agent named `{name}` is published here{}",
                if known.is_empty() {
                    " (none is)".to_string()
                } else {
                    format!(" (published: {})", known.join(", "))
                }
            ),
        ));
    };
    let internal = |e: String| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server.agent_unreadable",
            format!("agent `{name}`: {e}"),
        )
    };
    let text = std::fs::read_to_string(path).map_err(|e| internal(e.to_string()))?;
    let mut doc: Value = serde_json::from_str(&text).map_err(|e| internal(e.to_string()))?;
    if let (Some(i), Some(m)) = (input, doc.as_object_mut()) {
        m.insert("input".into(), i);
    }
    let base = path
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    Ok((doc, base))
}

/// Splits a submission into what it runs and the run's options.
fn envelope(v: Value, st: &AppState) -> ApiResult<(Submitted, RunOptions)> {
    let mut opts = RunOptions {
        allow_shell: st.grants.allows_shell(),
        server: true,
        ..RunOptions::default()
    };
    let Value::Object(mut m) = v else {
        return Err(problems(vec![Problem {
            pointer: String::new(),
            message: "the body must be a JSON object (a goal document)".into(),
        }]));
    };
    let agent = m.get("agent").is_some();
    if !agent && !m.get("goal").is_some_and(Value::is_object) {
        return Ok((Submitted::Goal(Value::Object(m)), opts));
    }
    let mut bad = Vec::new();
    let mut text = |key: &str, allowed: &[&str]| -> Option<String> {
        let v = m.remove(key)?;
        match v.as_str() {
            Some(s) if allowed.is_empty() || allowed.contains(&s) => Some(s.to_string()),
            _ => {
                bad.push(Problem {
                    pointer: format!("/{key}"),
                    message: if allowed.is_empty() {
                        "must be a string".into()
                    } else {
                        format!("must be one of {}", allowed.join(", "))
                    },
                });
                None
            }
        }
    };
    opts.model = text("model", &[]);
    let names: Vec<&str> = ModeName::ALL.iter().map(|m| m.as_str()).collect();
    opts.approve = text("approve", &names).and_then(|s| ModeName::parse(&s).ok());
    opts.mode = text("mode", &["structured", "tools"]);
    let name = text("agent", &[]);
    let submitted = match name {
        Some(name) if agent => {
            if m.contains_key("goal") {
                bad.push(Problem {
                    pointer: "/goal".into(),
                    message: "give either `agent` or `goal`, not both".into(),
                });
            }
            Submitted::Agent {
                name,
                input: m.remove("input"),
            }
        }
        _ => Submitted::Goal(m.remove("goal").unwrap_or(Value::Null)),
    };
    for k in m.keys() {
        bad.push(Problem {
            pointer: format!("/{k}"),
            message: if agent {
                "unknown field (expected agent, input, model, approve, mode, wait)".into()
            } else {
                "unknown field (expected goal, model, approve, mode, wait)".into()
            },
        });
    }
    if !bad.is_empty() {
        return Err(problems(bad));
    }
    Ok((submitted, opts))
}

fn problems(errors: Vec<Problem>) -> ApiError {
    let mut e = ApiError::new(
        StatusCode::BAD_REQUEST,
        "goal.invalid",
        format!("the goal is invalid ({} problem(s))", errors.len()),
    );
    e.errors = errors;
    e
}

/// The goal checked against the published schema (every violation, by pointer), then by the
/// same loader `dagloop run` uses.
pub(super) fn check_goal(doc: &Value, base: &std::path::Path) -> ApiResult<Goal> {
    let origin = std::path::Path::new("the submitted goal");
    // A misspelt meta key first: the schema would refuse it too, without the suggestion.
    Goal::check_meta_keys(doc, origin).map_err(goal_error)?;
    let violations = crate::schema::published::Document::Goal
        .validate(doc)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server.internal", e))?;
    if !violations.is_empty() {
        return Err(problems(
            violations
                .into_iter()
                .map(|v| Problem {
                    pointer: v.pointer,
                    message: v.message,
                })
                .collect(),
        ));
    }
    Goal::from_json(&doc.to_string(), origin, base.to_path_buf()).map_err(goal_error)
}

/// A goal the loader refused, as a 400 with the problem at its pointer.
fn goal_error(e: crate::goal::GoalError) -> ApiError {
    let mut err = ApiError::new(StatusCode::BAD_REQUEST, e.code(), &e);
    err.errors.push(Problem {
        pointer: pointer_of(&e),
        message: e.to_string(),
    });
    err
}

/// The JSON pointer a goal error names, as far as it names one.
fn pointer_of(e: &crate::goal::GoalError) -> String {
    use crate::goal::GoalError;
    match e {
        GoalError::ToolClash { second, .. } => format!("/tools/{second}"),
        GoalError::UnknownMetaKey { pointer, .. } => pointer.clone(),
        GoalError::BadSchema { field, .. } => match field.strip_prefix("tools[") {
            Some(rest) => format!("/tools/{}", rest.split(']').next().unwrap_or("")),
            None => format!("/{field}"),
        },
        _ => String::new(),
    }
}

/// A run: status, calls with their status and times, timeline spans, critical path, calls
/// awaiting a decision, state, output and error.
#[utoipa::path(get, path = "/runs/{id}", tag = "runs",
    params(("id" = String, Path, description = "The run id")),
    responses((status = 200, description = "The run described", body = crate::runs::RunView),
              (status = 404, description = "No such run (or not one the caller may read)", body = ApiError)))]
pub(super) async fn get_run(
    State(st): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    st.readable(&who, &id).await?;
    let v = st.describe(&id).await?;
    Ok(Json(super::shown::show(&st, &who, &id, v).await))
}

/// The calls awaiting a decision: the resolved call, its `params_hash`, whether it was
/// interrupted by a restart, and its tool's params schema. Listed to a reviewer, a call is
/// shown: its deadline (`deadline_at`), when the policy sets a timeout, starts at the first
/// listing (or terminal prompt) and is the same for every later reader.
#[utoipa::path(get, path = "/runs/{id}/approvals", tag = "approvals",
    params(("id" = String, Path, description = "The run id")),
    responses((status = 200, description = "Calls awaiting a decision", body = Vec<crate::runs::AwaitingCall>),
              (status = 404, description = "No such run (or not one the caller may read)", body = ApiError)))]
pub(super) async fn approvals(
    State(st): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    st.readable(&who, &id).await?;
    let v = st.describe(&id).await?;
    let mut v = super::shown::show(&st, &who, &id, v).await;
    Ok(Json(v["awaiting"].take()))
}

/// Decides a call awaiting approval. The body is a Decision (`{"decision": "approve"}`,
/// `{"decision": "edit", "params": {...}}`, `{"decision": "replace", "call": {...}}`,
/// `{"decision": "reject", "reason": "..."}`, `{"decision": "send_back", "feedback": "..."}`:
/// not run, and the model is told to do it differently), optionally with `presented`: the `params_hash`
/// the reviewer saw (a string; anything else is refused), and `presentation`: the `seq` of the
/// `approval_requested` event it answers (a number). Of concurrent decisions about one
/// presentation, whichever server or command records them, one is accepted; the others get 409
/// `op.already_decided` naming it. Needs the `review` role.
#[utoipa::path(post, path = "/runs/{id}/approvals/{call}", tag = "approvals",
    params(("id" = String, Path, description = "The run id"), ("call" = u64, Path, description = "The call id")),
    request_body(content = super::wire::DecideRequest, description = "A Decision, optionally with `presented` and `presentation`"),
    responses(
        (status = 200, description = "Applied: {status: applied}", body = OpStatus),
        (status = 202, description = "Recorded for a run no process drives now: {status: recorded}", body = OpStatus),
        (status = 400, description = "Not a decision (or `presented` is not a string, `presentation` not a number)", body = ApiError),
        (status = 403, description = "The caller may not decide, or submitted the run and the operator separates duties (`approval.own_run`)", body = ApiError),
        (status = 404, description = "No such run or call", body = ApiError),
        (status = 409, description = "The call is not awaiting a decision, was decided first by somebody else (`op.already_decided`, naming that decision and who made it), was presented with other params (`op.stale`), was presented again since (`op.stale_presentation`), or the run moved on while the decision was checked (`op.stale`)", body = ApiError),
        (status = 422, description = "The decision cannot apply (invalid params, an edit that changes the tool)", body = ApiError)))]
pub(super) async fn decide(
    State(st): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    Path((id, call)): Path<(String, u64)>,
    b: Result<Json<Value>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<OpStatus>)> {
    if !who.may(Role::Review) {
        return Err(forbidden("decide calls"));
    }
    st.check_duties(&who, &id).await?;
    let mut v = body(b)?;
    let presented = match v.as_object_mut().and_then(|m| m.remove("presented")) {
        None => None,
        Some(Value::String(p)) => Some(p),
        Some(other) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "op.bad_decision",
                format!("`presented` must be the params_hash string the reviewer saw, not {other}"),
            ));
        }
    };
    let presentation = match v.as_object_mut().and_then(|m| m.remove("presentation")) {
        None => None,
        Some(p) => Some(p.as_u64().ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "op.bad_decision",
                format!(
                    "`presentation` must be the seq of the approval_requested event the reviewer saw, not {p}"
                ),
            )
        })?),
    };
    let decision: Decision = serde_json::from_value(v).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "op.bad_decision",
            format!("not a decision: {e}"),
        )
    })?;
    let op = Op::Decide {
        call: CallId(call),
        decision,
        presented,
        presentation,
        by: actor(&who),
    };
    submit(&st, &id, op).await
}

/// `POST /runs/{id}/cancel`'s optional body.
#[derive(Default, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CancelRequest {
    /// Why, in the canceller's words.
    #[serde(default)]
    reason: Option<String>,
}

/// Cancels a run: nothing more launches, running calls are aborted. The body (JSON, as every
/// POST) may be empty or `{"reason": "..."}`. An admin cancels any run, a submitter its own.
#[utoipa::path(post, path = "/runs/{id}/cancel", tag = "runs",
    params(("id" = String, Path, description = "The run id")),
    request_body(content = Option<CancelRequest>, description = "Optional: {reason}"),
    responses((status = 200, description = "Cancelling: {status: applied}", body = OpStatus),
              (status = 400, description = "The body is not {reason?}", body = ApiError),
              (status = 403, description = "The caller may not cancel this run", body = ApiError),
              (status = 404, description = "No such run (or not one the caller may read)", body = ApiError),
              (status = 409, description = "The run has finished", body = ApiError),
              (status = 415, description = "Not application/json", body = ApiError)))]
pub(super) async fn cancel(
    State(st): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    b: axum::body::Bytes,
) -> ApiResult<(StatusCode, Json<OpStatus>)> {
    let req: CancelRequest = if b.iter().all(u8::is_ascii_whitespace) {
        CancelRequest::default()
    } else {
        serde_json::from_slice(&b).map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "http.bad_body",
                format!("expected nothing or {{\"reason\": \"...\"}}: {e}"),
            )
        })?
    };
    let owner = st.submitter(&id).await?;
    if !who.may_read(owner.as_deref()) {
        return Err(ApiError::from_store(
            &crate::store::StoreError::UnknownRun { id: id.clone() },
        ));
    }
    if !who.may_cancel(owner.as_deref()) {
        return Err(forbidden("cancel this run"));
    }
    let op = Op::Cancel {
        reason: req
            .reason
            .unwrap_or_else(|| format!("cancelled through the API by {}", who.name)),
        by: actor(&who),
    };
    submit(&st, &id, op).await
}

/// Applies an op to a live run, or records it (checked first) for a run nobody drives now.
pub(super) async fn submit(
    st: &Arc<AppState>,
    id: &str,
    op: Op,
) -> ApiResult<(StatusCode, Json<OpStatus>)> {
    #[cfg(feature = "temporal")]
    if let Some(t) = st.temporal() {
        return t.submit(id, op).await;
    }
    // A parked run of this server is woken to take the op itself (another process's run, or
    // one being parked right now, gets it recorded: its driver takes it when next driven).
    let live = match st.live(id) {
        Some(l) => Some(l),
        None if st.wake(id).await => st.live(id),
        None => None,
    };
    if let Some(live) = live {
        live.handle
            .submit(op)
            .await
            .map_err(|e| ApiError::from_op(&e))?;
        return Ok((StatusCode::OK, Json(OpStatus::new("applied"))));
    }
    let store = st.store.clone();
    let run = id.to_string();
    let (_, driven) =
        tokio::task::spawn_blocking(move || crate::runs::record_op(&*store, &run, &op))
            .await
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server.internal", e))?
            .map_err(|e| match e {
                crate::runs::Refused::Op(e) => ApiError::from_op(&e),
                crate::runs::Refused::Runs(crate::runs::RunsError::Store(e)) => {
                    ApiError::from_store(&e)
                }
                crate::runs::Refused::Runs(e) => {
                    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.code(), e)
                }
            })?;
    if driven {
        // Another process drives it and takes the op from the store.
        return Ok((
            StatusCode::ACCEPTED,
            Json(OpStatus::recorded(
                "the process that drives this run applies it within a second",
            )),
        ));
    }
    // Nobody drives it (a run started with `dagloop run --detach`...): this server takes it
    // and the op applies as the run continues, or says who can continue it.
    match st.adopt(id).await {
        Ok(true) => Ok((StatusCode::OK, Json(OpStatus::new("applied")))),
        Ok(false) => Ok((
            StatusCode::ACCEPTED,
            Json(OpStatus::recorded(&format!(
                "nobody drives this run now; it applies when the run is continued (`dagloop resume {id}` where the run was started)"
            ))),
        )),
        Err(why) => Ok((
            StatusCode::ACCEPTED,
            Json(OpStatus::recorded(&format!(
                "this server cannot continue the run ({why}: see the server's log); it applies when the run is continued with `dagloop resume {id}` where the run was started"
            ))),
        )),
    }
}

/// `GET /metrics`: the Prometheus text exposition of runs by status and what the runs driven by
/// this process did (`crate::telemetry::metrics`).
/// Only `admin` and `metrics` read it: it counts every principal's runs.
pub(super) async fn metrics(
    State(st): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
) -> ApiResult<impl IntoResponse> {
    if !who.may(Role::Metrics) {
        return Err(forbidden("read the metrics"));
    }
    // Runs by status as the store derives it (`store::derive_status`, one rule for the list,
    // `show` and this).
    let s = st.clone();
    let stats = tokio::task::spawn_blocking(move || s.store.stats())
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server.internal", e))?
        .map_err(|e| ApiError::from_store(&e))?;
    let by_status = stats.runs;
    let runs: Vec<(String, u64)> = by_status.into_iter().collect();
    let mut text = crate::telemetry::metrics::render(&runs);
    let (watched, waiters) = st.watches.counts();
    let driven = super::state::lock(&st.live).len();
    text.push_str(&format!(
        "# HELP dagloop_runs_driven Runs this process drives now (parked runs are not).\n\
         # TYPE dagloop_runs_driven gauge\ndagloop_runs_driven {driven}\n\
         # HELP dagloop_run_watchers Runs that clients wait on (one watcher each).\n\
         # TYPE dagloop_run_watchers gauge\ndagloop_run_watchers {watched}\n\
         # HELP dagloop_run_waiters Clients waiting on a run's end (`wait`).\n\
         # TYPE dagloop_run_waiters gauge\ndagloop_run_waiters {waiters}\n"
    ));
    Ok(([("content-type", "text/plain; version=0.0.4")], text))
}
