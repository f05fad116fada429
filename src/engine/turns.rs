//! The model streams of a run. Each agent's open turn is read on its own task: the task polls
//! the stream and hands each item to that turn's [`TurnReader`] (the sans-IO core's), which
//! makes machine inputs; the driver receives them ready-made. So parsing a model's answer runs
//! beside the driver, on another core, and a long answer's calls reach the machine as they are
//! parsed rather than once the whole text is.
//!
//! Deliberately not here: what an item means (the reader's) or what the inputs mean (the
//! machine's).

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use tokio::sync::mpsc;

use crate::llm::{Fallback, Request, Settings, StreamEvent};
use crate::machine::{AgentConfig, FrameKey, RunError, RunInput, TurnReader};

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

/// What a turn's reader made of one stream item (or of one piece of a long text delta): the
/// sizes of the text deltas it saw, to publish live, then the machine inputs.
pub(super) struct Read {
    /// The agent whose turn it is.
    pub frame: FrameKey,
    /// That turn's step.
    pub step: u32,
    /// Characters of each text delta, in order.
    pub deltas: Vec<u64>,
    /// The inputs, in order.
    pub inputs: Vec<RunInput>,
}

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

/// Every open model turn of a run, read concurrently (each on its own task). Closing one stops
/// its task, which drops the stream at once (closing its connection); what it had read and not
/// yet handed over is dropped with it.
#[derive(Default)]
pub(super) struct Turns {
    open: BTreeMap<FrameKey, Open>,
    /// Where the next poll starts (round robin between agents).
    cursor: usize,
}

/// One agent's open turn: its step, and the task reading it.
struct Open {
    step: u32,
    rx: mpsc::Receiver<Piece>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the reading task sends: one [`Read`]'s contents, and whether the turn ended with it.
struct Piece {
    deltas: Vec<u64>,
    inputs: Vec<RunInput>,
    ended: bool,
}

/// A text delta longer than this is handed to the reader in pieces of about this many bytes,
/// each piece's inputs sent on before the next is parsed (a scripted model sends its whole
/// answer as one delta; a provider's deltas are a few characters).
const PIECE_BYTES: usize = 8 * 1024;

/// How many pieces a reading task may have sent that the driver has not taken yet.
const PIECES_AHEAD: usize = 4;

/// Reads `stream` through `reader` until the turn ends (or the receiver is gone).
async fn read_turn(
    frame: FrameKey,
    mut stream: crate::llm::EventStream,
    mut reader: TurnReader,
    tx: mpsc::Sender<Piece>,
) {
    loop {
        let item = stream.next().await;
        if let Some(Ok(StreamEvent::TextDelta(text))) = &item
            && text.len() > PIECE_BYTES
        {
            // One delta event for the whole text, as if it had been read at once.
            let mut total = Some(text.chars().count() as u64);
            for piece in pieces(text, PIECE_BYTES) {
                let mut deltas = Vec::new();
                let item = Some(Ok(StreamEvent::TextDelta(piece.to_string())));
                let (inputs, _) = reader.read(frame, item, &mut |_, _| {
                    deltas.extend(total.take());
                });
                if !send(&tx, deltas, inputs, false).await {
                    return;
                }
            }
            continue;
        }
        let mut deltas = Vec::new();
        let (inputs, ended) = reader.read(frame, item, &mut |_, chars| deltas.push(chars));
        if !send(&tx, deltas, inputs, ended).await || ended {
            return;
        }
    }
}

/// Sends a piece unless it carries nothing; false once the receiver is gone.
async fn send(
    tx: &mpsc::Sender<Piece>,
    deltas: Vec<u64>,
    inputs: Vec<RunInput>,
    ended: bool,
) -> bool {
    if deltas.is_empty() && inputs.is_empty() && !ended {
        return true;
    }
    tx.send(Piece {
        deltas,
        inputs,
        ended,
    })
    .await
    .is_ok()
}

/// `text` cut at character boundaries into pieces of at least `size` bytes (the last shorter).
fn pieces(text: &str, size: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut cut = size.min(rest.len());
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        let (piece, tail) = rest.split_at(cut);
        rest = tail;
        Some(piece)
    })
}

impl Turns {
    /// Starts reading the answer to `req` (asked of `config`'s agent at `step`, first of the
    /// model named `model`), dropping the first `skip` calls. Needs a tokio runtime.
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
        let (tx, rx) = mpsc::channel(PIECES_AHEAD);
        let task = tokio::spawn(read_turn(frame, stream, reader, tx));
        self.open.insert(frame, Open { step, rx, task });
    }

    /// Stops reading an agent's stream; its task stops and the stream is dropped now.
    pub fn close(&mut self, frame: FrameKey) {
        self.open.remove(&frame);
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// What the reader of any open turn made next; a turn it ended is closed. Pending while
    /// every turn is.
    pub async fn next(&mut self) -> Option<Read> {
        if self.open.is_empty() {
            return std::future::pending().await;
        }
        futures::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    /// [`Turns::next`], if something is already there.
    pub fn try_next(&mut self) -> Option<Read> {
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        match self.poll_next(&mut cx) {
            std::task::Poll::Ready(r) => r,
            std::task::Poll::Pending => None,
        }
    }

    fn poll_next(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Read>> {
        use std::task::Poll;
        let n = self.open.len();
        if n == 0 {
            return Poll::Pending;
        }
        let start = self.cursor % n;
        for i in (start..n).chain(0..start) {
            let Some((&frame, o)) = self.open.iter_mut().nth(i) else {
                continue;
            };
            let step = o.step;
            let (deltas, inputs, ended) = match o.rx.poll_recv(cx) {
                Poll::Pending => continue,
                Poll::Ready(Some(p)) => (p.deltas, p.inputs, p.ended),
                // The task stopped without ending the turn (it panicked): the turn ends here.
                Poll::Ready(None) => {
                    let error = RunError::new(
                        "llm.incomplete_stream",
                        "the model's answer could not be read to its end",
                    );
                    let closed = RunInput::StreamClosed {
                        frame,
                        error: Some(Box::new(error)),
                        finish_reason: None,
                    };
                    (Vec::new(), vec![closed], true)
                }
            };
            self.cursor = i + 1;
            if ended {
                self.close(frame);
            }
            return Poll::Ready(Some(Read {
                frame,
                step,
                deltas,
                inputs,
            }));
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::pieces;

    #[test]
    fn pieces_end_at_character_boundaries_and_lose_nothing() {
        let text = "a†é€b".repeat(50);
        for size in [1, 2, 3, 4, 7, 64, 1000] {
            let parts: Vec<&str> = pieces(&text, size).collect();
            assert_eq!(parts.concat(), text, "size {size}");
            let last = parts.len() - 1;
            for (i, p) in parts.iter().enumerate() {
                assert!(!p.is_empty());
                assert!(
                    i == last || p.len() >= size,
                    "size {size}: a short piece mid-text"
                );
                assert!(
                    p.len() < size + 4,
                    "size {size}: a piece past its character"
                );
            }
        }
        assert_eq!(pieces("", 8).count(), 0);
    }
}
