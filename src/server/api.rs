//! The API's handlers: submit goals, list and describe runs, decide calls, cancel runs.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::error::{ApiError, Problem};
use super::state::AppState;
use crate::approval::ModeName;
use crate::goal::Goal;
use crate::protocol::{CallId, Decision, Op};
use crate::runs::RunOptions;
use crate::store::RunStore;

type ApiResult<T> = Result<T, ApiError>;

/// A JSON body, or a coded 400 saying why it is not one.
fn body(b: Result<Json<Value>, JsonRejection>) -> ApiResult<Value> {
    b.map(|Json(v)| v).map_err(|e| {
        let status = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            StatusCode::PAYLOAD_TOO_LARGE
        } else {
            StatusCode::BAD_REQUEST
        };
        ApiError::new(status, "http.bad_body", e.body_text())
    })
}

/// Stored runs, newest first, with how many calls each has waiting for a decision.
#[utoipa::path(get, path = "/runs", tag = "runs",
    responses((status = 200, description = "Runs, newest first: id, status, entries, created_at, updated_at, waiting", body = Object)))]
pub(super) async fn list_runs(State(st): State<Arc<AppState>>) -> ApiResult<Json<Value>> {
    let s = st.clone();
    let rows = tokio::task::spawn_blocking(move || s.store.list())
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server.internal", e))?
        .map_err(|e| ApiError::from_store(&e))?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let waiting = match st.live(&row.id) {
            Some(l) => l.handle.awaiting().len(),
            None => 0,
        };
        let status = if waiting > 0 {
            "waiting".to_string()
        } else {
            row.status.clone()
        };
        let mut v = json!(row);
        v["status"] = json!(status);
        v["waiting"] = json!(waiting);
        out.push(v);
    }
    Ok(Json(Value::Array(out)))
}

/// Submits a goal: the goal document itself, `{"goal": {...}, "model", "approve", "mode"}`, or
/// an agent the operator publishes, `{"agent": NAME, "input": {...}, "model", "approve", "mode"}`.
/// What the goal may touch is what the server's operator grants; the run starts at once; follow
/// it with `/runs/{id}/events`.
#[utoipa::path(post, path = "/runs", tag = "runs",
    request_body(content = Object, description = "A goal document, {goal, model?, approve?, mode?}, or {agent, input?, model?, approve?, mode?}"),
    responses(
        (status = 201, description = "The run was created and started: {id, status}", body = Object),
        (status = 400, description = "The goal is invalid, or asks for something the operator does not grant (`grant.*`); `errors` lists each problem with its JSON pointer", body = ApiError),
        (status = 404, description = "No agent of that name is published", body = ApiError),
        (status = 413, description = "The body is too large", body = ApiError)))]
pub(super) async fn create_run(
    State(st): State<Arc<AppState>>,
    b: Result<Json<Value>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let v = body(b)?;
    let (doc, opts) = envelope(v, &st)?;
    let (doc, base) = match doc {
        Submitted::Goal(doc) => (doc, st.base_dir.clone()),
        Submitted::Agent { name, input } => agent_goal(&st, &name, input)?,
    };
    let goal = check_goal(&doc, &base)?;
    let def = crate::runs::define(goal, opts, st.grants.clone()).map_err(runs_error)?;
    let id = st.launch_defined(&def, None).await.map_err(runs_error)?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"id": id, "status": "running"})),
    ))
}

/// A run that could not be defined or started, as an API error (grants with their pointer).
fn runs_error(e: crate::runs::RunsError) -> ApiError {
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
                "unknown field (expected agent, input, model, approve, mode)".into()
            } else {
                "unknown field (expected goal, model, approve, mode)".into()
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
fn check_goal(doc: &Value, base: &std::path::Path) -> ApiResult<Goal> {
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
    responses((status = 200, description = "The run described", body = Object),
              (status = 404, description = "No such run", body = ApiError)))]
pub(super) async fn get_run(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    st.describe(&id).await.map(Json)
}

/// The calls awaiting a decision: the resolved call, its `params_hash`, whether it was
/// interrupted by a restart, and its tool's params schema.
#[utoipa::path(get, path = "/runs/{id}/approvals", tag = "approvals",
    params(("id" = String, Path, description = "The run id")),
    responses((status = 200, description = "Calls awaiting a decision", body = Object),
              (status = 404, description = "No such run", body = ApiError)))]
pub(super) async fn approvals(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let mut v = st.describe(&id).await?;
    Ok(Json(v["awaiting"].take()))
}

/// Decides a call awaiting approval. The body is a Decision (`{"decision": "approve"}`,
/// `{"decision": "edit", "params": {...}}`, `{"decision": "replace", "call": {...}}`,
/// `{"decision": "reject", "reason": "..."}`), optionally with `presented`: the `params_hash`
/// the reviewer saw.
#[utoipa::path(post, path = "/runs/{id}/approvals/{call}", tag = "approvals",
    params(("id" = String, Path, description = "The run id"), ("call" = u64, Path, description = "The call id")),
    request_body(content = Object, description = "A Decision, optionally with `presented`"),
    responses(
        (status = 200, description = "Applied: {status: applied}", body = Object),
        (status = 202, description = "Recorded for a run no process drives now: {status: recorded}", body = Object),
        (status = 400, description = "Not a decision", body = ApiError),
        (status = 404, description = "No such run or call", body = ApiError),
        (status = 409, description = "The call is not awaiting a decision, was decided first by somebody else, or was presented with other params", body = ApiError),
        (status = 422, description = "The decision cannot apply (invalid params, an edit that changes the tool)", body = ApiError)))]
pub(super) async fn decide(
    State(st): State<Arc<AppState>>,
    Path((id, call)): Path<(String, u64)>,
    b: Result<Json<Value>, JsonRejection>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let mut v = body(b)?;
    let presented = v
        .as_object_mut()
        .and_then(|m| m.remove("presented"))
        .and_then(|p| p.as_str().map(str::to_string));
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
    };
    submit(&st, &id, op).await
}

/// Cancels a run: nothing more launches, running calls are aborted.
#[utoipa::path(post, path = "/runs/{id}/cancel", tag = "runs",
    params(("id" = String, Path, description = "The run id")),
    responses((status = 200, description = "Cancelling: {status: applied}", body = Object),
              (status = 404, description = "No such run", body = ApiError),
              (status = 409, description = "The run has finished", body = ApiError)))]
pub(super) async fn cancel(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let op = Op::Cancel {
        reason: "cancelled through the API".into(),
    };
    submit(&st, &id, op).await
}

/// Applies an op to a live run, or records it (checked first) for a run nobody drives now.
async fn submit(st: &Arc<AppState>, id: &str, op: Op) -> ApiResult<(StatusCode, Json<Value>)> {
    if let Some(live) = st.live(id) {
        live.handle
            .submit(op)
            .await
            .map_err(|e| ApiError::from_op(&e))?;
        return Ok((StatusCode::OK, Json(json!({"status": "applied"}))));
    }
    let store = st.store.clone();
    let run = id.to_string();
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
    Ok((StatusCode::ACCEPTED, Json(json!({"status": "recorded"}))))
}
