//! The Anthropic messages provider against an in-process SSE server on 127.0.0.1.
#![cfg(feature = "server")]

#[path = "common/bin.rs"]
mod bin;
mod common;

use common::*;
use dagloop::llm::Jitter;
use dagloop::llm::{
    Anthropic, ApiKey, FinishReason, LlmError, Mode, Model, RetryPolicy, Retrying, SOLUTION_TOOL,
    StreamEvent, ToolChoice,
};
use dagloop::protocol::{Message, Role, Tool};
use serde_json::{Value, json};
use std::sync::Arc;

const KEY: &str = "sk-ant-test-abcdef0123456789";

fn provider(server: &TestServer) -> Anthropic {
    Anthropic::new(server.base(), ApiKey::new(KEY), "claude-test").unwrap()
}

fn message_start(input: u64) -> String {
    named(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
               "role": "assistant", "content": [], "model": "claude-test", "stop_reason": null,
               "usage": {"input_tokens": input, "output_tokens": 1}}}),
    )
}

fn block_start(index: u64, block: Value) -> String {
    named(
        "content_block_start",
        json!({"type": "content_block_start", "index": index, "content_block": block}),
    )
}

fn block_delta(index: u64, delta: Value) -> String {
    named(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": index, "delta": delta}),
    )
}

fn json_delta(index: u64, partial: &str) -> String {
    block_delta(
        index,
        json!({"type": "input_json_delta", "partial_json": partial}),
    )
}

fn block_stop(index: u64) -> String {
    named(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": index}),
    )
}

fn message_end(stop: &str, output: u64) -> Vec<String> {
    vec![
        named(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
                   "usage": {"output_tokens": output}}),
        ),
        named("message_stop", json!({"type": "message_stop"})),
    ]
}

fn ping() -> String {
    named("ping", json!({"type": "ping"}))
}

fn tool_request() -> dagloop::llm::Request {
    let mut req = request(Mode::ToolCalls);
    req.tools = vec![
        Tool::from_value(json!({"_tool": "weather", "_activity": "http",
        "description": "Weather.", "type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}))
        .unwrap(),
    ];
    req
}

#[tokio::test]
async fn tool_use_blocks_become_tool_calls_with_text_and_usage() {
    let mut frames = vec![
        message_start(25),
        block_start(0, json!({"type": "text", "text": ""})),
        ping(),
        block_delta(0, json!({"type": "text_delta", "text": "Checking both."})),
        block_stop(0),
        block_start(
            1,
            json!({"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}),
        ),
        json_delta(1, ""),
        json_delta(1, "{\"city\": \"Pa"),
        json_delta(1, "ris\"}"),
        block_stop(1),
        block_start(
            2,
            json!({"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {}}),
        ),
        json_delta(2, "{\"city\": \"Oslo\"}"),
        block_stop(2),
    ];
    frames.extend(message_end("tool_use", 40));
    let server = serve(vec![Canned::sse(&frames)]).await;
    let (events, err) = collect(provider(&server).stream(&tool_request())).await;
    assert_eq!(err, None);
    assert_eq!(text_of(&events), "Checking both.");
    assert_eq!(
        dones(&events),
        vec![
            (
                0,
                "toolu_1".into(),
                "weather".into(),
                "{\"city\": \"Paris\"}".into()
            ),
            (
                1,
                "toolu_2".into(),
                "weather".into(),
                "{\"city\": \"Oslo\"}".into()
            ),
        ]
    );
    // The first call is done before the second one starts.
    let done0 = events
        .iter()
        .position(|e| matches!(e, StreamEvent::ToolCallDone { index: 0, .. }))
        .unwrap();
    let start1 = events
        .iter()
        .position(|e| matches!(e, StreamEvent::ToolCallDelta { index: 1, .. }))
        .unwrap();
    assert!(done0 < start1);
    let tail = &events[events.len() - 2..];
    assert_eq!(
        tail,
        &[
            StreamEvent::Usage {
                input_tokens: 25,
                output_tokens: 40
            },
            StreamEvent::Finish {
                reason: FinishReason::ToolCalls
            }
        ]
    );

    let rec = &server.requests()[0];
    assert_eq!(rec.path, "/v1/messages");
    assert_eq!(rec.headers["x-api-key"], KEY);
    assert_eq!(rec.headers["anthropic-version"], "2023-06-01");
    assert!(rec.headers.get("authorization").is_none());
    assert_eq!(rec.body["model"], "test-model");
    assert_eq!(rec.body["max_tokens"], 4096);
    assert_eq!(rec.body["stream"], true);
    assert_eq!(
        rec.body["system"],
        json!([{"type": "text", "text": "You plan tool calls.",
                "cache_control": {"type": "ephemeral"}}])
    );
    assert_eq!(
        rec.body["messages"],
        json!([{"role": "user", "content": "Look up the weather."}])
    );
    assert_eq!(rec.body["tools"][0]["name"], "weather");
    assert_eq!(rec.body["tools"][0]["description"], "Weather.");
    assert_eq!(
        rec.body["tools"][0]["input_schema"]["required"],
        json!(["city"])
    );
    assert_eq!(rec.body["tools"][1]["name"], "final_output");
    assert_eq!(rec.body["tool_choice"], json!({"type": "auto"}));
}

#[tokio::test]
async fn structured_mode_forces_the_solution_tool_and_streams_its_input_as_text() {
    let solution = r#"{"calls":[],"output":{"answer":"42"}}"#;
    let mut frames = vec![
        message_start(5),
        block_start(
            0,
            json!({"type": "tool_use", "id": "toolu_s", "name": SOLUTION_TOOL, "input": {}}),
        ),
        json_delta(0, &solution[..10]),
        json_delta(0, &solution[10..]),
        block_stop(0),
    ];
    frames.extend(message_end("tool_use", 12));
    let server = serve(vec![Canned::sse(&frames)]).await;
    let (events, err) = collect(provider(&server).stream(&request(Mode::StructuredOutput))).await;
    assert_eq!(err, None);
    assert_eq!(text_of(&events), solution);
    assert!(dones(&events).is_empty(), "the solution tool is not a call");
    let body = &server.requests()[0].body;
    assert_eq!(body["tools"][0]["name"], SOLUTION_TOOL);
    assert_eq!(body["tools"][0]["input_schema"], solution_schema());
    assert_eq!(
        body["tool_choice"],
        json!({"type": "tool", "name": SOLUTION_TOOL})
    );
}

#[tokio::test]
async fn consecutive_messages_of_one_role_are_merged_and_tool_choice_maps() {
    let mut frames = vec![message_start(1)];
    frames.extend(message_end("end_turn", 1));
    let server = serve(vec![Canned::sse(&frames)]).await;
    let mut req = tool_request();
    req.messages.push(Message::Data {
        kind: "user".into(),
        data: json!({"id": 7}),
        schema: None,
        instance: None,
        extra: Default::default(),
    });
    req.messages.push(Message::Text {
        role: Role::Assistant,
        text: "ok".into(),
        extra: Default::default(),
    });
    req.settings.tool_choice = ToolChoice::Required;
    req.settings.max_tokens = Some(100);
    let (events, err) = collect(provider(&server).stream(&req)).await;
    assert_eq!(err, None);
    assert_eq!(
        events.last(),
        Some(&StreamEvent::Finish {
            reason: FinishReason::Stop
        })
    );
    let body = &server.requests()[0].body;
    let msgs = body["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 2);
    assert_eq!(msgs[0]["role"], "user");
    assert!(
        msgs[0]["content"]
            .as_str()
            .unwrap()
            .contains("\"kind\":\"user\"")
    );
    assert_eq!(msgs[1]["role"], "assistant");
    assert_eq!(body["tool_choice"], json!({"type": "any"}));
    assert_eq!(body["max_tokens"], 100);
}

#[tokio::test(start_paused = true)]
async fn an_overloaded_error_event_is_retried_before_content() {
    let mut ok = vec![message_start(3)];
    ok.extend(message_end("end_turn", 2));
    let server = serve(vec![
        Canned::sse(&[
            message_start(3),
            named(
                "error",
                json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            ),
        ]),
        Canned::sse(&ok),
    ])
    .await;
    let policy = RetryPolicy {
        jitter: Jitter::None,
        ..RetryPolicy::default()
    };
    let model = Retrying::new(Arc::new(provider(&server)), policy);
    let (events, err) = collect(model.stream(&tool_request())).await;
    assert_eq!(err, None);
    assert_eq!(model.attempts(), 2);
    assert_eq!(
        events.last(),
        Some(&StreamEvent::Finish {
            reason: FinishReason::Stop
        })
    );
}

#[tokio::test]
async fn a_stream_without_message_stop_is_incomplete() {
    let server = serve(vec![Canned::sse(&[
        message_start(3),
        block_start(0, json!({"type": "text", "text": ""})),
        block_delta(0, json!({"type": "text_delta", "text": "hi"})),
    ])])
    .await;
    let (events, err) = collect(provider(&server).stream(&tool_request())).await;
    assert_eq!(text_of(&events), "hi");
    assert!(
        matches!(err, Some(LlmError::IncompleteStream { .. })),
        "{err:?}"
    );
}

#[test]
fn debug_hides_the_key_and_a_missing_key_is_typed() {
    let p = Anthropic::new("http://127.0.0.1:9", ApiKey::new(KEY), "claude-test").unwrap();
    let dbg = format!("{p:?}");
    assert!(!dbg.contains(KEY), "{dbg}");
    assert_eq!(p.name(), "anthropic:claude-test");
    let e = Anthropic::new("::", ApiKey::new(KEY), "m").unwrap_err();
    assert_eq!(e.code(), "llm.invalid_config");
    assert!(!format!("{e:?}").contains(KEY));
}

/// Prompt caching: the static prefix (tools, the Solution schema, the system prompt) carries
/// `cache_control` breakpoints, and the cache reads and writes the API reports come back as a
/// `CacheUsage` event next to `Usage`.
#[tokio::test]
async fn the_static_prefix_is_cached_and_cache_usage_is_reported() {
    let start = named(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
               "role": "assistant", "content": [], "model": "claude-test", "stop_reason": null,
               "usage": {"input_tokens": 7, "output_tokens": 1,
                         "cache_creation_input_tokens": 1200, "cache_read_input_tokens": 0}}}),
    );
    let solution = r#"{"calls":[],"output":null}"#;
    let mut first = vec![
        start,
        block_start(
            0,
            json!({"type": "tool_use", "id": "toolu_s", "name": SOLUTION_TOOL, "input": {}}),
        ),
        json_delta(0, solution),
        block_stop(0),
    ];
    first.extend(message_end("tool_use", 9));
    // The second request reads the prefix back; this time the counts come in `message_delta`.
    let mut second = vec![
        message_start(7),
        block_start(
            0,
            json!({"type": "tool_use", "id": "toolu_t", "name": "weather", "input": {}}),
        ),
        json_delta(0, "{\"city\": \"Oslo\"}"),
        block_stop(0),
    ];
    second.push(named(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"},
               "usage": {"output_tokens": 5, "cache_read_input_tokens": 1200,
                         "cache_creation_input_tokens": 0}}),
    ));
    second.push(named("message_stop", json!({"type": "message_stop"})));
    let server = serve(vec![Canned::sse(&first), Canned::sse(&second)]).await;
    let p = provider(&server);

    let (events, err) = collect(p.stream(&request(Mode::StructuredOutput))).await;
    assert_eq!(err, None);
    let n = events.len();
    assert_eq!(
        &events[n - 3..],
        &[
            StreamEvent::CacheUsage {
                read_tokens: 0,
                write_tokens: 1200
            },
            StreamEvent::Usage {
                input_tokens: 7,
                output_tokens: 9
            },
            StreamEvent::Finish {
                reason: FinishReason::ToolCalls
            }
        ]
    );
    let (events, err) = collect(p.stream(&tool_request())).await;
    assert_eq!(err, None);
    assert!(events.contains(&StreamEvent::CacheUsage {
        read_tokens: 1200,
        write_tokens: 0
    }));

    let reqs = server.requests();
    let ephemeral = json!({"type": "ephemeral"});
    // Structured mode: the forced solution tool (the schema text) and the system prompt.
    let body = &reqs[0].body;
    assert_eq!(body["tools"][0]["name"], SOLUTION_TOOL);
    assert_eq!(body["tools"][0]["cache_control"], ephemeral);
    assert_eq!(body["system"][0]["cache_control"], ephemeral);
    // Tool mode: a breakpoint on the last tool (so all tool definitions are cached) and the
    // system prompt; none on the messages, which change every step.
    let body = &reqs[1].body;
    let tools = body["tools"].as_array().unwrap();
    assert_eq!(tools.last().unwrap()["cache_control"], ephemeral);
    assert!(
        tools[..tools.len() - 1]
            .iter()
            .all(|t| t.get("cache_control").is_none())
    );
    assert_eq!(body["system"][0]["cache_control"], ephemeral);
    assert!(!body["messages"].to_string().contains("cache_control"));
    let breakpoints = body.to_string().matches("cache_control").count();
    assert!(breakpoints <= 4, "the API allows at most 4 breakpoints");

    // Without cache fields in the answer there is no CacheUsage event.
    let mut plain = vec![message_start(3)];
    plain.extend(message_end("end_turn", 2));
    let server = serve(vec![Canned::sse(&plain)]).await;
    let (events, _) = collect(provider(&server).stream(&request(Mode::StructuredOutput))).await;
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, StreamEvent::CacheUsage { .. }))
    );
}

/// One structured-mode answer: `solution` as the forced tool's input, with these token counts
/// (prompt-cache reads and writes in `message_start`).
fn cached_answer(solution: Value, input: u64, output: u64, read: u64, write: u64) -> Vec<String> {
    let mut v = vec![
        named(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
                   "role": "assistant", "content": [], "model": "claude-test", "stop_reason": null,
                   "usage": {"input_tokens": input, "output_tokens": 1,
                             "cache_read_input_tokens": read, "cache_creation_input_tokens": write}}}),
        ),
        block_start(
            0,
            json!({"type": "tool_use", "id": "toolu_s", "name": SOLUTION_TOOL, "input": {}}),
        ),
        json_delta(0, &solution.to_string()),
        block_stop(0),
    ];
    v.extend(message_end("tool_use", output));
    v
}

/// A goal with one latent tool, answered in two steps: the first writes the prompt cache,
/// the second reads it.
fn cached_goal_and_answers() -> (Value, Vec<Canned>) {
    let goal = json!({"goal": "Note it, then answer.", "output_schema": {"type": "object",
        "required": ["ok"], "properties": {"ok": {"type": "boolean"}}},
        "tools": [{"_tool": "note", "type": "object", "_output": {"type": "string"}}]});
    let first = cached_answer(
        json!({"calls": [{"_tool": "note", "_output": "n", "_outputPath": "†state.n"}], "output": null}),
        7,
        9,
        0,
        1200,
    );
    let second = cached_answer(
        json!({"calls": [], "output": {"ok": true}}),
        11,
        4,
        1200,
        30,
    );
    (goal, vec![Canned::sse(&first), Canned::sse(&second)])
}

/// The prompt-cache reads and writes Anthropic reports are summed into the run's usage, next
/// to input and output tokens, and count against the token budget.
#[tokio::test]
async fn cache_reads_and_writes_are_summed_into_the_runs_usage() {
    let (doc, answers) = cached_goal_and_answers();
    let r = run_against(&doc, answers.clone()).await;
    assert!(r.succeeded(), "{r:?}");
    let expected = dagloop::machine::Usage {
        input_tokens: 18,
        output_tokens: 13,
        cache_read_tokens: 1200,
        cache_write_tokens: 1230,
        estimated: false,
        models: Default::default(),
    };
    assert_eq!(r.usage, expected);
    assert_eq!(r.usage.total(), 18 + 13 + 1200 + 1230);
    assert_eq!(
        serde_json::to_value(&r.usage).unwrap(),
        json!({"input_tokens": 18, "output_tokens": 13,
               "cache_read_tokens": 1200, "cache_write_tokens": 1230})
    );

    // The budget sees the cached prompt too: the first step's 1,216 tokens (16 without the
    // cache write) are over a budget of 1,000.
    let mut tight = doc.clone();
    tight["limits"] = json!({"token_budget": 1000});
    let r = run_against(&tight, answers).await;
    assert_eq!(r.status, dagloop::RunStatus::TokenBudget, "{r:?}");
}

/// Runs the goal `doc` through the provider against a server giving these answers.
async fn run_against(doc: &Value, answers: Vec<Canned>) -> dagloop::RunResult {
    let server = serve(answers).await;
    let goal = dagloop::Goal::from_json(&doc.to_string(), "t.json".as_ref(), ".".into()).unwrap();
    dagloop::AgentBuilder::new(dagloop::RunDef::from_goal(goal).expect("defined"))
        .model(Arc::new(provider(&server)))
        .build()
        .unwrap()
        .run()
        .await
}

/// The same figures in the command line's JSON result (`dagloop run --model anthropic:...`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_result_shows_cache_usage() {
    let (doc, answers) = cached_goal_and_answers();
    let server = serve(answers).await;
    let dir = tempfile::tempdir().unwrap();
    let goal = dir.path().join("goal.json");
    std::fs::write(&goal, doc.to_string()).unwrap();
    let out = bin::dagloop_tokio()
        .args([
            "run",
            "--no-store",
            "--json",
            "--model",
            "anthropic:claude-test",
        ])
        .arg(&goal)
        .env("ANTHROPIC_API_KEY", KEY)
        .env("ANTHROPIC_BASE_URL", server.base())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        result["usage"],
        json!({"input_tokens": 18, "output_tokens": 13,
               "cache_read_tokens": 1200, "cache_write_tokens": 1230})
    );
}

/// Native tool calls in a tool-call-mode request's history (a goal's `context`, a carried
/// session) go to the loopback Anthropic endpoint as `tool_use` blocks, each followed by its
/// `tool_result` in the next user message: a call without a result gets one saying so
/// (`history.no_result`), a result that answers no call is dropped, and the user text after
/// them joins that user message. In structured mode the same history goes as text.
#[tokio::test]
async fn native_tool_calls_in_history_go_as_tool_use_each_with_its_tool_result() {
    use dagloop::llm::history::NO_RESULT;
    let text = |role: Role, text: &str, extra: Value| Message::Text {
        role,
        text: text.into(),
        extra: extra.as_object().cloned().unwrap_or_default(),
    };
    let call = |id: &str| json!({"id": id, "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}});
    let history = vec![
        text(
            Role::Assistant,
            "Checking.",
            json!({"tool_calls": [call("toolu_1"), call("toolu_2")]}),
        ),
        text(
            Role::User,
            "{\"temp\": 21}",
            json!({"tool_call_id": "toolu_1"}),
        ),
        text(Role::User, "stray", json!({"tool_call_id": "toolu_9"})),
        text(Role::User, "Now Rome.", json!({})),
    ];
    let answer = || {
        let mut frames = vec![message_start(1)];
        frames.extend(message_end("end_turn", 1));
        Canned::sse(&frames)
    };
    let server = serve(vec![answer(), answer()]).await;
    let mut req = tool_request();
    req.messages.extend(history.clone());
    let (_, err) = collect(provider(&server).stream(&req)).await;
    assert_eq!(err, None);
    let mut structured = request(Mode::StructuredOutput);
    structured.messages.extend(history);
    let (_, err) = collect(provider(&server).stream(&structured)).await;
    assert_eq!(err, None);
    let sent = server.requests();
    let msgs = sent[0].body["messages"]
        .as_array()
        .expect("messages")
        .clone();
    // The request's own user message first, then the history.
    let n = msgs.len();
    assert!(n >= 3, "{msgs:#?}");
    assert_eq!(
        msgs[n - 2],
        json!({"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {"city": "Paris"}},
        ]})
    );
    assert_eq!(
        msgs[n - 1],
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "{\"temp\": 21}"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": NO_RESULT},
            {"type": "text", "text": "Now Rome."},
        ]})
    );
    assert!(
        !sent[0].body.to_string().contains("toolu_9"),
        "the stray result is dropped"
    );
    // Roles alternate.
    for pair in msgs.windows(2) {
        assert_ne!(pair[0]["role"], pair[1]["role"], "{msgs:#?}");
    }
    // Structured mode: text only, no blocks.
    let plain = sent[1].body["messages"].as_array().expect("messages");
    assert!(plain.iter().all(|m| m["content"].is_string()), "{plain:#?}");
}
