//! The scripted model in-process, and served by `serve_mock` to the real OpenAI provider.
#![cfg(feature = "server")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use dagloop::llm::{
    FINAL_OUTPUT_TOOL, FinishReason, Jitter, LlmError, Mode, Model, ModelSpec, OpenAi, RetryPolicy,
    Retrying, Script, ScriptedModel, StreamEvent, ToolCallOutcome, TurnBody, call_from_tool_call,
    serve_mock,
};
use dagloop::protocol::Solution;
use serde_json::{Value, json};
use tokio::time::Instant;

fn solution() -> Value {
    json!({"calls": [
        {"_tool": "weather", "city": "Zürich", "_outputPath": "†state.w"},
        {"_tool": "summarise", "text": "†state.w"}
    ], "output": null})
}

fn script(turns: Value) -> Script {
    Script::parse(&json!({ "turns": turns }).to_string(), "<test>").unwrap()
}

fn policy() -> RetryPolicy {
    RetryPolicy {
        jitter: Jitter::None,
        ..RetryPolicy::default()
    }
}

fn text_chunks(events: &[StreamEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            StreamEvent::TextDelta(t) => Some(t.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_solution_turn_streams_in_character_chunks_with_delays() {
    let model = ScriptedModel::new(script(
        json!([{"solution": solution(), "chunk_chars": 7, "chunk_delay_ms": 100}]),
    ));
    let start = Instant::now();
    let (events, err) = collect(model.stream(&request(Mode::StructuredOutput))).await;
    assert_eq!(err, None);
    let text = solution().to_string();
    let chars = text.chars().count();
    let chunks = text_chunks(&events);
    assert_eq!(chunks.len(), chars.div_ceil(7));
    assert!(chunks.iter().all(|c| c.chars().count() <= 7));
    assert_eq!(chunks.concat(), text);
    let parsed = Solution::from_value(serde_json::from_str(&chunks.concat()).unwrap()).unwrap();
    assert_eq!(parsed.calls.len(), 2);
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(100) * (chunks.len() as u32 - 1)
    );
    let input_chars = "You plan tool calls.".len() + "Look up the weather.".len();
    assert_eq!(
        &events[events.len() - 2..],
        &[
            StreamEvent::Usage {
                input_tokens: input_chars.div_ceil(4) as u64,
                output_tokens: chars.div_ceil(4) as u64,
            },
            StreamEvent::Finish {
                reason: FinishReason::Stop
            }
        ]
    );
    assert_eq!(model.turns_used(), 1);
}

#[tokio::test]
async fn a_text_turn_streams_raw_text() {
    let model = ScriptedModel::new(script(json!([{"text": "not json {", "chunk_chars": 4}])));
    let (events, err) = collect(model.stream(&request(Mode::StructuredOutput))).await;
    assert_eq!(err, None);
    assert_eq!(text_chunks(&events), vec!["not ", "json", " {"]);
}

#[tokio::test(start_paused = true)]
async fn an_error_turn_is_retried_and_the_retry_consumes_the_next_turn() {
    let scripted = Arc::new(ScriptedModel::new(script(json!([
        {"error": {"status": 429, "retry_after_s": 3, "message": "rate limited"}},
        {"solution": solution()}
    ]))));
    let model = Retrying::new(scripted.clone(), policy());
    let start = Instant::now();
    let (events, err) = collect(model.stream(&request(Mode::StructuredOutput))).await;
    assert_eq!(err, None);
    assert_eq!(text_chunks(&events).concat(), solution().to_string());
    assert_eq!(start.elapsed(), Duration::from_secs(3));
    assert_eq!(model.attempts(), 2);
    assert_eq!(scripted.turns_used(), 2);
}

#[tokio::test]
async fn running_out_of_turns_is_a_typed_error_and_not_retried() {
    let scripted = Arc::new(ScriptedModel::new(script(json!([{"text": "{}"}]))));
    let model = Retrying::new(scripted, policy());
    let (_, err) = collect(model.stream(&request(Mode::StructuredOutput))).await;
    assert_eq!(err, None);
    let (_, err) = collect(model.stream(&request(Mode::StructuredOutput))).await;
    assert_eq!(err, Some(LlmError::ScriptExhausted { turns: 1 }));
    assert_eq!(err.map(|e| e.code()), Some("llm.script_exhausted"));
    assert_eq!(model.attempts(), 2);
}

#[tokio::test]
async fn tool_mode_turns_become_tool_calls_and_final_output() {
    let model = ScriptedModel::new(script(json!([
        {"solution": {"calls": [{"_tool": "weather", "city": "Oslo"}], "output": {"answer": "4"}},
         "chunk_chars": 5}
    ])));
    let (events, err) = collect(model.stream(&request(Mode::ToolCalls))).await;
    assert_eq!(err, None);
    let d = dones(&events);
    assert_eq!(d.len(), 2);
    assert_eq!(
        (d[0].2.as_str(), d[0].3.as_str()),
        ("weather", r#"{"city":"Oslo"}"#)
    );
    assert_eq!(
        call_from_tool_call(&d[1].2, &d[1].3).unwrap(),
        ToolCallOutcome::Output(json!({"answer": "4"}))
    );
    assert_eq!(
        events.last(),
        Some(&StreamEvent::Finish {
            reason: FinishReason::ToolCalls
        })
    );
}

#[test]
fn scripts_load_from_files_with_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.json");
    let e = ScriptedModel::load(&missing).unwrap_err();
    assert_eq!(e.code(), "llm.script_io");
    assert!(e.to_string().contains("missing.json"));

    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"turns": [{"solution": [1]}]}"#).unwrap();
    let e = ScriptedModel::load(&bad).unwrap_err();
    assert_eq!(e.code(), "llm.script_invalid");

    let good = dir.path().join("good.json");
    std::fs::write(
        &good,
        r#"{"$schema": "x", "description": "demo", "turns": [
            {"solution": {"calls": [], "output": 1}, "chunk_chars": 2, "chunk_delay_ms": 5},
            {"text": "raw"},
            {"error": {"status": 503, "retry_after_s": 1}}]}"#,
    )
    .unwrap();
    let s = Script::load(&good).unwrap();
    assert_eq!(s.turns.len(), 3);
    assert_eq!(s.turns[0].chunk_chars, 2);
    assert_eq!(s.turns[0].chunk_delay, Duration::from_millis(5));
    assert_eq!(s.turns[1].chunk_chars, 16);
    assert_eq!(
        s.turns[2].body,
        TurnBody::Error {
            status: 503,
            retry_after_s: Some(1),
            message: "scripted error 503".into()
        }
    );

    let spec = ModelSpec::parse(&format!("scripted:{}", good.display())).unwrap();
    let model = spec.build().unwrap();
    assert!(model.name().starts_with("scripted:"));
}

#[test]
fn model_specs_parse_with_typed_errors() {
    assert_eq!(
        ModelSpec::parse("openai:gpt-4o-mini").unwrap(),
        ModelSpec::OpenAi("gpt-4o-mini".into())
    );
    assert_eq!(
        ModelSpec::parse("anthropic:claude-x").unwrap(),
        ModelSpec::Anthropic("claude-x".into())
    );
    assert_eq!(
        ModelSpec::parse("scripted:a:b.json").unwrap(),
        ModelSpec::Scripted("a:b.json".into())
    );
    assert_eq!(
        ModelSpec::parse("gemini:x").unwrap_err().code(),
        "llm.unknown_spec"
    );
    assert_eq!(
        ModelSpec::parse("openai").unwrap_err().code(),
        "llm.unknown_spec"
    );
    assert_eq!(
        ModelSpec::parse("openai:").unwrap_err().code(),
        "llm.invalid_spec"
    );
}

#[test]
fn error_messages_are_stable() {
    let errors = vec![
        LlmError::HttpStatus {
            status: 429,
            retry_after: Some(Duration::from_secs(2)),
            message: "slow down".into(),
        },
        LlmError::Transport {
            message: "connection refused".into(),
        },
        LlmError::IdleTimeout {
            after: Duration::from_secs(10),
        },
        LlmError::Timeout {
            after: Duration::from_millis(1500),
        },
        LlmError::BadSse {
            reason: "data is not JSON".into(),
        },
        LlmError::IncompleteStream {
            reason: "the body ended before `data: [DONE]` or a finish_reason".into(),
        },
        LlmError::Provider {
            kind: "overloaded_error".into(),
            message: "Overloaded".into(),
            retryable: true,
        },
        LlmError::ScriptExhausted { turns: 3 },
        ModelSpec::parse("x:y").unwrap_err(),
        ModelSpec::parse("openai:").unwrap_err(),
        LlmError::MissingApiKey {
            var: "ANTHROPIC_API_KEY",
        },
    ];
    let text: Vec<String> = errors
        .iter()
        .map(|e| format!("{} (retryable: {}): {e}", e.code(), e.is_retryable()))
        .collect();
    insta::assert_snapshot!(text.join("\n"));
}

#[tokio::test]
async fn serve_mock_streams_turns_to_the_openai_provider() {
    heartbeat();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mock = serve_mock(
        script(json!([
            {"solution": solution(), "chunk_chars": 10},
            {"text": "oops, not json", "chunk_chars": 3}
        ])),
        listener,
    )
    .await
    .unwrap();
    let provider = OpenAi::new(mock.base_url(), None, "mock").unwrap();

    let (events, err) = collect(provider.stream(&request(Mode::StructuredOutput))).await;
    assert_eq!(err, None);
    let text = solution().to_string();
    assert_eq!(
        text_chunks(&events).len(),
        text.chars().count().div_ceil(10)
    );
    assert_eq!(text_chunks(&events).concat(), text);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, StreamEvent::Usage { .. }))
    );
    assert_eq!(
        events.last(),
        Some(&StreamEvent::Finish {
            reason: FinishReason::Stop
        })
    );

    let (events, err) = collect(provider.stream(&request(Mode::StructuredOutput))).await;
    assert_eq!(err, None);
    assert_eq!(text_chunks(&events), vec!["oop", "s, ", "not", " js", "on"]);

    let (_, err) = collect(provider.stream(&request(Mode::StructuredOutput))).await;
    let err = err.unwrap();
    assert!(
        matches!(err, LlmError::HttpStatus { status: 400, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("no turn left"));
    assert!(!err.is_retryable());

    let reqs = mock.requests();
    assert_eq!(reqs.len(), 3);
    assert_eq!(reqs[0]["response_format"]["type"], "json_schema");
    assert_eq!(mock.turns_used(), 3);
}

#[tokio::test]
async fn serve_mock_streams_tool_calls_when_the_request_has_tools() {
    heartbeat();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mock = serve_mock(
        script(
            json!([{"solution": {"calls": solution()["calls"], "output": {"answer": "done"}},
                       "chunk_chars": 6}]),
        ),
        listener,
    )
    .await
    .unwrap();
    let provider = OpenAi::new(mock.base_url(), None, "mock").unwrap();
    let mut req = request(Mode::ToolCalls);
    req.tools = vec![dagloop::protocol::Tool::new("weather")];
    let (events, err) = collect(provider.stream(&req)).await;
    assert_eq!(err, None);
    let d = dones(&events);
    let names: Vec<&str> = d.iter().map(|x| x.2.as_str()).collect();
    assert_eq!(names, vec!["weather", "summarise", FINAL_OUTPUT_TOOL]);
    let ToolCallOutcome::Call(first) = call_from_tool_call(&d[0].2, &d[0].3).unwrap() else {
        panic!("expected a call")
    };
    assert_eq!(first.params["city"], "Zürich");
    assert_eq!(first.output_path.as_deref(), Some("†state.w"));
    assert_eq!(
        call_from_tool_call(&d[2].2, &d[2].3).unwrap(),
        ToolCallOutcome::Output(json!({"answer": "done"}))
    );
    assert_eq!(
        events.last(),
        Some(&StreamEvent::Finish {
            reason: FinishReason::ToolCalls
        })
    );
}

#[tokio::test(start_paused = true)]
async fn serve_mock_error_turns_carry_retry_after_and_are_retried() {
    heartbeat();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mock = serve_mock(
        script(json!([
            {"error": {"status": 429, "retry_after_s": 2, "message": "busy"}},
            {"error": {"status": 500}},
            {"solution": solution(), "chunk_chars": 32, "chunk_delay_ms": 50}
        ])),
        listener,
    )
    .await
    .unwrap();
    let provider = OpenAi::new(mock.base_url(), None, "mock").unwrap();
    let model = Retrying::new(Arc::new(provider), policy());
    let start = Instant::now();
    let (events, err) = collect(model.stream(&request(Mode::StructuredOutput))).await;
    assert_eq!(err, None);
    assert_eq!(text_chunks(&events).concat(), solution().to_string());
    assert_eq!(model.attempts(), 3);
    let chunks = solution().to_string().chars().count().div_ceil(32) as u32;
    // 2 s Retry-After, then 1 s backoff after the second failure, then the chunk delays.
    let expected = Duration::from_secs(3) + Duration::from_millis(50) * (chunks - 1);
    let elapsed = start.elapsed();
    assert!(
        elapsed >= expected && elapsed < expected + Duration::from_secs(1),
        "{elapsed:?} vs {expected:?}"
    );
}

fn usage_of(events: &[StreamEvent]) -> Option<(u64, u64)> {
    events.iter().find_map(|e| match e {
        StreamEvent::Usage {
            input_tokens,
            output_tokens,
        } => Some((*input_tokens, *output_tokens)),
        _ => None,
    })
}

/// A turn's `usage` (allowed by the scripted-model schema) is what the turn reports, in process
/// and through the served mock; a figure left out is still estimated.
#[tokio::test]
async fn a_turns_usage_is_reported_as_written() {
    let turns = json!([
        {"solution": solution(), "usage": {"input_tokens": 1234, "output_tokens": 56}},
        {"solution": solution(), "usage": {"output_tokens": 7}}
    ]);
    let model = ScriptedModel::new(script(turns.clone()));
    let (events, err) = collect(model.stream(&request(Mode::StructuredOutput))).await;
    assert_eq!(err, None);
    assert_eq!(usage_of(&events), Some((1234, 56)));
    let (events, _) = collect(model.stream(&request(Mode::StructuredOutput))).await;
    let (input, output) = usage_of(&events).unwrap();
    assert_eq!(output, 7);
    assert!(input > 0 && input != 1234, "estimated: {input}");

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mock = serve_mock(script(turns), listener).await.unwrap();
    let provider = OpenAi::new(mock.base_url(), None, "mock").unwrap();
    let (events, err) = collect(provider.stream(&request(Mode::StructuredOutput))).await;
    assert_eq!(err, None);
    assert_eq!(usage_of(&events), Some((1234, 56)));
}

#[test]
fn a_turns_usage_refuses_unknown_figures() {
    let err = Script::parse(
        &json!({"turns": [{"solution": solution(), "usage": {"tokens": 3}}]}).to_string(),
        "<test>",
    )
    .unwrap_err();
    assert!(err.to_string().contains("tokens"), "{err}");
}
