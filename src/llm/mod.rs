//! Model providers: one `Model` trait that turns a [`Request`] into a stream of normalised
//! [`StreamEvent`]s, whatever the provider.
//!
//! Layers, bottom up: HTTP transport with timeouts and secret redaction (`http`), SSE framing
//! (eventsource-stream), a per-provider decoder (`openai`, `anthropic`) that maps provider chunks
//! to stream events, and [`Retrying`], which retries failed attempts that have not yet produced
//! content (protocol rule 17). [`ScriptedModel`] replays a script file offline, and
//! `serve_mock` (feature `server`) serves the same script as an OpenAI-compatible endpoint.
//!
//! Deliberately not here: parsing the Solution text into calls (the `plan` module does that from
//! the text deltas), composing the schema, building the context messages, or deciding what a
//! malformed solution means (a model error, shown back to the model by the engine).

mod anthropic;
mod error;
mod fallback;
pub mod history;
mod http;
#[cfg(feature = "server")]
mod mock;
mod openai;
mod openai_stream;
mod retry;
mod script;
mod scripted;
mod secret;
mod strict;
pub(crate) mod wire;

pub use anthropic::Anthropic;
pub use error::LlmError;
pub use fallback::Fallback;
pub use http::{MAX_SSE_LINE, parse_retry_after};
#[cfg(feature = "server")]
pub use mock::{MockServer, serve_mock};
pub use openai::{OpenAi, ResponseFormat, Strict, ToolStreaming};
pub use retry::{Jitter, RetryNotice, RetryPolicy, Retrying};
pub use script::{Script, Turn, TurnBody, TurnUsage};
pub use scripted::ScriptedModel;
pub use secret::ApiKey;
pub use strict::{
    drop_strict_nulls, drop_strict_nulls_in_call, drop_strict_nulls_in_output, strict_schema,
};
pub use wire::{
    FINAL_OUTPUT_TOOL, SOLUTION_TOOL, ToolCallOutcome, call_from_tool_call, function_definitions,
};

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use serde_json::Value;

use crate::protocol::{Message, Tool};

/// The stream a model returns for one request.
pub type EventStream = BoxStream<'static, Result<StreamEvent, LlmError>>;

/// A language model that streams normalised events for a request.
///
/// The stream is `'static`: implementations copy what they need from the request. A stream ends
/// after a [`StreamEvent::Finish`] or after the first error.
pub trait Model: Send + Sync {
    /// Starts one attempt at the request. Errors arrive as stream items.
    fn stream(&self, req: &Request) -> EventStream;
    /// Like [`Model::stream`], for a request the caller already shares: a model that keeps the
    /// request past this call (to retry it) holds this `Arc` instead of copying the request,
    /// whose plan can hold every call of a large step.
    fn stream_shared(&self, req: Arc<Request>) -> EventStream {
        self.stream(&req)
    }
    /// Asks `req` without streaming: one whole answer, turned into the events a stream gives.
    /// Used once to re-ask a turn whose stream broke after its content had started
    /// ([`Fallback`]). A provider that has no such request streams again (the default).
    fn stream_whole(&self, req: Arc<Request>) -> EventStream {
        self.stream_shared(req)
    }
    /// A display name for logs and events (`openai:gpt-4o-mini`); never contains a secret.
    fn name(&self) -> String;
    /// A resumed run already made `attempts` requests of this model in an earlier process. A
    /// model whose answers depend on how many came before (a script) moves on that far; others
    /// ignore it.
    fn resume_after(&self, attempts: usize) {
        let _ = attempts;
    }
}

impl<M: Model + ?Sized> Model for Arc<M> {
    fn stream(&self, req: &Request) -> EventStream {
        (**self).stream(req)
    }
    fn stream_shared(&self, req: Arc<Request>) -> EventStream {
        (**self).stream_shared(req)
    }
    fn stream_whole(&self, req: Arc<Request>) -> EventStream {
        (**self).stream_whole(req)
    }
    fn name(&self) -> String {
        (**self).name()
    }
    fn resume_after(&self, attempts: usize) {
        (**self).resume_after(attempts)
    }
}

impl<M: Model + ?Sized> Model for Box<M> {
    fn stream(&self, req: &Request) -> EventStream {
        (**self).stream(req)
    }
    fn stream_shared(&self, req: Arc<Request>) -> EventStream {
        (**self).stream_shared(req)
    }
    fn stream_whole(&self, req: Arc<Request>) -> EventStream {
        (**self).stream_whole(req)
    }
    fn name(&self) -> String {
        (**self).name()
    }
    fn resume_after(&self, attempts: usize) {
        (**self).resume_after(attempts)
    }
}

/// One LLM invocation: context messages, the composed Solution schema, tools and settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The context, in order.
    pub messages: Vec<Message>,
    /// The composed Solution schema (an object schema with `calls` and `output`).
    pub schema: Value,
    /// Tools offered as native functions in [`Mode::ToolCalls`].
    pub tools: Vec<Tool>,
    /// Model name, sampling and timeouts.
    pub settings: Settings,
}

/// How the model returns its Solution. In a goal file: `"mode": "structured" | "tools"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum Mode {
    /// The Solution streams as text constrained by the schema (`response_format` json_schema;
    /// for Anthropic a forced `solution` tool whose input streams as text deltas).
    #[default]
    #[serde(rename = "structured")]
    StructuredOutput,
    /// Each call is a native tool call; the output arrives through the `final_output` tool.
    #[serde(rename = "tools")]
    ToolCalls,
}

/// Which tool the model must call in [`Mode::ToolCalls`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ToolChoice {
    /// The model decides (`"auto"`).
    #[default]
    Auto,
    /// The model must call some tool (`"required"` / Anthropic `any`).
    Required,
    /// The model must call this tool.
    Named(String),
}

/// Per-request settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The provider's model name. Empty means the provider's configured default.
    pub model: String,
    /// Sampling temperature; None leaves the provider default.
    pub temperature: Option<f64>,
    /// Output token cap; None leaves the provider default (Anthropic requires one: 4096).
    pub max_tokens: Option<u32>,
    /// Structured output or native tool calls.
    pub mode: Mode,
    /// Tool choice in tool-call mode.
    pub tool_choice: ToolChoice,
    /// Deadline for one attempt, from sending the request to the last byte (`llm.timeout`).
    pub request_timeout: Duration,
    /// Longest silence allowed from the server, before the headers or between body bytes
    /// (`llm.idle_timeout`).
    pub idle_timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            model: String::new(),
            temperature: None,
            max_tokens: None,
            mode: Mode::StructuredOutput,
            tool_choice: ToolChoice::Auto,
            request_timeout: Duration::from_secs(600),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// Why the model stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FinishReason {
    /// Natural end (`stop`, `end_turn`, `stop_sequence`).
    Stop,
    /// The output token cap was hit (`length`, `max_tokens`).
    Length,
    /// The model stopped to have tools run (`tool_calls`, `function_call`, `tool_use`).
    ToolCalls,
    /// A content filter stopped it.
    ContentFilter,
    /// Something else, as the provider named it (empty when it named nothing).
    Other(String),
}

impl FinishReason {
    /// Maps a provider's stop reason to the normalised one.
    pub fn from_provider(reason: &str) -> FinishReason {
        match reason {
            "stop" | "end_turn" | "stop_sequence" => FinishReason::Stop,
            "length" | "max_tokens" => FinishReason::Length,
            "tool_calls" | "function_call" | "tool_use" => FinishReason::ToolCalls,
            "content_filter" | "refusal" => FinishReason::ContentFilter,
            other => FinishReason::Other(other.to_string()),
        }
    }

    /// The reason as the OpenTelemetry GenAI conventions spell it
    /// (`gen_ai.response.finish_reasons`): `stop`, `length`, `tool_calls`, `content_filter`, or
    /// the provider's own word (`other` when it named none).
    pub fn as_str(&self) -> &str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::Other(s) if s.is_empty() => "other",
            FinishReason::Other(s) => s,
        }
    }
}

/// One normalised event of a model's response stream.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum StreamEvent {
    /// More Solution text (structured-output mode) or free text (tool-call mode).
    TextDelta(String),
    /// A fragment of a native tool call. `id` and `name` are set the first time they are known.
    ToolCallDelta {
        /// The call's position among this response's tool calls.
        index: usize,
        /// The provider's call id, when first seen.
        id: Option<String>,
        /// The tool name, when first seen.
        name: Option<String>,
        /// The next piece of the JSON arguments text.
        arguments: String,
    },
    /// A native tool call whose arguments are complete.
    ToolCallDone {
        /// The call's position among this response's tool calls.
        index: usize,
        /// The provider's call id (`call_<index>` when the provider gave none).
        id: String,
        /// The tool name (empty when the provider never sent one).
        name: String,
        /// The whole JSON arguments text, unparsed.
        arguments: String,
    },
    /// Token usage of this request, reported once near the end when the provider gives it.
    Usage {
        /// Prompt tokens.
        input_tokens: u64,
        /// Completion tokens.
        output_tokens: u64,
    },
    /// An attempt failed before producing content and is retried after `wait` (emitted by
    /// [`Retrying`] before it waits; the engine journals and publishes it).
    Retry {
        /// The attempt that failed (from 1).
        attempt: u32,
        /// The HTTP status, when the server answered with one.
        status: Option<u16>,
        /// The wait before the next attempt.
        wait: Duration,
        /// Why it failed.
        error: String,
    },
    /// Prompt-cache accounting of this request, reported once near the end (before
    /// [`StreamEvent::Usage`]) when the provider gives it (Anthropic prompt caching). These
    /// tokens are not counted in `Usage::input_tokens`.
    CacheUsage {
        /// Prompt tokens read from the cache.
        read_tokens: u64,
        /// Prompt tokens written to the cache.
        write_tokens: u64,
    },
    /// This attempt's answer is constrained by OpenAI strict mode's transform of the request's
    /// schemas (`strict: true` was sent for them), so a `null` the original schema does not
    /// allow on an optional property means "absent" there ([`drop_strict_nulls`] undoes it).
    /// Sent by a provider before the first other event of such an attempt (a retried attempt
    /// sends it again).
    Strict {
        /// The Solution schema was sent strict (structured-output mode).
        solution: bool,
        /// The functions sent strict (tool-call mode), [`FINAL_OUTPUT_TOOL`] included.
        functions: Vec<String>,
    },
    /// The model answering the turn failed after its retries, before any content, with an
    /// error another provider could fix: the same request goes to the next model of the
    /// agent's list (emitted by [`Fallback`]; the engine journals and publishes it).
    Fallback {
        /// The display name of the model that failed.
        from: String,
        /// The display name of the model asked now.
        to: String,
        /// The position of `to` in the list (from 0).
        index: usize,
        /// The stable code of the error that caused it (`llm.http_status`...).
        code: String,
        /// The error, in words.
        error: String,
    },
    /// The model's stream broke after its content had started (a transport error, an idle
    /// timeout, a stream cut short): the same request is asked once more of the same model
    /// without streaming ([`Model::stream_whole`]), before any fallback (emitted by
    /// [`Fallback`]; the engine journals and publishes it). What the broken stream delivered is
    /// dropped, except the calls the run already took (the whole answer's first ones are
    /// skipped in their place).
    Reask {
        /// The display name of the model asked again.
        model: String,
        /// The stable code of the error that broke the stream (`llm.transport`...).
        code: String,
        /// The error, in words.
        error: String,
    },
    /// The last event of a successful stream.
    Finish {
        /// Why the model stopped.
        reason: FinishReason,
    },
}

impl StreamEvent {
    /// True for events that carry model output (text or tool-call pieces). Once one of these
    /// has been delivered, a failed attempt is no longer retried.
    pub fn is_content(&self) -> bool {
        matches!(
            self,
            StreamEvent::TextDelta(_)
                | StreamEvent::ToolCallDelta { .. }
                | StreamEvent::ToolCallDone { .. }
        )
    }
}

/// Which model a run uses, as written on the command line or in a goal file.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModelSpec {
    /// `scripted:PATH`: replay a scripted-model file.
    Scripted(PathBuf),
    /// `openai:MODEL`: an OpenAI-compatible endpoint (`OPENAI_BASE_URL`, `OPENAI_API_KEY`).
    OpenAi(String),
    /// `anthropic:MODEL`: the Anthropic messages API (`ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`).
    Anthropic(String),
}

/// How a model entry states its context window, after the spec: `openai:a#window=8192`.
pub const WINDOW_SUFFIX: &str = "#window=";

impl ModelSpec {
    /// The context window (in tokens) one model entry states (`openai:a#window=8192`), and the
    /// spec without it; an entry that states none is returned whole.
    pub fn split_window(spec: &str) -> Result<(&str, Option<u64>), LlmError> {
        let Some((model, window)) = spec.rsplit_once(WINDOW_SUFFIX) else {
            return Ok((spec, None));
        };
        match window.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok((model.trim_end(), Some(n))),
            _ => Err(LlmError::InvalidSpec {
                spec: spec.to_string(),
                reason: format!(
                    "`{WINDOW_SUFFIX}` needs a whole number of tokens above 0, found `{window}`"
                ),
            }),
        }
    }

    /// The smallest context window the models of a comma-separated list state
    /// (`openai:a#window=8192,openai:b`): a context that fits it fits every model that says.
    /// None when none states one (or the list does not parse: building its models says why).
    pub fn window_of_list(specs: &str) -> Option<u64> {
        specs
            .split(',')
            .filter_map(|one| Self::split_window(one.trim()).ok().and_then(|(_, w)| w))
            .min()
    }

    /// Parses `scripted:PATH`, `openai:MODEL` or `anthropic:MODEL`, each optionally followed by
    /// the model's context window (`#window=TOKENS`, [`ModelSpec::split_window`]).
    pub fn parse(spec: &str) -> Result<ModelSpec, LlmError> {
        let unknown = || LlmError::UnknownSpec {
            spec: spec.to_string(),
        };
        let (spec, _) = Self::split_window(spec)?;
        let (kind, rest) = spec.split_once(':').ok_or_else(unknown)?;
        if rest.trim().is_empty() {
            return Err(LlmError::InvalidSpec {
                spec: spec.to_string(),
                reason: format!("`{kind}:` needs a value after the colon"),
            });
        }
        match kind {
            "scripted" => Ok(ModelSpec::Scripted(PathBuf::from(rest))),
            "openai" => Ok(ModelSpec::OpenAi(rest.to_string())),
            "anthropic" => Ok(ModelSpec::Anthropic(rest.to_string())),
            _ => Err(unknown()),
        }
    }

    /// Parses a comma-separated list of specs (`openai:a,anthropic:b`): the models an agent
    /// tries in order (see [`Fallback`]). Blanks around each spec are ignored; an empty one is
    /// an error.
    pub fn parse_list(specs: &str) -> Result<Vec<ModelSpec>, LlmError> {
        specs
            .split(',')
            .map(|one| {
                let one = one.trim();
                if one.is_empty() {
                    return Err(LlmError::InvalidSpec {
                        spec: specs.to_string(),
                        reason: "a comma-separated model list has an empty entry".into(),
                    });
                }
                ModelSpec::parse(one)
            })
            .collect()
    }

    /// Builds the model, reading keys and base URLs from the environment. The model is not
    /// wrapped in [`Retrying`]; callers choose the policy.
    pub fn build(&self) -> Result<Arc<dyn Model>, LlmError> {
        Ok(match self {
            ModelSpec::Scripted(path) => Arc::new(ScriptedModel::load(path)?),
            ModelSpec::OpenAi(model) => Arc::new(OpenAi::from_env(model)?),
            ModelSpec::Anthropic(model) => Arc::new(Anthropic::from_env(model)?),
        })
    }
}
