//! The scripted model: replays a [`Script`] in-process, one turn per request, chunk by chunk with
//! the configured delays (tokio time, so tests can pause the clock). It is the embedded default
//! for examples, tests and benchmarks.
//!
//! Usage is estimated (characters / 4) so token budgets work offline. The request's timeouts do
//! not apply: the script is trusted to be finite.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;

use super::script::Rendered;
use super::wire::text_chars;
use super::{EventStream, FinishReason, LlmError, Mode, Model, Request, Script, StreamEvent};

/// A model that answers each request with the next turn of a script.
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    script: Arc<Script>,
    next: Arc<AtomicUsize>,
    name: String,
}

impl ScriptedModel {
    /// A model replaying `script`.
    pub fn new(script: Script) -> ScriptedModel {
        ScriptedModel {
            script: Arc::new(script),
            next: Arc::new(AtomicUsize::new(0)),
            name: "scripted".into(),
        }
    }

    /// Loads a script file (`llm.script_io`, `llm.script_invalid`). The model is named
    /// `scripted:` + the file's name, not the path: the path is resolved against the goal's
    /// folder or the working directory, so it differs between the process that started a run
    /// and one that resumes it (splitting the run's usage into two keys), and it is a machine
    /// path that must not reach spans or output.
    pub fn load(path: &Path) -> Result<ScriptedModel, LlmError> {
        let mut m = ScriptedModel::new(Script::load(path)?);
        let file = path.file_name().unwrap_or(path.as_os_str());
        m.name = format!("scripted:{}", file.to_string_lossy());
        Ok(m)
    }

    /// How many turns requests have consumed so far (including a failed extra request).
    pub fn turns_used(&self) -> usize {
        self.next.load(Ordering::SeqCst)
    }
}

impl Model for ScriptedModel {
    fn stream(&self, req: &Request) -> EventStream {
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        let Some(turn) = self.script.turns.get(n) else {
            let turns = self.script.turns.len();
            return futures::stream::once(async move { Err(LlmError::ScriptExhausted { turns }) })
                .boxed();
        };
        let input_chars: usize = req.messages.iter().map(text_chars).sum();
        let delay = turn.chunk_delay;
        let mut items: Vec<(Duration, Result<StreamEvent, LlmError>)> = Vec::new();
        let mut output_chars = 0;
        let mut chunk = |items: &mut Vec<_>, ev: StreamEvent, text: &str| {
            let d = if items.is_empty() {
                Duration::ZERO
            } else {
                delay
            };
            output_chars += text.chars().count();
            items.push((d, Ok(ev)));
        };
        let reason = match turn.render(req.settings.mode == Mode::ToolCalls, n) {
            Rendered::Error {
                status,
                retry_after_s,
                message,
            } => {
                let e = LlmError::HttpStatus {
                    status,
                    retry_after: retry_after_s.map(Duration::from_secs),
                    message,
                };
                return futures::stream::once(async move { Err(e) }).boxed();
            }
            Rendered::Text(chunks) => {
                for c in chunks {
                    chunk(&mut items, StreamEvent::TextDelta(c.clone()), &c);
                }
                FinishReason::Stop
            }
            Rendered::ToolCalls(calls) => {
                let any = !calls.is_empty();
                for (index, call) in calls.into_iter().enumerate() {
                    let mut pieces = call.argument_chunks.clone();
                    if pieces.is_empty() {
                        pieces.push(String::new());
                    }
                    for (i, piece) in pieces.iter().enumerate() {
                        let ev = StreamEvent::ToolCallDelta {
                            index,
                            id: (i == 0).then(|| call.id.clone()),
                            name: (i == 0).then(|| call.name.clone()),
                            arguments: piece.clone(),
                        };
                        chunk(&mut items, ev, piece);
                    }
                    items.push((
                        Duration::ZERO,
                        Ok(StreamEvent::ToolCallDone {
                            index,
                            id: call.id,
                            name: call.name,
                            arguments: call.argument_chunks.concat(),
                        }),
                    ));
                }
                if any {
                    FinishReason::ToolCalls
                } else {
                    FinishReason::Stop
                }
            }
        };
        let (input_tokens, output_tokens) = turn.usage.or_estimate(input_chars, output_chars);
        items.push((
            Duration::ZERO,
            Ok(StreamEvent::Usage {
                input_tokens,
                output_tokens,
            }),
        ));
        items.push((Duration::ZERO, Ok(StreamEvent::Finish { reason })));
        futures::stream::iter(items)
            .then(|(d, item)| async move {
                if !d.is_zero() {
                    tokio::time::sleep(d).await;
                }
                item
            })
            .boxed()
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn resume_after(&self, attempts: usize) {
        self.next.store(attempts, Ordering::SeqCst);
    }
}
