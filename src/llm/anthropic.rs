//! The Anthropic messages API provider (`stream: true` over SSE).
//!
//! Tool-call mode sends the tools with their input schemas and turns `tool_use` blocks into tool
//! call events (`input_json_delta` fragments, done at `content_block_stop`). Structured-output
//! mode forces a `solution` tool whose input schema is the Solution schema and streams that tool's
//! input JSON as text deltas, so the plan parser sees the same text as with OpenAI. It does not
//! retry and does not parse the Solution.
//!
//! Prompt caching: the static prefix of every request of a run (the tool definitions, with the
//! Solution schema, then the system prompt) carries `cache_control` breakpoints, on the last
//! tool and on the system block, so later steps read it from the cache. The cache reads and
//! writes the API reports arrive as [`StreamEvent::CacheUsage`].

use std::collections::BTreeMap;
use std::fmt;

use eventsource_stream::Event;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};

use super::http::{Decoder, HttpCall, sse_stream};
use super::openai_stream::{excerpt, provider_error};
use super::secret::Redactor;
use super::wire::{SOLUTION_TOOL, functions, role_and_text};
use super::{
    ApiKey, EventStream, FinishReason, LlmError, Mode, Model, Request, StreamEvent, ToolChoice,
};
use crate::protocol::{Message, Role};

/// Default base URL when `ANTHROPIC_BASE_URL` is unset.
pub const DEFAULT_ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";
/// The `anthropic-version` header sent with every request.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// `max_tokens` used when the settings give none (the API requires one).
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// The Anthropic messages API. `Debug` never shows the key.
#[derive(Clone)]
pub struct Anthropic {
    client: reqwest::Client,
    base_url: String,
    model: String,
    key: ApiKey,
    headers: HeaderMap,
    redactor: Redactor,
}

impl fmt::Debug for Anthropic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Anthropic")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("key", &self.key)
            .finish()
    }
}

impl Anthropic {
    /// A provider for `base_url` (without `/v1`), with a key and a default model name.
    pub fn new(
        base_url: impl Into<String>,
        key: ApiKey,
        model: impl Into<String>,
    ) -> Result<Anthropic, LlmError> {
        let base_url = base_url.into().trim_end_matches('/').to_string();
        reqwest::Url::parse(&base_url).map_err(|e| LlmError::InvalidConfig {
            reason: format!("invalid Anthropic base URL `{base_url}`: {e}"),
        })?;
        let mut headers = HeaderMap::new();
        let mut v = HeaderValue::from_str(key.expose()).map_err(|_| LlmError::InvalidConfig {
            reason: "the Anthropic API key contains characters not allowed in a header".into(),
        })?;
        v.set_sensitive(true);
        headers.insert(HeaderName::from_static("x-api-key"), v);
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(ANTHROPIC_VERSION),
        );
        Ok(Anthropic {
            client: crate::net::client().map_err(|e| LlmError::InvalidConfig {
                reason: format!("the HTTP client could not be built: {e}"),
            })?,
            redactor: key.redactor(),
            base_url,
            model: model.into(),
            key,
            headers,
        })
    }

    /// Reads `ANTHROPIC_API_KEY` (required) and `ANTHROPIC_BASE_URL` (optional).
    pub fn from_env(model: impl Into<String>) -> Result<Anthropic, LlmError> {
        let key = std::env::var("ANTHROPIC_API_KEY")
            .ok()
            .filter(|k| !k.is_empty())
            .ok_or(LlmError::MissingApiKey {
                var: "ANTHROPIC_API_KEY",
            })?;
        let base = std::env::var("ANTHROPIC_BASE_URL")
            .ok()
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_ANTHROPIC_BASE_URL.to_string());
        Anthropic::new(base, ApiKey::new(key), model)
    }

    /// Uses this HTTP client.
    pub fn with_client(mut self, client: reqwest::Client) -> Anthropic {
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
        let is_system = |m: &Message| {
            matches!(
                m,
                Message::Text {
                    role: Role::System,
                    ..
                }
            )
        };
        let system: Vec<String> = req
            .messages
            .iter()
            .filter(|m| is_system(m))
            .map(|m| role_and_text(m).1)
            .collect();
        // Consecutive messages of one role merge; in tool-call mode, native calls in the
        // history go as `tool_use`/`tool_result` blocks, each call with its result.
        let messages = super::history::anthropic_messages(
            req.messages.iter().filter(|m| !is_system(m)),
            matches!(s.mode, Mode::ToolCalls),
        );
        let mut body = json!({
            "model": model,
            "max_tokens": s.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
            "messages": messages,
            "stream": true,
        });
        if !system.is_empty() {
            // A cache breakpoint: tools and system prompt are the prefix every step repeats.
            body["system"] = json!([{
                "type": "text",
                "text": system.join("\n\n"),
                "cache_control": {"type": "ephemeral"},
            }]);
        }
        if let Some(t) = s.temperature {
            body["temperature"] = json!(t);
        }
        match s.mode {
            Mode::StructuredOutput => {
                body["tools"] = json!([{
                    "name": SOLUTION_TOOL,
                    "description": "Write your Solution: the calls to make and the output.",
                    "input_schema": req.schema,
                    "cache_control": {"type": "ephemeral"},
                }]);
                body["tool_choice"] = json!({"type": "tool", "name": SOLUTION_TOOL});
            }
            Mode::ToolCalls => {
                let tools: Vec<Value> = functions(&req.tools, &req.schema)
                    .into_iter()
                    .map(|f| {
                        let mut t = json!({"name": f.name, "input_schema": f.parameters});
                        if let Some(d) = f.description {
                            t["description"] = json!(d);
                        }
                        t
                    })
                    .collect();
                body["tools"] = Value::Array(tools);
                if let Some(last) = body["tools"].as_array_mut().and_then(|t| t.last_mut()) {
                    last["cache_control"] = json!({"type": "ephemeral"});
                }
                body["tool_choice"] = match &s.tool_choice {
                    ToolChoice::Auto => json!({"type": "auto"}),
                    ToolChoice::Required => json!({"type": "any"}),
                    ToolChoice::Named(n) => json!({"type": "tool", "name": n}),
                };
            }
        }
        body
    }
}

impl Model for Anthropic {
    fn stream(&self, req: &Request) -> EventStream {
        let call = HttpCall {
            client: self.client.clone(),
            url: format!("{}/v1/messages", self.base_url),
            headers: self.headers.clone(),
            body: self.request_body(req),
            request_timeout: req.settings.request_timeout,
            idle_timeout: req.settings.idle_timeout,
            redactor: self.redactor.clone(),
        };
        let structured = req.settings.mode == Mode::StructuredOutput;
        sse_stream(
            call,
            AnthropicDecoder::new(structured, self.redactor.clone()),
        )
    }

    fn name(&self) -> String {
        format!("anthropic:{}", self.model)
    }
}

enum Block {
    Text,
    Solution,
    Tool {
        call: usize,
        id: String,
        name: String,
        arguments: String,
    },
    Other,
}

/// Decodes Anthropic stream events.
struct AnthropicDecoder {
    structured: bool,
    blocks: BTreeMap<u64, Block>,
    next_call: usize,
    usage: Option<(u64, u64)>,
    /// Cache (read, write) tokens from `message_start` / `message_delta`.
    cache: Option<(u64, u64)>,
    stop_reason: Option<String>,
    done: bool,
    redactor: Redactor,
}

impl AnthropicDecoder {
    fn new(structured: bool, redactor: Redactor) -> AnthropicDecoder {
        AnthropicDecoder {
            structured,
            blocks: BTreeMap::new(),
            next_call: 0,
            usage: None,
            cache: None,
            stop_reason: None,
            done: false,
            redactor,
        }
    }

    fn close(&mut self, index: u64, out: &mut Vec<StreamEvent>) {
        if let Some(Block::Tool {
            call,
            id,
            name,
            arguments,
        }) = self.blocks.remove(&index)
        {
            out.push(StreamEvent::ToolCallDone {
                index: call,
                id,
                name,
                arguments: if arguments.is_empty() {
                    "{}".into()
                } else {
                    arguments
                },
            });
        }
    }
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> Option<&'a str> {
    v.pointer(ptr).and_then(Value::as_str)
}

impl Decoder for AnthropicDecoder {
    fn event(&mut self, ev: &Event, out: &mut Vec<StreamEvent>) -> Result<(), LlmError> {
        let v: Value = serde_json::from_str(ev.data.trim()).map_err(|e| LlmError::BadSse {
            reason: format!(
                "data is not JSON ({e}): {}",
                excerpt(&ev.data, &self.redactor)
            ),
        })?;
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
        match str_at(&v, "/type").unwrap_or(ev.event.as_str()) {
            "message_start" => {
                let n = |p: &str| v.pointer(p).and_then(Value::as_u64).unwrap_or(0);
                self.usage = Some((
                    n("/message/usage/input_tokens"),
                    n("/message/usage/output_tokens"),
                ));
                let read = v.pointer("/message/usage/cache_read_input_tokens");
                let write = v.pointer("/message/usage/cache_creation_input_tokens");
                if read.is_some() || write.is_some() {
                    self.cache = Some((
                        n("/message/usage/cache_read_input_tokens"),
                        n("/message/usage/cache_creation_input_tokens"),
                    ));
                }
            }
            "content_block_start" => {
                let cb = v.get("content_block").unwrap_or(&Value::Null);
                let block = match str_at(cb, "/type") {
                    Some("text") => {
                        if let Some(t) = str_at(cb, "/text").filter(|t| !t.is_empty())
                            && !self.structured
                        {
                            out.push(StreamEvent::TextDelta(t.to_string()));
                        }
                        Block::Text
                    }
                    Some("tool_use")
                        if self.structured && str_at(cb, "/name") == Some(SOLUTION_TOOL) =>
                    {
                        Block::Solution
                    }
                    Some("tool_use") => {
                        let call = self.next_call;
                        self.next_call += 1;
                        let id = str_at(cb, "/id").unwrap_or_default().to_string();
                        let name = str_at(cb, "/name").unwrap_or_default().to_string();
                        out.push(StreamEvent::ToolCallDelta {
                            index: call,
                            id: Some(id.clone()).filter(|s| !s.is_empty()),
                            name: Some(name.clone()).filter(|s| !s.is_empty()),
                            arguments: String::new(),
                        });
                        Block::Tool {
                            call,
                            id: if id.is_empty() {
                                format!("call_{call}")
                            } else {
                                id
                            },
                            name,
                            arguments: String::new(),
                        }
                    }
                    _ => Block::Other,
                };
                self.blocks.insert(index, block);
            }
            "content_block_delta" => {
                let delta = v.get("delta").unwrap_or(&Value::Null);
                let text = str_at(delta, "/text").or_else(|| str_at(delta, "/partial_json"));
                match (self.blocks.get_mut(&index), text) {
                    (Some(Block::Text), Some(t)) if !self.structured && !t.is_empty() => {
                        out.push(StreamEvent::TextDelta(t.to_string()));
                    }
                    (Some(Block::Solution), Some(t)) if !t.is_empty() => {
                        out.push(StreamEvent::TextDelta(t.to_string()));
                    }
                    (
                        Some(Block::Tool {
                            call, arguments, ..
                        }),
                        Some(t),
                    ) if !t.is_empty() => {
                        arguments.push_str(t);
                        out.push(StreamEvent::ToolCallDelta {
                            index: *call,
                            id: None,
                            name: None,
                            arguments: t.to_string(),
                        });
                    }
                    _ => {}
                }
            }
            "content_block_stop" => self.close(index, out),
            "message_delta" => {
                if let Some(r) = str_at(&v, "/delta/stop_reason") {
                    self.stop_reason = Some(r.to_string());
                }
                if let Some(n) = v.pointer("/usage/output_tokens").and_then(Value::as_u64) {
                    let input = self.usage.map_or(0, |u| u.0);
                    let input = v
                        .pointer("/usage/input_tokens")
                        .and_then(Value::as_u64)
                        .unwrap_or(input);
                    self.usage = Some((input, n));
                }
                let u = |k: &str| v.pointer(&format!("/usage/{k}")).and_then(Value::as_u64);
                if let (r @ Some(_), w) | (r, w @ Some(_)) = (
                    u("cache_read_input_tokens"),
                    u("cache_creation_input_tokens"),
                ) {
                    let (r0, w0) = self.cache.unwrap_or((0, 0));
                    self.cache = Some((r.unwrap_or(r0), w.unwrap_or(w0)));
                }
            }
            "message_stop" => self.done = true,
            "error" => {
                return Err(provider_error(
                    v.get("error").unwrap_or(&Value::Null),
                    &self.redactor,
                ));
            }
            // `ping` and event types added later are ignored, as the API asks.
            _ => {}
        }
        Ok(())
    }

    fn is_done(&self) -> bool {
        self.done
    }

    fn finish(&mut self, out: &mut Vec<StreamEvent>) -> Result<(), LlmError> {
        if !self.done && self.stop_reason.is_none() {
            return Err(LlmError::IncompleteStream {
                reason: "the body ended before `message_stop`".into(),
            });
        }
        let open: Vec<u64> = self.blocks.keys().copied().collect();
        for index in open {
            self.close(index, out);
        }
        if let Some((read_tokens, write_tokens)) = self.cache {
            out.push(StreamEvent::CacheUsage {
                read_tokens,
                write_tokens,
            });
        }
        if let Some((input_tokens, output_tokens)) = self.usage {
            out.push(StreamEvent::Usage {
                input_tokens,
                output_tokens,
            });
        }
        let reason = self
            .stop_reason
            .as_deref()
            .map(FinishReason::from_provider)
            .unwrap_or(FinishReason::Other(String::new()));
        out.push(StreamEvent::Finish { reason });
        Ok(())
    }
}
