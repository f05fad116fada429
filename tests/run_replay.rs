//! The journal rebuilds the run (DESIGN.md 3.1): random runs through the real engine (scripted
//! model, random DAGs of calls, random failures, random reviewer decisions and timeouts, on the
//! paused clock, with default or tight sanitize limits) are recorded; their journal, serialised
//! to JSON and read back, is replayed through the machine the run's record defines
//! (`RunDef::from_record`, then `replay`: what every reader of a stored run uses) and must give
//! exactly the events the run published.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dagloop::approval::{ApprovalRequest, Approver};
use dagloop::context::SanitizeLimits;
use dagloop::llm::{Script, ScriptedModel};
use dagloop::machine::JournalEntry;
use dagloop::runs::RunDef;
use dagloop::store::RunRecord;
use dagloop::{AgentBuilder, Decision, Event, Goal};
use futures::FutureExt;
use futures::future::BoxFuture;
use proptest::prelude::*;
use serde_json::{Value, json};

#[derive(Debug, Clone)]
struct Node {
    parents: Vec<usize>,
    ms: u64,
    fail: bool,
    /// 0 approve, 1 reject, 2 edit, 3 no answer (the policy's timeout decides), 4 late approve.
    review: u8,
}

fn nodes() -> impl Strategy<Value = Vec<Node>> {
    prop::collection::vec(
        (
            0u64..40,
            any::<bool>(),
            0u8..5,
            prop::collection::vec(0usize..12, 0..3),
        ),
        1..12,
    )
    .prop_map(|raw| {
        raw.into_iter()
            .enumerate()
            .map(|(i, (ms, fail, review, ps))| Node {
                parents: if i == 0 {
                    vec![]
                } else {
                    ps.into_iter().map(|p| p % i).collect()
                },
                ms,
                fail: fail && i % 3 == 1,
                review,
            })
            .collect()
    })
}

/// Answers by the `review` param the model wrote into each call.
struct Reviewer;
impl Approver for Reviewer {
    fn decide(&self, req: ApprovalRequest) -> BoxFuture<'static, Decision> {
        let review = req
            .call
            .params
            .get("review")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        async move {
            match review {
                1 => Decision::Reject {
                    reason: "no".into(),
                },
                2 => Decision::Edit {
                    params: json!({"ms": 1, "review": 2, "edited": true})
                        .as_object()
                        .cloned()
                        .unwrap_or_default(),
                },
                3 => std::future::pending().await,
                4 => {
                    // Answers after the policy's timeout: the run refuses it (already decided).
                    tokio::time::sleep(Duration::from_millis(80)).await;
                    Decision::Approve
                }
                _ => {
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    Decision::Approve
                }
            }
        }
        .boxed()
    }
}

/// Sanitize limits: the defaults, or tight ones that cut what the model is shown of results.
fn limits() -> impl Strategy<Value = SanitizeLimits> {
    prop_oneof![
        Just(SanitizeLimits::default()),
        (8usize..64, 1usize..4, 64usize..512).prop_map(|(chars, items, bytes)| SanitizeLimits {
            blob_min_chars: 16,
            max_string_chars: chars,
            max_array_items: items,
            max_total_bytes: bytes,
        }),
    ]
}

fn run_case(
    nodes: &[Node],
    ask_every: bool,
    limits: SanitizeLimits,
) -> (Vec<Event>, Vec<Event>, String) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(async {
        let calls: Vec<Value> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let deps: Vec<String> = n.parents.iter().map(|p| format!("†state.n{p}")).collect();
                json!({"_tool": if i % 4 == 3 { "note" } else { "work" },
                       "ms": n.ms, "fail": n.fail, "review": n.review, "deps": deps,
                       "_output": format!("latent {i}"),
                       "_outputPath": format!("†state.n{i} || †state.e{i}")})
            })
            .collect();
        let turns = json!({"turns": [
            {"solution": {"calls": calls, "output": null}, "chunk_chars": 40, "chunk_delay_ms": 2},
            {"solution": {"calls": [], "output": {"done": true}}, "chunk_chars": 40}
        ]});
        let approval = if ask_every {
            json!({"policy": "ask", "timeout_s": 0.05, "default_decision": "reject"})
        } else {
            json!({"policy": "auto"})
        };
        let doc = json!({"goal": "g", "output_schema": {"type": "object"}, "approval": approval,
            "tools": [{"_tool": "work", "_activity": "rust", "type": "object"},
                      {"_tool": "note", "type": "object", "_output": {"type": "string"}}]});
        let goal = Goal::from_json(&doc.to_string(), "g.json".as_ref(), ".".into()).expect("goal");
        let script = Script::parse(&turns.to_string(), "s").expect("script");
        let base = tokio::time::Instant::now();
        let mut b = AgentBuilder::new(dagloop::RunDef::from_goal(goal).expect("defined"))
            .model(Arc::new(ScriptedModel::new(script)))
            .sanitize(limits)
            .approver(Arc::new(Reviewer))
            .run_id("run-replay")
            .clock(Arc::new(move || {
                1_700_000_000_000 + base.elapsed().as_millis() as u64
            }));
        b.registry_mut().register_fn("work", |p: Value| async move {
            tokio::time::sleep(Duration::from_millis(p["ms"].as_u64().unwrap_or(0))).await;
            if p["fail"] == json!(true) {
                Err("it failed".to_string())
            } else {
                Ok(json!({"deps": p["deps"], "note": "a result long enough to be cut by tight limits",
                          "items": [1, 2, 3, 4, 5]}))
            }
        });
        let agent = b.build().expect("build");
        let h = agent.start();
        let mut sub = h.subscribe_from(0);
        let mut live = Vec::new();
        while let Some(e) = sub.recv().await {
            if !e.kind.is_ephemeral() {
                live.push((*e).clone());
            }
        }
        let status = h.wait().await.status.as_str().to_string();
        // The journal as it would be stored: JSON lines, read back.
        let text: Vec<String> = h
            .journal()
            .iter()
            .map(|e| serde_json::to_string(e).expect("journal entry serialises"))
            .collect();
        let back: Vec<JournalEntry> = text
            .iter()
            .map(|l| serde_json::from_str(l).expect("journal entry reads back"))
            .collect();
        // The run's record, as the store would hold it, is all the replay is given.
        let record = RunRecord {
            id: "run-replay".into(),
            created_at: 0,
            goal: doc,
            base_dir: ".".into(),
            options: json!({"record": {"version": 1, "sanitize": limits}}),
        };
        let replayed = RunDef::from_record(&record)
            .expect("defined from its record")
            .replay("run-replay", &back)
            .expect("replayed")
            .events;
        (live, replayed, status)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn replaying_the_journal_gives_the_same_events(
        nodes in nodes(),
        ask in any::<bool>(),
        limits in limits(),
    ) {
        let (live, replayed, status) = run_case(&nodes, ask, limits);
        prop_assert_eq!(&status, "succeeded");
        prop_assert!(!live.is_empty());
        let kinds: BTreeMap<&str, usize> = live.iter().fold(BTreeMap::new(), |mut m, e| {
            *m.entry(e.kind.name()).or_default() += 1;
            m
        });
        prop_assert!(kinds.contains_key("run_finished"), "{kinds:?}");
        prop_assert_eq!(live, replayed);
    }
}
