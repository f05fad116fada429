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

use super::http::{HttpCall, sse_stream};
use super::openai_stream::OpenAiDecoder;
use super::secret::Redactor;
use super::wire::{functions, role_and_text, role_name};
use super::{ApiKey, EventStream, LlmError, Mode, Model, Request, ToolChoice};

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
            client: reqwest::Client::new(),
            base_url,
            model: model.into(),
            key,
            headers,
            redactor,
            format: ResponseFormat::Auto,
            json_object_fallback: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Chooses the `response_format` dialect (default [`ResponseFormat::Auto`]).
    pub fn with_response_format(mut self, format: ResponseFormat) -> OpenAi {
        self.format = format;
        self
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

    /// Reads `OPENAI_BASE_URL` (default [`DEFAULT_OPENAI_BASE_URL`]), `OPENAI_API_KEY`
    /// (optional) and `OPENAI_RESPONSE_FORMAT` (`json_schema`, `json_object`, default auto).
    pub fn from_env(model: impl Into<String>) -> Result<OpenAi, LlmError> {
        let base = std::env::var("OPENAI_BASE_URL")
            .ok()
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_OPENAI_BASE_URL.to_string());
        let key = std::env::var("OPENAI_API_KEY").ok().map(ApiKey::new);
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
        Ok(OpenAi::new(base, key, model)?.with_response_format(format))
    }

    /// Uses this HTTP client (for custom TLS, proxies or connection pools).
    pub fn with_client(mut self, client: reqwest::Client) -> OpenAi {
        self.client = client;
        self
    }

    /// The JSON body sent for a request, with the current `response_format` dialect.
    pub fn request_body(&self, req: &Request) -> Value {
        self.body_with(req, self.effective_response_format())
    }

    fn body_with(&self, req: &Request, format: ResponseFormat) -> Value {
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
            Mode::StructuredOutput if format == ResponseFormat::JsonObject => {
                body["response_format"] = json!({"type": "json_object", "schema": req.schema});
            }
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

impl OpenAi {
    fn attempt(&self, req: &Request, format: ResponseFormat) -> EventStream {
        let call = HttpCall {
            client: self.client.clone(),
            url: format!("{}/chat/completions", self.base_url),
            headers: self.headers.clone(),
            body: self.body_with(req, format),
            request_timeout: req.settings.request_timeout,
            idle_timeout: req.settings.idle_timeout,
            redactor: self.redactor.clone(),
        };
        sse_stream(call, OpenAiDecoder::new(self.redactor.clone()))
    }
}

/// Whether an error answer says the server does not accept our `response_format`.
fn rejects_response_format(e: &LlmError) -> bool {
    matches!(e, LlmError::HttpStatus { status: 400 | 422 | 500, message, .. }
        if message.contains("response_format"))
}

impl Model for OpenAi {
    fn stream(&self, req: &Request) -> EventStream {
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

    fn name(&self) -> String {
        format!("openai:{}", self.model)
    }
}
