//! A built run, [`Agent`]: started, it spawns the one driver and returns a [`RunHandle`];
//! resumed, it replays its journal first.
//!
//! Deliberately not here: building it (`builder`, `loading`) or driving it (`driver`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::activities::Executor;
use super::bus::Clock;
use super::driver::Driver;
use super::handle::{Log, Owner, RunHandle, Shared};
use super::journal::JournalSink;
use super::review;
use super::timers::Alarm;
use super::turns::{Models, Turns};
use crate::approval::{Approver, Policy};
use crate::context::SanitizeLimits;
use crate::llm::Settings;
use crate::machine::{AgentConfig, JournalEntry, RunResult};
use crate::protocol::Tool;

/// Everything one run needs. Build it with [`AgentBuilder`]; run it with [`Agent::run`], or
/// [`Agent::start`] it to address it while it runs.
pub struct Agent {
    pub(super) config: Arc<AgentConfig>,
    pub(super) policy: Policy,
    pub(super) sanitize: SanitizeLimits,
    pub(super) kept_result_bytes: u64,
    pub(super) models: Models,
    pub(super) settings: Settings,
    pub(super) executor: Arc<dyn Executor>,
    pub(super) approver: Option<Arc<dyn Approver>>,
    pub(super) standing: Vec<crate::machine::RunInput>,
    pub(super) tools: BTreeMap<String, Arc<Tool>>,
    pub(super) asks: Option<String>,
    pub(super) journal: Option<Arc<dyn JournalSink>>,
    pub(super) clock: Clock,
    pub(super) run_id: String,
    pub(super) cancel: CancellationToken,
    pub(super) event_capacity: usize,
    /// Whether the run makes spans and metrics ([`super::AgentBuilder::traced`]).
    pub(super) traced: bool,
    /// The run's workspace memory, searched before each step ([`super::AgentBuilder::memory`]).
    pub(super) recall: Option<Arc<crate::context::memory::Recall>>,
    /// The context window the run's model list states ([`crate::llm::ModelSpec::window_of_list`]).
    pub(super) window_tokens: Option<u64>,
}

impl Agent {
    /// The id the run will have.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Why a call of the run may have to be presented to a reviewer (its policy, or tools of
    /// the goal, its MCP servers or its delegates that always ask: [`crate::approval::who_asks`]);
    /// None when none can.
    pub fn who_asks(&self) -> Option<&str> {
        self.asks.as_deref()
    }

    /// The run's configuration (its own agent; delegates inside).
    pub fn config(&self) -> &Arc<AgentConfig> {
        &self.config
    }

    /// A token that cancels the run when triggered.
    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Starts the run on the current tokio runtime and returns its handle. The run stops when
    /// the last clone of the handle is dropped.
    pub fn start(self) -> RunHandle {
        self.launch(None)
    }

    /// Continues a run from its journal (recorded by an earlier process under the same run id,
    /// goal and options): nothing completed runs again; model turns that were streaming are
    /// asked again; calls that had started are interrupted (re-run when their tool is
    /// `_idempotent`, else presented to a reviewer again, flagged `interrupted`).
    pub fn resume(self, journal: Vec<JournalEntry>) -> RunHandle {
        self.launch(Some(journal))
    }

    fn launch(self, journal: Option<Vec<JournalEntry>>) -> RunHandle {
        let def = super::MachineDef {
            config: self.config.clone(),
            policy: self.policy.clone(),
            sanitize: self.sanitize,
            recall: self.recall.is_some(),
            window_tokens: self.window_tokens,
        };
        let (tx, _) = broadcast::channel(self.event_capacity);
        let (ops_tx, ops) = mpsc::unbounded_channel();
        let (done, _) = watch::channel(None);
        let (idle, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            run_id: Arc::from(self.run_id.as_str()),
            def: def.clone(),
            log: Mutex::new(Log {
                spans: self
                    .traced
                    .then(|| {
                        crate::telemetry::for_run(&self.run_id, &self.config, journal.as_deref())
                    })
                    .flatten()
                    .and_then(crate::telemetry::SpanFeed::start),
                early: true,
                ..Log::default()
            }),
            tx,
            capacity: self.event_capacity,
            ops: ops_tx,
            done,
            idle,
            catch_up: Mutex::new(false),
            replays: Default::default(),
        });
        let bound = match &journal {
            Some(j) => super::bound::ResultBound::resumed(self.kept_result_bytes, j),
            None => super::bound::ResultBound::new(self.kept_result_bytes),
        };
        let mut aux = JoinSet::new();
        if let Some(approver) = self.approver {
            aux.spawn(review::serve(shared.clone(), approver, self.tools));
        }
        let driver = Driver {
            machine: def.machine(&self.run_id, super::MachineUse::Drive),
            shared: shared.clone(),
            ops,
            models: self.models,
            settings: self.settings,
            recall: self.recall,
            executor: self.executor,
            lease: super::driver::LeaseKeeper::new(self.journal.as_ref()),
            sink: self.journal,
            clock: self.clock,
            cancel: self.cancel,
            aux,
            activities: super::activities::Activities::bounded(bound),
            turns: Turns::default(),
            alarm: Alarm::default(),
            result: None,
            journal_seq: 0,
            queue: Vec::new(),
            commit: None,
            scratch: Default::default(),
        };
        let task = tokio::spawn(driver.run(journal, self.standing));
        RunHandle {
            shared,
            _owner: Arc::new(Owner {
                task: Some(task.abort_handle()),
            }),
        }
    }

    /// Runs to a terminal status. Never panics on bad model output or failing tools. Dropping
    /// the future stops the run and every task it owns.
    pub async fn run(self) -> RunResult {
        self.start().wait().await
    }
}
