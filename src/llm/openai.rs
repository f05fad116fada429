//! The OpenAI-compatible chat-completions provider (`stream: true` over SSE): OpenAI itself,
//! vLLM, llama.cpp / llama-cpp-python, Ollama and other compatible servers.
//!
//! Structured-output mode sends the Solution schema as `response_format` and streams the content
//! as text deltas; tool-call mode sends the tools as functions and merges tool-call fragments by
//! index. It does not retry (see `Retrying`) and does not parse the Solution.
//!
//! Two `response_format` dialects exist: OpenAI's `{"type": "json_schema", "json_schema": {...}}`
//! (OpenAI, vLLM, Ollama, llama.cpp's llama-server) and `{"type": "json_object", "schema": ...}`
//! (llama-cpp-python, Anyscale). [`ResponseFormat::Auto`] sends the first and, when the server
//! rejects the request naming `response_format`, switches to the second for this and every later
//! request of the provider.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use serde_json::{Value, json};

use super::http::{HttpCall, post_json, sse_stream};
use super::openai_stream::OpenAiDecoder;
use super::secret::Redactor;
use super::strict::strict_schema;
use super::wire::functions;
use super::{
    ApiKey, EventStream, FinishReason, LlmError, Mode, Model, Request, StreamEvent, ToolChoice,
};

/// Default base URL when `OPENAI_BASE_URL` is unset.
pub const DEFAULT_OPENAI_BASE_URL: &str = "https://api.openai.com/v1";

/// How structured output is requested.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ResponseFormat {
    /// `json_schema` first; `json_object` + `schema` once the server rejects it.
    #[default]
    Auto,
    /// Always `{"type": "json_schema", "json_schema": {"name", "schema", "strict": false}}`.
    JsonSchema,
    /// Always `{"type": "json_object", "schema": ...}` (llama-cpp-python's dialect).
    JsonObject,
}

/// Whether schemas are sent with `strict: true` (OpenAI strict structured outputs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strict {
    /// Strict when the base URL is OpenAI's own API and the schema fits the strict subset
    /// (transformed by [`strict_schema`]); other servers get the schema as composed.
    #[default]
    Auto,
    /// Strict whenever the schema fits, whatever the server.
    On,
    /// Never strict.
    Off,
}

/// How tool-call mode requests are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolStreaming {
    /// `stream: true`, tool-call fragments as they come.
    #[default]
    Stream,
    /// `stream: false`: one whole answer, turned into the same events. For servers that cannot
    /// stream tool calls the model chooses itself (llama-cpp-python's `chatml-function-calling`
    /// streams only a named `tool_choice`).
    Whole,
}

/// An OpenAI-compatible chat-completions endpoint. `Debug` never shows the key.
#[derive(Clone)]
pub struct OpenAi {
    client: reqwest::Client,
    base_url: String,
    model: String,
    key: Option<ApiKey>,
    headers: HeaderMap,
    redactor: Redactor,
    format: ResponseFormat,
    strict: Strict,
    tool_streaming: ToolStreaming,
    /// Set once an `Auto` provider has seen the server reject `json_schema`.
    json_object_fallback: Arc<AtomicBool>,
}

impl fmt::Debug for OpenAi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAi")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("key", &self.key)
            .field("response_format", &self.format)
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
            client: crate::net::client().map_err(|e| LlmError::InvalidConfig {
                reason: format!("the HTTP client could not be built: {e}"),
            })?,
            base_url,
            model: model.into(),
            key,
            headers,
            redactor,
            format: ResponseFormat::Auto,
            strict: Strict::Auto,
            tool_streaming: ToolStreaming::Stream,
            json_object_fallback: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Chooses the `response_format` dialect (default [`ResponseFormat::Auto`]).
    pub fn with_response_format(mut self, format: ResponseFormat) -> OpenAi {
        self.format = format;
        self
    }

    /// Chooses when schemas are sent strict (default [`Strict::Auto`]).
    pub fn with_strict(mut self, strict: Strict) -> OpenAi {
        self.strict = strict;
        self
    }

    /// Chooses how tool-call mode requests are sent (default [`ToolStreaming::Stream`]).
    pub fn with_tool_streaming(mut self, t: ToolStreaming) -> OpenAi {
        self.tool_streaming = t;
        self
    }

    /// The schema to send and whether to mark it strict: the strict transform of `schema` when
    /// strict mode applies and the schema fits, else `schema` itself (and the reason is logged).
    pub fn strict_variant(&self, schema: &Value, what: &str) -> (Value, bool) {
        let wanted = match self.strict {
            Strict::Off => false,
            Strict::On => true,
            Strict::Auto => reqwest::Url::parse(&self.base_url)
                .is_ok_and(|u| u.host_str() == Some("api.openai.com")),
        };
        if !wanted {
            tracing::debug!(model = %self.name(), what, "strict: false (strict mode is off for this server; OPENAI_STRICT=on forces it)");
            return (schema.clone(), false);
        }
        match strict_schema(schema) {
            Ok(s) => (s, true),
            Err(why) => {
                tracing::info!(model = %self.name(), what, why = %why, "strict: false: the schema does not fit OpenAI's strict subset");
                (schema.clone(), false)
            }
        }
    }

    /// The dialect the next structured-output request will use (never `Auto`).
    pub fn effective_response_format(&self) -> ResponseFormat {
        match self.format {
            ResponseFormat::Auto if self.json_object_fallback.load(Ordering::SeqCst) => {
                ResponseFormat::JsonObject
            }
            ResponseFormat::Auto => ResponseFormat::JsonSchema,
            f => f,
        }
    }

    /// Reads `OPENAI_BASE_URL` (default [`DEFAULT_OPENAI_BASE_URL`]), `OPENAI_API_KEY`,
    /// `OPENAI_RESPONSE_FORMAT` (`json_schema`, `json_object`, default auto), `OPENAI_STRICT`
    /// (`auto`, `on`, `off`) and `OPENAI_TOOL_STREAM` (`on`, `off`: see [`ToolStreaming`]).
    ///
    /// The key is optional only with a base URL (local servers need none): with neither, this is
    /// [`LlmError::MissingApiKey`], so a run fails before it starts rather than on its first
    /// request.
    pub fn from_env(model: impl Into<String>) -> Result<OpenAi, LlmError> {
        let base = std::env::var("OPENAI_BASE_URL")
            .ok()
            .filter(|s| !s.trim().is_empty());
        let key = std::env::var("OPENAI_API_KEY")
            .ok()
            .filter(|k| !k.is_empty())
            .map(ApiKey::new);
        if base.is_none() && key.is_none() {
            return Err(LlmError::MissingApiKey {
                var: "OPENAI_API_KEY",
            });
        }
        let base = base.unwrap_or_else(|| DEFAULT_OPENAI_BASE_URL.to_string());
        let format = match std::env::var("OPENAI_RESPONSE_FORMAT").ok().as_deref() {
            None | Some("" | "auto") => ResponseFormat::Auto,
            Some("json_schema") => ResponseFormat::JsonSchema,
            Some("json_object") => ResponseFormat::JsonObject,
            Some(other) => {
                return Err(LlmError::InvalidConfig {
                    reason: format!(
                        "OPENAI_RESPONSE_FORMAT is `{other}` (expected auto, json_schema or json_object)"
                    ),
                });
            }
        };
        let strict = match std::env::var("OPENAI_STRICT").ok().as_deref() {
            None | Some("" | "auto") => Strict::Auto,
            Some("on") => Strict::On,
            Some("off") => Strict::Off,
            Some(other) => {
                return Err(LlmError::InvalidConfig {
                    reason: format!("OPENAI_STRICT is `{other}` (expected auto, on or off)"),
                });
            }
        };
        let tool_streaming = match std::env::var("OPENAI_TOOL_STREAM").ok().as_deref() {
            None | Some("" | "on") => ToolStreaming::Stream,
            Some("off") => ToolStreaming::Whole,
            Some(other) => {
                return Err(LlmError::InvalidConfig {
                    reason: format!("OPENAI_TOOL_STREAM is `{other}` (expected on or off)"),
                });
            }
        };
        Ok(OpenAi::new(base, key, model)?
            .with_response_format(format)
            .with_strict(strict)
            .with_tool_streaming(tool_streaming))
    }

    /// Uses this HTTP client (for custom TLS, proxies or connection pools).
    pub fn with_client(mut self, client: reqwest::Client) -> OpenAi {
        self.client = client;
        self
    }

    /// The JSON body sent for a request, with the current `response_format` dialect.
    pub fn request_body(&self, req: &Request) -> Value {
        self.body_with(req, self.effective_response_format()).0
    }

    /// The body, and which of its schemas were sent strict (see [`StreamEvent::Strict`]).
    fn body_with(&self, req: &Request, format: ResponseFormat) -> (Value, Option<StreamEvent>) {
        let s = &req.settings;
        let model = if s.model.is_empty() {
            &self.model
        } else {
            &s.model
        };
        let messages = super::history::openai_messages(&req.messages, s.mode == Mode::ToolCalls);
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
        let mut solution_strict = false;
        let mut strict_functions = Vec::new();
        match s.mode {
            Mode::StructuredOutput if format == ResponseFormat::JsonObject => {
                body["response_format"] = json!({"type": "json_object", "schema": req.schema});
            }
            Mode::StructuredOutput => {
                let (schema, strict) = self.strict_variant(&req.schema, "solution");
                solution_strict = strict;
                body["response_format"] = json!({
                    "type": "json_schema",
                    "json_schema": {"name": "solution", "schema": schema, "strict": strict}
                });
            }
            Mode::ToolCalls => {
                let tools: Vec<Value> = functions(&req.tools, &req.schema)
                    .into_iter()
                    .map(|f| {
                        let (parameters, strict) = self.strict_variant(&f.parameters, &f.name);
                        if strict {
                            strict_functions.push(f.name.clone());
                        }
                        let mut function =
                            json!({"name": f.name, "parameters": parameters, "strict": strict});
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
        let strict =
            (solution_strict || !strict_functions.is_empty()).then_some(StreamEvent::Strict {
                solution: solution_strict,
                functions: strict_functions,
            });
        (body, strict)
    }
}

/// Sends `strict` just before the first event of the attempt that is not an error (an attempt
/// that fails at once, and may be retried or switch dialects, says nothing).
fn announce(stream: EventStream, strict: Option<StreamEvent>) -> EventStream {
    let Some(strict) = strict else {
        return stream;
    };
    let mut pending = Some(strict);
    stream
        .flat_map(move |item| {
            let first = match (&item, pending.take()) {
                (Ok(_), Some(ev)) => Some(Ok(ev)),
                (_, p) => {
                    pending = p;
                    None
                }
            };
            futures::stream::iter(first.into_iter().chain(std::iter::once(item)))
        })
        .boxed()
}

impl OpenAi {
    /// One non-streaming tool-call request, turned into the events a stream would give.
    fn whole(&self, req: &Request) -> EventStream {
        let (mut body, strict) = self.body_with(req, self.effective_response_format());
        body["stream"] = json!(false);
        if let Value::Object(m) = &mut body {
            m.shift_remove("stream_options");
        }
        let call = HttpCall {
            client: self.client.clone(),
            url: format!("{}/chat/completions", self.base_url),
            headers: self.headers.clone(),
            body,
            request_timeout: req.settings.request_timeout,
            idle_timeout: req.settings.idle_timeout,
            redactor: self.redactor.clone(),
        };
        let answer = futures::stream::once(async move {
            let items: Vec<Result<StreamEvent, LlmError>> = match post_json(call).await {
                Ok(v) => whole_answer_events(&v).into_iter().map(Ok).collect(),
                Err(e) => vec![Err(e)],
            };
            futures::stream::iter(items)
        })
        .flatten()
        .boxed();
        announce(answer, strict)
    }

    fn attempt(&self, req: &Request, format: ResponseFormat) -> EventStream {
        let (body, strict) = self.body_with(req, format);
        let call = HttpCall {
            client: self.client.clone(),
            url: format!("{}/chat/completions", self.base_url),
            headers: self.headers.clone(),
            body,
            request_timeout: req.settings.request_timeout,
            idle_timeout: req.settings.idle_timeout,
            redactor: self.redactor.clone(),
        };
        announce(
            sse_stream(call, OpenAiDecoder::new(self.redactor.clone())),
            strict,
        )
    }
}

/// Whether an error answer says the server does not accept our `response_format`.
fn rejects_response_format(e: &LlmError) -> bool {
    matches!(e, LlmError::HttpStatus { status: 400 | 422 | 500, message, .. }
        if message.contains("response_format"))
}

/// The events of a whole (non-streaming) chat-completions answer: its text, each tool call as
/// one delta and its done event, usage, and the finish reason.
fn whole_answer_events(v: &Value) -> Vec<StreamEvent> {
    let mut out = Vec::new();
    let message = v.pointer("/choices/0/message").unwrap_or(&Value::Null);
    if let Some(t) = message.get("content").and_then(Value::as_str)
        && !t.is_empty()
    {
        out.push(StreamEvent::TextDelta(t.to_string()));
    }
    for (index, c) in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let id = c
            .get("id")
            .and_then(Value::as_str)
            .map_or_else(|| format!("call_{index}"), str::to_string);
        let name = c
            .pointer("/function/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let arguments = c
            .pointer("/function/arguments")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        out.push(StreamEvent::ToolCallDelta {
            index,
            id: Some(id.clone()),
            name: Some(name.clone()),
            arguments: arguments.clone(),
        });
        out.push(StreamEvent::ToolCallDone {
            index,
            id,
            name,
            arguments,
        });
    }
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
        out.push(StreamEvent::Usage {
            input_tokens: n("prompt_tokens"),
            output_tokens: n("completion_tokens"),
        });
    }
    let reason = v
        .pointer("/choices/0/finish_reason")
        .and_then(Value::as_str)
        .unwrap_or_default();
    out.push(StreamEvent::Finish {
        reason: FinishReason::from_provider(reason),
    });
    out
}

impl Model for OpenAi {
    fn stream(&self, req: &Request) -> EventStream {
        if req.settings.mode == Mode::ToolCalls && self.tool_streaming == ToolStreaming::Whole {
            return self.whole(req);
        }
        let format = self.effective_response_format();
        let first = self.attempt(req, format);
        if self.format != ResponseFormat::Auto
            || format != ResponseFormat::JsonSchema
            || req.settings.mode != Mode::StructuredOutput
        {
            return first;
        }
        let this = self.clone();
        let req = req.clone();
        futures::stream::once(async move {
            let mut first = first;
            match first.next().await {
                Some(Err(e)) if rejects_response_format(&e) => {
                    tracing::info!(
                        model = %this.name(),
                        "server rejected response_format json_schema; using json_object + schema"
                    );
                    this.json_object_fallback.store(true, Ordering::SeqCst);
                    this.attempt(&req, ResponseFormat::JsonObject)
                }
                Some(item) => futures::stream::once(async move { item })
                    .chain(first)
                    .boxed(),
                None => futures::stream::empty().boxed(),
            }
        })
        .flatten()
        .boxed()
    }

    /// `stream: false`, in either mode: the whole answer as the events a stream gives.
    fn stream_whole(&self, req: Arc<Request>) -> EventStream {
        self.whole(&req)
    }

    fn name(&self) -> String {
        format!("openai:{}", self.model)
    }
}
