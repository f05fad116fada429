//! A simulation harness for the scheduler tests: one step of a real run on tokio's paused
//! (virtual) clock, driven by the run driver `dagloop run` uses (`AgentBuilder::build` →
//! `Agent::start` → `RunHandle`), with every event and every activity start/end recorded.
//!
//! [`run`] builds an agent the way a program does: a [`Goal`] with the step's tools, initial
//! state (`state`, `input`) and per-call time limit (`limits.call_timeout_s`), and an output
//! schema of `{"type": "object"}`; the approval policy and the reviewer through the builder; the
//! scripted [`TestExec`] as the run's executor; and [`SimModel`] as its model. The model answers
//! the first Request with one streamed turn, `{"calls": [...], "output": null}`, each call a
//! chunk of that text that arrives at its virtual time (an `Err` arrival is an element that is
//! not a call), closed at `close_at`; it answers every later Request with
//! `{"calls": [], "output": {}}`, which ends the run. `cancel_at` cancels through the
//! `RunHandle`.
//!
//! What the step produced is what the run reports: its final state (`RunResult::state`), its
//! calls (`RunResult::calls`), and its events (journaled ones, in order: the run's own, such as
//! `run_started` or `solution`, carry no call id, so tests that filter by call see only the
//! scheduler's). Call ids are the run's: the first call of the run is `c1`.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dagloop::approval::{Approver, Policy, ScriptedApprover};
use dagloop::engine::Executor;
use dagloop::llm::{EventStream, FinishReason, Model, Request, StreamEvent};
use dagloop::protocol::{Call, CallId, Decision, Event, EventKind, OutputMethod, Path, Tool};
use dagloop::scheduler::{CallStatus, Outcome};
use dagloop::state::State;
use dagloop::{AgentBuilder, CallSummary, Goal, RunResult, RunStatus};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use serde_json::{Value, json};
use tokio::time::Instant;

/// A tool backed by an activity (a Rust activity: the program runs it, here [`TestExec`]).
pub fn tool(name: &str) -> Tool {
    let mut t = Tool::new(name);
    t.activity = Some("rust".into());
    t
}

/// A latent tool (no activity).
pub fn latent(name: &str) -> Tool {
    Tool::new(name)
}

/// A call from JSON.
pub fn call(v: Value) -> Call {
    Call::try_from(v).expect("valid call")
}

pub fn path(s: &str) -> Path {
    Path::parse(s).expect("path")
}

/// What one activity run looked like, in virtual milliseconds since the run started.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub id: CallId,
    pub tool: String,
    pub params: serde_json::Map<String, Value>,
    pub start: u64,
    pub end: Option<u64>,
}

/// How the test executor behaves for one tool.
#[derive(Clone)]
pub enum Behaviour {
    /// Sleep, then return `{"tool": name, "params": params}` (or the given value).
    Sleep(u64, Option<Value>),
    /// Sleep, then fail with this error object.
    Fail(u64, Value),
    /// Sleep, then panic.
    Panic(u64),
    /// Sleep, then succeed on the given `||` branch.
    Branch(u64, usize),
}

/// An executor scripted per tool, recording every run.
pub struct TestExec {
    pub base: Instant,
    pub by_tool: BTreeMap<String, Behaviour>,
    pub runs: Arc<Mutex<Vec<Run>>>,
}

impl TestExec {
    pub fn new(base: Instant) -> Self {
        TestExec {
            base,
            by_tool: BTreeMap::new(),
            runs: Arc::new(Mutex::new(Vec::new())),
        }
    }

    pub fn with(mut self, tool: &str, b: Behaviour) -> Self {
        self.by_tool.insert(tool.into(), b);
        self
    }

    pub fn runs(&self) -> Vec<Run> {
        self.runs.lock().expect("runs").clone()
    }
}

fn ms_since(base: Instant) -> u64 {
    (Instant::now() - base).as_millis() as u64
}

impl Executor for TestExec {
    fn execute(&self, id: CallId, tool: &Tool, call: Arc<Call>) -> BoxFuture<'static, Outcome> {
        let b = self
            .by_tool
            .get(&tool.name)
            .cloned()
            .unwrap_or(Behaviour::Sleep(10, None));
        let runs = self.runs.clone();
        let base = self.base;
        let ix = {
            let mut r = runs.lock().expect("runs");
            r.push(Run {
                id,
                tool: tool.name.clone(),
                params: call.params.clone().into_map(),
                start: ms_since(base),
                end: None,
            });
            r.len() - 1
        };
        async move {
            let (ms, outcome) = match b {
                Behaviour::Sleep(ms, v) => (
                    ms,
                    Some(Outcome::ok(v.unwrap_or_else(
                        || json!({"tool": call.tool, "params": call.params}),
                    ))),
                ),
                Behaviour::Fail(ms, e) => (ms, Some(Outcome::error(e))),
                Behaviour::Panic(ms) => (ms, None),
                Behaviour::Branch(ms, i) => {
                    (ms, Some(Outcome::ok(json!("branched")).with_branch(i)))
                }
            };
            tokio::time::sleep(Duration::from_millis(ms)).await;
            runs.lock().expect("runs")[ix].end = Some(ms_since(base));
            match outcome {
                Some(o) => o,
                None => panic!("activity {id} exploded"),
            }
        }
        .boxed()
    }
}

/// The answer that ends the run: no calls, an output the schema `{"type": "object"}` accepts.
const FINAL_ANSWER: &str = r#"{"calls": [], "output": {}}"#;

/// The model of a simulated run. The first Request is answered with one turn whose calls arrive
/// at their virtual times (ms after `base`), each as one text chunk of the Solution
/// `{"calls": [...], "output": null}`; the turn closes at `close_at` (or with the last call).
/// Every later Request is answered at once with [`FINAL_ANSWER`].
pub struct SimModel {
    base: Instant,
    /// Each call's arrival time and its array element as written.
    elements: Vec<(u64, String)>,
    close_at: Option<u64>,
    answered: AtomicUsize,
    /// Every Request the model was asked, in order.
    pub requests: Arc<Mutex<Vec<Request>>>,
}

impl SimModel {
    pub fn new(
        base: Instant,
        calls: &[(u64, Result<Call, String>)],
        close_at: Option<u64>,
    ) -> Self {
        let elements = calls
            .iter()
            .map(|(at, c)| {
                let element = match c {
                    Ok(call) => call.to_value().to_string(),
                    // Something that is no call: a JSON string element (the parser says so).
                    Err(text) => Value::String(text.clone()).to_string(),
                };
                (*at, element)
            })
            .collect();
        SimModel {
            base,
            elements,
            close_at,
            answered: AtomicUsize::new(0),
            requests: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// The first turn's text chunks with their arrival times.
    fn first_turn(&self) -> Vec<(u64, String)> {
        let mut chunks: Vec<(u64, String)> = self
            .elements
            .iter()
            .enumerate()
            .map(|(i, (at, element))| {
                let lead = if i == 0 { r#"{"calls": ["# } else { ", " };
                (*at, format!("{lead}{element}"))
            })
            .collect();
        let last = chunks.last().map_or(0, |(at, _)| *at);
        let close = self.close_at.unwrap_or(last);
        let end = if chunks.is_empty() {
            r#"{"calls": [], "output": null}"#
        } else {
            r#"], "output": null}"#
        };
        chunks.push((close, end.to_string()));
        chunks
    }
}

impl Model for SimModel {
    fn stream(&self, req: &Request) -> EventStream {
        self.requests.lock().expect("requests").push(req.clone());
        let finish = StreamEvent::Finish {
            reason: FinishReason::Stop,
        };
        if self.answered.fetch_add(1, Ordering::SeqCst) > 0 {
            let events = [StreamEvent::TextDelta(FINAL_ANSWER.into()), finish];
            return futures::stream::iter(events.into_iter().map(Ok)).boxed();
        }
        let base = self.base;
        let timed = self
            .first_turn()
            .into_iter()
            .map(|(at, text)| (at, StreamEvent::TextDelta(text)));
        futures::stream::iter(timed)
            .then(move |(at, ev)| async move {
                tokio::time::sleep_until(base + Duration::from_millis(at)).await;
                ev
            })
            .chain(futures::stream::once(async { finish }))
            .map(Ok)
            .boxed()
    }

    fn name(&self) -> String {
        "sim".into()
    }
}

/// One step's setup.
pub struct Step {
    pub tools: Vec<Tool>,
    pub policy: Policy,
    /// The initial state: what it holds under `state` and `input` becomes the goal's `state`
    /// and `input`.
    pub state: State,
    /// Calls with their arrival time (virtual ms); the stream closes at `close_at` (or right after
    /// the last call).
    pub calls: Vec<(u64, Result<Call, String>)>,
    pub close_at: Option<u64>,
    pub approver: Arc<dyn Approver>,
    /// Each activity fails with a timeout after this long (the goal's `limits.call_timeout_s`).
    pub call_timeout: Option<Duration>,
    /// Cancel the run at this virtual time (through the `RunHandle`).
    pub cancel_at: Option<u64>,
}

impl Step {
    pub fn new(tools: Vec<Tool>) -> Self {
        Step {
            tools,
            policy: Policy::auto(),
            state: State::new(),
            calls: Vec::new(),
            close_at: None,
            approver: Arc::new(ScriptedApprover::new()),
            call_timeout: None,
            cancel_at: None,
        }
    }

    pub fn at(mut self, ms: u64, c: Value) -> Self {
        self.calls.push((ms, Ok(call(c))));
        self
    }

    /// The goal a program would write for this step.
    pub fn goal(&self) -> Goal {
        let kinds = self.state.kinds();
        assert!(
            kinds.iter().all(|k| k == "state" || k == "input"),
            "a goal gives only `state` and `input`: {kinds:?}"
        );
        let tools: Vec<Value> = self
            .tools
            .iter()
            .map(|t| serde_json::to_value(t).expect("tool"))
            .collect();
        let mut doc = json!({
            "goal": "Run the scheduler test's calls.",
            "output_schema": {"type": "object"},
            "tools": tools,
            "state": self.state.view("state").unwrap_or_else(|| json!({})),
        });
        if let Some(input) = self.state.view("input") {
            doc["input"] = input;
        }
        if let Some(t) = self.call_timeout {
            doc["limits"] = json!({"call_timeout_s": t.as_secs_f64()});
        }
        Goal::from_json(&doc.to_string(), "sim.json".as_ref(), ".".into()).expect("goal")
    }
}

/// What the run reports of its calls (`RunResult::calls`), in arrival order.
#[derive(Debug, Clone)]
pub struct Report {
    pub calls: Vec<CallSummary>,
}

impl Report {
    /// The summary of one call.
    pub fn get(&self, id: CallId) -> Option<&CallSummary> {
        self.calls.iter().find(|c| c.id == id)
    }

    /// How many calls ended with `status`.
    pub fn count(&self, status: CallStatus) -> usize {
        self.calls.iter().filter(|c| c.status == status).count()
    }
}

/// What a step produced.
pub struct Outcome2 {
    /// The run's final state (`†state`, as `RunResult::state` gives it).
    pub state: Value,
    /// The run's calls.
    pub report: Report,
    /// The run's journaled events, in order (live-only ones, `model_delta`, left out).
    pub events: Vec<Event>,
    pub runs: Vec<Run>,
    /// Virtual ms from start to the run's end.
    pub elapsed: u64,
    /// The whole result.
    pub result: RunResult,
    /// The Requests the model was asked.
    pub requests: Vec<Request>,
}

impl Outcome2 {
    /// What state holds at `p` (a `state.` path).
    pub fn get(&self, p: &str) -> Option<Value> {
        let mut s = State::new();
        s.write(
            Path::root("state"),
            self.state.clone(),
            OutputMethod::Set,
            None,
            0,
        );
        s.get(&path(p))
    }

    pub fn run_of(&self, id: u64) -> Run {
        self.runs
            .iter()
            .find(|r| r.id == CallId(id))
            .cloned()
            .unwrap_or_else(|| panic!("c{id} never ran; runs: {:?}", self.runs))
    }

    pub fn kinds(&self, id: u64) -> Vec<&'static str> {
        self.of(id).map(|e| e.kind.name()).collect()
    }

    fn of(&self, id: u64) -> impl Iterator<Item = &Event> {
        self.events
            .iter()
            .filter(move |e| e.call == Some(CallId(id)))
    }

    /// The call as the model wrote it (its `call_received` event).
    pub fn received(&self, id: u64) -> Option<Call> {
        self.of(id).find_map(|e| match &e.kind {
            EventKind::CallReceived { call } => Some(Call::clone(call)),
            _ => None,
        })
    }

    /// The result of a call that succeeded (its `finished` event).
    pub fn result_of(&self, id: u64) -> Option<Value> {
        self.of(id).find_map(|e| match &e.kind {
            EventKind::Finished { result } => Some(Value::clone(result)),
            _ => None,
        })
    }

    /// The decision taken about a call (its `decision` event).
    pub fn decision(&self, id: u64) -> Option<Decision> {
        self.of(id).find_map(|e| match &e.kind {
            EventKind::Decision { decision, .. } => Some(decision.clone()),
            _ => None,
        })
    }

    /// The state writes of the run's calls in log order: the writing call and when.
    pub fn writes(&self) -> Vec<(Option<CallId>, u64)> {
        self.events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Written { .. }))
            .map(|e| (e.call, e.at))
            .collect()
    }
}

/// Longest a simulated run may take, in virtual time.
pub const VIRTUAL_LIMIT: Duration = Duration::from_secs(3600);

/// Runs one step as a run of a real agent on the paused clock (call from a `start_paused` test).
/// The run must succeed (or, with `cancel_at`, end cancelled).
pub async fn run(step: Step, exec: TestExec) -> Outcome2 {
    let base = exec.base;
    let goal = step.goal();
    let model = Arc::new(SimModel::new(base, &step.calls, step.close_at));
    let requests = model.requests.clone();
    let runs = exec.runs.clone();
    let mut builder = AgentBuilder::new(dagloop::RunDef::from_goal(goal).expect("defined"))
        .model(model)
        .executor(Arc::new(exec))
        .policy(step.policy)
        .approver(step.approver)
        .clock(Arc::new(move || ms_since(base)))
        .run_id("sim");
    // Every call runs through the executor; the builder checks only that each Rust tool has a
    // function under its name (as `dagloop run --tools-from` does for a recording).
    for t in step.tools.iter().filter(|t| !t.is_latent()) {
        builder
            .registry_mut()
            .register_fn(&t.name, |_: Value| async {
                Err::<Value, String>("run by the test's executor".into())
            });
    }
    let handle = builder.build().expect("agent").start();
    let mut sub = handle.subscribe_from(0);
    let collect = tokio::spawn(async move {
        let mut events = Vec::new();
        while let Some(e) = sub.recv().await {
            if !e.kind.is_ephemeral() {
                events.push(Event::clone(&e));
            }
        }
        events
    });
    let cancel = step.cancel_at.map(|at| {
        let h = handle.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(base + Duration::from_millis(at)).await;
            let _ = h.cancel("cancelled by the test").await;
        })
    });
    // On the paused clock a run that waits for something nobody will do would hang the test:
    // the clock jumps to this limit instead, and the test fails saying what waits.
    let result = tokio::select! {
        r = handle.wait() => r,
        _ = tokio::time::sleep_until(base + VIRTUAL_LIMIT) => panic!(
            "the run did not end within {VIRTUAL_LIMIT:?} of virtual time; awaiting a \
             decision: {:?}; journal: {:?}",
            handle.awaiting(),
            handle.journal()
        ),
    };
    let elapsed = ms_since(base);
    if let Some(c) = cancel {
        c.abort();
    }
    let events = collect.await.expect("events");
    let expected = match step.cancel_at {
        Some(at) if at <= elapsed => RunStatus::Cancelled,
        _ => RunStatus::Succeeded,
    };
    assert_eq!(result.status, expected, "the run: {result:?}");
    let runs = runs.lock().expect("runs").clone();
    let requests = requests.lock().expect("requests").clone();
    Outcome2 {
        state: result.state.clone(),
        report: Report {
            calls: result.calls.clone(),
        },
        events,
        runs,
        elapsed,
        result,
        requests,
    }
}
