//! A run's spans, derived from what it already records: fed every published event and the
//! journal beside it, [`RunSpans`] opens and closes the spans of the OpenTelemetry GenAI
//! conventions (the run, each step, each model turn, each call, each approval wait, nested
//! agents) and hands each finished one to its exporter, with the journal's own times.
//!
//! Ids are derived from the run id ([`super::ids`]), so a resumed run writes into the same
//! trace and links to the spans of the process before it. Events replayed from the journal on a
//! resume make spans marked `dagloop.replayed = true`, linked to the original: nothing is
//! reported as executed twice.
//!
//! Deliberately not here: IO of any kind (the exporter sends), clocks (events carry their
//! times), or recording content unless the pipeline says the operator opted in.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value as Json;

use super::ids::{self, SpanId, TraceId};
use super::metrics;
use super::record::{Attrs, Kind, Link, Shared, SpanEvent, SpanRecord, Value};
use crate::fxhash::FxHashMap;
use crate::machine::{AgentConfig, JournalEntry, RunInput};
use crate::protocol::{Event, EventKind, Millis};

/// Where finished spans go.
pub trait SpanExport: Send + Sync {
    /// Takes one finished span (never blocks on the network). The span is lent: its builder
    /// reuses the record's buffers for the next one.
    fn export(&self, span: &SpanRecord);

    /// How many links a span keeps; the rest are counted in `dropped_links`. The
    /// OpenTelemetry default (`OTEL_SPAN_LINK_COUNT_LIMIT`) is 128: a fan-in that waited on a
    /// fan-out of thousands would otherwise make a span of megabytes, which collectors refuse.
    fn link_limit(&self) -> usize {
        LINK_LIMIT
    }

    /// The most characters a string attribute keeps (`OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT`,
    /// `OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`); None: no limit, the OpenTelemetry default.
    fn value_limit(&self) -> Option<usize> {
        None
    }
}

/// Cuts `s` to its first `limit` characters.
fn cut(s: &mut String, limit: usize) {
    if let Some((at, _)) = s.char_indices().nth(limit) {
        s.truncate(at);
    }
}

/// Links a span keeps unless its exporter says otherwise.
pub const LINK_LIMIT: usize = 128;

/// Spans handed to an exporter by this process, every run's ([`exported`]).
static EXPORTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many spans this process has handed to its exporter so far (a benchmark compares it with
/// what its collector received: the export pipeline dropped the difference).
pub fn exported() -> u64 {
    EXPORTED.load(std::sync::atomic::Ordering::Relaxed)
}

/// The key of an agent's frame: 0 for the run's own agent, else its delegate call.
type Frame = u64;

struct Open {
    id: SpanId,
    start: Millis,
    replayed: bool,
}

/// A tool's name, its calls' span name and the attributes every call span of the tool shares
/// (the run's id, the operation, the tool's name, type and activity), made once per tool of a
/// run.
#[derive(Clone)]
struct ToolNames {
    tool: Arc<str>,
    span: Arc<str>,
    attrs: Arc<Shared>,
}

struct CallState {
    tool: ToolNames,
    frame: Frame,
    step: u32,
    received: Millis,
    started: Option<Millis>,
    asked: Option<(Millis, bool)>,
    /// The calls whose writes it read, as its `started` (or `approval_requested`) event names
    /// them.
    read_from: Vec<crate::protocol::CallId>,
    params: Option<Json>,
    interrupted: bool,
    replayed: bool,
    incarnation: u32,
}

struct Turn {
    open: Open,
    step: u32,
    attempt: u32,
    first_call: Option<Millis>,
    events: Vec<SpanEvent>,
    usage: Option<(u64, u64, bool)>,
    model: Option<String>,
    /// When the model's stream for it closed (the journal's `stream_closed`): the end of the
    /// model's work, while the turn itself lasts until its step drains.
    closed: Option<Millis>,
    /// Why the model stopped, as the journal's `stream_closed` says.
    finish_reason: Option<String>,
}

/// The spans of one run in progress.
pub struct RunSpans {
    run_id: Arc<str>,
    trace: TraceId,
    keys: ids::SpanKeys,
    export: Option<Arc<dyn SpanExport>>,
    metrics: bool,
    content: bool,
    /// Journal entries up to this seq were recorded by an earlier process (replayed here).
    replayed_upto: u64,
    /// Resumes seen in the journal so far: the incarnation of what is replayed now.
    incarnation: u32,
    /// The incarnation of this process (0 for a new run, n after the n-th resume).
    own: u32,
    /// The incarnation each finished call ran in.
    /// (A call missing from it ran in incarnation 0.)
    done: FxHashMap<u64, u32>,
    /// Journal entries already looked at.
    scanned: usize,
    root: Option<Open>,
    workflow: bool,
    agents: BTreeMap<String, String>,
    activities: BTreeMap<String, Arc<str>>,
    /// Nested agents' spans, by their delegate call.
    nested: BTreeMap<Frame, Open>,
    steps: BTreeMap<Frame, (u32, Open)>,
    turns: BTreeMap<Frame, Turn>,
    calls: FxHashMap<u64, CallState>,
    /// Each tool's names ([`ToolNames`]), by tool.
    tool_names: BTreeMap<String, ToolNames>,
    /// Usage reported for each frame since its turn was last closed.
    usage: BTreeMap<Frame, (u64, u64, bool, Option<String>)>,
    /// The attributes every span of the run carries (its id).
    run_attrs: Arc<Shared>,
    /// The last span emitted, its buffers kept for the next ([`RunSpans::span`]).
    spare: Option<SpanRecord>,
    /// The attribute lists of its links, emptied, for the next span's links
    /// ([`RunSpans::link`]).
    spare_links: Vec<Attrs>,
}

fn frame_of(e: &Event) -> Frame {
    e.parent.map_or(0, |p| p.0)
}

fn frame_key(f: crate::machine::FrameKey) -> Frame {
    f.map_or(0, |c| c.0)
}

impl RunSpans {
    /// The spans of `run_id`, whose agent is `config`; `stored` is the journal a resumed run
    /// starts from (empty for a new run). `export` None: metrics only.
    pub fn new(
        run_id: &str,
        config: &AgentConfig,
        stored: &[JournalEntry],
        export: Option<Arc<dyn SpanExport>>,
        metrics: bool,
        content: bool,
    ) -> Self {
        let mut agents = BTreeMap::new();
        let mut activities = BTreeMap::new();
        collect_tools(config, &mut agents, &mut activities);
        let id: Arc<str> = Arc::from(run_id);
        let run_attrs = Arc::new(Shared::new(vec![(
            "dagloop.run.id",
            Value::from(id.clone()),
        )]));
        let mut spans = RunSpans {
            run_id: id,
            trace: ids::trace_id(run_id),
            keys: ids::SpanKeys::new(run_id),
            export,
            metrics,
            content,
            replayed_upto: stored.last().map_or(0, |e| e.seq),
            incarnation: 0,
            own: if stored.is_empty() {
                0
            } else {
                1 + stored
                    .iter()
                    .filter(|e| matches!(e.input, RunInput::Resumed))
                    .count() as u32
            },
            done: FxHashMap::default(),
            scanned: 0,
            root: None,
            workflow: !config.delegates.is_empty(),
            agents,
            activities,
            nested: BTreeMap::new(),
            steps: BTreeMap::new(),
            turns: BTreeMap::new(),
            calls: FxHashMap::default(),
            tool_names: BTreeMap::new(),
            usage: BTreeMap::new(),
            run_attrs,
            spare: None,
            spare_links: Vec::new(),
        };
        spans.predecessor(stored);
        spans
    }

    /// A resumed run: reports the run span of the process before this one, which never ended
    /// it (it was killed, or parked its run), so that this process's `resumed_from` link points
    /// at a span that exists. It lasts from that process's start (the run's start, or the
    /// `resumed` entry it journaled) to its last journal entry, with status `stopped`.
    fn predecessor(&mut self, stored: &[JournalEntry]) {
        if self.own == 0 || self.export.is_none() {
            return;
        }
        let inc = self.own - 1;
        let start = if inc == 0 {
            stored.first().map(|e| e.at)
        } else {
            stored
                .iter()
                .filter(|e| matches!(e.input, RunInput::Resumed))
                .nth(inc as usize - 1)
                .map(|e| e.at)
        };
        let (Some(start), Some(end)) = (start, stored.last().map(|e| e.at)) else {
            return;
        };
        let open = Open {
            id: self.id("run", &[], inc),
            start,
            replayed: false,
        };
        let mut s = self.span(&self.root_name(), None, &open, end);
        s.attrs.extend([
            ("gen_ai.operation.name", Value::from(self.operation())),
            ("gen_ai.agent.name", Value::from("dagloop")),
            ("dagloop.run.status", Value::from("stopped")),
        ]);
        if inc > 0 {
            s.attrs.push(("dagloop.run.resumed", Value::Bool(true)));
            let link = self.link(self.id("run", &[], inc - 1), "resumed_from", None);
            s.links.push(link);
        }
        self.emit(s);
    }

    /// The name of the run's span.
    fn root_name(&self) -> String {
        if self.workflow {
            "invoke_workflow".to_string()
        } else {
            "invoke_agent dagloop".to_string()
        }
    }

    /// The run span's `gen_ai.operation.name`.
    fn operation(&self) -> &'static str {
        if self.workflow {
            "invoke_workflow"
        } else {
            "invoke_agent"
        }
    }

    /// The run's trace id.
    pub fn trace_id(&self) -> TraceId {
        self.trace
    }

    fn id(&self, what: &str, key: &[u64], incarnation: u32) -> SpanId {
        self.keys.span_id(what, key, incarnation)
    }

    fn emit(&mut self, mut span: SpanRecord) {
        // Spans replayed from the journal were exported by the process that made them; only
        // calls are reported again (marked, under a span id of their own).
        let replayed = span.attrs.iter().any(|(k, _)| *k == "dagloop.replayed");
        if replayed && !span.name.starts_with("execute_tool") {
            self.spare = Some(span);
            return;
        }
        if let Some(x) = &self.export {
            let limit = x.link_limit();
            if span.links.len() > limit {
                let over = u32::try_from(span.links.len() - limit).unwrap_or(u32::MAX);
                span.dropped_links = span.dropped_links.saturating_add(over);
                span.links.truncate(limit);
            }
            if let Some(limit) = x.value_limit() {
                span.unshare();
                for (_, v) in &mut span.attrs {
                    match v {
                        Value::Str(_) | Value::Shared(_) => {
                            if let Some(text) = v.as_str()
                                && text.chars().nth(limit).is_some()
                            {
                                let mut text = text.to_string();
                                cut(&mut text, limit);
                                *v = Value::from(text);
                            }
                        }
                        Value::Strs(list) => list.iter_mut().for_each(|s| cut(s, limit)),
                        Value::Id(n) => {
                            let mut text = n.to_string();
                            if text.len() > limit {
                                cut(&mut text, limit);
                                *v = Value::from(text);
                            }
                        }
                        Value::Int(_) | Value::Bool(_) => {}
                    }
                }
            }
            EXPORTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            x.export(&span);
        }
        self.spare = Some(span);
    }

    /// A new span, in the buffers of the last one emitted when there is one: a run makes a
    /// span per call, and allocating its name, attributes, events and links each time was a
    /// fifth of what the span worker spent on a call.
    fn span(&mut self, name: &str, parent: Option<SpanId>, open: &Open, end: Millis) -> SpanRecord {
        let shared = self.run_attrs.clone();
        self.span_sharing(name, parent, open, end, shared)
    }

    /// A new span ([`RunSpans::span`]) whose shared attributes are `shared`, which start with
    /// the run's id.
    fn span_sharing(
        &mut self,
        name: &str,
        parent: Option<SpanId>,
        open: &Open,
        end: Millis,
        shared: Arc<Shared>,
    ) -> SpanRecord {
        // Only the buffers are kept; every field is set here.
        let (mut text, mut attrs, mut events, mut links) = match self.spare.take() {
            Some(s) => (s.name, s.attrs, s.events, s.links),
            // Room for the most attributes any span sets (a call's), so that adding them never
            // reallocates.
            None => (
                String::new(),
                Vec::with_capacity(14),
                Vec::new(),
                Vec::new(),
            ),
        };
        text.clear();
        text.push_str(name);
        attrs.clear();
        events.clear();
        self.spare_links.extend(links.drain(..).map(|l| {
            let mut attrs = l.attrs;
            attrs.clear();
            attrs
        }));
        if open.replayed {
            attrs.push(("dagloop.replayed", Value::Bool(true)));
        }
        SpanRecord {
            trace: self.trace,
            id: open.id,
            parent,
            name: text,
            kind: Kind::Internal,
            start: open.start,
            end: end.max(open.start),
            shared: Some(shared),
            attrs,
            events,
            links,
            dropped_links: 0,
            error: None,
        }
    }

    /// Whether [`RunSpans::observe_new`] needs to see a journal entry: those that say what the
    /// events do not (usage, a stream's end, interruptions, resumes). A caller that feeds the
    /// spans from elsewhere hands over only these.
    pub fn reads(input: &RunInput) -> bool {
        matches!(
            input,
            RunInput::Resumed
                | RunInput::Interrupted { .. }
                | RunInput::StreamClosed { .. }
                | RunInput::Usage { .. }
        )
    }

    /// Looks at the journal entries added since the last event (usage, interruptions, resumes).
    fn scan(&mut self, new: &[JournalEntry]) {
        for e in new {
            match &e.input {
                RunInput::Resumed => self.incarnation += 1,
                RunInput::Interrupted { call } => {
                    if let Some(c) = self.calls.get_mut(&call.0) {
                        c.interrupted = true;
                    }
                }
                RunInput::StreamClosed {
                    frame,
                    finish_reason,
                    ..
                } => {
                    if let Some(t) = self.turns.get_mut(&frame_key(*frame)) {
                        t.closed = Some(e.at);
                        t.finish_reason.clone_from(finish_reason);
                    }
                }
                RunInput::Usage {
                    frame,
                    input_tokens,
                    output_tokens,
                    estimated,
                    model,
                    ..
                } => {
                    let u = self.usage.entry(frame_key(*frame)).or_default();
                    u.0 += input_tokens;
                    u.1 += output_tokens;
                    u.2 |= estimated;
                    if model.is_some() {
                        u.3.clone_from(model);
                    }
                }
                _ => {}
            }
        }
    }

    /// Whether an event says anything the spans or metrics use. A call's `blocked`,
    /// `unblocked`, `unresolved` and `written` events do not (its `started` names what it read),
    /// nor do live-only ones; a caller may leave them out (`feed` does: half of a call's events).
    pub fn uses(e: &Event) -> bool {
        if e.kind.is_ephemeral() {
            return false;
        }
        e.call.is_none()
            || matches!(
                e.kind,
                EventKind::CallReceived { .. }
                    | EventKind::ApprovalRequested { .. }
                    | EventKind::Decision { .. }
                    | EventKind::Started { .. }
                    | EventKind::Finished { .. }
                    | EventKind::Failed { .. }
                    | EventKind::Cancelled
                    | EventKind::CallRefused { .. }
            )
    }

    /// Takes one published event; `journal` is the run's journal as handled so far.
    pub fn observe(&mut self, journal: &[JournalEntry], e: &Event) {
        let new = journal.get(self.scanned..).unwrap_or_default();
        self.scanned = journal.len();
        self.observe_new(new, journal.last().map(|x| x.seq), e);
    }

    /// [`RunSpans::observe`], given the journal entries added since the last event (only those
    /// [`RunSpans::reads`] are needed) and the sequence number of the journal's last entry.
    pub fn observe_new(&mut self, new: &[JournalEntry], last_seq: Option<u64>, e: &Event) {
        self.scan(new);
        if !Self::uses(e) {
            return;
        }
        let replayed = last_seq.is_some_and(|seq| seq <= self.replayed_upto);
        if self.root.is_none() && !replayed {
            self.root = Some(Open {
                id: self.root_id(),
                start: e.at,
                replayed: false,
            });
        }
        let frame = frame_of(e);
        if let Some(call) = e.call {
            self.call_event(call.0, frame, e, replayed);
            return;
        }
        match &e.kind {
            EventKind::RequestStarted { attempt } => {
                self.turn_started(frame, e, *attempt, replayed)
            }
            EventKind::ModelRetry {
                attempt,
                status,
                wait_ms,
                error,
            } => {
                if let Some(t) = self.turns.get_mut(&frame) {
                    let mut attrs: Attrs = vec![
                        ("dagloop.attempt", Value::from(*attempt)),
                        ("dagloop.retry.wait_ms", Value::from(*wait_ms)),
                        ("error.type", Value::from(error_type(error))),
                    ];
                    if let Some(s) = status {
                        attrs.push(("http.response.status_code", Value::from(u32::from(*s))));
                    }
                    t.events.push(SpanEvent {
                        name: "gen_ai.retry",
                        at: e.at,
                        attrs,
                    });
                }
            }
            EventKind::ModelFallback { from, to, code, .. } => {
                if let Some(t) = self.turns.get_mut(&frame) {
                    t.events.push(SpanEvent {
                        name: "gen_ai.fallback",
                        at: e.at,
                        attrs: vec![
                            ("dagloop.model.from", Value::text(from)),
                            ("dagloop.model.to", Value::text(to)),
                            ("error.type", Value::text(code)),
                        ],
                    });
                }
            }
            EventKind::Solution { .. } => self.turn_ended(frame, e.at, None, replayed),
            // A nested agent's end is its delegate call's (closed with the call).
            EventKind::RunFinished { status, .. } if !replayed && frame == 0 => {
                self.run_finished(e.at, status)
            }
            _ => {}
        }
    }

    /// This process's span of the run (a resumed run's starts when it was resumed: its past is
    /// the earlier process's, linked).
    fn root_id(&self) -> SpanId {
        self.id("run", &[], self.own)
    }

    /// The span a frame's steps hang under: the run's, or the nested agent's.
    fn agent_span(&mut self, frame: Frame, at: Millis, replayed: bool) -> Option<SpanId> {
        if frame == 0 {
            return Some(self.root_id());
        }
        let inc = self.live_incarnation(replayed);
        let id = self.id("agent", &[frame], inc);
        Some(
            self.nested
                .entry(frame)
                .or_insert(Open {
                    id,
                    start: at,
                    replayed,
                })
                .id,
        )
    }

    fn live_incarnation(&self, replayed: bool) -> u32 {
        if replayed { self.incarnation } else { self.own }
    }

    /// The span of `step` of a frame, opened when it is the frame's newest (steps only move
    /// forward: a call of an earlier step that ends late still hangs under its own step).
    fn step_span(&mut self, frame: Frame, step: u32, at: Millis, replayed: bool) -> Option<SpanId> {
        let inc = self.live_incarnation(replayed);
        let id = self.id("step", &[frame, u64::from(step)], inc);
        if let Some((s, open)) = self.steps.get(&frame)
            && *s >= step
        {
            return Some(if *s == step { open.id } else { id });
        }
        self.close_step(frame, at, replayed);
        self.agent_span(frame, at, replayed)?;
        self.steps.insert(
            frame,
            (
                step,
                Open {
                    id,
                    start: at,
                    replayed,
                },
            ),
        );
        Some(id)
    }

    /// Closes the open step of a frame; `replayed`: the close itself is replayed (a step that
    /// ends live is reported here even when it began before a resume: the process that began
    /// it stopped before its end, so it never reported it).
    fn close_step(&mut self, frame: Frame, at: Millis, replayed: bool) {
        if let Some((step, mut open)) = self.steps.remove(&frame) {
            open.replayed &= replayed;
            let parent = if frame == 0 {
                Some(self.root_id())
            } else {
                self.nested.get(&frame).map(|o| o.id)
            };
            let mut s = self.span(&format!("step {step}"), parent, &open, at);
            s.attrs.push(("dagloop.step", Value::from(step)));
            if frame != 0 {
                s.attrs.push(("dagloop.delegate_call", Value::from(frame)));
            }
            self.emit(s);
        }
    }

    fn turn_started(&mut self, frame: Frame, e: &Event, attempt: u32, replayed: bool) {
        self.turn_ended(frame, e.at, Some("superseded"), replayed);
        if self.step_span(frame, e.step, e.at, replayed).is_none() {
            return;
        }
        let inc = self.live_incarnation(replayed);
        let id = self.id("chat", &[frame, u64::from(e.step), u64::from(attempt)], inc);
        self.usage.remove(&frame);
        self.turns.insert(
            frame,
            Turn {
                open: Open {
                    id,
                    start: e.at,
                    replayed,
                },
                step: e.step,
                attempt,
                first_call: None,
                events: Vec::new(),
                usage: None,
                model: None,
                closed: None,
                finish_reason: None,
            },
        );
    }

    /// Ends a frame's model turn; `replayed`: its end is replayed. A turn that ends live is
    /// reported (span and metrics) even when it began before a resume or a wake from parking:
    /// the process that began it stopped before its end, so it never reported it.
    fn turn_ended(&mut self, frame: Frame, at: Millis, error: Option<&str>, replayed: bool) {
        let Some(mut t) = self.turns.remove(&frame) else {
            return;
        };
        t.open.replayed &= replayed;
        if let Some((i, o, est, model)) = self.usage.remove(&frame) {
            t.usage = Some((i, o, est));
            t.model = model;
        }
        let (provider, model) = match t.model.as_deref().and_then(|m| m.split_once(':')) {
            // A script is named by its file, not by where it lies on this machine (the path
            // would name the span, label metrics and tell the collector about the disk).
            Some(("scripted", path)) => (
                "scripted".to_string(),
                std::path::Path::new(path)
                    .file_name()
                    .map_or_else(|| path.to_string(), |f| f.to_string_lossy().into_owned()),
            ),
            Some((p, m)) => (p.to_string(), m.to_string()),
            None => ("unknown".into(), t.model.clone().unwrap_or_default()),
        };
        let parent = self.steps.get(&frame).map(|(_, o)| o.id);
        let name = if model.is_empty() {
            "chat".to_string()
        } else {
            format!("chat {model}")
        };
        let mut s = self.span(&name, parent, &t.open, t.closed.unwrap_or(at));
        s.kind = Kind::Client;
        s.attrs.extend([
            ("gen_ai.operation.name", Value::from("chat")),
            ("gen_ai.provider.name", Value::from(provider)),
            ("gen_ai.request.model", Value::text(&model)),
            ("dagloop.step", Value::from(t.step)),
            ("dagloop.attempt", Value::from(t.attempt)),
        ]);
        if let Some((i, o, est)) = t.usage {
            s.attrs.push(("gen_ai.usage.input_tokens", Value::from(i)));
            s.attrs.push(("gen_ai.usage.output_tokens", Value::from(o)));
            if est {
                s.attrs.push(("dagloop.usage.estimated", Value::Bool(true)));
            }
            if self.metrics && !t.open.replayed {
                let latency = t.closed.unwrap_or(at).saturating_sub(t.open.start);
                metrics::model_turn(&model, latency, i, o);
            }
        }
        if let Some(r) = t.finish_reason.take() {
            s.attrs
                .push(("gen_ai.response.finish_reasons", Value::Strs(vec![r])));
        }
        if let Some(first) = t.first_call {
            s.attrs.push((
                "dagloop.time_to_first_call_ms",
                Value::from(first.saturating_sub(t.open.start)),
            ));
        }
        s.events = t.events;
        s.error = error.map(str::to_string);
        self.emit(s);
    }

    fn call_event(&mut self, id: u64, frame: Frame, e: &Event, replayed: bool) {
        match &e.kind {
            EventKind::CallReceived { call } => {
                if let Some(t) = self.turns.get_mut(&frame)
                    && t.first_call.is_none()
                {
                    t.first_call = Some(e.at);
                }
                let params = self
                    .content
                    .then(|| serde_json::to_value(&call.params).unwrap_or(Json::Null));
                let incarnation = self.live_incarnation(replayed);
                if !replayed {
                    self.step_span(frame, e.step, e.at, replayed);
                }
                let c = self.new_call(id, &call.tool, frame, e, replayed);
                c.params = params;
                c.incarnation = incarnation;
            }
            EventKind::ApprovalRequested {
                call,
                interrupted,
                read_from,
                ..
            } => {
                // A call presented again after a restart was received by an earlier process.
                if !self.calls.contains_key(&id) {
                    self.new_call(id, &call.tool, frame, e, replayed);
                }
                let Some(c) = self.calls.get_mut(&id) else {
                    return;
                };
                c.asked = Some((e.at, replayed));
                c.interrupted |= *interrupted;
                c.read_from.clone_from(read_from);
            }
            EventKind::Decision {
                decision,
                timed_out,
                by,
                ..
            } => self.decided(id, e, decision.name(), *timed_out, by.as_ref(), replayed),
            EventKind::Started { read_from, .. } => {
                if let Some(c) = self.calls.get_mut(&id) {
                    c.read_from.clone_from(read_from);
                    c.started = Some(e.at);
                    if !replayed {
                        c.replayed = false;
                    }
                }
            }
            EventKind::Finished { result } => {
                let result = self.content.then(|| Json::clone(result));
                self.call_ended(id, e.at, "ok", None, result, replayed);
            }
            EventKind::Failed { error, kind } => {
                let code = error
                    .get("code")
                    .and_then(Json::as_str)
                    .unwrap_or(kind.as_str())
                    .to_string();
                let result = self.content.then(|| Json::clone(error));
                self.call_ended(id, e.at, kind.as_str(), Some(code), result, replayed);
            }
            EventKind::Cancelled => self.call_ended(
                id,
                e.at,
                "cancelled",
                Some("cancelled".into()),
                None,
                replayed,
            ),
            EventKind::CallRefused { .. } => {
                self.call_ended(id, e.at, "refused", Some("refused".into()), None, replayed)
            }
            _ => {}
        }
    }

    fn decided(
        &mut self,
        id: u64,
        e: &Event,
        decision: &'static str,
        timed_out: bool,
        by: Option<&crate::protocol::Actor>,
        replayed: bool,
    ) {
        let Some(c) = self.calls.get_mut(&id) else {
            return;
        };
        let Some((asked, _)) = c.asked.take() else {
            return;
        };
        let tool = c.tool.tool.clone();
        let inc = c.incarnation;
        if self.metrics && !replayed {
            metrics::approval_wait(e.at.saturating_sub(asked), decision);
        }
        let span_inc = self.live_incarnation(replayed);
        let open = Open {
            id: self.id("approval", &[id], span_inc),
            start: asked,
            replayed,
        };
        let parent = self.id("call", &[id], inc);
        let mut s = self.span(&format!("approval {tool}"), Some(parent), &open, e.at);
        let source = if timed_out || by.is_some_and(|b| b.channel == "policy") {
            "policy"
        } else {
            "reviewer"
        };
        s.attrs.extend([
            ("gen_ai.tool.call.id", Value::Id(id)),
            ("dagloop.approval.decision", Value::from(decision)),
            ("dagloop.approval.source", Value::from(source)),
            ("dagloop.approval.timed_out", Value::Bool(timed_out)),
        ]);
        if let Some(b) = by {
            s.attrs
                .push(("dagloop.approval.principal", Value::text(&b.principal)));
            s.attrs
                .push(("dagloop.approval.channel", Value::text(&b.channel)));
        }
        if decision == "reject" {
            s.error = Some("rejected".into());
        }
        self.emit(s);
    }

    fn call_ended(
        &mut self,
        id: u64,
        at: Millis,
        status: &'static str,
        code: Option<String>,
        result: Option<Json>,
        replayed: bool,
    ) {
        let Some(c) = self.calls.remove(&id) else {
            return;
        };
        // The nested agent a delegate call ran ends with it.
        if self.nested.contains_key(&id) {
            self.turn_ended(id, at, Some("ended"), replayed);
            self.close_step(id, at, replayed);
        }
        if let Some(mut open) = self.nested.remove(&id) {
            open.replayed &= replayed;
            let agent = (self.agents.get(&*c.tool.tool).cloned())
                .unwrap_or_else(|| c.tool.tool.to_string());
            let mut s = self.span(
                &format!("invoke_agent {agent}"),
                Some(self.id("call", &[id], c.incarnation)),
                &open,
                at,
            );
            s.attrs.extend([
                ("gen_ai.operation.name", Value::from("invoke_agent")),
                ("gen_ai.agent.name", Value::from(agent)),
            ]);
            self.emit(s);
        }
        let parent = if replayed && c.replayed {
            self.root_id()
        } else {
            self.id("step", &[c.frame, u64::from(c.step)], c.incarnation)
        };
        // Most calls run in the first incarnation: only the others are kept (0 by default).
        if c.incarnation != 0 {
            self.done.insert(id, c.incarnation);
        }
        let replayed = replayed && c.replayed;
        // A call replayed from the journal is reported again, never as executed again: its
        // span is marked and linked to the one the process that ran it made.
        let own = if replayed {
            self.id("call-replayed", &[id], self.own)
        } else {
            self.id("call", &[id], c.incarnation)
        };
        let open = Open {
            id: own,
            start: c.received,
            replayed,
        };
        let mut s = self.span_sharing(&c.tool.span, Some(parent), &open, at, c.tool.attrs);
        if self.metrics && !replayed {
            metrics::call(&c.tool.tool, status);
        }
        s.attrs.extend([
            ("gen_ai.tool.call.id", Value::Id(id)),
            ("dagloop.call.status", Value::from(status)),
            ("dagloop.step", Value::from(c.step)),
        ]);
        if let Some(code) = &code {
            s.attrs.push(("error.type", Value::text(code)));
            s.error = Some(code.clone());
        }
        if c.interrupted {
            s.attrs
                .push(("dagloop.call.interrupted", Value::Bool(true)));
        }
        if let Some(p) = c.params {
            s.attrs
                .push(("gen_ai.tool.call.arguments", Value::from(p.to_string())));
        }
        if let Some(r) = result {
            s.attrs
                .push(("gen_ai.tool.call.result", Value::from(r.to_string())));
        }
        // Links past the exporter's limit are only counted: a fan-in over thousands of calls
        // made as many links, to drop all but 128 of them.
        let limit = self.export.as_ref().map_or(0, |x| x.link_limit());
        let linked = c.read_from.len() + usize::from(replayed);
        s.links.reserve_exact(linked.min(limit));
        if let Some(started) = c.started {
            s.events.reserve_exact(1);
            s.events.push(SpanEvent {
                name: "dagloop.call.started",
                at: started,
                attrs: Vec::new(),
            });
        }
        if replayed {
            let link = self.link(self.id("call", &[id], c.incarnation), "original", None);
            s.links.push(link);
        }
        for w in c.read_from.iter().map(|w| w.0).filter(|&w| w != id) {
            if s.links.len() >= limit {
                s.dropped_links = s.dropped_links.saturating_add(1);
                continue;
            }
            let link = self.link(self.writer_span(w), "waited_on", Some(w));
            s.links.push(link);
        }
        self.emit(s);
    }

    /// A link of type `kind` to `span`, naming the call it points at when there is one, in the
    /// attribute list of an earlier span's link when there is one left ([`RunSpans::span`]):
    /// most call spans link to the calls they waited on, and a new list per link cost an
    /// allocation and a free each time.
    fn link(&mut self, span: SpanId, kind: &'static str, call: Option<u64>) -> Link {
        let mut attrs = self.spare_links.pop().unwrap_or_default();
        attrs.push(("dagloop.link.type", Value::from(kind)));
        if let Some(call) = call {
            attrs.push(("gen_ai.tool.call.id", Value::Id(call)));
        }
        Link { span, attrs }
    }

    /// Starts following call `id` of `tool`, received with event `e`.
    fn new_call(
        &mut self,
        id: u64,
        tool: &str,
        frame: Frame,
        e: &Event,
        replayed: bool,
    ) -> &mut CallState {
        let tool = self.tool_names(tool);
        // Every field here: a default `CallState` would allocate a `ToolNames` to drop.
        let c = CallState {
            tool,
            frame,
            step: e.step,
            received: e.at,
            started: None,
            asked: None,
            read_from: Vec::new(),
            params: None,
            interrupted: false,
            replayed,
            incarnation: 0,
        };
        match self.calls.entry(id) {
            std::collections::hash_map::Entry::Occupied(mut o) => {
                o.insert(c);
                o.into_mut()
            }
            std::collections::hash_map::Entry::Vacant(v) => v.insert(c),
        }
    }

    /// `tool`'s names, made the first time the run sees it.
    fn tool_names(&mut self, tool: &str) -> ToolNames {
        if let Some(n) = self.tool_names.get(tool) {
            return n.clone();
        }
        let name: Arc<str> = Arc::from(tool);
        let activity = self.activities.get(tool);
        let attrs = vec![
            ("dagloop.run.id", Value::from(self.run_id.clone())),
            ("gen_ai.operation.name", Value::from("execute_tool")),
            ("gen_ai.tool.name", Value::from(name.clone())),
            (
                "gen_ai.tool.type",
                Value::from(tool_type(activity.map_or("latent", |a| a))),
            ),
            (
                "dagloop.activity",
                activity.map_or(Value::from("latent"), |a| Value::from(a.clone())),
            ),
        ];
        let names = ToolNames {
            tool: name,
            span: Arc::from(format!("execute_tool {tool}")),
            attrs: Arc::new(Shared::new(attrs)),
        };
        self.tool_names.insert(tool.to_string(), names.clone());
        names
    }

    /// The span of a call that wrote a path (its own incarnation's).
    fn writer_span(&self, call: u64) -> SpanId {
        let inc = self.done.get(&call).copied().unwrap_or(0);
        self.id("call", &[call], inc)
    }

    fn run_finished(&mut self, at: Millis, status: &str) {
        let frames: Vec<Frame> = self.turns.keys().copied().collect();
        for f in frames {
            self.turn_ended(f, at, Some("run ended"), false);
        }
        let frames: Vec<Frame> = self.steps.keys().copied().rev().collect();
        for f in frames {
            self.close_step(f, at, false);
        }
        let Some(root) = self.root.take() else {
            return;
        };
        let mut s = self.span(&self.root_name(), None, &root, at);
        s.attrs.extend([
            ("gen_ai.operation.name", Value::from(self.operation())),
            ("gen_ai.agent.name", Value::from("dagloop")),
            ("dagloop.run.status", Value::text(status)),
        ]);
        let inc = self.own;
        if inc > 0 {
            s.attrs.push(("dagloop.run.resumed", Value::Bool(true)));
            let link = self.link(self.id("run", &[], inc - 1), "resumed_from", None);
            s.links.push(link);
        }
        if status != "succeeded" {
            s.error = Some(status.to_string());
        }
        if self.metrics && !root.replayed {
            metrics::run_finished(status);
        }
        self.emit(s);
    }
}

/// The exported span's name for a piece of a run's timeline as `runs::describe` names it
/// (`call fetch`, `model step 2`, `reviewer`).
pub fn span_name_for(what: &str) -> String {
    if let Some(tool) = what.strip_prefix("call ") {
        format!("execute_tool {tool}")
    } else if let Some(step) = what.strip_prefix("model step ") {
        format!("chat (step {step})")
    } else if what == "reviewer" {
        "approval".to_string()
    } else {
        what.to_string()
    }
}

/// `gen_ai.tool.type`: `function` for tools dagloop runs, `extension` for MCP servers'
/// tools, `datastore` never; latent tools (the model fills in the result) are `function` too.
fn tool_type(activity: &str) -> &'static str {
    match activity {
        "mcp" => "extension",
        _ => "function",
    }
}

/// The stable part of a model error for `error.type` (its first word, when it is a code).
fn error_type(error: &str) -> String {
    error
        .split_whitespace()
        .next()
        .filter(|w| w.contains('.'))
        .unwrap_or("model_error")
        .trim_end_matches(':')
        .to_string()
}

fn collect_tools(
    config: &AgentConfig,
    agents: &mut BTreeMap<String, String>,
    activities: &mut BTreeMap<String, Arc<str>>,
) {
    for t in &config.tools {
        if let Some(a) = &t.activity {
            activities
                .entry(t.name.clone())
                .or_insert_with(|| Arc::from(a.as_str()));
        }
    }
    for (name, nested) in &config.delegates {
        agents.entry(name.clone()).or_insert_with(|| name.clone());
        collect_tools(nested, agents, activities);
    }
}
