//! Property test: random DAGs, streamed in random order with random timings, run through the
//! sans-IO scheduler in a discrete-event simulation, checked against a reference topological
//! executor: every call runs once, after all its producers, and the final state is the same.

use std::collections::BTreeMap;

use dagloop::approval::Policy;
use dagloop::protocol::{Call, CallId, Tool};
use dagloop::scheduler::{Action, CallStatus, Input, Outcome, Scheduler, SchedulerOptions};
use dagloop::state::State;
use proptest::prelude::*;
use serde_json::{Value, json};

#[derive(Debug, Clone)]
struct Dag {
    parents: Vec<Vec<usize>>,
    dur: Vec<u64>,
    /// Stream order: a permutation of the nodes (producers may arrive after their readers).
    order: Vec<usize>,
    gaps: Vec<u64>,
    close_gap: u64,
    nested: Vec<bool>,
}

fn out_path(d: &Dag, i: usize) -> String {
    if d.nested[i] {
        format!("state.g{}.n{i}", i % 3)
    } else {
        format!("state.n{i}")
    }
}

fn value_of(i: usize, deps: &[u64]) -> u64 {
    (i as u64 * 7919 + deps.iter().sum::<u64>()) % 1_000_003
}

fn dag() -> impl Strategy<Value = Dag> {
    (1usize..=24).prop_flat_map(|n| {
        let parents = (0..n)
            .map(|i| proptest::collection::vec(any::<bool>(), i))
            .collect::<Vec<_>>();
        (
            parents,
            proptest::collection::vec(0u64..6, n),
            Just((0..n).collect::<Vec<usize>>()).prop_shuffle(),
            proptest::collection::vec(0u64..4, n),
            0u64..10,
            proptest::collection::vec(any::<bool>(), n),
        )
            .prop_map(|(bits, dur, order, gaps, close_gap, nested)| Dag {
                parents: bits
                    .into_iter()
                    .map(|b| {
                        b.iter()
                            .enumerate()
                            .filter(|(_, x)| **x)
                            .map(|(j, _)| j)
                            .collect()
                    })
                    .collect(),
                dur,
                order,
                gaps,
                close_gap,
                nested,
            })
    })
}

fn call_for(d: &Dag, i: usize) -> Call {
    let deps: Vec<Value> = d.parents[i]
        .iter()
        .map(|&j| Value::String(format!("†{}", out_path(d, j))))
        .collect();
    Call::try_from(json!({
        "_tool": "t", "node": i, "deps": deps, "_outputPath": format!("†{}", out_path(d, i)),
    }))
    .expect("call")
}

enum Ev {
    Arrive(usize),
    Close,
    Finish(CallId, Outcome),
}

/// (start, finish) per node, launches per node, the final `state` view, every call's status.
type Sim = (Vec<(u64, u64)>, Vec<usize>, Value, Vec<CallStatus>);

/// Runs the DAG through the scheduler.
fn simulate(d: &Dag) -> Sim {
    let mut tool = Tool::new("t");
    tool.activity = Some("sim".into());
    let mut s = Scheduler::new(
        State::new(),
        vec![tool],
        Policy::auto(),
        SchedulerOptions::default(),
    );
    let mut queue: BTreeMap<(u64, u64), Ev> = BTreeMap::new();
    let mut seq = 0u64;
    let mut t = 0u64;
    for (k, &node) in d.order.iter().enumerate() {
        t += d.gaps[k];
        queue.insert((t, seq), Ev::Arrive(node));
        seq += 1;
    }
    queue.insert((t + d.close_gap, seq), Ev::Close);
    seq += 1;
    let n = d.parents.len();
    let mut times = vec![(u64::MAX, u64::MAX); n];
    let mut launches = vec![0usize; n];
    let mut out = Vec::new();
    let mut drained = false;
    while let Some(((now, _), ev)) = queue.pop_first() {
        let input = match ev {
            Ev::Arrive(i) => Input::CallArrived {
                id: CallId(i as u64),
                call: Ok(call_for(d, i).into()),
                parsed: Default::default(),
            },
            Ev::Close => Input::StreamClosed,
            Ev::Finish(id, o) => Input::Finished { id, outcome: o },
        };
        s.handle_into(input, now, &mut out);
        for a in out.drain(..) {
            match a {
                Action::Launch { id, call, .. } => {
                    let node = call.params["node"].as_u64().expect("node") as usize;
                    let deps: Vec<u64> = call.params["deps"]
                        .as_array()
                        .expect("deps")
                        .iter()
                        .map(|v| v.as_u64().expect("resolved dep"))
                        .collect();
                    launches[node] += 1;
                    let end = now + d.dur[node];
                    times[node] = (now, end);
                    queue.insert(
                        (end, seq),
                        Ev::Finish(id, Outcome::ok(json!(value_of(node, &deps)))),
                    );
                    seq += 1;
                }
                Action::Drained => drained = true,
                Action::Event { .. } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    assert!(drained, "the step drained");
    let statuses = s.report().calls.iter().map(|c| c.status).collect();
    let view = s.state().view("state").unwrap_or(Value::Null);
    (times, launches, view, statuses)
}

fn reference(d: &Dag) -> Value {
    let mut state = State::new();
    let mut values = Vec::new();
    for i in 0..d.parents.len() {
        let deps: Vec<u64> = d.parents[i].iter().map(|&j| values[j]).collect();
        let v = value_of(i, &deps);
        values.push(v);
        let p = dagloop::protocol::Path::parse(&out_path(d, i)).expect("path");
        state.write(p, json!(v), Default::default(), None, 0);
    }
    state.view("state").unwrap_or(Value::Null)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, ..ProptestConfig::default() })]

    #[test]
    fn random_dags_match_a_topological_reference(d in dag()) {
        let (times, launches, view, statuses) = simulate(&d);
        prop_assert!(statuses.iter().all(|s| *s == CallStatus::Done), "{statuses:?}");
        prop_assert!(launches.iter().all(|&k| k == 1), "each call launched once: {launches:?}");
        for (i, ps) in d.parents.iter().enumerate() {
            for &j in ps {
                prop_assert!(times[i].0 >= times[j].1, "node {i} started at {} before parent {j} finished at {}", times[i].0, times[j].1);
            }
        }
        prop_assert_eq!(view, reference(&d));
    }
}
