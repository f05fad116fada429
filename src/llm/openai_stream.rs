//! Decoding of OpenAI-compatible chat-completion chunks into stream events, and the provider
//! error helpers shared with the Anthropic decoder.
//!
//! Only the first choice (index 0) is read; `n > 1` is not supported.

use eventsource_stream::Event;
use serde_json::Value;

use super::http::Decoder;
use super::secret::Redactor;
use super::wire::ToolCallMerger;
use super::{FinishReason, LlmError, StreamEvent};

/// Decodes chat-completion chunks.
pub(crate) struct OpenAiDecoder {
    merger: ToolCallMerger,
    finish: Option<String>,
    usage: Option<(u64, u64)>,
    done: bool,
    redactor: Redactor,
}

impl OpenAiDecoder {
    pub(crate) fn new(redactor: Redactor) -> OpenAiDecoder {
        OpenAiDecoder {
            merger: ToolCallMerger::default(),
            finish: None,
            usage: None,
            done: false,
            redactor,
        }
    }

    fn choice(&mut self, choice: &Value, out: &mut Vec<StreamEvent>) -> Result<(), LlmError> {
        if let Some(delta) = choice.get("delta") {
            if let Some(text) = delta.get("content").and_then(Value::as_str)
                && !text.is_empty()
            {
                out.push(StreamEvent::TextDelta(text.to_string()));
            }
            match delta.get("tool_calls").and_then(Value::as_array) {
                Some(calls) => {
                    for (pos, tc) in calls.iter().enumerate() {
                        let index = tc
                            .get("index")
                            .and_then(Value::as_u64)
                            .map_or(pos, |i| i as usize);
                        let f = tc.get("function");
                        self.merger.fragment(
                            index,
                            tc.get("id").and_then(Value::as_str),
                            f.and_then(|f| f.get("name")).and_then(Value::as_str),
                            f.and_then(|f| f.get("arguments"))
                                .and_then(Value::as_str)
                                .unwrap_or(""),
                            out,
                        )?;
                    }
                }
                // The legacy field counts only when `tool_calls` is absent: llama-cpp-python sends
                // both, carrying the same fragment twice.
                None => {
                    if let Some(fc) = delta.get("function_call").filter(|f| f.is_object()) {
                        self.merger.fragment(
                            0,
                            None,
                            fc.get("name").and_then(Value::as_str),
                            fc.get("arguments").and_then(Value::as_str).unwrap_or(""),
                            out,
                        )?;
                    }
                }
            }
        }
        if let Some(r) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(r.to_string());
        }
        Ok(())
    }
}

/// Whether a provider error type names a transient condition.
pub(crate) fn transient_kind(kind: &str) -> bool {
    [
        "overloaded",
        "server_error",
        "rate_limit",
        "api_error",
        "timeout",
        "unavailable",
    ]
    .iter()
    .any(|k| kind.contains(k))
}

pub(crate) fn provider_error(err: &Value, redactor: &Redactor) -> LlmError {
    let kind = ["type", "code"]
        .iter()
        .find_map(|k| err.get(k).and_then(Value::as_str))
        .unwrap_or("error")
        .to_string();
    let message = err
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| err.to_string());
    LlmError::Provider {
        retryable: transient_kind(&kind),
        kind,
        message: redactor.apply(&message),
    }
}

/// A short, redacted excerpt of a bad data line for error messages.
pub(crate) fn excerpt(data: &str, redactor: &Redactor) -> String {
    let short: String = data.chars().take(80).collect();
    redactor.apply(&short)
}

impl Decoder for OpenAiDecoder {
    fn event(&mut self, ev: &Event, out: &mut Vec<StreamEvent>) -> Result<(), LlmError> {
        let data = ev.data.trim();
        if data == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let v: Value = serde_json::from_str(data).map_err(|e| LlmError::BadSse {
            reason: format!("data is not JSON ({e}): {}", excerpt(data, &self.redactor)),
        })?;
        if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
            return Err(provider_error(err, &self.redactor));
        }
        if let Some(choice) = v.get("choices").and_then(Value::as_array).and_then(|cs| {
            cs.iter()
                .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
        }) {
            self.choice(choice, out)?;
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
            self.usage = Some((n("prompt_tokens"), n("completion_tokens")));
        }
        Ok(())
    }

    fn is_done(&self) -> bool {
        self.done
    }

    fn finish(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), LlmError> {
        if !self.done && self.finish.is_none() {
            return Err(LlmError::IncompleteStream {
                reason: "the body ended before `data: [DONE]` or a finish_reason".into(),
            });
        }
        self.merger.flush(out);
        if let Some((input_tokens, output_tokens)) = self.usage {
            out.push(StreamEvent::Usage {
                input_tokens,
                output_tokens,
            });
        }
        let reason = self
            .finish
            .as_deref()
            .map(FinishReason::from_provider)
            .unwrap_or(FinishReason::Other(String::new()));
        out.push(StreamEvent::Finish { reason });
        Ok(())
    }
}
