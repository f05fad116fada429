//! The OpenAI-compatible chat-completions provider (`stream: true` over SSE): OpenAI itself,
//! vLLM, llama.cpp / llama-cpp-python, Ollama and other compatible servers.
//!
//! Structured-output mode sends the Solution schema as `response_format` and streams the content
//! as text deltas; tool-call mode sends the tools as functions and merges tool-call fragments by
//! index. It does not retry (see `Retrying`) and does not parse the Solution.

use std::fmt;

use eventsource_stream::Event;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use serde_json::{Value, json};

use super::http::{Decoder, HttpCall, sse_stream};
use super::secret::Redactor;
use super::wire::{ToolCallMerger, functions, role_and_text, role_name};
use super::{
    ApiKey, EventStream, FinishReason, LlmError, Mode, Model, Request, StreamEvent, ToolChoice,
};

/// Default base URL when `OPENAI_BASE_URL` is unset.
pub const DEFAULT_OPENAI_BASE_URL: &str = "https://api.openai.com/v1";

/// An OpenAI-compatible chat-completions endpoint. `Debug` never shows the key.
#[derive(Clone)]
pub struct OpenAi {
    client: reqwest::Client,
    base_url: String,
    model: String,
    key: Option<ApiKey>,
    headers: HeaderMap,
    redactor: Redactor,
}

impl fmt::Debug for OpenAi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAi")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("key", &self.key)
            .finish()
    }
}

impl OpenAi {
    /// A provider for `base_url` (which usually ends in `/v1`), with an optional key (local
    /// servers need none) and a default model name.
    pub fn new(
        base_url: impl Into<String>,
        key: Option<ApiKey>,
        model: impl Into<String>,
    ) -> Result<OpenAi, LlmError> {
        let base_url = base_url.into().trim_end_matches('/').to_string();
        reqwest::Url::parse(&base_url).map_err(|e| LlmError::InvalidConfig {
            reason: format!("invalid OpenAI base URL `{base_url}`: {e}"),
        })?;
        let key = key.filter(|k| !k.expose().is_empty());
        let mut headers = HeaderMap::new();
        if let Some(k) = &key {
            let mut v = HeaderValue::from_str(&format!("Bearer {}", k.expose())).map_err(|_| {
                LlmError::InvalidConfig {
                    reason: "the OpenAI API key contains characters not allowed in a header".into(),
                }
            })?;
            v.set_sensitive(true);
            headers.insert(AUTHORIZATION, v);
        }
        let redactor = key.as_ref().map(ApiKey::redactor).unwrap_or_default();
        Ok(OpenAi {
            client: reqwest::Client::new(),
            base_url,
            model: model.into(),
            key,
            headers,
            redactor,
        })
    }

    /// Reads `OPENAI_BASE_URL` (default [`DEFAULT_OPENAI_BASE_URL`]) and `OPENAI_API_KEY`
    /// (optional).
    pub fn from_env(model: impl Into<String>) -> Result<OpenAi, LlmError> {
        let base = std::env::var("OPENAI_BASE_URL")
            .ok()
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_OPENAI_BASE_URL.to_string());
        let key = std::env::var("OPENAI_API_KEY").ok().map(ApiKey::new);
        OpenAi::new(base, key, model)
    }

    /// Uses this HTTP client (for custom TLS, proxies or connection pools).
    pub fn with_client(mut self, client: reqwest::Client) -> OpenAi {
        self.client = client;
        self
    }

    /// The JSON body sent for a request.
    pub fn request_body(&self, req: &Request) -> Value {
        let s = &req.settings;
        let model = if s.model.is_empty() {
            &self.model
        } else {
            &s.model
        };
        let messages: Vec<Value> = req
            .messages
            .iter()
            .map(|m| {
                let (role, text) = role_and_text(m);
                json!({"role": role_name(role), "content": text})
            })
            .collect();
        let mut body = json!({
            "model": model,
            "messages": messages,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        if let Some(t) = s.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(m) = s.max_tokens {
            body["max_tokens"] = json!(m);
        }
        match s.mode {
            Mode::StructuredOutput => {
                body["response_format"] = json!({
                    "type": "json_schema",
                    "json_schema": {"name": "solution", "schema": req.schema, "strict": false}
                });
            }
            Mode::ToolCalls => {
                let tools: Vec<Value> = functions(&req.tools, &req.schema)
                    .into_iter()
                    .map(|f| {
                        let mut function = json!({"name": f.name, "parameters": f.parameters});
                        if let Some(d) = f.description {
                            function["description"] = json!(d);
                        }
                        json!({"type": "function", "function": function})
                    })
                    .collect();
                body["tools"] = Value::Array(tools);
                body["tool_choice"] = match &s.tool_choice {
                    ToolChoice::Auto => json!("auto"),
                    ToolChoice::Required => json!("required"),
                    ToolChoice::Named(n) => json!({"type": "function", "function": {"name": n}}),
                };
            }
        }
        body
    }
}

impl Model for OpenAi {
    fn stream(&self, req: &Request) -> EventStream {
        let call = HttpCall {
            client: self.client.clone(),
            url: format!("{}/chat/completions", self.base_url),
            headers: self.headers.clone(),
            body: self.request_body(req),
            request_timeout: req.settings.request_timeout,
            idle_timeout: req.settings.idle_timeout,
            redactor: self.redactor.clone(),
        };
        sse_stream(call, OpenAiDecoder::new(self.redactor.clone()))
    }

    fn name(&self) -> String {
        format!("openai:{}", self.model)
    }
}

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
