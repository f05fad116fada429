//! The API's request and response bodies as types, for the OpenAPI document
//! (`super::openapi`) and for the handlers that answer with them.
//!
//! Deliberately not here: parsing requests. The handlers read bodies as JSON values and refuse
//! each problem with its own code and pointer; the request types here describe what they
//! accept (a test checks the document against every answer the server gives in the tests).

use serde_json::Value;

use crate::approval::ModeName;

/// `POST /runs`: a goal to run. Either the goal document itself (its fields at the top level),
/// or `{"goal": {...}}`, or a published agent `{"agent": NAME, "input": ...}`; with the run's
/// options beside it.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[allow(dead_code)] // describes what `api::create_run` reads from the JSON body
pub struct SubmitRun {
    /// The goal document (docs/goal-file.md); in a bare goal document, the goal's text.
    goal: Option<Value>,
    /// The name of an agent the operator publishes (instead of `goal`).
    agent: Option<String>,
    /// The run's input, for a published agent; any JSON value.
    input: Option<Value>,
    /// The model, overriding the goal's (`openai:gpt-4o`, `scripted:FILE`, ...).
    model: Option<String>,
    /// Which calls wait for a reviewer.
    approve: Option<ModeName>,
    /// How the model is asked: `structured` or `tools`.
    mode: Option<String>,
    /// Seconds (0 to 300) to wait for the run to end before answering: the answer then carries
    /// its result, or its status and the calls awaiting a decision.
    wait: Option<f64>,
    /// A bare goal document's other fields (`tools`, `output_schema`, ...).
    #[serde(flatten)]
    goal_fields: std::collections::BTreeMap<String, Value>,
}

/// `POST /runs/{id}/approvals/{call}`: a decision (`crate::protocol::Decision`), optionally
/// with the `params_hash` the reviewer was shown.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[allow(dead_code)] // describes what `api::decide` reads from the JSON body
pub struct DecideRequest {
    /// What to do with the call.
    decision: DecisionName,
    /// For `edit`: the params to run it with instead.
    params: Option<serde_json::Map<String, Value>>,
    /// For `replace`: the call to run in its place.
    call: Option<crate::protocol::Call>,
    /// For `reject`: why, in the reviewer's words (the model is told not to retry).
    reason: Option<String>,
    /// For `send_back`: what the model should do differently (it is told so; not a veto).
    feedback: Option<String>,
    /// The `params_hash` the reviewer saw: the decision applies only to exactly that call.
    presented: Option<String>,
    /// The presentation the decision answers: the `seq` of the call's `approval_requested`
    /// event (`presentation` in the run's awaiting calls). A decision answers that presentation
    /// only; once the call is presented again (after a restart) it is refused with 409
    /// `op.stale_presentation`. Without it, the decision answers the presentation awaiting a
    /// decision when the server checks it.
    presentation: Option<u64>,
}

/// A decision's name.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum DecisionName {
    /// Run the call as presented.
    Approve,
    /// Run it with `params` instead.
    Edit,
    /// Run `call` in its place.
    Replace,
    /// Do not run it; the model is told `reason` and not to retry it.
    Reject,
    /// Do not run it; the model is told `feedback`: what to do differently (not a veto).
    SendBack,
}

/// One run as `GET /runs` lists it.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct RunSummary {
    /// The run as the store lists it (its `status` is `waiting` while calls await a decision).
    #[serde(flatten)]
    pub row: crate::store::RunSummary,
    /// The same as `awaiting` (the name the page read first).
    pub waiting: u64,
}

/// What became of a decision or a cancellation.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct OpStatus {
    /// `applied` (the run's process took it) or `recorded` (kept for a run nobody drives now,
    /// applied when it continues).
    pub status: String,
    /// The standing approval's id (`g1`, `g2`, ...), in the answer to
    /// `POST /runs/{id}/standing`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standing: Option<String>,
    /// The same as `standing`, under its name before the rename (for older clients).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
    /// For `recorded`: who applies it, and when (the process that drives the run, or what must
    /// continue it when this server cannot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl OpStatus {
    /// `applied` or `recorded`.
    pub fn new(status: &str) -> OpStatus {
        OpStatus {
            status: status.to_string(),
            standing: None,
            grant: None,
            detail: None,
        }
    }

    /// `recorded`, saying who applies it.
    pub fn recorded(detail: &str) -> OpStatus {
        OpStatus {
            detail: Some(detail.to_string()),
            ..OpStatus::new("recorded")
        }
    }
}

/// A ticket that opens one run's events for 60 seconds.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Ticket {
    /// Send it once, as the `X-Dagloop-Ticket` header, to `GET /runs/{run}/events` (the
    /// answer also sets it as the `dagloop_ticket` cookie, for a browser's `EventSource`).
    pub ticket: String,
    /// The run it opens.
    pub run: String,
    /// Seconds it stays valid.
    pub expires_in_s: u64,
}

/// A run as a cassette: a scripted-model file and a tools recording.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Cassette {
    /// A scripted-model file of the run's own agent's turns (`--model scripted:FILE`).
    pub model: Value,
    /// Its tool results keyed by tool and resolved params (`--tools-from FILE`).
    pub tools: Value,
}
