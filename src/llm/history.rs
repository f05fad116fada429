//! Provider-native tool calls in a request's history (a goal's `context`, a carried session),
//! and the rule that keeps them acceptable to providers that reject unmatched pairs: every
//! call has its result (the seeds' "orphan tool calls").
//!
//! A context message carries native calls in its unknown fields, in the OpenAI shape: an
//! assistant text message with `tool_calls` (`[{"id", "type": "function", "function": {"name",
//! "arguments"}}]`), and a text message with `tool_call_id` for a call's result (its text is
//! the result). In tool-call mode the OpenAI provider sends them natively ([`openai_messages`])
//! and so does Anthropic, as `tool_use` and `tool_result` blocks ([`anthropic_messages`]); in
//! the other modes they are sent as text, as any message is, so no unmatched pair can reach a
//! provider. Before native messages are sent, [`pair_calls`] makes every call be followed by
//! its result: a call without one is completed with a result that says so, a result that
//! answers no call just before it is dropped.
//!
//! Deliberately not here: where history comes from (`context`, `runs::session`), and the rest
//! of either provider's request (system prompt, tools, settings).

use serde_json::{Value, json};

use super::wire::{role_and_text, role_name};
use crate::protocol::{Message, Role};

/// The field of an assistant message that carries its native calls.
pub const TOOL_CALLS: &str = "tool_calls";
/// The field of a message that carries the result of the native call with this id.
pub const TOOL_CALL_ID: &str = "tool_call_id";

/// What a call without a result in the history is completed with.
pub const NO_RESULT: &str = "{\"error\": {\"code\": \"history.no_result\", \"message\": \"no result was recorded for this call\"}}";

/// The chat-completions messages for `messages`: with `native` (tool-call mode), an assistant
/// message's `tool_calls` and a `tool_call_id` result are sent as the API's own, every call
/// paired with its result ([`pair_calls`]); otherwise every message is its role and text.
pub(crate) fn openai_messages<'a>(
    messages: impl IntoIterator<Item = &'a Message>,
    native: bool,
) -> Vec<Value> {
    let plain = |m: &Message| {
        let (role, text) = role_and_text(m);
        json!({"role": role_name(role), "content": text})
    };
    if !native {
        return messages.into_iter().map(plain).collect();
    }
    let mut any = false;
    let out: Vec<Value> = messages
        .into_iter()
        .map(|m| match m {
            Message::Text {
                role: Role::Assistant,
                text,
                extra,
            } if extra.get(TOOL_CALLS).is_some_and(Value::is_array) => {
                any = true;
                let content = if text.is_empty() {
                    Value::Null
                } else {
                    Value::String(text.clone())
                };
                json!({"role": "assistant", "content": content, "tool_calls": extra[TOOL_CALLS]})
            }
            Message::Text { text, extra, .. } if extra.get(TOOL_CALL_ID).is_some() => {
                any = true;
                json!({"role": "tool", "tool_call_id": extra[TOOL_CALL_ID], "content": text})
            }
            other => plain(other),
        })
        .collect();
    if any { pair_calls(out) } else { out }
}

/// The Anthropic messages for `messages` (no system message among them): with `native`
/// (tool-call mode) and native calls in the history, the calls paired as for OpenAI
/// ([`pair_calls`]) and sent as an assistant message's `tool_use` blocks (`input`: the call's
/// arguments as JSON, `{}` when they do not parse) followed by a user message of their
/// `tool_result` blocks. The API wants alternating roles: consecutive messages of one role
/// merge (texts joined by a blank line; with blocks, their blocks in order).
pub(crate) fn anthropic_messages<'a>(
    messages: impl IntoIterator<Item = &'a Message>,
    native: bool,
) -> Vec<Value> {
    let chat = openai_messages(messages, native);
    let blocks = chat
        .iter()
        .any(|m| m["role"] == "tool" || m.get(TOOL_CALLS).is_some());
    let mut out: Vec<Value> = Vec::with_capacity(chat.len());
    for m in chat {
        let (role, content) = if blocks {
            anthropic_blocks(m)
        } else {
            let role = m["role"].as_str().unwrap_or("user").to_string();
            (role, m["content"].clone())
        };
        match out.last_mut() {
            Some(last) if last["role"] == role.as_str() => {
                let prev = last["content"].take();
                last["content"] = match (prev, content) {
                    (Value::String(a), Value::String(b)) => Value::String(format!("{a}\n\n{b}")),
                    (Value::Array(mut a), Value::Array(b)) => {
                        a.extend(b);
                        Value::Array(a)
                    }
                    (a, _) => a,
                };
            }
            _ => out.push(json!({"role": role, "content": content})),
        }
    }
    out
}

/// One chat-completions message as Anthropic content blocks: a call's `tool_use` blocks after
/// its text, a `tool` message's `tool_result` block (from the user), any other text a `text`
/// block.
fn anthropic_blocks(m: Value) -> (String, Value) {
    let text = |t: &Value| -> Vec<Value> {
        match t.as_str() {
            Some(t) if !t.is_empty() => vec![json!({"type": "text", "text": t})],
            _ => Vec::new(),
        }
    };
    let role = m["role"].as_str().unwrap_or("user");
    if role == "tool" {
        let block = json!({"type": "tool_result", "tool_use_id": m["tool_call_id"],
                           "content": m["content"]});
        return ("user".into(), json!([block]));
    }
    let mut blocks = text(&m["content"]);
    for c in m[TOOL_CALLS].as_array().into_iter().flatten() {
        let input = c["function"]["arguments"]
            .as_str()
            .and_then(|a| serde_json::from_str::<Value>(a).ok())
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        blocks.push(json!({"type": "tool_use", "id": c["id"],
                           "name": c["function"]["name"], "input": input}));
    }
    (role.to_string(), Value::Array(blocks))
}

/// Chat-completions messages in which every assistant tool call is followed by its result:
/// the `tool` messages right after an assistant message with `tool_calls` that answer one of
/// its calls are kept (the first per call), a call none answers gets a result saying so
/// ([`NO_RESULT`]), and every other `tool` message (answering no call just before it, or a
/// call answered already) is dropped. A call without an id is dropped (nothing could answer
/// it); an assistant message left with no call and no text is dropped too.
pub fn pair_calls(messages: Vec<Value>) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::with_capacity(messages.len());
    // The calls of the last assistant message with calls that are still unanswered, while only
    // results have followed it.
    let mut open: Vec<String> = Vec::new();
    let mut answering = false;
    let close = |open: &mut Vec<String>, out: &mut Vec<Value>| {
        for id in open.drain(..) {
            out.push(json!({"role": "tool", "tool_call_id": id, "content": NO_RESULT}));
        }
    };
    for mut m in messages {
        let role = m["role"].as_str().unwrap_or("").to_string();
        if role == "tool" {
            let id = m["tool_call_id"].as_str().unwrap_or("");
            if answering && let Some(i) = open.iter().position(|o| o == id) {
                open.remove(i);
                out.push(m);
            }
            continue;
        }
        close(&mut open, &mut out);
        answering = false;
        if role == "assistant"
            && let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut)
        {
            calls.retain(|c| c["id"].as_str().is_some_and(|id| !id.is_empty()));
            let mut ids: Vec<String> = Vec::new();
            calls.retain(|c| {
                let id = c["id"].as_str().unwrap_or("").to_string();
                if ids.contains(&id) {
                    return false;
                }
                ids.push(id);
                true
            });
            if calls.is_empty() {
                if let Some(o) = m.as_object_mut() {
                    o.remove("tool_calls");
                }
                if m["content"].is_null() {
                    continue;
                }
            } else {
                open = ids;
                answering = true;
            }
        }
        out.push(m);
    }
    close(&mut open, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: &str) -> Value {
        json!({"id": id, "type": "function", "function": {"name": "greet", "arguments": "{}"}})
    }

    fn result(id: &str) -> Value {
        json!({"role": "tool", "tool_call_id": id, "content": "ok"})
    }

    /// Orphan calls are completed, orphan results dropped, answered pairs kept in order.
    #[test]
    fn every_call_has_its_result_and_every_result_its_call() {
        let user = json!({"role": "user", "content": "hi"});
        let got = pair_calls(vec![
            result("early"),
            user.clone(),
            json!({"role": "assistant", "content": null, "tool_calls": [call("a"), call("b"), call("a")]}),
            result("b"),
            result("x"),
            result("b"),
            user.clone(),
            json!({"role": "assistant", "content": null, "tool_calls": [call("c")]}),
        ]);
        let no = |id: &str| json!({"role": "tool", "tool_call_id": id, "content": NO_RESULT});
        assert_eq!(
            got,
            vec![
                user.clone(),
                json!({"role": "assistant", "content": null, "tool_calls": [call("a"), call("b")]}),
                result("b"),
                no("a"),
                user,
                json!({"role": "assistant", "content": null, "tool_calls": [call("c")]}),
                no("c"),
            ]
        );
    }

    /// A call without an id cannot be answered: it goes, and so does a message left empty.
    #[test]
    fn calls_without_ids_are_dropped() {
        let got = pair_calls(vec![
            json!({"role": "assistant", "content": null, "tool_calls": [{"type": "function"}]}),
            json!({"role": "assistant", "content": "text", "tool_calls": [{"id": ""}]}),
        ]);
        assert_eq!(got, vec![json!({"role": "assistant", "content": "text"})]);
    }
}
