//! A run described from its journal: every call with its status and times, the timeline of
//! calls, reviewer waits and model turns, the critical path, what awaits a decision, and the
//! result. `dagloop show` prints it; the server returns it.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{RunDef, RunsError};
use crate::goal::Goal;
use crate::machine::{JournalEntry, RunMachine, RunResult};
use crate::protocol::{Event, EventKind, params_hash};
use crate::store::RunRecord;

/// A stored or live run rebuilt by replaying its journal through the machine that ran it.
pub struct Rebuilt {
    /// The goal as recorded.
    pub goal: Goal,
    /// The machine after the whole journal (what awaits a decision, whether an op applies).
    pub machine: RunMachine,
    /// The events the run published (live-only ones excepted).
    pub events: Vec<Event>,
    /// When each model stream closed: the agent (its delegate call, None for the run's own
    /// agent) and the time.
    pub streams_closed: Vec<(Option<u64>, u64)>,
    /// Who cancelled the run, when its cancellation said so.
    pub cancelled_by: Option<crate::protocol::Actor>,
    /// The tools of the run's agent and of its nested agents (first of a name wins), to say
    /// what a call awaiting a decision will do.
    pub tools: Vec<crate::protocol::Tool>,
    /// The run this one was forked from, and after which step (`dagloop fork`).
    pub forked_from: Option<super::ForkedFrom>,
    /// The session this follow-up belongs to and the run it follows (`run --continue`).
    pub session: Option<super::SessionOf>,
    /// The principal that submitted the run to a server (None for runs started otherwise).
    pub submitted_by: Option<String>,
    /// The model's thoughts, turn by turn, as journaled.
    pub thoughts: Vec<Thought>,
}

/// The model's `thoughts` for one step of one agent.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct Thought {
    /// The step (model turn) whose Solution carried them.
    pub step: u32,
    /// The delegate call whose nested agent wrote them (none: the run's own agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegate_call: Option<u64>,
    /// What the model wrote (a string, usually).
    pub thoughts: Value,
}

/// What the driver would have noted for the run `record` describes after `journal`: how many
/// calls await a decision and its earliest pending timer (for rows an older dagloop wrote).
pub fn rebuild_note(
    record: &RunRecord,
    journal: &[JournalEntry],
) -> Result<crate::engine::RunNote, RunsError> {
    let machine = rebuild_machine(record, journal)?;
    Ok(crate::engine::RunNote {
        awaiting: machine.awaiting().len() as u64,
        wake_at: machine.poll_timeout(),
    })
}

/// The machine of the run `record` describes after `journal`, without its events: what awaits
/// a decision, what a resume would present.
pub fn rebuild_machine(
    record: &RunRecord,
    journal: &[JournalEntry],
) -> Result<RunMachine, RunsError> {
    Ok(RunDef::from_record(record)?
        .replay(&record.id, journal)?
        .machine)
}

/// Replays `journal` for the run `record` describes, from the record alone (no environment
/// variable, file or MCP server is needed: [`RunDef::from_record`]).
pub fn rebuild(record: &RunRecord, journal: &[JournalEntry]) -> Result<Rebuilt, RunsError> {
    let def = RunDef::from_record(record)?;
    let config = def.config()?;
    let super::Replay { machine, events } = def.replay(&record.id, journal)?;
    let mut tools = Vec::new();
    all_tools(&config, &mut tools);
    let streams_closed = journal
        .iter()
        .filter_map(|e| match &e.input {
            crate::machine::RunInput::StreamClosed { frame, .. } => {
                Some((frame.map(|c| c.0), e.at))
            }
            _ => None,
        })
        .collect();
    // The model's thoughts, with the step of the turn that wrote them (a turn's stream closes
    // after its Solution: the step is one more than the streams its agent closed before).
    let mut closed: std::collections::BTreeMap<Option<u64>, u32> = Default::default();
    let mut thoughts = Vec::new();
    for e in journal {
        match &e.input {
            crate::machine::RunInput::StreamClosed { frame, .. } => {
                *closed.entry(frame.map(|c| c.0)).or_default() += 1;
            }
            crate::machine::RunInput::Thoughts { frame, thoughts: t } => {
                let key = frame.map(|c| c.0);
                thoughts.push(Thought {
                    step: closed.get(&key).copied().unwrap_or(0) + 1,
                    delegate_call: key,
                    thoughts: t.clone(),
                });
            }
            _ => {}
        }
    }
    let cancelled_by = journal.iter().find_map(|e| match &e.input {
        crate::machine::RunInput::Cancel { by, .. } => by.clone(),
        _ => None,
    });
    let forked_from = def.options().forked_from.clone();
    let session = def.options().session.clone();
    let submitted_by = def.options().submitted_by.clone();
    Ok(Rebuilt {
        forked_from,
        session,
        submitted_by,
        goal: def.goal().clone(),
        machine,
        events,
        streams_closed,
        cancelled_by,
        tools,
        thoughts,
    })
}

/// The tools of `config`'s agent, then of its nested agents (depth first, a name once).
fn all_tools(config: &crate::machine::AgentConfig, out: &mut Vec<crate::protocol::Tool>) {
    for t in &config.tools {
        if !out.iter().any(|o| o.name == t.name) {
            out.push(t.clone());
        }
    }
    for d in config.delegates.values() {
        all_tools(d, out);
    }
}

/// One span of the run's timeline (ms from the run's start).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct Span {
    /// `model step N`, `call TOOL` or `reviewer`.
    pub what: String,
    /// The call, for a call's or a reviewer's span.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_id: Option<u64>,
    /// When it began.
    pub start_ms: u64,
    /// When it ended.
    pub end_ms: u64,
}

/// A run described: what `dagloop show --json` prints and `GET /runs/{id}` returns.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct RunView {
    /// The run id.
    pub id: String,
    /// The terminal status once it ended (`succeeded`, `failed`, `cancelled`, ...); before:
    /// `waiting` (calls await a decision), `running`, or `stopped` (nobody drives it).
    pub status: String,
    /// From the first event to the last (ms).
    pub duration_ms: u64,
    /// When its first event happened (milliseconds since the Unix epoch): a run still going has
    /// lasted from then to now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<u64>,
    /// The goal's text, as submitted.
    #[serde(default)]
    pub goal: String,
    /// The goal's input, when it has one; any JSON value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// The principal that submitted it to a server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<String>,
    /// Entries in its journal.
    pub journal_entries: usize,
    /// Every call, by id.
    pub calls: Vec<CallView>,
    /// The timeline: model steps, calls and reviewer waits.
    pub spans: Vec<Span>,
    /// The spans that set the run's duration, in order.
    pub critical_path: Vec<Span>,
    /// The calls awaiting a decision.
    pub awaiting: Vec<AwaitingCall>,
    /// The model's `thoughts`, step by step (what it said it was doing, beside the calls).
    pub thoughts: Vec<Thought>,
    /// The standing approvals given (and revoked) during the run, with the calls they covered.
    #[serde(default)]
    pub standing: Vec<Value>,
    /// `standing` under its name before the rename (a reviewer's standing approval was called
    /// a grant), for one release.
    #[serde(default)]
    #[cfg_attr(feature = "server", schema(deprecated))]
    pub grants: Vec<Value>,
    /// Turns that went to the next model of their agent's list.
    pub model_fallbacks: Vec<ModelFallback>,
    /// Turns asked again without streaming after their stream broke: `{step, depth, at_ms,
    /// model, code, calls_kept}`.
    pub stream_reasks: Vec<Value>,
    /// Contexts compacted to fit the model's window (after the provider refused them, or
    /// before they were asked once the window was known): `{step, depth, at_ms,
    /// level, chars, refused_chars}`.
    pub context_compactions: Vec<Value>,
    /// Tokens used, once the run ended.
    pub usage: Option<crate::machine::Usage>,
    /// The run's state (the final one once it ended); any JSON value.
    pub state: Option<Value>,
    /// The validated output, once it ended (null unless it succeeded); any JSON value.
    pub output: Option<Value>,
    /// Why it failed, once it ended.
    pub error: Option<crate::machine::RunError>,
    /// Who cancelled it, when its cancellation said so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancelled_by: Option<crate::protocol::Actor>,
    /// The run this one was forked from, and after which step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<super::ForkedFrom>,
    /// For a follow-up (`run --continue`): its session (the first run's id) and the run it
    /// follows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<super::SessionOf>,
}

/// One call of a run and what became of it (times in ms from the run's start).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct CallView {
    /// The call id.
    pub id: u64,
    /// The step (model turn) that wrote it (0: the goal's plan).
    pub step: u32,
    /// How deep its agent is nested (0: the run's own).
    pub depth: u32,
    /// `pending`, `blocked`, `unresolved`, `refused`, `awaiting_approval`, `rejected`,
    /// `running`, `done`, `error`, `timeout`, `panic`, `cancelled` or `interrupted`.
    pub status: String,
    /// Its tool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The delegate call whose nested agent made it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<u64>,
    /// Its params (resolved, once presented or started).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub params: Option<serde_json::Map<String, Value>>,
    /// The params as the model proposed them (before references resolved or a decision).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proposed: Option<serde_json::Map<String, Value>>,
    /// The params as presented to the reviewer, references resolved (before a decision
    /// changed them): an edit's diff is against these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presented: Option<serde_json::Map<String, Value>>,
    /// When it arrived from the model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub received_ms: Option<u64>,
    /// Why it was refused (a string), or its error object when it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
    /// The paths it waits on (blocked), or that point at nothing (unresolved).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_on: Option<Vec<String>>,
    /// The earlier calls of its agent that write a path it reads (its dependencies, as the
    /// graph of calls has them: one per writer however many of its params read it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waits_for: Vec<u64>,
    /// When it was presented to a reviewer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asked_ms: Option<u64>,
    /// It had started before the run stopped and was presented again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<bool>,
    /// The reviewer's decision: `approve`, `edit`, `replace` or `reject`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<String>,
    /// Who decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<crate::protocol::Actor>,
    /// The approval rule that asked a reviewer about it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asked_by_rule: Option<String>,
    /// The approval rule that decided it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_by_rule: Option<String>,
    /// The standing approval that decided it (`g1`...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by_standing: Option<String>,
    /// `decided_by_standing` under its name before the rename, for one release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "server", schema(deprecated))]
    pub decided_by_grant: Option<String>,
    /// When it was decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_ms: Option<u64>,
    /// The policy's default applied because nobody decided in time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision_timed_out: Option<bool>,
    /// When it started running.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_ms: Option<u64>,
    /// When it ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
}

/// A call awaiting a decision, with what a reviewer needs to decide it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct AwaitingCall {
    /// The call id (`POST /runs/{id}/approvals/{call_id}`).
    pub call_id: u64,
    /// The fingerprint of the call as presented: quote it as `presented` in a decision.
    pub params_hash: String,
    /// The presentation awaiting a decision: the `seq` of the call's `approval_requested`
    /// event; quote it as `presentation` in a decision (DESIGN.md 3.6).
    #[serde(default)]
    pub presentation: u64,
    /// It had started before the run stopped, and may have had effects.
    pub interrupted: bool,
    /// The approval rule that asked for a reviewer.
    pub rule: Option<String>,
    /// How long a reviewer has (ms), when the policy sets a timeout.
    pub timeout_ms: Option<u64>,
    /// When the timeout's default applies (ms since the epoch): set once the call was first
    /// shown to somebody (a terminal prompt, the page, this API), whose time starts then; null
    /// before that, or when the policy sets no timeout.
    pub deadline_at: Option<u64>,
    /// What happens when nobody decides in time (`reject` or `approve`).
    pub default_decision: Value,
    /// The calls waiting on this one, as presented (`call_id`, `params_hash`, `call`): what
    /// "approve this call and the calls waiting on it" covers.
    pub downstream: Vec<Value>,
    /// The tool's params schema (a JSON Schema), when the tool is the goal's.
    pub tool_schema: Option<Value>,
    /// The tool's description.
    pub description: Value,
    /// What the call will do (`tools::describe_action`: method and URL, command line, MCP
    /// server and tool; never header values), or null.
    pub action: Value,
    /// Where each param came from: `{param, from: model|reference, wrote?, value}`.
    pub sources: Vec<Value>,
    /// The delegate calls above it, outermost first (empty for the run's own agent).
    pub path: Vec<u64>,
    /// The call with its references resolved.
    pub call: crate::protocol::Call,
}

/// A model turn that went to the next model of its agent's list.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct ModelFallback {
    /// The step.
    pub step: u32,
    /// How deep its agent is nested.
    pub depth: u32,
    /// The delegate call that runs the agent (none for the run's own).
    pub delegate_call: Option<u64>,
    /// When (ms from the run's start).
    pub at_ms: u64,
    /// The model that failed.
    pub from: String,
    /// The model asked instead.
    pub to: String,
    /// The failure's stable code.
    pub code: String,
    /// The failure, in words.
    pub error: String,
}

/// The description of a run as JSON ([`describe_view`]).
pub fn describe(
    id: &str,
    rb: &Rebuilt,
    journal_entries: usize,
    result: Option<&RunResult>,
    live: bool,
) -> Value {
    serde_json::to_value(describe_view(id, rb, journal_entries, result, live))
        .unwrap_or(Value::Null)
}

/// The description of a run: `live` says whether a process runs it now (a call that started
/// and did not finish in a run nobody runs was interrupted).
pub fn describe_view(
    id: &str,
    rb: &Rebuilt,
    journal_entries: usize,
    result: Option<&RunResult>,
    live: bool,
) -> RunView {
    let t0 = rb.events.first().map_or(0, |e| e.at);
    let rel = |at: u64| at.saturating_sub(t0);
    let mut calls: BTreeMap<u64, CallView> = BTreeMap::new();
    let mut spans: Vec<Span> = Vec::new();
    let mut turns: BTreeMap<(u32, u64), u64> = BTreeMap::new();
    let mut asked: BTreeMap<u64, u64> = BTreeMap::new();
    // Turns that went to the next model of their agent's list, as journaled.
    let mut fallbacks: Vec<ModelFallback> = Vec::new();
    // Turns re-asked without streaming after their stream broke, and contexts compacted after
    // the provider refused them as too long.
    let mut reasks: Vec<Value> = Vec::new();
    let mut compactions: Vec<Value> = Vec::new();
    // What each received call writes, with its agent (its delegate call): later calls of that
    // agent reading an overlapping path depend on it.
    let mut writers: Vec<(u64, Option<u64>, Vec<crate::protocol::Path>)> = Vec::new();
    for e in &rb.events {
        let t = rel(e.at);
        if let Some(id) = e.call.map(|c| c.0) {
            let c = calls
                .entry(id)
                .or_insert_with(|| CallView::new(id, e.step, e.depth, e.parent.map(|p| p.0)));
            if let EventKind::CallReceived { call } = &e.kind {
                let parent = e.parent.map(|p| p.0);
                let reads = crate::check::read_paths(call);
                c.waits_for = writers
                    .iter()
                    .filter(|(w, p, writes)| {
                        *w != id
                            && *p == parent
                            && writes.iter().any(|q| reads.iter().any(|r| q.overlaps(r)))
                    })
                    .map(|(w, ..)| *w)
                    .collect();
                writers.push((id, parent, crate::check::write_paths(call)));
            }
            if let Some(span) = call_event(c, &e.kind, t, &mut asked, id) {
                spans.push(span);
            }
            continue;
        }
        let frame = (e.depth, e.parent.map_or(0, |p| p.0));
        match &e.kind {
            EventKind::RequestStarted { .. } => {
                turns.insert(frame, t);
            }
            EventKind::ModelFallback {
                from,
                to,
                code,
                error,
            } => fallbacks.push(ModelFallback {
                step: e.step,
                depth: e.depth,
                delegate_call: e.parent.map(|p| p.0),
                at_ms: t,
                from: from.clone(),
                to: to.clone(),
                code: code.clone(),
                error: error.clone(),
            }),
            EventKind::StreamReasked {
                model,
                code,
                calls_kept,
                ..
            } => reasks.push(json!({
                "step": e.step,
                "depth": e.depth,
                "at_ms": t,
                "model": model,
                "code": code,
                "calls_kept": calls_kept,
            })),
            EventKind::ContextCompacted {
                chars,
                level,
                refused_chars,
            } => compactions.push(json!({
                "step": e.step,
                "depth": e.depth,
                "at_ms": t,
                "level": level,
                "chars": chars,
                "refused_chars": refused_chars,
            })),
            EventKind::Solution { .. } => {
                if let Some(s) = turns.remove(&frame) {
                    // The model's part of the step ends when its stream closes; the calls
                    // it streamed have their own spans.
                    let closed = rb
                        .streams_closed
                        .iter()
                        .filter(|(f, at)| {
                            *f == e.parent.map(|p| p.0) && (s..=t).contains(&rel(*at))
                        })
                        .map(|(_, at)| rel(*at))
                        .next()
                        .unwrap_or(t);
                    spans.push(Span {
                        what: format!("model step {}", e.step),
                        call_id: None,
                        start_ms: s,
                        end_ms: closed,
                    });
                }
            }
            _ => {}
        }
    }
    if !live && result.is_none() {
        for c in calls.values_mut() {
            if c.status == "running" {
                c.status = "interrupted".into();
            }
        }
    }
    let end = rb.events.last().map_or(0, |e| rel(e.at));
    let critical = critical_path(&spans, end);
    let awaiting = awaiting(rb);
    let standing = super::audit::standing(&rb.events);
    let status = crate::store::derive_status(
        result.map(|r| r.status.as_str()),
        awaiting.len() as u64,
        live,
    );
    RunView {
        id: id.to_string(),
        status: status.to_string(),
        duration_ms: end,
        started_at: rb.events.first().map(|e| e.at),
        goal: rb.goal.goal.clone(),
        input: rb.goal.input.clone(),
        submitted_by: rb.submitted_by.clone(),
        journal_entries,
        calls: calls.into_values().collect(),
        spans,
        critical_path: critical,
        awaiting,
        thoughts: rb.thoughts.clone(),
        standing: standing.clone(),
        grants: standing,
        model_fallbacks: fallbacks,
        stream_reasks: reasks,
        context_compactions: compactions,
        usage: result.map(|r| r.usage.clone()),
        state: result.map_or_else(|| rb.machine.state_view(), |r| Some(r.state.clone())),
        output: result.map(|r| r.output.clone()),
        error: result.and_then(|r| r.error.clone()),
        cancelled_by: rb.cancelled_by.clone(),
        forked_from: rb.forked_from.clone(),
        session: rb.session.clone(),
    }
}

impl CallView {
    fn new(id: u64, step: u32, depth: u32, parent: Option<u64>) -> CallView {
        CallView {
            id,
            step,
            depth,
            status: "pending".into(),
            tool: None,
            parent,
            params: None,
            proposed: None,
            presented: None,
            received_ms: None,
            error: None,
            waiting_on: None,
            waits_for: Vec::new(),
            asked_ms: None,
            interrupted: None,
            decision: None,
            decided_by: None,
            asked_by_rule: None,
            decided_by_rule: None,
            decided_by_standing: None,
            decided_by_grant: None,
            decided_ms: None,
            decision_timed_out: None,
            started_ms: None,
            ended_ms: None,
        }
    }
}

/// Folds one event into its call's description; returns the span it closes, if any.
fn call_event(
    c: &mut CallView,
    kind: &EventKind,
    t: u64,
    asked: &mut BTreeMap<u64, u64>,
    id: u64,
) -> Option<Span> {
    match kind {
        EventKind::CallReceived { call } => {
            c.tool = Some(call.tool.clone());
            c.params = Some(call.params.clone().into_map());
            // What the model proposed, kept when a decision or the references change `params`.
            c.proposed = Some(call.params.clone().into_map());
            c.received_ms = Some(t);
        }
        EventKind::CallRefused { reason, .. } => {
            c.status = "refused".into();
            c.error = Some(json!(reason));
        }
        EventKind::Blocked { waiting_on } => {
            c.status = "blocked".into();
            c.waiting_on = Some(waiting_on.iter().map(|p| p.to_string()).collect());
        }
        EventKind::Unblocked => {
            c.status = "pending".into();
            c.waiting_on = None;
        }
        EventKind::Unresolved { missing } => {
            c.status = "unresolved".into();
            c.waiting_on = Some(missing.iter().map(|p| p.to_string()).collect());
        }
        EventKind::ApprovalRequested {
            call,
            interrupted,
            rule,
            ..
        } => {
            asked.insert(id, t);
            c.status = "awaiting_approval".into();
            c.tool = Some(call.tool.clone());
            c.params = Some(call.params.clone().into_map());
            c.presented = Some(call.params.clone().into_map());
            c.asked_ms = Some(t);
            if *interrupted {
                c.interrupted = Some(true);
            }
            if let Some(r) = rule {
                c.asked_by_rule = Some(r.clone());
            }
        }
        EventKind::Decision {
            decision,
            timed_out,
            by,
            rule,
            standing,
        } => {
            c.decision = Some(decision.name().to_string());
            if let Some(by) = by {
                c.decided_by = Some(by.clone());
            }
            if let Some(r) = rule {
                c.decided_by_rule = Some(r.clone());
            }
            if let Some(g) = standing {
                c.decided_by_standing = Some(g.clone());
                c.decided_by_grant = Some(g.clone());
            }
            c.decided_ms = Some(t);
            c.status = if decision.name() == "reject" {
                "rejected"
            } else {
                "pending"
            }
            .into();
            if *timed_out {
                c.decision_timed_out = Some(true);
            }
            if let Some(a) = asked.remove(&id) {
                return Some(Span {
                    what: "reviewer".into(),
                    call_id: Some(id),
                    start_ms: a,
                    end_ms: t,
                });
            }
        }
        EventKind::Started { tool, params, .. } => {
            c.status = "running".into();
            c.started_ms = Some(t);
            c.tool = Some(tool.to_string());
            c.params = Some(params.as_map().clone());
        }
        EventKind::Finished { .. } | EventKind::Failed { .. } | EventKind::Cancelled => {
            c.ended_ms = Some(t);
            c.status = match kind {
                EventKind::Finished { .. } => "done",
                EventKind::Failed { kind, .. } => kind.as_str(),
                _ => "cancelled",
            }
            .into();
            if let EventKind::Failed { error, .. } = kind {
                c.error = Some(Value::clone(error));
            }
            if let Some(s) = c.started_ms {
                return Some(Span {
                    what: format!("call {}", c.tool.as_deref().unwrap_or("")),
                    call_id: Some(id),
                    start_ms: s,
                    end_ms: t,
                });
            }
        }
        _ => {}
    }
    None
}

/// The calls awaiting a decision, with what a reviewer needs: the resolved call, the
/// fingerprint a decision may quote, whether it was interrupted, and the tool's params schema.
/// What a call of `tool` with `params` would do in this run, described without doing it
/// (`tools::describe_action`): the `action` of a call awaiting a decision, and of an edit of it
/// being typed. Null for a tool the run does not know.
pub fn action_of(rb: &Rebuilt, tool: &str, params: &serde_json::Map<String, Value>) -> Value {
    match rb.tools.iter().find(|t| t.name == tool) {
        Some(t) => json!(crate::tools::describe_action(t, params)),
        // MCP tools join the run when their servers start; they are not in the goal.
        None if !rb.goal.mcp_servers.is_empty() => json!(crate::tools::Action::Mcp {
            server: match rb.goal.mcp_servers.as_slice() {
                [one] => Some(one.name().to_string()),
                _ => None,
            },
            tool: tool.to_string(),
        }),
        None => Value::Null,
    }
}

fn awaiting(rb: &Rebuilt) -> Vec<AwaitingCall> {
    rb.machine
        .awaiting()
        .into_iter()
        .map(|(id, call)| {
            let asked = rb.events.iter().rev().find_map(|e| match &e.kind {
                EventKind::ApprovalRequested {
                    interrupted,
                    rule,
                    path,
                    ..
                } if e.call == Some(id) => Some((*interrupted, rule.clone(), e.at, path.clone())),
                _ => None,
            });
            let interrupted = asked.as_ref().map(|a| a.0);
            let policy = rb.machine.policy();
            // The floor's deadline and default for a call the operator's floor asks about.
            let (timeout, default_decision) = match rb.tools.iter().find(|t| t.name == call.tool)
            {
                Some(t) => policy.on_timeout(t, &call),
                None => (policy.timeout, policy.default_decision),
            };
            let timeout_ms = timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
            // Waiting on this call: what a reviewer approves with "this call and the calls
            // waiting on it, as presented" (a calls standing approval quoting these hashes).
            let downstream: Vec<Value> = rb
                .machine
                .downstream(id)
                .into_iter()
                .map(|(c, written)| {
                    json!({"call_id": c, "params_hash": params_hash(&written), "call": written})
                })
                .collect();
            let proposed = rb.events.iter().find_map(|e| match &e.kind {
                EventKind::CallReceived { call } if e.call == Some(id) => Some(&*call.params),
                _ => None,
            });
            let tool = rb.tools.iter().find(|t| t.name == call.tool);
            let action = action_of(rb, &call.tool, &call.params);
            let description = tool
                .and_then(|t| t.schema.get("description"))
                .cloned()
                .unwrap_or(Value::Null);
            let schema = tool.map(|t| {
                // The params' schema only: tool configuration (`_http` URLs, headers) is
                // the operator's, not the reviewer's.
                let mut m = t.schema.clone();
                m.retain(|k, _| !k.starts_with('_'));
                Value::Object(m)
            });
            AwaitingCall {
                call_id: id.0,
                params_hash: params_hash(&call),
                presentation: rb.machine.presentation(id).unwrap_or(0),
                interrupted: interrupted.unwrap_or(false),
                rule: asked.as_ref().and_then(|a| a.1.clone()),
                timeout_ms,
                // Set once somebody was shown the call (its clock starts then).
                deadline_at: rb
                    .machine
                    .timer_at(crate::machine::Timer::Approval { call: id }),
                default_decision: serde_json::to_value(default_decision).unwrap_or(Value::Null),
                downstream,
                tool_schema: schema,
                description,
                action,
                sources: sources(proposed, &call.params),
                path: asked
                    .as_ref()
                    .map(|a| a.3.iter().map(|c| c.0).collect())
                    .unwrap_or_default(),
                call,
            }
        })
        .collect()
}

/// Where each resolved param came from: `reference` with what the model wrote when that was
/// not the value itself (a reference, or a value holding references), else `model`.
fn sources(
    proposed: Option<&serde_json::Map<String, Value>>,
    resolved: &serde_json::Map<String, Value>,
) -> Vec<Value> {
    resolved
        .iter()
        .map(|(k, v)| match proposed.and_then(|p| p.get(k)) {
            Some(p) if p != v => json!({"param": k, "from": "reference", "wrote": p, "value": v}),
            _ => json!({"param": k, "from": "model", "value": v}),
        })
        .collect()
}

/// Walks back from the end: the span that ended last before the current point, then the one
/// that ended last before that span started, and so on.
fn critical_path(spans: &[Span], end: u64) -> Vec<Span> {
    let mut path = Vec::new();
    let mut at = end;
    let mut used = vec![false; spans.len()];
    loop {
        let best = spans
            .iter()
            .enumerate()
            .filter(|(i, s)| !used[*i] && s.end_ms <= at)
            .max_by_key(|(_, s)| (s.end_ms, s.start_ms));
        let Some((i, s)) = best else { break };
        used[i] = true;
        path.push(s.clone());
        // A zero-length span (a model turn answered at once) moves nothing: the path goes on
        // from its start, through what ended there. Each span is used once, so this ends.
        if s.start_ms == 0 {
            break;
        }
        at = s.start_ms;
    }
    path.reverse();
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(what: &str, start_ms: u64, end_ms: u64) -> Span {
        Span {
            what: what.into(),
            call_id: None,
            start_ms,
            end_ms,
        }
    }

    #[test]
    fn a_zero_length_span_at_the_end_does_not_cut_the_critical_path() {
        let spans = [
            span("model step 1", 0, 10),
            span("call a", 10, 710),
            span("call b", 10, 705),
            span("call c", 10, 700),
            span("model step 2", 710, 710),
        ];
        let path: Vec<String> = critical_path(&spans, 710)
            .into_iter()
            .map(|s| s.what)
            .collect();
        assert_eq!(path, ["model step 1", "call a", "model step 2"]);
    }
}
