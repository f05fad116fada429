//! Shared helpers for the scheduler tests: tools, calls, scripted executors and a step runner on
//! tokio's paused clock, with every event and every activity start/end recorded.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dagloop::approval::{Approver, Policy, ScriptedApprover};
use dagloop::engine::bus::EventBus;
use dagloop::engine::inner::{DriveOptions, Executor, drive};
use dagloop::protocol::{Call, CallId, Event, Path, Tool};
use dagloop::scheduler::{Outcome, Scheduler, SchedulerOptions, StepReport};
use dagloop::state::State;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A tool backed by an activity.
pub fn tool(name: &str) -> Tool {
    let mut t = Tool::new(name);
    t.activity = Some("test".into());
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

/// What one activity run looked like, in virtual milliseconds since the step started.
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
    fn execute(&self, id: CallId, tool: &Tool, call: Call) -> BoxFuture<'static, Outcome> {
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
                params: call.params.clone(),
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

/// One step's setup.
pub struct Step {
    pub tools: Vec<Tool>,
    pub policy: Policy,
    pub state: State,
    /// Calls with their arrival time (virtual ms); the stream closes at `close_at` (or right after
    /// the last call).
    pub calls: Vec<(u64, Result<Call, String>)>,
    pub close_at: Option<u64>,
    pub approver: Arc<dyn Approver>,
    pub opts: DriveOptions,
    pub sched: SchedulerOptions,
    /// Cancel the step at this virtual time.
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
            opts: DriveOptions::default(),
            sched: SchedulerOptions::default(),
            cancel_at: None,
        }
    }

    pub fn at(mut self, ms: u64, c: Value) -> Self {
        self.calls.push((ms, Ok(call(c))));
        self
    }
}

/// What a step produced.
pub struct Outcome2 {
    pub state: State,
    pub report: StepReport,
    pub events: Vec<Event>,
    pub runs: Vec<Run>,
    /// Virtual ms from start to `drive` returning.
    pub elapsed: u64,
}

impl Outcome2 {
    pub fn get(&self, p: &str) -> Option<Value> {
        self.state.get(&path(p))
    }

    pub fn run_of(&self, id: u64) -> Run {
        self.runs
            .iter()
            .find(|r| r.id == CallId(id))
            .cloned()
            .unwrap_or_else(|| panic!("c{id} never ran; runs: {:?}", self.runs))
    }

    pub fn kinds(&self, id: u64) -> Vec<&'static str> {
        self.events
            .iter()
            .filter(|e| e.call == Some(CallId(id)))
            .map(|e| e.kind.name())
            .collect()
    }
}

/// Runs one step on the paused clock (call from a `start_paused` test).
pub async fn run(step: Step, exec: TestExec) -> Outcome2 {
    let base = exec.base;
    let events = Arc::new(Mutex::new(Vec::new()));
    let ev2 = events.clone();
    let bus = EventBus::new(1024)
        .with_clock(Arc::new(move || ms_since(base)))
        .with_sink(Box::new(move |e| {
            ev2.lock().expect("events").push(e.clone())
        }));
    let sched = Scheduler::new(step.state, step.tools, step.policy, step.sched);
    let close_at = step.close_at;
    let timed = step.calls;
    let stream = futures::stream::unfold(
        (timed.into_iter(), close_at, false),
        move |(mut it, close_at, done)| async move {
            if done {
                return None;
            }
            match it.next() {
                Some((at, c)) => {
                    tokio::time::sleep_until(base + Duration::from_millis(at)).await;
                    Some((Some(c), (it, close_at, false)))
                }
                None => {
                    if let Some(at) = close_at {
                        tokio::time::sleep_until(base + Duration::from_millis(at)).await;
                    }
                    Some((None, (it, close_at, true)))
                }
            }
        },
    )
    .filter_map(|x| async move { x })
    .boxed();
    let cancel = CancellationToken::new();
    if let Some(at) = step.cancel_at {
        let c = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(base + Duration::from_millis(at)).await;
            c.cancel();
        });
    }
    let runs = exec.runs.clone();
    let (state, report) = drive(
        sched,
        stream,
        Arc::new(exec),
        step.approver,
        &bus,
        cancel,
        step.opts,
    )
    .await;
    let elapsed = ms_since(base);
    let runs = runs.lock().expect("runs").clone();
    let events = events.lock().expect("events").clone();
    Outcome2 {
        state,
        report,
        events,
        runs,
        elapsed,
    }
}
