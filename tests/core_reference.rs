//! The core's representation (interned path ids in the graph and its indexes, references parsed
//! once, the state's trie) against a straightforward reference implementation of the same rules
//! on generated plans: linear scans over the pending calls with `Path::overlaps` (rule 4) for
//! the graph, the cycle check and "who may still write this" (rules 5, 7), and a read that
//! replays the whole log of a kind for the state (rules 2, 3). Both get the same inputs (calls
//! arriving, activities ending, the stream closing); after every input, what the scheduler did
//! (launches with their resolved params, refusals, unresolved calls, writes, endings) must be
//! what the reference did. Within one input the order may differ (the scheduler's recheck queue
//! is incremental), so each input's records are compared as sorted lists.
//!
//! The plans include sibling indexes (`state.b[0]`, `state.b[1]`): a write to `state.b[1]`
//! pads `state.b[0]` with null, and the scheduler wakes the readers of the padded indexes at
//! that write (spec/state.md S6a), as the reference, which checks every waiting call after
//! every input, does.

#[path = "common/plan_gen.rs"]
mod plan_gen;

use std::sync::{Arc, Mutex};

use dagloop::approval::Policy;
use dagloop::protocol::{
    Call, CallId, Combinator, EventKind, Expression, OutputMethod, Path, Tool, parse_expression,
};
use dagloop::scheduler::{Action, Input, Outcome, Scheduler, SchedulerOptions, Validator};
use dagloop::state::{State, apply, output_paths};
use plan_gen::core_plan;
use proptest::prelude::*;
use serde_json::{Value, json};

/// One thing a scheduler did, comparable between the two.
type Record = (u64, String, Value);

#[derive(Clone, Copy, PartialEq, Debug)]
enum Phase {
    Waiting,
    Running,
    Done,
}

struct RefCall {
    call: Call,
    reads: Vec<Path>,
    exprs: Vec<Expression>,
    writes: Vec<Path>,
    target: Option<Expression>,
    phase: Phase,
    /// The paths it was blocked on at its last full check, and the first of them that may
    /// still block it: a blocked call is checked in full again only once every one of them is
    /// free (what it waits on is what it was told it waits on).
    waiting_on: Vec<Path>,
    watch: usize,
}

/// The reference: every rule by linear scan, no index, no incremental state.
#[derive(Default)]
struct Reference {
    calls: Vec<(u64, RefCall)>,
    log: Vec<(Path, Value, OutputMethod)>,
    closed: bool,
    /// The scheduler under test has a params validator: each launch is preceded by the params
    /// it was handed.
    validating: bool,
}

enum Eval {
    Ready(Value),
    Blocked(Vec<Path>),
    Missing,
}

impl Reference {
    fn read(&self, p: &Path) -> Option<Value> {
        let mut doc = None;
        for (wp, v, m) in &self.log {
            if wp.kind() == p.kind() {
                apply::apply_at(&mut doc, wp.rest(), *m, v);
            }
        }
        doc.and_then(|d| apply::get(&d, p.rest()).cloned())
    }

    /// Rule 5: some other pending or running call may write a path overlapping `p`, or the
    /// stream is open and nothing holds `p` yet.
    fn writable(&self, p: &Path, except: u64) -> bool {
        let by_other = self.calls.iter().any(|(id, c)| {
            *id != except && c.phase != Phase::Done && c.writes.iter().any(|w| w.overlaps(p))
        });
        by_other || (!self.closed && self.read(p).is_none())
    }

    fn eval(&self, e: &Expression, me: u64) -> Eval {
        match e.op {
            Combinator::And => {
                let blocked: Vec<Path> = e
                    .refs
                    .iter()
                    .filter(|r| self.writable(&r.path, me))
                    .map(|r| r.path.clone())
                    .collect();
                if !blocked.is_empty() {
                    return Eval::Blocked(blocked);
                }
                let mut last = None;
                for r in &e.refs {
                    match self.read(&r.path) {
                        Some(v) => last = Some(v),
                        None => return Eval::Missing,
                    }
                }
                last.map_or(Eval::Missing, Eval::Ready)
            }
            _ => {
                for r in &e.refs {
                    if self.writable(&r.path, me) {
                        return Eval::Blocked(vec![r.path.clone()]);
                    }
                    if let Some(v) = self.read(&r.path) {
                        return Eval::Ready(v);
                    }
                }
                Eval::Missing
            }
        }
    }

    /// Replaces every reference string by its value (rule 1).
    fn substitute(&self, v: &Value, me: u64) -> Value {
        match v {
            Value::String(s) => match parse_expression(s) {
                Ok(Some(e)) => match self.eval(&e, me) {
                    Eval::Ready(x) => x,
                    _ => Value::Null,
                },
                _ => v.clone(),
            },
            Value::Array(a) => Value::Array(a.iter().map(|x| self.substitute(x, me)).collect()),
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, x)| (k.clone(), self.substitute(x, me)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    fn reading(&self, k: usize) -> bool {
        let c = &self.calls[k].1;
        c.phase == Phase::Waiting && !c.reads.is_empty()
    }

    /// Rule 7: accepting `c` closes a cycle when a waiting reader of what it writes reaches,
    /// over writer → waiting-reader overlaps, a waiting writer of what it reads.
    fn closes_cycle(&self, c: &RefCall) -> bool {
        let n = self.calls.len();
        let alive = |k: usize| self.calls[k].1.phase != Phase::Done;
        let feeds = |a: &[Path], b: &[Path]| a.iter().any(|x| b.iter().any(|y| x.overlaps(y)));
        let producer = |k: usize| alive(k) && feeds(&self.calls[k].1.writes, &c.reads);
        let mut seen = vec![false; n];
        let mut todo: Vec<usize> = (0..n)
            .filter(|&k| self.reading(k) && feeds(&c.writes, &self.calls[k].1.reads))
            .collect();
        while let Some(k) = todo.pop() {
            if std::mem::replace(&mut seen[k], true) {
                continue;
            }
            if self.reading(k) && producer(k) {
                return true;
            }
            for (j, &done) in seen.iter().enumerate() {
                if j != k
                    && !done
                    && self.reading(j)
                    && alive(k)
                    && feeds(&self.calls[k].1.writes, &self.calls[j].1.reads)
                {
                    todo.push(j);
                }
            }
        }
        false
    }

    fn arrive(&mut self, id: u64, call: Call, out: &mut Vec<Record>) {
        let refs = call.references().expect("generated references parse");
        let target = call.output_target().expect("generated target parses");
        let exprs: Vec<Expression> = refs.into_iter().map(|(_, e)| e).collect();
        let reads = exprs
            .iter()
            .flat_map(|e| e.refs.iter().map(|r| r.path.clone()))
            .collect();
        let writes = target
            .iter()
            .flat_map(|t| t.refs.iter().map(|r| r.path.clone()))
            .collect();
        let c = RefCall {
            call,
            reads,
            exprs,
            writes,
            target,
            phase: Phase::Waiting,
            waiting_on: Vec::new(),
            watch: 0,
        };
        let refused = self.closes_cycle(&c);
        self.calls.push((
            id,
            RefCall {
                phase: if refused { Phase::Done } else { Phase::Waiting },
                ..c
            },
        ));
        if refused {
            out.push((id, "refused".into(), Value::Null));
        }
        self.settle(out);
    }

    fn finish(&mut self, id: u64, ok: bool, out: &mut Vec<Record>) {
        let Some(k) = self.calls.iter().position(|(i, _)| *i == id) else {
            return;
        };
        let c = &mut self.calls[k].1;
        c.phase = Phase::Done;
        let value = result_value(id, ok);
        let method = c.call.method_or_default();
        let paths = c
            .target
            .as_ref()
            .map(|t| output_paths(t, ok, None))
            .unwrap_or_default();
        out.push((
            id,
            if ok { "finished" } else { "failed" }.into(),
            value.clone(),
        ));
        for p in paths {
            out.push((id, "written".into(), json!([p.text(), method])));
            self.log.push((p, value.clone(), method));
        }
        self.settle(out);
    }

    /// Checks every waiting call until nothing changes (launches and unresolved calls only
    /// ever make others readier, so the end does not depend on the order).
    fn settle(&mut self, out: &mut Vec<Record>) {
        loop {
            let mut changed = false;
            for k in 0..self.calls.len() {
                let (id, c) = &self.calls[k];
                let id = *id;
                if c.phase != Phase::Waiting {
                    continue;
                }
                let mut watch = c.watch;
                while watch < c.waiting_on.len() && !self.writable(&c.waiting_on[watch], id) {
                    watch += 1;
                }
                let still = watch < c.waiting_on.len();
                self.calls[k].1.watch = watch;
                let c = &self.calls[k].1;
                if still {
                    continue;
                }
                let evals: Vec<Eval> = c.exprs.iter().map(|e| self.eval(e, id)).collect();
                let missing = evals.iter().any(|e| matches!(e, Eval::Missing));
                let blocked: Vec<Path> = evals
                    .into_iter()
                    .flat_map(|e| match e {
                        Eval::Blocked(ps) => ps,
                        _ => Vec::new(),
                    })
                    .collect();
                if missing && self.closed {
                    out.push((id, "unresolved".into(), Value::Null));
                    self.calls[k].1.phase = Phase::Done;
                    changed = true;
                } else if missing || !blocked.is_empty() {
                    let c = &mut self.calls[k].1;
                    c.waiting_on = if missing { Vec::new() } else { blocked };
                    c.watch = 0;
                } else {
                    let params = c.call.params.as_value().clone();
                    let resolved = self.substitute(&params, id);
                    if self.validating {
                        out.push((id, "validated".into(), resolved.clone()));
                    }
                    out.push((id, "started".into(), resolved.clone()));
                    // A call without references launches as written, shared, not copied.
                    if self.calls[k].1.exprs.is_empty() {
                        out.push((id, "shared".into(), Value::Null));
                    }
                    out.push((id, "launched".into(), resolved));
                    self.calls[k].1.phase = Phase::Running;
                    changed = true;
                }
            }
            if changed {
                continue;
            }
            // Rule 8's last resort: nothing runs and the stream is closed.
            let running = self.calls.iter().any(|(_, c)| c.phase == Phase::Running);
            if self.closed && !running {
                for (id, c) in &mut self.calls {
                    if c.phase == Phase::Waiting {
                        out.push((*id, "unresolved".into(), Value::Null));
                        c.phase = Phase::Done;
                    }
                }
            }
            return;
        }
    }

    fn running(&self) -> Vec<u64> {
        self.calls
            .iter()
            .filter(|(_, c)| c.phase == Phase::Running)
            .map(|(id, _)| *id)
            .collect()
    }
}

/// What call `id` returns: nested values, so reads of paths below an output path find them.
fn result_value(id: u64, ok: bool) -> Value {
    match (ok, id % 2) {
        (false, _) => json!({"code": "test.failed", "message": format!("call {id} failed")}),
        (true, 0) => json!({"b": {"d": id}, "c": [id], "x": id}),
        (true, _) => json!([id, {"x": id}]),
    }
}

/// The scheduler's actions as records, after the params its validator was handed.
fn records(actions: Vec<Action>, validated: Vec<Record>) -> Vec<Record> {
    let mut out = validated;
    for a in actions {
        match a {
            Action::Launch { id, call, .. } => {
                out.push((id.0, "launched".into(), call.params.as_value().clone()));
            }
            Action::Event {
                call: Some(id),
                kind,
            } => {
                let (what, v) = match kind {
                    EventKind::Started { params, .. } => {
                        ("started", Value::Object(params.as_map().clone()))
                    }
                    EventKind::CallRefused { .. } => ("refused", Value::Null),
                    EventKind::Unresolved { .. } => ("unresolved", Value::Null),
                    EventKind::Finished { result } => ("finished", (*result).clone()),
                    EventKind::Failed { error, .. } => ("failed", (*error).clone()),
                    EventKind::Written { path, method, .. } => ("written", json!([path, method])),
                    _ => continue,
                };
                out.push((id.0, what.into(), v));
            }
            _ => {}
        }
    }
    out.sort_by(|a, b| (a.0, &a.1, a.2.to_string()).cmp(&(b.0, &b.1, b.2.to_string())));
    out
}

fn sorted(mut v: Vec<Record>) -> Vec<Record> {
    v.sort_by(|a, b| (a.0, &a.1, a.2.to_string()).cmp(&(b.0, &b.1, b.2.to_string())));
    v
}

fn tool() -> Tool {
    let mut t = Tool::new("t");
    t.activity = Some("rust".into());
    t
}

/// Runs the plan through both and compares after every input; returns every record.
fn compare(calls: Vec<Value>, schedule: Vec<u8>) -> Result<Vec<Record>, TestCaseError> {
    let mut r = Reference::default();
    Ok(compare_step(State::new(), &mut r, 0, calls, schedule)?.1)
}

/// [`compare`] with a params validator in the scheduler: it must be handed each call's resolved
/// params (the written params with the overlay of resolved references), as the reference
/// substitutes them.
fn compare_validating(calls: Vec<Value>, schedule: Vec<u8>) -> Result<Vec<Record>, TestCaseError> {
    let mut r = Reference {
        validating: true,
        ..Reference::default()
    };
    Ok(compare_step(State::new(), &mut r, 0, calls, schedule)?.1)
}

/// A `shared` record for each launch in `actions` that hands on the call as written (the
/// `Arc` that arrived, with no copy of its params), its `started` event sharing it too.
fn shared(actions: &[Action], written: &[(u64, Arc<Call>)]) -> Vec<Record> {
    let started = |id: u64, w: &Arc<Call>| {
        actions.iter().any(|a| {
            matches!(a, Action::Event { call: Some(c), kind: EventKind::Started { params, .. } }
                if c.0 == id && params.is_of(w))
        })
    };
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Launch { id, call, .. } => written
                .iter()
                .find(|(i, w)| *i == id.0 && Arc::ptr_eq(call, w) && started(id.0, w))
                .map(|_| (id.0, "shared".to_string(), Value::Null)),
            _ => None,
        })
        .collect()
}

/// Runs the plan as two steps of one run: the first `split` calls, then (with the state the
/// first step left, whose path table the second step's calls are interned into) the rest.
fn compare_two_steps(
    calls: Vec<Value>,
    schedule: Vec<u8>,
    split: usize,
) -> Result<Vec<Record>, TestCaseError> {
    let split = split.min(calls.len());
    let (first, second) = (calls[..split].to_vec(), calls[split..].to_vec());
    let mut r = Reference::default();
    let (state, mut all) = compare_step(State::new(), &mut r, 0, first, schedule.clone())?;
    r.calls.clear();
    r.closed = false;
    let (_, more) = compare_step(state, &mut r, split as u64, second, schedule)?;
    all.extend(more);
    Ok(all)
}

/// One step: the calls get ids from `first_id + 1`; returns the state it leaves.
fn compare_step(
    state: State,
    r: &mut Reference,
    first_id: u64,
    calls: Vec<Value>,
    schedule: Vec<u8>,
) -> Result<(State, Vec<Record>), TestCaseError> {
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let sink = seen.clone();
    let validate: Validator = Arc::new(move |_, params| {
        if let Ok(mut v) = sink.lock() {
            v.push(params.clone());
        }
        Ok(())
    });
    let mut s = Scheduler::new(
        state,
        vec![tool()],
        Policy::auto(),
        SchedulerOptions {
            validate: r.validating.then_some(validate),
            ..SchedulerOptions::default()
        },
    );
    let mut written: Vec<(u64, Arc<Call>)> = Vec::new();
    let calls: Vec<Call> = calls
        .into_iter()
        .map(|v| Call::try_from(v).expect("generated call"))
        .collect();
    let mut next = 0usize;
    let mut inputs = 0usize;
    let mut all = Vec::new();
    let mut schedule = schedule.into_iter();
    loop {
        let running = r.running();
        let b = schedule.next();
        let arrive = next < calls.len() && (running.is_empty() || b.is_none_or(|b| b % 3 == 0));
        let mut expected = Vec::new();
        let input = if arrive {
            let id = first_id + next as u64 + 1;
            let call = calls[next].clone();
            next += 1;
            r.arrive(id, call.clone(), &mut expected);
            let call = Arc::new(call);
            written.push((id, call.clone()));
            Input::CallArrived {
                id: CallId(id),
                call: Ok(call),
                parsed: Default::default(),
            }
        } else if next == calls.len() && !r.closed {
            r.closed = true;
            r.settle(&mut expected);
            Input::StreamClosed
        } else if let Some(&id) =
            running.get(usize::from(b.unwrap_or(0) / 3) % running.len().max(1))
        {
            let ok = b.unwrap_or(0).is_multiple_of(2);
            r.finish(id, ok, &mut expected);
            let outcome = if ok {
                Outcome::ok(result_value(id, true))
            } else {
                Outcome::error(result_value(id, false))
            };
            Input::Finished {
                id: CallId(id),
                outcome,
            }
        } else {
            break;
        };
        inputs += 1;
        let actions = s.handle(input, 0);
        // The validator's calls, named by the launches they came before (every validated call
        // launches: the validator accepts all, the policy allows all).
        let handed = std::mem::take(&mut *seen.lock().map_err(|_| TestCaseError::fail("lock"))?);
        let launched = actions.iter().filter_map(|a| match a {
            Action::Launch { id, .. } => Some(id.0),
            _ => None,
        });
        let validated = launched
            .zip(handed)
            .map(|(id, v)| (id, "validated".to_string(), v))
            .chain(shared(&actions, &written))
            .collect();
        let got = records(actions, validated);
        prop_assert_eq!(&got, &sorted(expected), "after input {}", inputs);
        all.extend(got);
    }
    prop_assert!(r.running().is_empty());
    Ok((s.into_state(), all))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn the_core_does_what_the_reference_does((calls, schedule) in core_plan()) {
        compare(calls, schedule)?;
    }

    /// The validator reads each call's params as resolved (call and overlay), in launch order.
    #[test]
    fn a_validating_core_is_handed_the_resolved_params((calls, schedule) in core_plan()) {
        compare_validating(calls, schedule)?;
    }

    /// The run's path table outlives a step: the second step's calls are interned into the
    /// table the first step's state holds, and read what the first step wrote through it.
    #[test]
    fn a_second_step_on_the_same_state_does_what_the_reference_does(
        (calls, schedule) in core_plan(), split in 0usize..10,
    ) {
        compare_two_steps(calls, schedule, split)?;
    }
}

/// A hand-made plan with every overlap kind and a cycle, checked to really launch, write,
/// refuse and leave a call unresolved (so the property above is not comparing two schedulers
/// that do nothing).
#[test]
fn a_known_plan_exercises_every_record_kind() {
    let calls = vec![
        json!({"_tool": "t", "k": 1, "_outputPath": "†state.a"}),
        json!({"_tool": "t", "k": 2, "r0": "†state.a.b.d", "_outputPath": "†state.b"}),
        json!({"_tool": "t", "k": 3, "r0": "†state.b[0] || †state.c", "_outputPath": "†state.a.c"}),
        json!({"_tool": "t", "k": 4, "r0": "†state.a.c", "_outputPath": "†state.b[0].x"}),
        json!({"_tool": "t", "k": 5, "r0": "†state.c"}),
        json!({"_tool": "t", "k": 6, "r0": "†state.y", "_outputPath": "†state.x"}),
        json!({"_tool": "t", "k": 7, "r0": "†state.x", "_outputPath": "†state.y"}),
    ];
    let all = compare(calls.clone(), vec![0; 7]).expect("same as the reference");
    let validating = compare_validating(calls, vec![0; 7]).expect("same as the reference");
    assert!(
        validating.iter().any(|r| r.1 == "validated"),
        "{validating:?}"
    );
    for kind in [
        "launched",
        "started",
        "shared",
        "written",
        "finished",
        "unresolved",
        "refused",
    ] {
        assert!(all.iter().any(|r| r.1 == kind), "no {kind} in {all:?}");
    }
    assert!(all.contains(&(7, "refused".into(), Value::Null)), "{all:?}");
}

/// The padding case the generated plans may miss: a write to `state.b[1]` while the stream is
/// open makes `state.b[0]` read as null, and both launch its waiting reader at that write
/// (spec/state.md S6a), not when the stream closes.
#[test]
fn a_write_past_the_end_launches_the_reader_of_a_padded_index_at_once() {
    let calls = vec![
        json!({"_tool": "t", "k": 1, "r0": "†state.b[0]"}),
        json!({"_tool": "t", "k": 2, "_outputPath": "†state.b[1]"}),
        json!({"_tool": "t", "k": 3}),
    ];
    // Arrive, arrive, call 2 succeeds, arrive (the stream is still open until then). Records
    // are compared per input with the reference, so call 1 launched at call 2's write.
    let all = compare(calls, vec![0, 0, 2, 0]).expect("same as the reference");
    let launched = all
        .iter()
        .position(|r| r.0 == 1 && r.1 == "launched")
        .expect("call 1 launched");
    assert_eq!(all[launched].2["r0"], Value::Null, "{all:?}");
    let third = all
        .iter()
        .position(|r| r.0 == 3 && r.1 == "launched")
        .expect("call 3 launched");
    assert!(
        launched < third,
        "launched before the stream closed: {all:?}"
    );
}
