//! The model streams of a run: each agent's open stream, polled in turn, its items handed to
//! that turn's [`TurnReader`] (the sans-IO core's), which makes them machine inputs.
//!
//! Deliberately not here: what an item means (the reader's) or what the inputs mean (the
//! machine's).

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;

use crate::llm::{Fallback, LlmError, Request, Settings, StreamEvent};
use crate::machine::{AgentConfig, FrameKey, RunInput, TurnReader};

/// The request an agent's turn sends: its messages, its composed Solution schema and tools, and
/// the run's model settings with the agent's own mode when its goal names one. Every driver
/// (the embedded one, Temporal's turn activity) asks with this.
pub(super) fn request(
    settings: &Settings,
    config: &AgentConfig,
    messages: Vec<crate::protocol::Message>,
) -> Arc<Request> {
    let mut settings = settings.clone();
    if let Some(mode) = config.mode {
        settings.mode = mode;
    }
    Arc::new(Request {
        messages,
        schema: config.composed.clone(),
        tools: config.tools.clone(),
        settings,
    })
}

/// One item of some agent's model stream (`None`: the stream ended).
pub(super) type TurnItem = (FrameKey, Option<Result<StreamEvent, LlmError>>);

/// The models of a run: the run's own list, and those delegates name (by their specs,
/// comma-separated), each tried in order within a turn.
#[derive(Clone)]
pub(super) struct Models {
    pub root: Arc<Fallback>,
    pub by_spec: BTreeMap<String, Arc<Fallback>>,
}

impl Models {
    pub fn get(&self, spec: Option<&str>) -> Arc<Fallback> {
        spec.and_then(|s| self.by_spec.get(s))
            .cloned()
            .unwrap_or_else(|| self.root.clone())
    }
}

/// Every open model stream of a run, read concurrently. Closing one drops it at once (which
/// closes its connection).
#[derive(Default)]
pub(super) struct Turns {
    open: BTreeMap<FrameKey, Open>,
    /// Where the next poll starts (round robin between agents).
    cursor: usize,
}

/// One agent's open turn: its stream, its step and its reader.
struct Open {
    stream: crate::llm::EventStream,
    step: u32,
    reader: TurnReader,
}

impl Turns {
    /// Starts reading the answer to `req` (asked of `config`'s agent at `step`, first of the
    /// model named `model`), dropping the first `skip` calls.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        &mut self,
        frame: FrameKey,
        step: u32,
        skip: usize,
        config: Arc<AgentConfig>,
        req: &Arc<crate::llm::Request>,
        stream: crate::llm::EventStream,
        model: String,
    ) {
        let reader = TurnReader::new(skip, config, req.clone(), model);
        self.open.insert(
            frame,
            Open {
                stream,
                step,
                reader,
            },
        );
    }

    /// Stops reading an agent's stream; the stream is dropped now.
    pub fn close(&mut self, frame: FrameKey) {
        self.open.remove(&frame);
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// The next item of any open stream (`None` in the item: that stream ended). Pending while
    /// every stream is.
    pub async fn next(&mut self) -> Option<TurnItem> {
        if self.open.is_empty() {
            return std::future::pending().await;
        }
        futures::future::poll_fn(|cx| {
            let n = self.open.len();
            let start = self.cursor % n.max(1);
            let order: Vec<usize> = (start..n).chain(0..start).collect();
            for i in order {
                let Some((frame, o)) = self.open.iter_mut().nth(i) else {
                    continue;
                };
                if let std::task::Poll::Ready(item) = o.stream.poll_next_unpin(cx) {
                    self.cursor = i + 1;
                    return std::task::Poll::Ready(Some((*frame, item)));
                }
            }
            std::task::Poll::Pending
        })
        .await
    }

    /// The step of the turn an agent is streaming.
    pub fn step(&self, frame: FrameKey) -> u32 {
        self.open.get(&frame).map_or(0, |o| o.step)
    }

    /// Turns one stream item into machine inputs; `delta` is told of each text delta's size.
    /// A turn the item ended is closed.
    pub fn read(
        &mut self,
        (frame, item): TurnItem,
        delta: &mut dyn FnMut(FrameKey, u64),
    ) -> Vec<RunInput> {
        let Some(o) = self.open.get_mut(&frame) else {
            return Vec::new();
        };
        let (out, ended) = o.reader.read(frame, item, delta);
        if ended {
            self.close(frame);
        }
        out
    }
}
