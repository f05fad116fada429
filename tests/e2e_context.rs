//! The context sent to the model at each step of a refund-like run, through the library
//! (`AgentBuilder` + a recording wrapper around `ScriptedModel`), on tokio's paused clock.
//!
//! Each step's messages are an insta snapshot, and so is the result JSON. Besides the snapshots,
//! each rule the context carries is asserted directly: the plan with every status (done,
//! failed, unresolved, refused, rejected), observations of calls without an output path, error
//! messages, output validation errors, a malformed response shown back (rule 17), and results
//! sanitised for the model while state keeps them whole (rule 18).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use dagloop::approval::{Decision, ScriptedApprover};
use dagloop::context::SanitizeLimits;
use dagloop::engine::{AgentBuilder, RunResult};
use dagloop::goal::Goal;
use dagloop::llm::{EventStream, Model, Request, ScriptedModel};
use dagloop::protocol::Message;
use serde::Deserialize;
use serde_json::{Value, json};

/// Records the messages of every Request, then lets the scripted model answer.
struct Recording {
    inner: ScriptedModel,
    seen: Arc<Mutex<Vec<Vec<Message>>>>,
}

impl Model for Recording {
    fn stream(&self, req: &Request) -> EventStream {
        self.seen.lock().unwrap().push(req.messages.clone());
        self.inner.stream(req)
    }

    fn name(&self) -> String {
        format!("recording:{}", self.inner.name())
    }
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/e2e/refund")
}

/// The base64 invoice the billing system returns: long enough to be stripped for the model.
fn invoice() -> String {
    "JVBERi0xLjQK".repeat(30)
}

const NOTES: &str = "Customer since 2019. Two earlier refunds, both approved. Prefers email. \
                     The last order had a 10.00 goodwill credit applied in September, which is \
                     why only 40.00 of it can still be refunded. Do not offer vouchers: they were \
                     declined twice.";

/// What the model may see of a string (the notes are longer).
const MAX_CHARS: usize = 160;

#[derive(Deserialize)]
struct Billing {
    #[serde(rename = "customerId")]
    customer_id: String,
}

#[derive(Deserialize)]
struct Refund {
    #[serde(rename = "orderId")]
    order_id: String,
    amount: f64,
}

#[derive(Deserialize)]
struct Anything {}

/// Runs the refund flow; returns the result and the messages of each Request.
async fn run_refund() -> (RunResult, Vec<Vec<Message>>) {
    let goal = Goal::load(&dir().join("goal.json")).expect("goal fixture");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let model = Recording {
        inner: ScriptedModel::load(&dir().join("refund.script.json")).expect("script fixture"),
        seen: seen.clone(),
    };
    let reviewer = ScriptedApprover::new().for_tool(
        "notifyManager",
        Decision::Reject {
            reason: "managers are not told about partial refunds".into(),
        },
    );
    let mut builder = AgentBuilder::new(dagloop::RunDef::from_goal(goal).expect("defined"))
        .model(Arc::new(model))
        .approver(Arc::new(reviewer))
        .sanitize(SanitizeLimits {
            max_string_chars: MAX_CHARS,
            ..SanitizeLimits::default()
        });
    let tools = builder.registry_mut();
    tools.register_fn("checkBillingHistory", |p: Billing| async move {
        Ok::<_, String>(json!({
            "customerId": p.customer_id,
            "lastOrder": {"id": "ord_981", "total": 50.0, "refundable": 40.0},
            "invoicePdf": invoice(),
            "notes": NOTES,
        }))
    });
    tools.register_fn("issueRefund", |p: Refund| async move {
        if p.amount > 40.0 {
            return Err(format!(
                "amount {:.2} exceeds the refundable 40.00 of {}",
                p.amount, p.order_id
            ));
        }
        Ok(json!({"refundId": format!("rf_{}", p.order_id), "amount": p.amount}))
    });
    tools.register_fn("lookupPolicy", |_: Anything| async move {
        Ok::<_, String>(json!({"partialRefunds": "allowed up to the refundable balance"}))
    });
    tools.register_fn("notifyManager", |_: Anything| async move {
        Ok::<_, String>(json!({"sent": true}))
    });
    let result = builder.build().expect("agent").run().await;
    let messages = seen.lock().unwrap().clone();
    (result, messages)
}

/// The messages of one step as JSON, with maps sorted (concurrent writes may land in either
/// order; the snapshot should not depend on it).
fn snapshot_messages(name: &str, messages: &[Message]) {
    insta::with_settings!({sort_maps => true}, {
        insta::assert_json_snapshot!(name, messages);
    });
}

fn of_type(messages: &[Message], ty: &str) -> Vec<Value> {
    messages
        .iter()
        .map(|m| serde_json::to_value(m).unwrap())
        .filter(|v| v["type"] == ty)
        .collect()
}

fn texts(messages: &[Message]) -> Vec<String> {
    messages
        .iter()
        .filter_map(|m| match m {
            Message::Text { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

fn plan_statuses(messages: &[Message]) -> Vec<(String, String)> {
    of_type(messages, "plan")
        .first()
        .map(|p| {
            p["plan"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| {
                    (
                        c["_tool"].as_str().unwrap().to_string(),
                        c["_status"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn context_at_each_step_of_the_refund_flow() {
    let (result, steps) = run_refund().await;
    assert_eq!(steps.len(), 5, "one Request per step");
    for (i, messages) in steps.iter().enumerate() {
        snapshot_messages(&format!("refund_step_{}", i + 1), messages);
    }

    // Step 1: instructions, goal, input with its schema, empty state; no plan yet.
    let s1 = &steps[0];
    assert!(
        texts(s1)[0].contains("Tools:\n- checkBillingHistory"),
        "{:?}",
        texts(s1)[0]
    );
    assert!(texts(s1)[0].contains("draftCustomerMessage: Writes the message sent to the customer. (you fill in `_output` yourself)"));
    assert_eq!(
        of_type(s1, "input")[0]["data"],
        json!({"customerId": "cust_123", "amount": 50.0})
    );
    assert!(of_type(s1, "input")[0]["schema"].is_object());
    assert_eq!(of_type(s1, "state")[0]["data"], json!({}));
    assert!(of_type(s1, "plan").is_empty());

    // Step 2: the previous plan with each call's status.
    let s2 = &steps[1];
    assert_eq!(
        plan_statuses(s2),
        [
            ("checkBillingHistory", "done"),
            ("issueRefund", "failed"),
            ("lookupPolicy", "done"),
            ("issueRefund", "unresolved"),
            ("refundEverything", "refused"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    let plan = &of_type(s2, "plan")[0]["plan"];
    // A call without an output path shows its result as an observation; others do not.
    assert_eq!(
        plan[2]["_result"],
        json!({"partialRefunds": "allowed up to the refundable balance"})
    );
    assert!(plan[0].get("_result").is_none());
    // One error message per call that did not succeed.
    let errors = of_type(s2, "error");
    assert_eq!(errors.len(), 3);
    assert!(
        errors[0]["error"]
            .to_string()
            .contains("exceeds the refundable 40.00")
    );
    assert_eq!(
        errors[1]["error"]["details"]["missing"],
        json!(["state.archive.orderId"])
    );
    assert!(
        errors[2]["error"].to_string().contains("refundEverything"),
        "{}",
        errors[2]
    );
    // Rule 18: the invoice blob is stripped and the notes cut for the model...
    let state = &of_type(s2, "state")[0]["data"];
    assert_eq!(
        state["billing"]["invoicePdf"],
        json!("[base64 data stripped: 360 chars]")
    );
    let cut = format!(
        "{}…[truncated: {} more chars]",
        NOTES.chars().take(MAX_CHARS).collect::<String>(),
        NOTES.chars().count() - MAX_CHARS
    );
    assert_eq!(state["billing"]["notes"], json!(cut));
    // ... and the branch wrote the failure where the model can read it.
    assert_eq!(state["refundError"]["code"], "activity.failed");

    // Step 3: the rejected call, with the reviewer's reason.
    let s3 = &steps[2];
    assert_eq!(
        plan_statuses(s3)[2],
        ("notifyManager".to_string(), "rejected".to_string())
    );
    let rejected = of_type(s3, "error");
    assert_eq!(rejected.len(), 1);
    assert!(
        rejected[0]["error"]
            .to_string()
            .contains("managers are not told about partial refunds")
    );
    assert!(texts(s3)[0].contains("rejected by a reviewer must not be retried"));

    // Step 4: the invalid output comes back with the validation errors.
    let s4 = &steps[3];
    let last = texts(s4).pop().unwrap();
    assert!(
        last.starts_with("Your output did not match the output schema; fix it:"),
        "{last}"
    );
    assert!(last.contains("\"partial\""), "{last}");
    assert!(last.contains("message"), "{last}");
    assert!(of_type(s4, "plan").is_empty(), "step 3 made no calls");

    // Step 5: the malformed response is shown back as a problem (a model error, not fatal).
    let s5 = &steps[4];
    let last = texts(s5).pop().unwrap();
    assert!(
        last.starts_with("Your previous response was not a valid Solution: it could not be read at byte 47 (in calls[0])"),
        "{last}"
    );

    // The result: success, the full results kept in state.
    assert!(result.succeeded(), "{result:?}");
    assert_eq!(result.steps, 5);
    assert_eq!(result.state["billing"]["invoicePdf"], json!(invoice()));
    assert_eq!(result.state["billing"]["notes"], json!(NOTES));
    let v = serde_json::to_value(&result).unwrap();
    insta::with_settings!({sort_maps => true}, {
        insta::assert_json_snapshot!("refund_result", v);
    });
}

#[tokio::test(start_paused = true)]
async fn the_same_run_gives_the_same_context() {
    let (a, ma) = run_refund().await;
    let (b, mb) = run_refund().await;
    // Concurrent writes may land in either order; compare with every map's keys sorted.
    fn canonical(v: Value) -> Value {
        match v {
            Value::Object(m) => {
                let sorted: std::collections::BTreeMap<String, Value> =
                    m.into_iter().map(|(k, x)| (k, canonical(x))).collect();
                Value::Object(sorted.into_iter().collect())
            }
            Value::Array(a) => Value::Array(a.into_iter().map(canonical).collect()),
            other => other,
        }
    }
    let sorted = |m: &Vec<Vec<Message>>| -> Vec<Value> {
        m.iter()
            .flatten()
            .map(|x| canonical(serde_json::to_value(x).unwrap()))
            .collect()
    };
    assert_eq!(sorted(&ma), sorted(&mb));
    assert_eq!(a.calls, b.calls);
    assert_eq!(a.output, b.output);
    assert_eq!(a.usage, b.usage);
}
