//! The OpenAI-compatible provider's strict structured outputs and its non-streaming tool-call
//! mode, against an in-process server on 127.0.0.1.
#![cfg(feature = "server")]

mod common;

use common::*;
use dagloop::llm::{
    FinishReason, Mode, Model, OpenAi, StreamEvent, Strict, ToolStreaming, strict_schema,
};
use dagloop::protocol::Tool;
use serde_json::{Value, json};

fn small_goal_schema() -> (Vec<Tool>, Value) {
    let tools = vec![
        Tool::from_value(json!({
            "_tool": "greet", "description": "Greets.", "type": "object",
            "properties": {"name": {"type": "string"}}, "required": ["name"],
            "_output": {"type": "object", "required": ["greeting"],
                        "properties": {"greeting": {"type": "string"}}}
        }))
        .unwrap(),
    ];
    let output = json!({"type": "object", "required": ["name", "greeting"],
        "properties": {"name": {"type": "string"}, "greeting": {"type": "string"}}});
    let composed = dagloop::schema::compose(&tools, &output).unwrap();
    (tools, composed)
}

#[test]
fn strict_is_sent_when_the_schema_fits_and_the_server_is_openai() {
    let (tools, composed) = small_goal_schema();
    let mut req = request(Mode::StructuredOutput);
    req.schema = composed.clone();
    // Auto: strict for OpenAI's own API only.
    let openai = OpenAi::new("https://api.openai.com/v1", None, "gpt-4o-mini").unwrap();
    let body = openai.request_body(&req);
    let js = &body["response_format"]["json_schema"];
    assert_eq!(js["strict"], true);
    assert_eq!(js["schema"], strict_schema(&composed).unwrap());
    assert_eq!(
        js["schema"]["required"],
        json!(["thoughts", "calls", "output"])
    );
    let local = OpenAi::new("http://127.0.0.1:9/v1", None, "m").unwrap();
    let body = local.request_body(&req);
    assert_eq!(body["response_format"]["json_schema"]["strict"], false);
    assert_eq!(body["response_format"]["json_schema"]["schema"], composed);
    // On: strict whatever the server; Off: never.
    let on = local.clone().with_strict(Strict::On);
    assert_eq!(
        on.request_body(&req)["response_format"]["json_schema"]["strict"],
        true
    );
    let off = openai.clone().with_strict(Strict::Off);
    assert_eq!(
        off.request_body(&req)["response_format"]["json_schema"]["strict"],
        false
    );

    // A schema outside the subset (a free-form array param) is sent as composed, strict false.
    let free = vec![
        Tool::from_value(
            json!({"_tool": "rank", "_activity": "http", "type": "object",
            "properties": {"sources": {"type": "array"}}}),
        )
        .unwrap(),
    ];
    req.schema = dagloop::schema::compose(&free, &json!({"type": "string"})).unwrap();
    let body = openai.request_body(&req);
    assert_eq!(body["response_format"]["json_schema"]["strict"], false);
    assert_eq!(body["response_format"]["json_schema"]["schema"], req.schema);

    // Tool mode: each function is strict on its own.
    let mut req = request(Mode::ToolCalls);
    req.schema = composed;
    req.tools = tools;
    let body = openai.request_body(&req);
    for f in body["tools"].as_array().unwrap() {
        assert_eq!(f["function"]["strict"], true, "{f}");
        let params = &f["function"]["parameters"];
        assert_eq!(params["additionalProperties"], false, "{f}");
    }
}

#[tokio::test]
async fn whole_tool_call_answers_become_the_same_events() {
    let answer = json!({
        "id": "c1", "object": "chat.completion",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": null,
            "tool_calls": [
                {"id": "call_a", "type": "function",
                 "function": {"name": "greet", "arguments": "{\"name\": \"Ada\"}"}},
                {"id": "call_b", "type": "function",
                 "function": {"name": "final_output", "arguments": "{\"output\": {}}"}}
            ]}}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52}
    });
    let server = serve(vec![Canned::status(200, &answer.to_string())]).await;
    let (tools, composed) = small_goal_schema();
    let mut req = request(Mode::ToolCalls);
    req.schema = composed;
    req.tools = tools;
    let p = OpenAi::new(server.openai_base(), None, "m")
        .unwrap()
        .with_tool_streaming(ToolStreaming::Whole);
    let (events, err) = collect(p.stream(&req)).await;
    assert_eq!(err, None);
    assert_eq!(
        dones(&events),
        vec![
            (
                0,
                "call_a".into(),
                "greet".into(),
                "{\"name\": \"Ada\"}".into()
            ),
            (
                1,
                "call_b".into(),
                "final_output".into(),
                "{\"output\": {}}".into()
            ),
        ]
    );
    let n = events.len();
    assert_eq!(
        &events[n - 2..],
        &[
            StreamEvent::Usage {
                input_tokens: 40,
                output_tokens: 12
            },
            StreamEvent::Finish {
                reason: FinishReason::ToolCalls
            }
        ]
    );
    let body = &server.requests()[0].body;
    assert_eq!(body["stream"], false);
    assert!(body.get("stream_options").is_none());
    assert_eq!(body["tools"][0]["function"]["name"], "greet");

    // A failing status is the same typed error as when streaming.
    let server = serve(vec![Canned::status(
        400,
        r#"{"error": {"message": "bad"}}"#,
    )])
    .await;
    let p = OpenAi::new(server.openai_base(), None, "m")
        .unwrap()
        .with_tool_streaming(ToolStreaming::Whole);
    let (_, err) = collect(p.stream(&req)).await;
    assert_eq!(err.map(|e| e.code()), Some("llm.http_status"));
}

/// An agent greeting Ada with `model`: a `greet` tool with an optional `title` and an output
/// with an optional `nickname`; the params each `greet` call ran with are kept.
fn greet_agent(
    model: std::sync::Arc<dyn Model>,
) -> (
    dagloop::AgentBuilder,
    std::sync::Arc<std::sync::Mutex<Vec<Value>>>,
) {
    let goal = json!({"goal": "Greet Ada.",
        "output_schema": {"type": "object", "required": ["name"], "additionalProperties": false,
            "properties": {"name": {"type": "string"}, "nickname": {"type": "string"}}},
        "tools": [{"_tool": "greet", "_activity": "rust", "type": "object",
            "properties": {"name": {"type": "string"}, "title": {"type": "string"}},
            "required": ["name"]}]});
    let g = dagloop::Goal::from_json(&goal.to_string(), "t.json".as_ref(), ".".into()).unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    let mut b = dagloop::AgentBuilder::new(dagloop::RunDef::from_goal(g).expect("defined"))
        .model(model)
        .retry(dagloop::llm::RetryPolicy {
            jitter: dagloop::llm::Jitter::None,
            ..Default::default()
        });
    let s = seen.clone();
    b.registry_mut().register_fn("greet", move |p: Value| {
        s.lock().unwrap().push(p);
        async move { Ok::<_, String>(json!("Hello, Ada")) }
    });
    (b, seen)
}

/// Strict mode makes optional properties required and nullable, so the model writes `null`
/// for what it leaves out. A strict run drops those nulls (driven by the goal's own schemas)
/// before the tool's params are validated and used and before the output is validated; a run
/// that was not sent strict leaves them, and they are the model's mistakes.
#[tokio::test]
async fn a_strict_run_drops_the_nulls_strict_mode_made_the_model_write() {
    use std::sync::Arc;
    let first = json!({"thoughts": null, "calls": [{"_tool": "greet", "name": "Ada",
        "title": null, "_outputPath": "†state.g", "_outputMethod": null}], "output": null});
    let second =
        json!({"thoughts": null, "calls": [], "output": {"name": "Ada", "nickname": null}});
    for strict in [Strict::On, Strict::Off] {
        let server = serve(vec![
            Canned::sse(&oa_stream(&first.to_string())),
            Canned::sse(&oa_stream(&second.to_string())),
        ])
        .await;
        let model = OpenAi::new(server.openai_base(), None, "m")
            .unwrap()
            .with_strict(strict);
        let (b, seen) = greet_agent(Arc::new(model));
        let r = b.build().unwrap().run().await;
        let body = &server.requests()[0].body;
        let sent_strict = body["response_format"]["json_schema"]["strict"].clone();
        if strict == Strict::On {
            assert_eq!(sent_strict, true);
            assert!(r.succeeded(), "{r:?}");
            assert_eq!(
                r.output,
                json!({"name": "Ada"}),
                "the null nickname was dropped"
            );
            assert_eq!(r.state["g"], json!("Hello, Ada"));
            let seen = seen.lock().unwrap();
            assert_eq!(seen.len(), 1);
            assert_eq!(seen[0]["name"], "Ada");
            assert!(
                seen[0].get("title").is_none(),
                "the null title was dropped: {seen:?}"
            );
        } else {
            assert_eq!(sent_strict, false);
            assert_eq!(r.status, dagloop::RunStatus::InvalidOutput, "{r:?}");
            assert!(
                seen.lock().unwrap().is_empty(),
                "the null title failed validation"
            );
            assert!(
                r.calls[0]
                    .error
                    .as_ref()
                    .is_some_and(|e| e.to_string().contains("title")),
                "{:?}",
                r.calls[0]
            );
        }
    }
}

/// The same in tool-call mode: each function is strict on its own, and so is `final_output`.
#[tokio::test]
async fn a_strict_tool_call_run_drops_the_same_nulls() {
    use std::sync::Arc;
    let answer = |name: &str, args: Value| {
        json!({"id": "c1", "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": null,
                "tool_calls": [{"id": "call_a", "type": "function",
                    "function": {"name": name, "arguments": args.to_string()}}]}}],
            "usage": {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52}})
        .to_string()
    };
    let server = serve(vec![
        Canned::status(
            200,
            &answer(
                "greet",
                json!({"name": "Ada", "title": null, "_outputPath": "†state.g", "_outputMethod": null}),
            ),
        ),
        Canned::status(
            200,
            &answer("final_output", json!({"output": {"name": "Ada", "nickname": null}})),
        ),
    ])
    .await;
    let model = OpenAi::new(server.openai_base(), None, "m")
        .unwrap()
        .with_strict(Strict::On)
        .with_tool_streaming(ToolStreaming::Whole);
    let (b, seen) = greet_agent(Arc::new(model));
    let r = b.mode(Mode::ToolCalls).build().unwrap().run().await;
    let body = &server.requests()[0].body;
    assert!(
        body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["function"]["strict"] == true),
        "{body}"
    );
    assert!(r.succeeded(), "{r:?}");
    assert_eq!(r.output, json!({"name": "Ada"}));
    let seen = seen.lock().unwrap();
    assert!(
        seen.len() == 1 && seen[0].get("title").is_none(),
        "{seen:?}"
    );
}
