//! One call for a result: `POST /runs` with `"wait": SECONDS` and
//! `GET /runs/{id}/result?wait=SECONDS` answer with the run's final result when it ends within
//! that time, else with its current status and the calls awaiting a decision.
//!
//! The wait is the run's one watcher (`watch`, shared by every waiter), bounded by a timer.
//! Deliberately not here: deciding calls or cancelling a run because the wait ran out (the run
//! goes on; the caller asks again or follows its events).

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde_json::Value;

use super::error::ApiError;
use super::principals::Principal;
use super::state::AppState;
use crate::machine::{RunError, Usage};
use crate::runs::AwaitingCall;

/// The longest wait a request may ask for, in seconds.
pub const MAX_WAIT_SECONDS: f64 = 300.0;

/// Where a run stands: its final result once it ended, else its status and the calls awaiting
/// a decision. `POST /runs` without `wait` answers `{id, status, finished: false}` only.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct RunOutcome {
    /// The run id.
    pub id: String,
    /// Its terminal status once it ended (`succeeded`, `failed`, `cancelled`, ...), else
    /// `running`, `waiting` (calls await a decision) or `stopped` (nobody drives it now).
    pub status: String,
    /// True when the run has ended: `output`, `error` and `usage` are final.
    pub finished: bool,
    /// The validated output (null unless it succeeded); any JSON value. Once finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// Why it failed. Once finished, for a run that did not succeed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
    /// Tokens used. Once finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The run's state (the final one once finished); any JSON value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<Value>,
    /// The calls awaiting a decision (empty once finished). Present when the answer waited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub awaiting: Option<Vec<AwaitingCall>>,
}

impl RunOutcome {
    /// What `POST /runs` answers without `wait`.
    pub fn started(id: String, status: String) -> RunOutcome {
        RunOutcome {
            id,
            status,
            finished: false,
            output: None,
            error: None,
            usage: None,
            state: None,
            awaiting: None,
        }
    }

    /// The status code of a `GET /runs/{id}/result` answer: 200 once finished, else 202.
    pub fn http_status(&self) -> StatusCode {
        if self.finished {
            StatusCode::OK
        } else {
            StatusCode::ACCEPTED
        }
    }
}

/// `wait` as a duration: a number of seconds from 0 to [`MAX_WAIT_SECONDS`]; anything else is
/// 400 `http.bad_wait`.
pub fn wait_duration(v: &Value) -> Result<Duration, ApiError> {
    let bad = || {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "http.bad_wait",
            format!("`wait` must be a number of seconds from 0 to {MAX_WAIT_SECONDS}, not {v}"),
        )
    };
    match v.as_f64() {
        Some(s) if (0.0..=MAX_WAIT_SECONDS).contains(&s) => {
            crate::duration::seconds("wait", s).map_err(|_| bad())
        }
        _ => Err(bad()),
    }
}

/// Waits up to `wait` for the run to end, through the run's one watcher (shared with every
/// other waiter: `watch`), then says where it stands: the watcher's description of the ended
/// run, else the run described once, now.
pub async fn outcome(st: &Arc<AppState>, id: &str, wait: Duration) -> Result<RunOutcome, ApiError> {
    let mut ended = None;
    if !wait.is_zero() {
        let watch = st.watch_run(id);
        if let Ok(Some(view)) = tokio::time::timeout(wait, watch.ended()).await {
            ended = Some(view);
        }
    }
    let view = match ended {
        Some(view) => Arc::unwrap_or_clone(view),
        None => st.describe_view(id).await?,
    };
    let finished = view.usage.is_some();
    Ok(RunOutcome {
        id: view.id,
        status: view.status,
        finished,
        output: if finished { view.output } else { None },
        error: view.error,
        usage: view.usage,
        state: view.state,
        awaiting: Some(view.awaiting),
    })
}

/// `GET /runs/{id}/result`'s query.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct WaitQuery {
    /// Seconds to wait for the run to end (0 to 300; default 0: answer at once).
    #[param(value_type = Option<f64>)]
    wait: Option<String>,
}

/// The run's result: at once, or once it ends within `wait` seconds. 200 with the final
/// result when it has ended; 202 with its status and the calls awaiting a decision when it has
/// not (ask again, or follow `/runs/{id}/events`).
#[utoipa::path(get, path = "/runs/{id}/result", tag = "runs",
    params(("id" = String, Path, description = "The run id"), WaitQuery),
    responses(
        (status = 200, description = "The run has ended: its final result", body = RunOutcome),
        (status = 202, description = "The run has not ended (within `wait`): its status and the calls awaiting a decision", body = RunOutcome),
        (status = 400, description = "`wait` is not a number of seconds from 0 to 300 (`http.bad_wait`)", body = ApiError),
        (status = 404, description = "No such run (or not one the caller may read)", body = ApiError),
        (status = 429, description = "The caller already holds as many open waits as one principal may (`server.too_many_open`)", body = ApiError)))]
pub(super) async fn result(
    State(st): State<Arc<AppState>>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
    Query(q): Query<WaitQuery>,
) -> Result<(StatusCode, Json<RunOutcome>), ApiError> {
    let wait = match q.wait.as_deref() {
        None => Duration::ZERO,
        Some(s) => wait_duration(
            &s.trim()
                .parse::<f64>()
                .map_or_else(|_| Value::String(s.to_string()), Value::from),
        )?,
    };
    st.readable(&who, &id).await?;
    // A held wait takes one of the caller's slots until it is answered (`limits`).
    let _held = match wait.is_zero() {
        true => None,
        false => Some(st.open.hold(&who, "waits")?),
    };
    let o = outcome(&st, &id, wait).await?;
    Ok((o.http_status(), Json(o)))
}
