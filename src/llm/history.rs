//! Provider-native tool calls in a request's history (a goal's `context`, a carried session),
//! and the rule that keeps them acceptable to providers that reject unmatched pairs: every
//! call has its result (the seeds' "orphan tool calls").
//!
//! A context message carries native calls in its unknown fields, in the OpenAI shape: an
//! assistant text message with `tool_calls` (`[{"id", "type": "function", "function": {"name",
//! "arguments"}}]`), and a text message with `tool_call_id` for a call's result (its text is
//! the result). In tool-call mode the OpenAI provider sends them natively ([`openai_messages`]);
//! in the other modes, and to Anthropic, they are sent as text, as any message is, so no
//! unmatched pair can reach a provider. Before native messages are sent, [`pair_calls`] makes
//! every call be followed by its result: a call without one is completed with a result that
//! says so, a result that answers no call just before it is dropped.
//!
//! Deliberately not here: where history comes from (`context`, `runs::session`), and
//! Anthropic's `tool_use` blocks (never sent in history).

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
pub(crate) fn openai_messages(messages: &[Message], native: bool) -> Vec<Value> {
    let plain = |m: &Message| {
        let (role, text) = role_and_text(m);
        json!({"role": role_name(role), "content": text})
    };
    if !native {
        return messages.iter().map(plain).collect();
    }
    let mut any = false;
    let out: Vec<Value> = messages
        .iter()
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
