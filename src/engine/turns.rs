//! The model streams of a run: each agent's open stream, polled in turn, its items handed to
//! that turn's [`TurnReader`] (the sans-IO core's), which makes them machine inputs. A long
//! text delta (a scripted model's or a replay's whole answer) is parsed on a task of its own,
//! beside the driver, in pieces whose calls reach the machine as they are parsed; a provider's
//! few-character deltas are parsed where they are read, so no hand-over between tasks delays a
//! call. A stream is started (its request built and sent, up to its first item) on a task of
//! its own too: a long context is serialised beside the driver.
//!
//! Deliberately not here: what an item means (the reader's) or what the inputs mean (the
//! machine's).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;

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
/// text deltas it saw, to publish live, then the machine inputs.
pub(super) struct Read {
    /// The agent whose turn it is.
    pub frame: FrameKey,
    /// That turn's step.
    pub step: u32,
    /// Each text delta, in order.
    pub deltas: Vec<String>,
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

/// Every open model stream of a run, read concurrently. Closing one drops it at once (which
/// closes its connection), with whatever its reader was still parsing.
#[derive(Default)]
pub(super) struct Turns {
    open: BTreeMap<FrameKey, Open>,
    /// Where the next poll starts (round robin between agents).
    cursor: usize,
}

/// One agent's open turn: its stream, its step and its reader.
struct Open {
    /// The stream, once started.
    stream: Option<crate::llm::EventStream>,
    /// The stream being started on a task of its own: the request built and sent, up to its
    /// first item (a long context is serialised beside the driver, not on it).
    starting: Option<Starting>,
    step: u32,
    /// The turn's reader; away while it parses a long text delta on its own task.
    reader: Option<TurnReader>,
    away: Option<Away>,
}

/// One item of a model stream (`None`: the stream ended).
type Item = Option<Result<StreamEvent, crate::llm::LlmError>>;

/// A stream's start on a task of its own: the task gives back the stream and its first item.
struct Starting(tokio::task::JoinHandle<(crate::llm::EventStream, Item)>);

impl Drop for Starting {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A reader parsing a long text delta on its own task: what it parsed so far comes through
/// `rx`, and the task gives the reader back when the text is done.
struct Away {
    rx: mpsc::Receiver<Piece>,
    task: tokio::task::JoinHandle<TurnReader>,
}

impl Drop for Away {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the reading task sends for one piece of the text.
struct Piece {
    deltas: Vec<String>,
    inputs: Vec<RunInput>,
}

/// A text delta longer than [`LONG_TEXT`] is parsed on a task of its own, in pieces, each
/// piece's inputs handed over before the next is parsed: the driver takes the first calls
/// while the rest is parsed beside it. A scripted model, a replay or a provider that does not
/// stream sends a whole answer as one delta; a provider streams deltas of a few characters,
/// which are parsed where they are read, with no hand-over between tasks in the way of the
/// first call's latency.
///
/// The pieces grow from [`FIRST_PIECE_BYTES`], doubling, to this many bytes, and the task
/// yields after each: the first calls arrive after a few hundred bytes are parsed (a piece of
/// 8 KiB holds about a hundred calls, a quarter of a millisecond of parsing before the first
/// could start), an activity those calls launched waits for one piece at most, not for the
/// rest of the text, and a long answer still crosses between tasks once per 2 KiB.
const PIECE_BYTES: usize = 2 * 1024;

/// The first piece of a long text delta, in bytes (see [`PIECE_BYTES`]).
const FIRST_PIECE_BYTES: usize = 512;

/// A text delta longer than this is parsed on a task of its own (see [`PIECE_BYTES`]).
const LONG_TEXT: usize = PIECE_BYTES;

/// How many pieces the parsing task may be ahead of the driver.
const PIECES_AHEAD: usize = 4;

/// Parses `text` through `reader` piece by piece, sending each piece's inputs on; gives the
/// reader back. The text's delta counts once, with all its characters.
async fn parse_long(
    frame: FrameKey,
    mut reader: TurnReader,
    text: String,
    tx: mpsc::Sender<Piece>,
) -> TurnReader {
    let mut total = Some(text.clone());
    for piece in pieces(&text, FIRST_PIECE_BYTES, PIECE_BYTES) {
        let mut deltas = Vec::new();
        let item = Some(Ok(StreamEvent::TextDelta(piece.to_string())));
        let (inputs, _) = reader.read(frame, item, &mut |_, _| {
            deltas.extend(total.take());
        });
        if !(deltas.is_empty() && inputs.is_empty())
            && tx.send(Piece { deltas, inputs }).await.is_err()
        {
            break;
        }
        // The calls just handed over launch activities on this runtime: they run before the
        // next piece is parsed, not behind the whole text.
        tokio::task::yield_now().await;
    }
    reader
}

/// What one poll of a turn gave: text delta sizes, inputs, and whether the turn ended.
type Polled = (Vec<String>, Vec<RunInput>, bool);

/// The end of a turn whose reader was lost (its parsing task panicked).
fn reader_lost(frame: FrameKey) -> Polled {
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

impl Open {
    /// The next thing this turn's reader made, from the parsing task or from the stream.
    fn poll(&mut self, frame: FrameKey, cx: &mut std::task::Context<'_>) -> Poll<Polled> {
        let mut first = None;
        if let Some(starting) = &mut self.starting {
            match std::pin::Pin::new(&mut starting.0).poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok((stream, item))) => {
                    self.stream = Some(stream);
                    self.starting = None;
                    first = Some(item);
                }
                Poll::Ready(Err(_)) => {
                    self.starting = None;
                    return Poll::Ready(reader_lost(frame));
                }
            }
        }
        loop {
            if let Some(away) = &mut self.away {
                match away.rx.poll_recv(cx) {
                    Poll::Ready(Some(p)) => return Poll::Ready((p.deltas, p.inputs, false)),
                    Poll::Pending => return Poll::Pending,
                    // The text is parsed: the reader comes back.
                    Poll::Ready(None) => match std::pin::Pin::new(&mut away.task).poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Ok(reader)) => {
                            self.reader = Some(reader);
                            self.away = None;
                        }
                        Poll::Ready(Err(_)) => {
                            self.away = None;
                            return Poll::Ready(reader_lost(frame));
                        }
                    },
                }
            }
            if self.reader.is_none() {
                return Poll::Ready(reader_lost(frame));
            }
            let item = match first.take() {
                Some(item) => item,
                None => {
                    let Some(stream) = self.stream.as_mut() else {
                        return Poll::Ready(reader_lost(frame));
                    };
                    match stream.poll_next_unpin(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(item) => item,
                    }
                }
            };
            let item = match item {
                Some(Ok(StreamEvent::TextDelta(text))) if text.len() > LONG_TEXT => {
                    if let Some(reader) = self.reader.take() {
                        let (tx, rx) = mpsc::channel(PIECES_AHEAD);
                        let task = tokio::spawn(parse_long(frame, reader, text, tx));
                        self.away = Some(Away { rx, task });
                    }
                    continue;
                }
                item => item,
            };
            let Some(reader) = self.reader.as_mut() else {
                return Poll::Ready(reader_lost(frame));
            };
            let mut deltas = Vec::new();
            let (inputs, ended) =
                reader.read(frame, item, &mut |_, text| deltas.push(text.to_string()));
            if deltas.is_empty() && inputs.is_empty() && !ended {
                continue;
            }
            return Poll::Ready((deltas, inputs, ended));
        }
    }
}

/// `text` cut at character boundaries into pieces of at least `first` bytes, then twice that,
/// and so on up to `most` (the last piece shorter).
fn pieces(text: &str, first: usize, most: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    let mut size = first.max(1);
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut cut = size.min(rest.len());
        size = (size * 2).min(most.max(1));
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
    /// model named `model`), dropping the first `skip` calls. A long text delta is parsed on a
    /// task of its own, so this needs a tokio runtime.
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
                stream: None,
                starting: Some(Starting(tokio::spawn(async move {
                    let mut stream = stream;
                    let first = stream.next().await;
                    (stream, first)
                }))),
                step,
                reader: Some(reader),
                away: None,
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
            Poll::Ready(r) => r,
            Poll::Pending => None,
        }
    }

    fn poll_next(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Option<Read>> {
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
            let Poll::Ready((deltas, inputs, ended)) = o.poll(frame, cx) else {
                continue;
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
            let parts: Vec<&str> = pieces(&text, size, size).collect();
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
        assert_eq!(pieces("", 8, 8).count(), 0);
    }

    #[test]
    fn pieces_grow_from_the_first_size_to_the_largest() {
        let text = "x".repeat(100);
        let sizes: Vec<usize> = pieces(&text, 4, 32).map(str::len).collect();
        assert_eq!(sizes, [4, 8, 16, 32, 32, 8]);
        let text = "é".repeat(20);
        let parts: Vec<&str> = pieces(&text, 3, 8).collect();
        assert_eq!(parts.concat(), text);
        assert_eq!(
            parts[0].len(),
            4,
            "the first piece ends after its character"
        );
    }
}
