//! Sessions: a follow-up run on a finished run (`dagloop run --continue RUN GOAL_OR_TEXT`,
//! `POST /runs/{id}/continue`, [`continue_run`]). The follow-up is an ordinary run whose goal is
//! written from its parent's record and result: the new goal (a goal file, or the parent's goal
//! with a new instruction), starting from the parent's final state and with a summary of the
//! parent's history (its goal, its calls with their outcomes, its output) in its context. What
//! carries over is the caller's choice ([`Carry`]; both by default). Because all of it is in
//! the follow-up's own record, replay, fork, export and show treat it like any run.
//!
//! A session is its first run and every follow-up after it; each follow-up names the session
//! (the first run's id) and the run it follows ([`SessionOf`], in its options). Runs of one
//! session are serialised: the store refuses (`session.busy`) to record a follow-up while a run
//! of its session is unfinished, checked in the transaction that records it, and
//! [`continue_run`] waits and tries again unless told not to wait.
//!
//! Deliberately not here: what the follow-up may touch (the front-end's grants, through
//! [`super::define`]) and driving it (the front-ends resume it as they resume a fork).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::{Fork, RunOptions, RunsError};
use crate::goal::Goal;
use crate::protocol::{Message, Millis, Role};
use crate::machine::RunResult;
use crate::store::{Compacted, RunRecord, RunStore, StoreError, StoredRun};

/// The field a history message carries (beside its text, never sent to a model) to say which
/// run of the session it summarises.
pub const HISTORY_MARK: &str = "_session_run";

/// How long [`continue_run`] waits between two tries while the session is busy.
const BUSY_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// The session a follow-up run belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
pub struct SessionOf {
    /// The session: the id of its first run.
    pub root: String,
    /// The run this one follows.
    pub parent: String,
}

/// What a follow-up takes over from the run it follows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "server", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Carry {
    /// The parent's final state, as the follow-up's initial state.
    State,
    /// A summary of the session's history (each run's goal, calls and output) in the context.
    History,
    /// Both (the default).
    #[default]
    Both,
}

impl Carry {
    /// `state`, `history` or `both`.
    pub fn parse(s: &str) -> Option<Carry> {
        serde_json::from_value(Value::String(s.to_string())).ok()
    }

    fn state(self) -> bool {
        matches!(self, Carry::State | Carry::Both)
    }

    fn history(self) -> bool {
        matches!(self, Carry::History | Carry::Both)
    }
}

/// What the follow-up does.
#[derive(Debug, Clone)]
pub enum Next {
    /// The parent's goal, with this instruction as its goal text.
    Text(String),
    /// Another goal (a goal file, a submitted goal document), loaded and checked.
    Goal(Box<Goal>),
}

/// How to continue a run.
#[derive(Debug, Clone)]
pub struct Continue {
    /// What the follow-up does.
    pub next: Next,
    /// What carries over.
    pub carry: Carry,
    /// Wait while a run of the session is unfinished (else `session.busy` at once).
    pub wait: bool,
}

/// The session a stored run belongs to, and whether it follows another: a run that is no
/// follow-up is its own session's first run.
pub fn session_of(record: &RunRecord) -> SessionOf {
    match RunOptions::from_stored(&record.options)
        .ok()
        .and_then(|o| o.session)
    {
        Some(s) => s,
        None => SessionOf {
            root: record.id.clone(),
            parent: String::new(),
        },
    }
}

/// The run a follow-up follows, as the store holds it.
#[derive(Debug, Clone)]
pub enum Parent {
    /// With its journal: its history is read by replaying it.
    Whole(Box<StoredRun>),
    /// Compacted (`dagloop runs compact`, the store's retention): its journal is gone; its
    /// result gives the final state and output, and the description kept in its place the
    /// calls of its history.
    Compacted(Box<Compacted>),
}

impl Parent {
    /// The run `id` from `store`, whole or compacted.
    pub fn load(store: &dyn RunStore, id: &str) -> Result<Parent, RunsError> {
        match store.load(id) {
            Ok(s) => Ok(Parent::Whole(Box::new(s))),
            Err(StoreError::Compacted { .. }) => match store.compacted(id)? {
                Some(c) => Ok(Parent::Compacted(Box::new(c))),
                None => Err(StoreError::UnknownRun { id: id.into() }.into()),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// How it was started.
    pub fn record(&self) -> &RunRecord {
        match self {
            Parent::Whole(s) => &s.record,
            Parent::Compacted(c) => &c.record,
        }
    }

    /// Its result, once finished (a compacted run always is).
    pub fn result(&self) -> Option<&RunResult> {
        match self {
            Parent::Whole(s) => s.result.as_ref(),
            Parent::Compacted(c) => Some(&c.result),
        }
    }

    /// The calls of its own agent, as its description gives them (a compacted run's kept
    /// description; none if that cannot be read).
    fn calls(&self) -> Result<Vec<super::view::CallView>, RunsError> {
        Ok(match self {
            Parent::Whole(s) => parent_view(s)?.calls,
            Parent::Compacted(c) => c
                .snapshot
                .get("view")
                .and_then(|v| v.get("calls"))
                .and_then(|v| serde_json::from_value(v.clone()).ok())
                .unwrap_or_default(),
        })
    }
}

/// Plans a follow-up of the finished run `parent` (`session.busy` when it has not finished):
/// its record (a new id, the goal with the parent's state and history as `how` carries them,
/// `options` with [`RunOptions::session`]) and an empty journal. Nothing is recorded yet. A
/// compacted parent is followed like a whole one: its state and output come from its result,
/// its calls from the description kept when it was compacted.
pub fn follow_up(
    parent: &Parent,
    how: &Continue,
    mut options: RunOptions,
    now: Millis,
) -> Result<Fork, RunsError> {
    let record = parent.record();
    let session = session_of(record);
    let Some(result) = parent.result() else {
        return Err(StoreError::SessionBusy {
            session: session.root,
            running: record.id.clone(),
        }
        .into());
    };
    let recorded = Goal::from_record(
        &record.goal,
        std::path::Path::new(&record.id),
        std::path::PathBuf::from(&record.base_dir),
    )?;
    let mut goal = match &how.next {
        Next::Text(text) => {
            let mut g = recorded.clone();
            g.goal = text.clone();
            // The parent's own plan ran already.
            g.plan.clear();
            g
        }
        Next::Goal(g) => {
            let mut g = (**g).clone();
            // The session's earlier history, as the parent carried it.
            if how.carry.history() {
                let earlier: Vec<Message> = recorded
                    .context
                    .iter()
                    .filter(|m| history_of(m).is_some())
                    .cloned()
                    .collect();
                g.context.splice(0..0, earlier);
            }
            g
        }
    };
    if how.carry.state() {
        goal.state = Some(carried_state(goal.state.take(), &result.state));
    }
    if how.carry.history() {
        let calls = parent.calls()?;
        goal.context.push(summary(&record.id, &recorded, &calls, result));
    }
    let base_dir = match &how.next {
        Next::Text(_) => record.base_dir.clone(),
        Next::Goal(g) => g.base_dir.display().to_string(),
    };
    options.definition.clear();
    // A follow-up of the parent's own goal goes on with what the parent was defined with (its
    // delegate goals and MCP tools as recorded), as a fork does; another goal is defined afresh.
    options.record = match &how.next {
        Next::Text(_) => RunOptions::from_stored(&record.options)?.record,
        Next::Goal(_) => None,
    };
    // Another goal is the caller's, not the published agent's: its calls carry no agent (an env
    // grant bound to the agent does not follow it). The floor, being stricter, does.
    if matches!(how.next, Next::Goal(_)) {
        options.agent = None;
    }
    options.forked_from = None;
    options.session = Some(SessionOf {
        root: session.root,
        parent: record.id.clone(),
    });
    let record = RunRecord {
        id: crate::engine::bus::new_run_id(),
        created_at: now,
        goal: serde_json::to_value(&goal).unwrap_or(Value::Null),
        base_dir,
        options: serde_json::to_value(&options).unwrap_or(Value::Null),
    };
    Ok(Fork {
        record,
        goal,
        options,
        journal: Vec::new(),
    })
}

/// Continues the finished run `parent`: plans the follow-up ([`follow_up`]), lets `check`
/// refuse it before anything is recorded (the front-end defines it under its grants there),
/// and records it, leased to this process, for the front-end to resume. While a run of the
/// session is unfinished (the parent included), it waits and plans again from the parent as it
/// then stands, unless `how.wait` is false or that run is stopped (nobody drives it: resume or
/// cancel it first): then `session.busy`.
pub async fn continue_run(
    store: &dyn RunStore,
    parent: &str,
    how: &Continue,
    options: RunOptions,
    check: &mut (dyn FnMut(&Fork) -> Result<(), RunsError> + Send),
) -> Result<(Fork, StoredRun), RunsError> {
    loop {
        let stored = Parent::load(store, parent)?;
        let planned = follow_up(&stored, how, options.clone(), super::now_ms())
            .and_then(|f| check(&f).map(|()| f));
        let busy = match planned {
            Ok(fork) => match super::seed(store, &fork).await {
                Ok(seeded) => return Ok((fork, seeded)),
                Err(e) => e,
            },
            Err(e) => e,
        };
        match busy {
            RunsError::Store(StoreError::SessionBusy { session, running })
                if how.wait && !stopped(store, &session, &running)? =>
            {
                tokio::time::sleep(BUSY_POLL).await;
            }
            other => return Err(other),
        }
    }
}

/// Whether the unfinished run `running` of `session` is stopped: nobody drives it, so waiting
/// for it would never end (a run waiting for a reviewer is not stopped).
fn stopped(store: &dyn RunStore, session: &str, running: &str) -> Result<bool, RunsError> {
    let page = store.query(&crate::store::RunQuery {
        session: Some(session.to_string()),
        statuses: vec!["stopped".into()],
        limit: crate::store::MAX_LIMIT,
        ..Default::default()
    })?;
    Ok(page.runs.iter().any(|r| r.id == running))
}

/// The follow-up's initial state: the parent's final state, with what the new goal's own
/// `state` says over it (key by key when both are objects).
fn carried_state(own: Option<Value>, parent: &Value) -> Value {
    match (own, parent) {
        (None, p) => p.clone(),
        (Some(Value::Object(mine)), Value::Object(theirs)) => {
            let mut out = theirs.clone();
            out.extend(mine);
            Value::Object(out)
        }
        (Some(mine), _) => mine,
    }
}

/// The run a history message summarises, when it is one.
fn history_of(m: &Message) -> Option<&str> {
    match m {
        Message::Text { extra, .. } => extra.get(HISTORY_MARK).and_then(Value::as_str),
        _ => None,
    }
}

/// The parent's calls and outcome as its description gives them.
fn parent_view(parent: &StoredRun) -> Result<super::RunView, RunsError> {
    let rb = super::rebuild(&parent.record, &parent.journal)?;
    Ok(super::describe_view(
        &parent.record.id,
        &rb,
        parent.journal.len(),
        parent.result.as_ref(),
        false,
    ))
}

/// The message that tells the model what the run it follows did: its goal, each call of its
/// own agent (tool, params as written, outcome, error) and its output or error.
fn summary(
    id: &str,
    goal: &Goal,
    calls: &[super::view::CallView],
    result: &RunResult,
) -> Message {
    let calls: Vec<Value> = calls
        .iter()
        .filter(|c| c.depth == 0)
        .map(|c| {
            let mut call = json!({"id": c.id, "step": c.step, "tool": c.tool, "status": c.status});
            if let Some(p) = c.proposed.as_ref().or(c.params.as_ref()) {
                call["params"] = Value::Object(p.clone());
            }
            if let Some(e) = &c.error {
                call["error"] = e.clone();
            }
            call
        })
        .collect();
    let mut record = json!({
        "run": id,
        "goal": goal.goal,
        "status": result.status.as_str(),
        "calls": calls,
        "output": result.output,
    });
    if let Some(e) = &result.error {
        record["error"] = serde_json::to_value(e).unwrap_or(Value::Null);
    }
    let text = format!(
        "Earlier in this session, run {id} did this (its final state is the state you start from, when it was carried over):\n{}",
        serde_json::to_string_pretty(&record).unwrap_or_default()
    );
    let mut extra = Map::new();
    extra.insert(HISTORY_MARK.into(), Value::String(id.to_string()));
    Message::Text {
        role: Role::User,
        text,
        extra,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_goal_state_goes_over_the_parents_key_by_key() {
        let parent = json!({"a": 1, "b": 2});
        assert_eq!(carried_state(None, &parent), parent);
        assert_eq!(
            carried_state(Some(json!({"b": 3, "c": 4})), &parent),
            json!({"a": 1, "b": 3, "c": 4})
        );
        assert_eq!(carried_state(Some(json!([1])), &parent), json!([1]));
    }

    #[test]
    fn carry_names_parse() {
        assert_eq!(Carry::parse("state"), Some(Carry::State));
        assert_eq!(Carry::parse("history"), Some(Carry::History));
        assert_eq!(Carry::parse("both"), Some(Carry::Both));
        assert_eq!(Carry::parse("all"), None);
    }
}
