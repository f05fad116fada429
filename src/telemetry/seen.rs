//! What a run's spans read of one published event, taken on the driver's thread while the
//! event is at hand ([`Seen::of`]). The span worker gets these few words per event instead of
//! a share of the event: it no longer holds events (a 10 ms batch of a fan-out's is thousands)
//! and frees them on its core, and it reads the records, not the events' scattered memory. A
//! call's common events (received, decided, started, finished, failed, cancelled, refused) are
//! copied this way; the rare kinds (a model turn's, an approval request, the run's end) are
//! handed over whole, shared.
//!
//! The calls a `started` event read from go into one buffer per batch of records ([`Ids`]), so
//! a record allocates nothing.
//!
//! Deliberately not here: what the spans make of a record (`spans`), or the hand-over (`feed`).

use std::sync::Arc;

use serde_json::Value as Json;

use super::spans::RunSpans;
use crate::protocol::{Call, CallId, Event, EventKind, FailKind, Millis};

/// The calls that records of one batch name, in one buffer.
pub type Ids = Vec<CallId>;

/// What the spans read of one event.
pub struct Seen {
    /// When it was published.
    pub at: Millis,
    /// Its step.
    pub step: u32,
    /// Its agent's frame: 0 for the run's own agent, else the delegate call running it.
    pub frame: u64,
    /// What happened.
    pub what: What,
}

/// The part of an event the spans read, by kind.
pub enum What {
    /// An event read whole (a kind with no record of its own).
    Whole(Arc<Event>),
    /// A call arrived (its body is the journal's, shared).
    Received { call: u64, body: Arc<Call> },
    /// A decision on a call.
    Decided {
        call: u64,
        decision: &'static str,
        timed_out: bool,
        by: Option<crate::protocol::Actor>,
    },
    /// An activity started, having read from the calls at `ids[from..from + len]`.
    Started { call: u64, from: u32, len: u32 },
    /// A call succeeded (its result only when content is recorded).
    Finished {
        call: u64,
        result: Option<Arc<Json>>,
    },
    /// A call failed (its error is shared, like the event's).
    Failed {
        call: u64,
        error: Arc<Json>,
        kind: FailKind,
    },
    /// A call was cancelled.
    Cancelled { call: u64 },
    /// A call was refused before it ran.
    Refused { call: u64 },
}

impl Seen {
    /// What the spans read of `e`, or None when they do not use it ([`RunSpans::uses`]).
    /// `content`: the run records results; `ids` takes the calls the record names.
    pub fn of(e: &Arc<Event>, content: bool, ids: &mut Ids) -> Option<Seen> {
        if !RunSpans::uses(e) {
            return None;
        }
        Some(Seen {
            at: e.at,
            step: e.step,
            frame: e.parent.map_or(0, |p| p.0),
            what: record(e, content, ids).unwrap_or_else(|| What::Whole(e.clone())),
        })
    }
}

/// The record of a call's common event, or None for one read whole.
fn record(e: &Event, content: bool, ids: &mut Ids) -> Option<What> {
    let c = e.call?.0;
    Some(match &e.kind {
        EventKind::CallReceived { call } => What::Received {
            call: c,
            body: call.clone(),
        },
        EventKind::Decision {
            decision,
            timed_out,
            by,
            ..
        } => What::Decided {
            call: c,
            decision: decision.name(),
            timed_out: *timed_out,
            by: by.clone(),
        },
        EventKind::Started { read_from, .. } => {
            let from = u32::try_from(ids.len()).ok()?;
            let len = u32::try_from(read_from.len()).ok()?;
            ids.extend_from_slice(read_from);
            What::Started { call: c, from, len }
        }
        EventKind::Finished { result } => What::Finished {
            call: c,
            result: content.then(|| result.clone()),
        },
        EventKind::Failed { error, kind } => What::Failed {
            call: c,
            error: error.clone(),
            kind: *kind,
        },
        EventKind::Cancelled => What::Cancelled { call: c },
        EventKind::CallRefused { .. } => What::Refused { call: c },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Decision;

    fn event(call: Option<u64>, kind: EventKind) -> Event {
        Event {
            run_id: Arc::from("r"),
            seq: 7,
            step: 3,
            at: 1_000,
            call: call.map(CallId),
            parent: Some(CallId(9)),
            depth: 1,
            kind,
        }
    }

    /// What the spans read of `e`, and whether it shares the event.
    fn of(e: Event, content: bool, ids: &mut Ids) -> (Option<Seen>, bool) {
        let e = Arc::new(e);
        let seen = Seen::of(&e, content, ids);
        (seen, Arc::strong_count(&e) > 1)
    }

    /// A call's common events become records (the event is not shared), the rare ones
    /// are shared whole, and a `started` event's calls land in the batch's buffer, after what
    /// was there.
    #[test]
    fn common_call_events_are_copied_and_the_rest_shared() {
        let mut ids = vec![CallId(1)];
        let started = event(
            Some(5),
            EventKind::Started {
                tool: "t".into(),
                params: Default::default(),
                read_from: vec![CallId(2), CallId(3)],
            },
        );
        let (seen, shared) = of(started, false, &mut ids);
        let Some(seen) = seen else {
            panic!("started is used")
        };
        assert!(!shared);
        assert!(matches!(
            seen.what,
            What::Started {
                call: 5,
                from: 1,
                len: 2
            }
        ));
        assert_eq!((seen.at, seen.step, seen.frame), (1_000, 3, 9));
        assert_eq!(ids, [CallId(1), CallId(2), CallId(3)]);

        let decided = event(
            Some(5),
            EventKind::Decision {
                decision: Decision::Approve,
                timed_out: true,
                by: None,
                rule: None,
                grant: None,
            },
        );
        let (seen, shared) = of(decided, false, &mut ids);
        assert!(!shared);
        assert!(matches!(
            seen.map(|s| s.what),
            Some(What::Decided {
                call: 5,
                decision: "approve",
                timed_out: true,
                by: None
            })
        ));

        for content in [false, true] {
            let finished = event(
                Some(5),
                EventKind::Finished {
                    result: Arc::new(Json::from(1)),
                },
            );
            let (seen, shared) = of(finished, content, &mut ids);
            assert!(!shared);
            let Some(What::Finished { result, .. }) = seen.map(|s| s.what) else {
                panic!("finished is a record")
            };
            assert_eq!(
                result.is_some(),
                content,
                "the result is kept only with content"
            );
        }

        let turn = event(None, EventKind::RequestStarted { attempt: 1 });
        let (seen, shared) = of(turn, false, &mut ids);
        assert!(shared, "a turn's event is read whole");
        assert!(matches!(seen.map(|s| s.what), Some(What::Whole(_))));

        let (seen, shared) = of(event(Some(5), EventKind::Unblocked), false, &mut ids);
        assert!(seen.is_none(), "an event the spans do not use is not kept");
        assert!(!shared);
        assert_eq!(ids.len(), 3, "only `started` names calls");
    }
}
