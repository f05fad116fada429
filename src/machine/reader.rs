//! Reading one model turn, sans IO: each item of an agent's stream of normalised model events
//! becomes machine inputs (calls the moment their array element closes, the output, usage,
//! retries, fallbacks, problems, and the stream's end with its finish reason), and an answer
//! that is not a usable Solution becomes what the model is told (`context::correction`), with a
//! usage estimate when the provider reports none.
//!
//! Calls and outputs of an answer constrained by OpenAI strict mode (the provider says so with
//! `StreamEvent::Strict`) lose here, before they are journaled, the `null`s strict mode made the
//! model write for what it left out (`llm::drop_strict_nulls`, driven by the agent's composed
//! schema).
//!
//! Deliberately not here: polling streams (the engine's `Turns` holds them and hands each item
//! here) and what the inputs mean (the machine decides).

use std::sync::Arc;

use serde_json::{Value, json};

use super::{AgentConfig, FrameKey, RunError, RunInput};
use crate::context::correction::{self, Received};
use crate::llm::{
    FINAL_OUTPUT_TOOL, FinishReason, LlmError, StreamEvent, ToolCallOutcome, call_from_tool_call,
    drop_strict_nulls_in_call, drop_strict_nulls_in_output,
};
use crate::plan::{ParseErrorKind, ParseEvent, SolutionParser};
use crate::protocol::Call;

/// Reads one model turn of one agent: see the module docs.
pub struct TurnReader {
    parser: SolutionParser,
    saw_text: bool,
    /// Calls at the start of the answer the run already took (before a restart, or from a
    /// stream that broke and was re-asked): that many are dropped.
    skip: usize,
    /// Calls (readable or not) the current answer gave so far, dropped ones included.
    seen: usize,
    /// The provider reported usage for this turn.
    usage_seen: bool,
    /// Prompt-cache (read, write) tokens the provider reported, until they go with the usage.
    cache: Option<(u64, u64)>,
    /// What was sent, measured only for an estimate when the provider reports no usage (a
    /// large step's Request runs to megabytes), and the characters received.
    request: Arc<crate::llm::Request>,
    out_chars: usize,
    /// The agent: its composed schema is what strict mode transformed.
    config: Arc<AgentConfig>,
    /// What the attempt said was sent strict: the Solution schema (structured mode), and the
    /// functions (tool-call mode).
    strict_solution: bool,
    strict_functions: Vec<String>,
    /// The turn is asked in tool-call mode (text is commentary unless it holds a Solution).
    tool_mode: bool,
    /// The start of the text, for what the model is told when it was not a Solution.
    received: Received,
    /// Something came of the answer: a call (readable or not) or the output.
    yielded: bool,
    /// Top-level members a Solution does not have.
    unknown: Vec<(String, Value)>,
    /// The display name of the model answering (journaled with the turn's usage).
    model: String,
}

impl TurnReader {
    /// Reads the answer to `request`, asked of `config`'s agent of the model named `model`,
    /// dropping the first `skip` calls (already taken: a turn asked again).
    pub fn new(
        skip: usize,
        config: Arc<AgentConfig>,
        request: Arc<crate::llm::Request>,
        model: String,
    ) -> Self {
        let tool_mode = request.settings.mode == crate::llm::Mode::ToolCalls;
        TurnReader {
            parser: SolutionParser::new().streaming(),
            saw_text: false,
            skip,
            seen: 0,
            usage_seen: false,
            cache: None,
            request,
            out_chars: 0,
            config,
            strict_solution: false,
            strict_functions: Vec::new(),
            tool_mode,
            received: Received::default(),
            yielded: false,
            unknown: Vec::new(),
            model,
        }
    }

    /// Turns one item of the agent's stream (`None`: the stream ended) into machine inputs;
    /// `delta` is told of each text delta. True with them when the turn ended (its
    /// `stream_closed` is among them): read nothing more of that stream.
    pub fn read(
        &mut self,
        frame: FrameKey,
        item: Option<Result<StreamEvent, LlmError>>,
        delta: &mut dyn FnMut(FrameKey, &str),
    ) -> (Vec<RunInput>, bool) {
        let mut out = Vec::new();
        let ended = self.read_into(frame, item, delta, &mut out);
        // A turn asked again (after a restart, or after its stream broke): drop the calls
        // already taken.
        out.retain(|i| {
            if !matches!(i, RunInput::Call { .. } | RunInput::Unreadable { .. }) {
                return true;
            }
            self.seen += 1;
            self.seen > self.skip
        });
        (out, ended)
    }

    /// Forgets what a failed attempt sent (a retry starts over; none of it was content).
    fn restart(&mut self) {
        self.parser = SolutionParser::new().streaming();
        self.saw_text = false;
        self.cache = None;
        self.strict_solution = false;
        self.strict_functions.clear();
        self.received = Received::default();
        self.yielded = false;
        self.unknown.clear();
    }

    /// A whole new answer to the turn begins (another model, or the same one asked again
    /// whole): it starts over, and the calls the run already took are the first ones it drops.
    fn answer_again(&mut self) {
        self.restart();
        self.skip = self.skip.max(self.seen);
        self.seen = 0;
        self.usage_seen = false;
        self.out_chars = 0;
    }

    /// The end of the answer: the last parsed pieces, then what was wrong with it as a whole,
    /// if anything (the model is told, see `context::correction`).
    fn finish_answer(&mut self, frame: FrameKey, at_token_limit: bool, out: &mut Vec<RunInput>) {
        let error = if self.saw_text {
            match std::mem::take(&mut self.parser).finish() {
                Ok(evs) => {
                    self.parsed(frame, evs, out);
                    None
                }
                Err(e) => Some(e),
            }
        } else {
            None
        };
        let blank = self.received.is_blank();
        let problem = if self.tool_mode {
            match error {
                _ if self.yielded => None,
                _ if blank => Some(correction::empty(true)),
                Some(e) if e.kind != ParseErrorKind::NoSolution => {
                    Some(correction::parse_error(&e, &self.received, at_token_limit))
                }
                _ => Some(correction::no_tool_call(&self.received)),
            }
        } else {
            match error {
                _ if blank && !self.yielded => Some(correction::empty(false)),
                Some(e) => Some(correction::parse_error(&e, &self.received, at_token_limit)),
                None => None,
            }
        };
        let unknown = (!self.unknown.is_empty()).then(|| correction::unknown_fields(&self.unknown));
        for p in problem.into_iter().chain(unknown) {
            out.push(RunInput::Problem {
                frame,
                problem: p.message,
                code: Some(p.code.to_string()),
            });
        }
    }

    /// A call the model wrote, strict mode's nulls dropped when its schema was sent strict.
    fn call(&self, frame: FrameKey, mut call: Call, from_function: bool) -> RunInput {
        let strict = if from_function {
            self.strict_functions.contains(&call.tool)
        } else {
            self.strict_solution
        };
        if strict {
            drop_strict_nulls_in_call(&self.config.composed, &mut call);
        }
        // Parsed with the call: beside the driver when a long answer is (`engine::turns`).
        let parsed = crate::scheduler::Parsed::of(&call);
        RunInput::Call {
            frame,
            call: Arc::new(call),
            parsed,
        }
    }

    /// The output the model wrote, likewise.
    fn output(&self, frame: FrameKey, mut output: Value, from_function: bool) -> RunInput {
        let strict = if from_function {
            self.strict_functions.iter().any(|f| f == FINAL_OUTPUT_TOOL)
        } else {
            self.strict_solution
        };
        if strict {
            drop_strict_nulls_in_output(&self.config.composed, &mut output);
        }
        RunInput::Output { frame, output }
    }

    /// The inputs a piece of parsed Solution text gives.
    fn parsed(&mut self, frame: FrameKey, events: Vec<ParseEvent>, out: &mut Vec<RunInput>) {
        for ev in events {
            self.yielded |= matches!(ev, ParseEvent::Call { .. } | ParseEvent::Output(_));
            match ev {
                ParseEvent::Call { call: Ok(call), .. } => out.push(self.call(frame, call, false)),
                ParseEvent::Call {
                    call: Err(e), raw, ..
                } => out.push(RunInput::Unreadable {
                    frame,
                    raw: raw.to_string(),
                    reason: e.to_string(),
                }),
                ParseEvent::Output(output) => out.push(self.output(frame, output, false)),
                ParseEvent::UnknownField { key, value } => self.unknown.push((key, value)),
                ParseEvent::Solution(s) => {
                    if let Some(thoughts) = s.thoughts.filter(|t| !t.is_null() && *t != "") {
                        out.push(RunInput::Thoughts { frame, thoughts });
                    }
                }
            }
        }
    }

    /// Reads one item; true when it ended the turn (the stream closed or failed).
    fn read_into(
        &mut self,
        frame: FrameKey,
        item: Option<Result<StreamEvent, LlmError>>,
        delta: &mut dyn FnMut(FrameKey, &str),
        out: &mut Vec<RunInput>,
    ) -> bool {
        let reader = self;
        let at_token_limit = matches!(
            item,
            Some(Ok(StreamEvent::Finish {
                reason: FinishReason::Length
            }))
        );
        let finish_reason = match &item {
            Some(Ok(StreamEvent::Finish { reason })) => Some(reason.as_str().to_string()),
            _ => None,
        };
        match item {
            // A stream ends with `Finish` (a provider may keep the connection open after it).
            None | Some(Ok(StreamEvent::Finish { .. })) => {
                reader.finish_answer(frame, at_token_limit, out);
                if !reader.usage_seen {
                    // Honest accounting: the budget holds even when the server says nothing.
                    let (cache_read_tokens, cache_write_tokens) =
                        reader.cache.take().unwrap_or_default();
                    out.push(RunInput::Usage {
                        frame,
                        input_tokens: crate::llm::wire::json_chars(&reader.request.messages)
                            .div_ceil(4) as u64,
                        output_tokens: reader.out_chars.div_ceil(4) as u64,
                        estimated: true,
                        cache_read_tokens,
                        cache_write_tokens,
                        model: Some(reader.model.clone()),
                    });
                }
                out.push(RunInput::StreamClosed {
                    frame,
                    error: None,
                    finish_reason,
                });
                return true;
            }
            Some(Ok(StreamEvent::TextDelta(t))) => {
                reader.saw_text = true;
                reader.received.push(&t);
                reader.out_chars += t.chars().count();
                delta(frame, &t);
                let evs = reader.parser.feed(&t);
                reader.parsed(frame, evs, out);
            }
            Some(Ok(StreamEvent::Strict {
                solution,
                functions,
            })) => {
                reader.strict_solution = solution;
                reader.strict_functions = functions;
            }
            Some(Ok(StreamEvent::ToolCallDone {
                name, arguments, ..
            })) => {
                reader.yielded = true;
                match call_from_tool_call(&name, &arguments) {
                    Ok(ToolCallOutcome::Call(call)) => {
                        reader.out_chars += arguments.chars().count();
                        out.push(reader.call(frame, call, true))
                    }
                    Ok(ToolCallOutcome::Output(output)) => {
                        out.push(reader.output(frame, output, true))
                    }
                    Err(e) => out.push(RunInput::Unreadable {
                        frame,
                        raw: arguments,
                        reason: e.to_string(),
                    }),
                }
            }
            Some(Ok(StreamEvent::CacheUsage {
                read_tokens,
                write_tokens,
            })) => {
                // Providers send it before `Usage`; it is journaled with it.
                let (r, w) = reader.cache.unwrap_or_default();
                reader.cache = Some((
                    r.saturating_add(read_tokens),
                    w.saturating_add(write_tokens),
                ));
            }
            Some(Ok(StreamEvent::Usage {
                input_tokens,
                output_tokens,
            })) => {
                reader.usage_seen = true;
                let (cache_read_tokens, cache_write_tokens) =
                    reader.cache.take().unwrap_or_default();
                out.push(RunInput::Usage {
                    frame,
                    input_tokens,
                    output_tokens,
                    estimated: false,
                    cache_read_tokens,
                    cache_write_tokens,
                    model: Some(reader.model.clone()),
                });
            }
            Some(Ok(StreamEvent::Fallback {
                from,
                to,
                index,
                code,
                error,
            })) => {
                // The next model starts the turn over: what the failed one parsed is
                // discarded (none of it was content).
                reader.answer_again();
                reader.model.clone_from(&to);
                out.push(RunInput::Fallback {
                    frame,
                    from,
                    to,
                    index,
                    code,
                    error,
                });
            }
            Some(Ok(StreamEvent::Reask { model, code, error })) => {
                // The same model answers again, whole: what the broken stream parsed is
                // discarded, except the calls the run already took (the answer's first ones
                // are dropped in their place).
                reader.answer_again();
                out.push(RunInput::Reask {
                    frame,
                    model,
                    code,
                    error,
                });
            }
            Some(Ok(StreamEvent::Retry {
                attempt,
                status,
                wait,
                error,
            })) => {
                // A retried attempt starts over: what it parsed is discarded (none was content).
                reader.restart();
                out.push(RunInput::Retry {
                    frame,
                    attempt,
                    status,
                    wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                    error,
                });
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                let mut err = RunError::new("run.model_error", format!("the model failed: {e}"));
                let mut cause = json!({"code": e.code(), "message": e.to_string()});
                if matches!(e, LlmError::ContextOverflow { .. }) {
                    // The size of what was refused, for the run's error if it never fits.
                    cause["request_chars"] =
                        json!(crate::llm::wire::json_chars(&reader.request.messages));
                }
                err.cause = Some(cause);
                out.push(RunInput::StreamClosed {
                    frame,
                    error: Some(Box::new(err)),
                    finish_reason: None,
                });
                return true;
            }
        }
        false
    }
}
