//! A turn that yields no Solution tells the model exactly what was wrong (what was received, in
//! short, and what was expected), and a run that ends on a limit names the last such problem in
//! its error: through the library on scripted `text` turns (paused clock), and through the
//! binary on a scripted-model file and against an OpenAI-compatible server that records what
//! the model is sent.
#![cfg(feature = "server")]

#[path = "common/bin.rs"]
mod bin;
mod common;

use std::sync::{Arc, Mutex};

use common::*;
use dagloop::llm::{EventStream, Model, Request, Script, ScriptedModel};
use dagloop::protocol::{Message, Role};
use dagloop::{AgentBuilder, Goal, RunResult, RunStatus};
use serde_json::{Value, json};

fn goal_doc(limits: Value) -> Value {
    json!({
        "goal": "Answer with the doubled input.",
        "input": {"n": 2},
        "output_schema": {"type": "object", "required": ["answer"],
                          "properties": {"answer": {"type": "integer"}}},
        "tools": [{"_tool": "note", "description": "Notes a thought.", "type": "object",
                   "_output": {"type": "string"}}],
        "limits": limits
    })
}

/// Seven answers that are not Solutions, one of each kind; the seventh ends the run
/// (`empty_turns` 7).
fn bad_texts() -> Vec<&'static str> {
    vec![
        "I will double the number, then answer.",
        "",
        r#"[{"_tool": "note", "_output": "doubling"}]"#,
        r#""{\"calls\": [], \"output\": {\"answer\": 4}}""#,
        r#"{"answer": 4, "tool_calls": [{"name": "note"}]}"#,
        r#"{"calls": {"_tool": "note", "_output": "x"}, "output": null}"#,
        r#"{"calls": [{"_tool": "note", "_output": "unfinished"#,
    ]
}

/// Records every Request and answers with a scripted model.
struct Recording {
    inner: ScriptedModel,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl Model for Recording {
    fn stream(&self, req: &Request) -> EventStream {
        self.requests.lock().expect("requests").push(req.clone());
        self.inner.stream(req)
    }
    fn name(&self) -> String {
        "recording".into()
    }
}

async fn run_texts(limits: Value, texts: &[&str]) -> (RunResult, Vec<Request>) {
    let turns: Vec<Value> = texts
        .iter()
        .map(|t| json!({"text": t, "chunk_chars": 5, "chunk_delay_ms": 1}))
        .collect();
    let script = Script::parse(&json!({ "turns": turns }).to_string(), "t").expect("script");
    let requests = Arc::new(Mutex::new(Vec::new()));
    let model = Recording {
        inner: ScriptedModel::new(script),
        requests: requests.clone(),
    };
    let goal = Goal::from_json(&goal_doc(limits).to_string(), "t.json".as_ref(), ".".into())
        .expect("goal");
    let r = AgentBuilder::new(dagloop::RunDef::from_goal(goal).expect("defined"))
        .model(Arc::new(model))
        .build()
        .expect("build")
        .run()
        .await;
    let reqs = requests.lock().expect("requests").clone();
    (r, reqs)
}

/// The corrections a Request carries: its user text messages about the previous response.
fn corrections(messages: &[(String, String)]) -> Vec<String> {
    messages
        .iter()
        .filter(|(role, text)| role == "user" && text.starts_with("Your previous response"))
        .map(|(_, text)| text.clone())
        .collect()
}

fn texts_of(req: &Request) -> Vec<(String, String)> {
    req.messages
        .iter()
        .filter_map(|m| match m {
            Message::Text { role, text, .. } => {
                let role = match role {
                    Role::User => "user",
                    Role::System => "system",
                    _ => "assistant",
                };
                Some((role.to_string(), text.clone()))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn each_kind_of_non_solution_is_corrected_precisely_and_the_run_error_names_the_last() {
    let (r, reqs) = run_texts(json!({"empty_turns": 7}), &bad_texts()).await;
    assert_eq!((r.status, r.steps), (RunStatus::EmptyTurns, 7), "{r:?}");
    assert_eq!(reqs.len(), 7);
    assert!(
        corrections(&texts_of(&reqs[0])).is_empty(),
        "the first Request has nothing to correct"
    );
    let received: Vec<Vec<String>> = reqs[1..]
        .iter()
        .map(|q| corrections(&texts_of(q)))
        .collect();
    let codes = [
        "no JSON object",
        "was empty",
        "a JSON array, not an object",
        "a JSON string, not an object",
        "fields a Solution does not have",
        "its `calls` is an object, not an array",
    ];
    for (got, want) in received.iter().zip(codes) {
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].contains(want), "{want}: {got:?}");
    }
    let err = r.error.as_ref().expect("an error");
    assert_eq!(err.code, "run.empty_turns");
    assert_eq!(
        err.cause.as_ref().and_then(|c| c.get("code")),
        Some(&json!("plan.truncated"))
    );
    insta::assert_json_snapshot!("corrections", json!({"received": received, "error": err}));
}

/// Calls that are not calls, or name no known tool, come back as error messages of the plan
/// (what was received and what a call is); a run that ends on a limit names the first of the
/// last step's refusals.
#[tokio::test(start_paused = true)]
async fn calls_that_are_not_calls_or_name_no_tool_are_corrected_and_named_in_the_error() {
    let text = r#"{"calls": ["note: doubling", {"_output": "x"}, {"_tool": "nte", "_output": "x"}], "output": null}"#;
    let (r, reqs) = run_texts(json!({}), &[text, text, text]).await;
    assert_eq!((r.status, r.steps), (RunStatus::DoomLoop, 3), "{r:?}");
    let errors: Vec<Value> = reqs[1]
        .messages
        .iter()
        .filter_map(|m| match m {
            Message::Error { error, .. } => Some(error["message"].clone()),
            _ => None,
        })
        .collect();
    assert_eq!(errors.len(), 3, "{errors:?}");
    let err = r.error.as_ref().expect("an error");
    assert_eq!(
        err.cause.as_ref().and_then(|c| c.get("code")),
        Some(&json!("scheduler.unreadable_call"))
    );
    insta::assert_json_snapshot!("call_corrections", json!({"errors": errors, "error": err}));
}

/// Issue 23: a call the model writes with a meta key no call has (a typo of `_outputPath`) is
/// not run with the key kept as a param: it is refused, and the model is told which key and
/// what it probably meant; the next answer, spelled right, runs.
#[tokio::test(start_paused = true)]
async fn a_misspelt_meta_key_in_a_call_is_refused_and_the_model_is_told() {
    let texts = [
        r#"{"calls": [{"_tool": "note", "_output": "x", "_outputpath": "†state.n"}], "output": null}"#,
        r#"{"calls": [{"_tool": "note", "_output": "x", "_outputPath": "†state.n"}], "output": null}"#,
        r#"{"calls": [], "output": {"answer": 4}}"#,
    ];
    let (r, reqs) = run_texts(json!({}), &texts).await;
    assert_eq!(r.status, RunStatus::Succeeded, "{r:?}");
    let errors: Vec<Value> = reqs[1]
        .messages
        .iter()
        .filter_map(|m| match m {
            Message::Error { error, .. } => Some(error.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0]["code"], "scheduler.unreadable_call", "{errors:?}");
    let message = errors[0]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("unknown meta key `_outputpath` (did you mean `_outputPath`?)"),
        "{message}"
    );
    let statuses: Vec<&str> = r.calls.iter().map(|c| c.status.as_str()).collect();
    assert_eq!(statuses, ["refused", "done"], "{r:?}");
}

/// The OpenAI-compatible stream answering with this text.
fn answer(text: &str) -> Canned {
    Canned::sse(&oa_stream(text))
}

/// Through the binary: the same answers from a scripted-model file end the run with the same
/// error (exit 1), and from an OpenAI-compatible server the model receives exactly the
/// corrections the library sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_sends_the_same_corrections_and_prints_the_cause() {
    let texts = bad_texts();
    let dir = tempfile::tempdir().expect("dir");
    let turns: Vec<Value> = texts.iter().map(|t| json!({"text": t})).collect();
    std::fs::write(
        dir.path().join("script.json"),
        json!({ "turns": turns }).to_string(),
    )
    .expect("script");
    let goal = dir.path().join("goal.json");
    std::fs::write(&goal, goal_doc(json!({"empty_turns": 7})).to_string()).expect("goal");

    // A scripted-model file: exit 1, and the result's error names the last problem.
    let out = bin::dagloop_tokio()
        .args(["run", "--no-store", "--json", "--model"])
        .arg(format!(
            "scripted:{}",
            dir.path().join("script.json").display()
        ))
        .arg(&goal)
        .output()
        .await
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let result: Value = serde_json::from_str(&stdout).expect("JSON result");
    assert_eq!(result["status"], "empty_turns");
    assert_eq!(result["error"]["code"], "run.empty_turns");
    assert_eq!(result["error"]["cause"]["code"], "plan.truncated");
    let message = result["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(
            "the run ended: empty_turns; the model's last response (step 7) was not a valid \
             Solution: it could not be read at byte"
        ),
        "{message}"
    );

    // An OpenAI-compatible server: what the model receives, request by request.
    let server = serve(texts.iter().map(|t| answer(t)).collect()).await;
    let out = bin::dagloop_tokio()
        .args(["run", "--no-store", "--json", "--model", "openai:m"])
        .arg(&goal)
        .env("OPENAI_BASE_URL", server.openai_base())
        .env_remove("OPENAI_API_KEY")
        .output()
        .await
        .expect("run");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sent: Vec<Vec<String>> = server.requests()[1..]
        .iter()
        .map(|r| {
            let messages: Vec<(String, String)> = r.body["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| {
                    (
                        m["role"].as_str().unwrap_or_default().to_string(),
                        m["content"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect();
            corrections(&messages)
        })
        .collect();
    let (_, reqs) = run_texts(json!({"empty_turns": 7}), &texts).await;
    let library: Vec<Vec<String>> = reqs[1..]
        .iter()
        .map(|q| corrections(&texts_of(q)))
        .collect();
    assert_eq!(sent, library);
    assert_eq!(sent.len(), 6);
}

/// Answers each request with the next list of events.
struct Events {
    turns: Mutex<std::collections::VecDeque<Vec<dagloop::llm::StreamEvent>>>,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl Model for Events {
    fn stream(&self, req: &Request) -> EventStream {
        use futures::StreamExt;
        self.requests.lock().expect("requests").push(req.clone());
        let turn = self
            .turns
            .lock()
            .expect("turns")
            .pop_front()
            .unwrap_or_default();
        futures::stream::iter(turn.into_iter().map(Ok)).boxed()
    }
    fn name(&self) -> String {
        "events".into()
    }
}

/// In tool-call mode text is commentary: next to a tool call it is no problem; alone it is
/// an answer that called no tool, and the model is told so.
#[tokio::test(start_paused = true)]
async fn in_tool_mode_text_alone_is_corrected_and_commentary_is_not() {
    use dagloop::llm::{FinishReason, StreamEvent};
    let text = |t: &str| StreamEvent::TextDelta(t.into());
    let tool = |name: &str, args: Value| StreamEvent::ToolCallDone {
        index: 0,
        id: "c".into(),
        name: name.into(),
        arguments: args.to_string(),
    };
    let finish = || StreamEvent::Finish {
        reason: FinishReason::Stop,
    };
    let requests = Arc::new(Mutex::new(Vec::new()));
    let model = Events {
        turns: Mutex::new(
            vec![
                vec![
                    text("Let me note that first."),
                    tool("note", json!({"_output": "doubling 2"})),
                    finish(),
                ],
                vec![text("The answer is 4."), finish()],
                vec![
                    tool("final_output", json!({"output": {"answer": 4}})),
                    finish(),
                ],
            ]
            .into(),
        ),
        requests: requests.clone(),
    };
    let goal = Goal::from_json(
        &goal_doc(json!({})).to_string(),
        "t.json".as_ref(),
        ".".into(),
    )
    .expect("goal");
    let r = AgentBuilder::new(dagloop::RunDef::from_goal(goal).expect("defined"))
        .model(Arc::new(model))
        .mode(dagloop::llm::Mode::ToolCalls)
        .build()
        .expect("build")
        .run()
        .await;
    assert!(r.succeeded(), "{r:?}");
    let reqs = requests.lock().expect("requests").clone();
    assert_eq!(reqs.len(), 3);
    assert!(
        corrections(&texts_of(&reqs[1])).is_empty(),
        "commentary next to a tool call is no problem"
    );
    assert_eq!(
        corrections(&texts_of(&reqs[2])),
        vec![
            "Your previous response was not a valid Solution: it called no tool; it is 16 \
             characters of text: `The answer is 4.`. Call the tools you need, and call \
             final_output with the output when you are done."
                .to_string()
        ]
    );
}
