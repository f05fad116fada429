//! The one way outside the core to a run's machine: [`MachineDef`], what a machine is built
//! from (the run's agent tree, its approval policy, its sanitize limits). The engine builds its
//! live run's machine, a late subscriber's catch-up replay and [`super::RunHandle::awaiting`]
//! through it, and `runs::RunDef::machine`/`replay` (every reader of a stored run: `show`, the
//! server's views, Temporal's workflow, telemetry) build theirs through it from the run's
//! record, so a stored run and a live one are made the same way.
//!
//! Deliberately not here: where the parts come from (`runs::RunDef` reads them from the record;
//! `AgentBuilder` from the goal) or the machine itself (`machine`).

use std::sync::Arc;

use crate::approval::Policy;
use crate::context::SanitizeLimits;
use crate::machine::{AgentConfig, JournalEntry, RunMachine};
use crate::protocol::Event;

/// What a run's machine is built from.
#[derive(Debug, Clone)]
pub(crate) struct MachineDef {
    /// The run's own agent, its delegates inside.
    pub(crate) config: Arc<AgentConfig>,
    /// The approval policy.
    pub(crate) policy: Policy,
    /// What is shown of tool results.
    pub(crate) sanitize: SanitizeLimits,
    /// The run's agent searches its workspace memory before each step.
    pub(crate) recall: bool,
    /// The context window the run's model list states (`openai:a#window=8192`; the smallest
    /// of the list), known before any refusal.
    pub(crate) window_tokens: Option<u64>,
}

/// What the machine is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MachineUse {
    /// Driving the run: calls launched and finished are forgotten as the run goes.
    Drive,
    /// Reading a journal: it keeps what a view of the run needs (see
    /// [`RunMachine::replaying`]).
    Replay,
}

impl MachineDef {
    /// A fresh machine for run `run_id`, nothing consumed yet.
    pub(crate) fn machine(&self, run_id: &str, purpose: MachineUse) -> RunMachine {
        let mut m = RunMachine::new(
            run_id,
            self.config.clone(),
            self.policy.clone(),
            self.sanitize,
        );
        m.recall_memory(self.recall);
        m.stated_window(self.window_tokens);
        if purpose == MachineUse::Replay {
            m.keep_launched(true);
        }
        m
    }

    /// The machine after `journal`, and the events it published, in one pass.
    pub(crate) fn replay(
        &self,
        run_id: &str,
        journal: &[JournalEntry],
    ) -> (RunMachine, Vec<Event>) {
        let mut machine = self.machine(run_id, MachineUse::Replay);
        let mut events = Vec::new();
        let mut out = Vec::new();
        for e in journal {
            machine.handle_into(e.input.clone(), e.at, &mut out);
            events.extend(out.drain(..).filter_map(|a| match a {
                crate::machine::Action::Emit(ev) => Some(ev),
                _ => None,
            }));
        }
        (machine, events)
    }
}
