//! Replaying a journal through a fresh machine for the events the run published: at once
//! ([`replay`]) or as the journal grows ([`Replayer`]).
//!
//! Deliberately not here: checking a replay against the stored run (`runs::replay`).

use super::*;

/// Replays a journal through a fresh machine: the events the run published, in order (wall
/// clock included: each input carries the time it was consumed).
pub fn replay(
    run_id: &str,
    root: Arc<AgentConfig>,
    policy: Policy,
    sanitize: SanitizeLimits,
    journal: &[JournalEntry],
) -> Vec<Event> {
    let mut r = Replayer::new(run_id, root, policy, sanitize);
    r.feed(journal);
    r.events
}

/// A journal replayed as it grows: each [`Replayer::feed`] consumes only the entries after
/// those it has seen, so following a long run costs one replay in all, not one per catch-up.
pub struct Replayer {
    machine: RunMachine,
    fed: usize,
    /// Every event the replayed entries produced, in order.
    pub events: Vec<Event>,
}

impl Replayer {
    /// A fresh machine for the run.
    pub fn new(
        run_id: &str,
        root: Arc<AgentConfig>,
        policy: Policy,
        sanitize: SanitizeLimits,
    ) -> Self {
        Replayer {
            machine: RunMachine::replaying(run_id, root, policy, sanitize),
            fed: 0,
            events: Vec::new(),
        }
    }

    /// How many journal entries have been replayed.
    pub fn fed(&self) -> usize {
        self.fed
    }

    /// Replays `entries`, the journal's entries from position [`Replayer::fed`] on.
    pub fn feed(&mut self, entries: &[JournalEntry]) {
        let mut out = Vec::new();
        for e in entries {
            self.machine.handle_into(e.input.clone(), e.at, &mut out);
            self.events.extend(out.drain(..).filter_map(|a| match a {
                Action::Emit(ev) => Some(ev),
                _ => None,
            }));
        }
        self.fed += entries.len();
    }
}
