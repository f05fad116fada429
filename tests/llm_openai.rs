//! The OpenAI-compatible provider against an in-process SSE server on 127.0.0.1.
#![cfg(feature = "server")]

mod common;

use common::*;
use dagloop::llm::{
    ApiKey, FINAL_OUTPUT_TOOL, FinishReason, LlmError, Mode, Model, OpenAi, ResponseFormat,
    StreamEvent, ToolCallOutcome, ToolChoice, call_from_tool_call,
};
use dagloop::protocol::Tool;
use serde_json::{Value, json};

const KEY: &str = "sk-test-0123456789abcdef";

fn provider(server: &TestServer) -> OpenAi {
    OpenAi::new(
        server.openai_base(),
        Some(ApiKey::new(KEY)),
        "default-model",
    )
    .unwrap()
}

#[tokio::test]
async fn structured_mode_streams_the_solution_as_text_deltas() {
    let solution = r#"{"calls":[{"_tool":"weather","city":"Paris"}],"output":null}"#;
    let (a, b) = solution.split_at(20);
    let server = serve(vec![Canned::sse(&[
        oa_delta(json!({"role": "assistant", "content": ""})),
        oa_text(a),
        oa_text(b),
        oa_finish("stop"),
        oa_usage(42, 17),
        DONE.to_string(),
    ])])
    .await;
    let (events, err) = collect(provider(&server).stream(&request(Mode::StructuredOutput))).await;
    assert_eq!(err, None);
    assert_eq!(
        events,
        vec![
            StreamEvent::TextDelta(a.into()),
            StreamEvent::TextDelta(b.into()),
            StreamEvent::Usage {
                input_tokens: 42,
                output_tokens: 17
            },
            StreamEvent::Finish {
                reason: FinishReason::Stop
            },
        ]
    );
    let parsed: Value = serde_json::from_str(&text_of(&events)).unwrap();
    assert_eq!(parsed["calls"][0]["city"], "Paris");

    let req = &server.requests()[0];
    assert_eq!(req.path, "/v1/chat/completions");
    assert_eq!(
        req.headers["authorization"],
        format!("Bearer {KEY}").as_str()
    );
    assert_eq!(req.body["model"], "test-model");
    assert_eq!(req.body["stream"], true);
    assert_eq!(req.body["stream_options"], json!({"include_usage": true}));
    assert_eq!(
        req.body["response_format"],
        json!({"type": "json_schema",
               "json_schema": {"name": "solution", "schema": solution_schema(), "strict": false}})
    );
    assert_eq!(
        req.body["messages"][0],
        json!({"role": "system", "content": "You plan tool calls."})
    );
    assert!(req.body.get("tools").is_none());
}

#[tokio::test]
async fn settings_model_falls_back_to_the_provider_default_and_no_key_sends_no_auth() {
    let server = serve(vec![Canned::sse(&oa_stream("{}"))]).await;
    let p = OpenAi::new(format!("{}/", server.openai_base()), None, "default-model").unwrap();
    let mut req = request(Mode::StructuredOutput);
    req.settings.model.clear();
    req.settings.temperature = Some(0.0);
    req.settings.max_tokens = Some(64);
    let (_, err) = collect(p.stream(&req)).await;
    assert_eq!(err, None);
    let rec = &server.requests()[0];
    assert_eq!(
        rec.path, "/v1/chat/completions",
        "trailing slash of the base URL is dropped"
    );
    assert_eq!(rec.body["model"], "default-model");
    assert_eq!(rec.body["temperature"], 0.0);
    assert_eq!(rec.body["max_tokens"], 64);
    assert!(rec.headers.get("authorization").is_none());
}

fn tool_request() -> dagloop::llm::Request {
    let mut req = request(Mode::ToolCalls);
    req.tools = vec![
        Tool::from_value(
            json!({"_tool": "weather", "_activity": "http", "description": "Weather.",
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        )
        .unwrap(),
        Tool::from_value(json!({"_tool": "news", "_activity": "http",
            "type": "object", "properties": {"topic": {"type": "string"}}}))
        .unwrap(),
    ];
    req
}

fn tc(index: usize, id: Option<&str>, name: Option<&str>, args: &str) -> String {
    let mut call = json!({"index": index, "function": {"arguments": args}});
    if let Some(id) = id {
        call["id"] = json!(id);
        call["type"] = json!("function");
    }
    if let Some(name) = name {
        call["function"]["name"] = json!(name);
    }
    oa_delta(json!({"tool_calls": [call]}))
}

#[tokio::test]
async fn tool_mode_merges_parallel_interleaved_calls_by_index() {
    let server = serve(vec![Canned::sse(&[
        oa_delta(json!({"role": "assistant", "content": null})),
        tc(0, Some("call_a"), Some("weather"), ""),
        tc(1, Some("call_b"), Some("news"), "{\"topic\""),
        tc(0, None, None, "{\"city\": \"Pa"),
        tc(1, None, None, ": \"rain}\"}"),
        tc(0, None, None, "ris\"}"),
        tc(
            2,
            Some("call_c"),
            Some(FINAL_OUTPUT_TOOL),
            "{\"output\": null}",
        ),
        oa_finish("tool_calls"),
        oa_usage(100, 30),
        DONE.to_string(),
    ])])
    .await;
    let (events, err) = collect(provider(&server).stream(&tool_request())).await;
    assert_eq!(err, None);
    assert_eq!(
        dones(&events),
        vec![
            (
                1,
                "call_b".into(),
                "news".into(),
                "{\"topic\": \"rain}\"}".into()
            ),
            (
                0,
                "call_a".into(),
                "weather".into(),
                "{\"city\": \"Paris\"}".into()
            ),
            (
                2,
                "call_c".into(),
                FINAL_OUTPUT_TOOL.into(),
                "{\"output\": null}".into()
            ),
        ],
        "each call is done the moment its arguments close, whatever the order"
    );
    // Call 1 is done before call 0's last fragment arrives.
    let pos_done_1 = events
        .iter()
        .position(|e| matches!(e, StreamEvent::ToolCallDone { index: 1, .. }))
        .unwrap();
    let pos_last_0 = events
        .iter()
        .rposition(|e| matches!(e, StreamEvent::ToolCallDelta { index: 0, .. }))
        .unwrap();
    assert!(pos_done_1 < pos_last_0);
    assert_eq!(
        events.last(),
        Some(&StreamEvent::Finish {
            reason: FinishReason::ToolCalls
        })
    );
    let ToolCallOutcome::Call(call) = call_from_tool_call("weather", &dones(&events)[1].3).unwrap()
    else {
        panic!("expected a call")
    };
    assert_eq!(call.params["city"], "Paris");

    let body = &server.requests()[0].body;
    let names: Vec<&str> = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["weather", "news", FINAL_OUTPUT_TOOL]);
    assert_eq!(body["tools"][0]["type"], "function");
    assert_eq!(body["tools"][0]["function"]["description"], "Weather.");
    assert_eq!(body["tool_choice"], "auto");
    assert!(body.get("response_format").is_none());
}

#[tokio::test]
async fn a_call_is_done_when_the_next_index_starts() {
    let server = serve(vec![Canned::sse(&[
        tc(0, Some("a"), Some("weather"), "{\"city\":\"Oslo\"}"),
        tc(1, Some("b"), Some("news"), "{}"),
        oa_finish("tool_calls"),
        DONE.to_string(),
    ])])
    .await;
    let (events, err) = collect(provider(&server).stream(&tool_request())).await;
    assert_eq!(err, None);
    let done0 = events
        .iter()
        .position(|e| matches!(e, StreamEvent::ToolCallDone { index: 0, .. }))
        .unwrap();
    let first1 = events
        .iter()
        .position(|e| matches!(e, StreamEvent::ToolCallDelta { index: 1, .. }))
        .unwrap();
    assert!(done0 < first1);
    assert_eq!(dones(&events).len(), 2);
}

#[tokio::test]
async fn llama_cpp_style_chunks_repeat_id_and_name_and_carry_function_call() {
    // llama-cpp-python's chatml-function-calling repeats id and name in every chunk and mirrors
    // the fragment in the legacy `function_call` field; the fragment must count once.
    let chunk = |args: &str| {
        oa_delta(json!({
            "role": "assistant", "content": null,
            "function_call": {"name": "weather", "arguments": args},
            "tool_calls": [{"index": 0, "id": "call_x", "type": "function",
                            "function": {"name": "weather", "arguments": args}}]
        }))
    };
    let server = serve(vec![Canned::sse(&[
        chunk("{\"city\""),
        chunk(": \"Rome\""),
        chunk("}"),
        oa_finish("tool_calls"),
        DONE.to_string(),
    ])])
    .await;
    let (events, err) = collect(provider(&server).stream(&tool_request())).await;
    assert_eq!(err, None);
    assert_eq!(
        dones(&events),
        vec![(
            0,
            "call_x".into(),
            "weather".into(),
            "{\"city\": \"Rome\"}".into()
        )]
    );
    let named = events
        .iter()
        .filter(|e| matches!(e, StreamEvent::ToolCallDelta { name: Some(_), .. }))
        .count();
    assert_eq!(named, 1, "a repeated name is announced once");
}

#[tokio::test]
async fn legacy_function_call_alone_is_call_zero() {
    let fc = |name: Option<&str>, args: &str| {
        let mut f = json!({"arguments": args});
        if let Some(n) = name {
            f["name"] = json!(n);
        }
        oa_delta(json!({"function_call": f}))
    };
    let server = serve(vec![Canned::sse(&[
        fc(Some("news"), ""),
        fc(None, "{\"topic\":"),
        fc(None, "\"x\"}"),
        oa_finish("function_call"),
        DONE.to_string(),
    ])])
    .await;
    let (events, err) = collect(provider(&server).stream(&tool_request())).await;
    assert_eq!(err, None);
    assert_eq!(
        dones(&events),
        vec![(
            0,
            "call_0".into(),
            "news".into(),
            "{\"topic\":\"x\"}".into()
        )]
    );
    assert_eq!(
        events.last(),
        Some(&StreamEvent::Finish {
            reason: FinishReason::ToolCalls
        })
    );
}

#[tokio::test]
async fn tool_mode_content_is_text_and_named_tool_choice_is_sent() {
    let server = serve(vec![Canned::sse(&oa_stream(
        "{\"calls\":[],\"output\":{}}",
    ))])
    .await;
    let mut req = tool_request();
    req.settings.tool_choice = ToolChoice::Named("weather".into());
    let (events, err) = collect(provider(&server).stream(&req)).await;
    assert_eq!(err, None);
    assert_eq!(text_of(&events), "{\"calls\":[],\"output\":{}}");
    assert_eq!(
        server.requests()[0].body["tool_choice"],
        json!({"type": "function", "function": {"name": "weather"}})
    );
}

#[tokio::test]
async fn unclosed_tool_arguments_are_flushed_at_the_end_of_the_stream() {
    let server = serve(vec![Canned::sse(&[
        tc(0, Some("a"), Some("weather"), "{\"city\": "),
        oa_finish("length"),
        DONE.to_string(),
    ])])
    .await;
    let (events, err) = collect(provider(&server).stream(&tool_request())).await;
    assert_eq!(err, None);
    assert_eq!(dones(&events)[0].3, "{\"city\": ");
    assert_eq!(
        events.last(),
        Some(&StreamEvent::Finish {
            reason: FinishReason::Length
        })
    );
    assert_eq!(
        call_from_tool_call("weather", &dones(&events)[0].3)
            .unwrap_err()
            .code(),
        "llm.bad_tool_call"
    );
}

#[tokio::test]
async fn an_error_object_inside_the_stream_is_a_provider_error() {
    let server = serve(vec![Canned::sse(&[
        oa_text("{\"calls\""),
        data(json!({"error": {"message": "model crashed", "type": "invalid_request_error"}})),
    ])])
    .await;
    let (events, err) = collect(provider(&server).stream(&request(Mode::StructuredOutput))).await;
    assert_eq!(text_of(&events), "{\"calls\"");
    let err = err.unwrap();
    assert_eq!(err.code(), "llm.provider_error");
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("model crashed"));
}

#[tokio::test]
async fn a_finish_reason_without_done_marker_ends_the_stream_cleanly() {
    let server = serve(vec![Canned::sse(&[oa_text("{}"), oa_finish("stop")])]).await;
    let (events, err) = collect(provider(&server).stream(&request(Mode::StructuredOutput))).await;
    assert_eq!(err, None);
    assert_eq!(
        events.last(),
        Some(&StreamEvent::Finish {
            reason: FinishReason::Stop
        })
    );
}

#[test]
fn debug_of_the_provider_hides_the_key() {
    let p = OpenAi::new("http://127.0.0.1:9/v1", Some(ApiKey::new(KEY)), "m").unwrap();
    let dbg = format!("{p:?}");
    assert!(!dbg.contains(KEY), "{dbg}");
    assert!(dbg.contains("REDACTED"));
    assert_eq!(p.name(), "openai:m");
}

#[test]
fn invalid_configuration_is_typed_and_never_echoes_the_key() {
    let e = OpenAi::new("not a url", None, "m").unwrap_err();
    assert_eq!(e.code(), "llm.invalid_config");
    let bad_key = "sk-bad\nkey";
    let e = OpenAi::new("http://127.0.0.1:9/v1", Some(ApiKey::new(bad_key)), "m").unwrap_err();
    assert_eq!(e.code(), "llm.invalid_config");
    assert!(!format!("{e:?}{e}").contains(bad_key));
}

/// What llama-cpp-python answers when it sees `response_format.type = json_schema`.
const LLAMA_CPP_REJECTION: &str = r#"{"error": {"message": "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), 'msg': \"Input should be 'text' or 'json_object'\"}", "type": "internal_server_error"}}"#;

#[tokio::test]
async fn auto_response_format_falls_back_to_json_object_once_rejected() {
    let server = serve(vec![
        Canned::status(500, LLAMA_CPP_REJECTION),
        Canned::sse(&oa_stream("{\"calls\":[],\"output\":null}")),
    ])
    .await;
    let p = provider(&server);
    assert_eq!(p.effective_response_format(), ResponseFormat::JsonSchema);
    let (events, err) = collect(p.stream(&request(Mode::StructuredOutput))).await;
    assert_eq!(err, None);
    assert_eq!(text_of(&events), "{\"calls\":[],\"output\":null}");
    assert_eq!(p.effective_response_format(), ResponseFormat::JsonObject);
    // Later requests (also from clones) go straight to the accepted dialect.
    let (_, err) = collect(p.clone().stream(&request(Mode::StructuredOutput))).await;
    assert_eq!(err, None);
    let reqs = server.requests();
    assert_eq!(reqs.len(), 3);
    assert_eq!(reqs[0].body["response_format"]["type"], "json_schema");
    for r in &reqs[1..] {
        assert_eq!(
            r.body["response_format"],
            json!({"type": "json_object", "schema": solution_schema()})
        );
    }
}

#[tokio::test]
async fn an_explicit_response_format_never_falls_back() {
    let server = serve(vec![
        Canned::status(500, LLAMA_CPP_REJECTION),
        Canned::sse(&oa_stream("{}")),
    ])
    .await;
    let p = provider(&server).with_response_format(ResponseFormat::JsonSchema);
    let (_, err) = collect(p.stream(&request(Mode::StructuredOutput))).await;
    assert!(matches!(
        err,
        Some(LlmError::HttpStatus { status: 500, .. })
    ));
    assert_eq!(server.hits(), 1);

    let server = serve(vec![Canned::sse(&oa_stream("{}"))]).await;
    let p = provider(&server).with_response_format(ResponseFormat::JsonObject);
    let (_, err) = collect(p.stream(&request(Mode::StructuredOutput))).await;
    assert_eq!(err, None);
    assert_eq!(
        server.requests()[0].body["response_format"]["type"],
        "json_object"
    );
}

#[tokio::test]
async fn other_errors_do_not_switch_the_response_format() {
    let server = serve(vec![
        Canned::status(500, "boom"),
        Canned::sse(&oa_stream("{}")),
    ])
    .await;
    let p = provider(&server);
    let (_, err) = collect(p.stream(&request(Mode::StructuredOutput))).await;
    assert!(matches!(
        err,
        Some(LlmError::HttpStatus { status: 500, .. })
    ));
    assert_eq!(server.hits(), 1);
    assert_eq!(p.effective_response_format(), ResponseFormat::JsonSchema);
}

/// History sanitised (spec/sessions.md SE6): native tool calls in the history (a goal's
/// `context`) are sent as the API's own in tool-call mode, each followed by its result: a call
/// without one is completed with a result that says so, a result that answers no call is
/// dropped. Checked on the request the loopback server received; structured mode sends them
/// as text.
#[tokio::test]
async fn native_tool_calls_in_history_each_have_their_result() {
    use dagloop::llm::history::NO_RESULT;
    use dagloop::protocol::{Message, Role};
    let text = |role: Role, text: &str, extra: Value| Message::Text {
        role,
        text: text.into(),
        extra: extra.as_object().cloned().unwrap_or_default(),
    };
    let call = |id: &str| json!({"id": id, "type": "function", "function": {"name": "greet", "arguments": "{\"name\":\"Ada\"}"}});
    let history = vec![
        text(
            Role::Assistant,
            "",
            json!({"tool_calls": [call("c1"), call("c2")]}),
        ),
        text(
            Role::User,
            "{\"greeting\":\"Hello, Ada!\"}",
            json!({"tool_call_id": "c1"}),
        ),
        text(Role::User, "stray", json!({"tool_call_id": "c9"})),
        text(Role::User, "Now greet Grace.", json!({})),
    ];
    let answer = || {
        Canned::sse(&[
            oa_delta(json!({"role": "assistant", "content": ""})),
            oa_text("{}"),
            oa_finish("stop"),
            DONE.to_string(),
        ])
    };
    let server = serve(vec![answer(), answer()]).await;
    let mut req = request(Mode::ToolCalls);
    req.messages.extend(history.clone());
    let _ = collect(provider(&server).stream(&req)).await;
    let mut structured = request(Mode::StructuredOutput);
    structured.messages.extend(history);
    let _ = collect(provider(&server).stream(&structured)).await;
    let sent = server.requests();
    let msgs = sent[0].body["messages"].as_array().expect("messages")[2..].to_vec();
    assert_eq!(
        msgs,
        vec![
            json!({"role": "assistant", "content": null, "tool_calls": [call("c1"), call("c2")]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "{\"greeting\":\"Hello, Ada!\"}"}),
            json!({"role": "tool", "tool_call_id": "c2", "content": NO_RESULT}),
            json!({"role": "user", "content": "Now greet Grace."}),
        ]
    );
    // Every call id has exactly one result, right after its call.
    let plain = sent[1].body["messages"].as_array().expect("messages");
    assert!(
        plain
            .iter()
            .all(|m| m.get("tool_calls").is_none() && m["role"] != "tool"),
        "{plain:#?}"
    );
}
