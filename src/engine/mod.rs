//! The async side of dagloop: the only module that spawns tasks, sleeps, reads clocks and talks
//! to the outside world. It performs the actions of the sans-IO core.
//!
//! [`AgentBuilder`] builds an [`Agent`]; [`Agent::start`] spawns its driver (the one driver of
//! every run, `driver`) and returns a [`RunHandle`] (ops in, events out). `bus` holds the
//! run's clock, new run ids and the size of the event ring. The scheduler's tests drive single
//! steps through real runs on tokio's paused clock (`tests/common/sched.rs`).
//!
//! Deliberately not here: decisions about a run (the `machine` and `scheduler` modules take
//! them) and how events are shown or stored (their consumers').

pub mod bus;

mod activities;
mod agent;
mod bound;
mod builder;
mod driver;
mod error;
mod exec;
mod handle;
mod journal;
mod loading;
mod machines;
#[cfg(feature = "temporal")]
mod remote;
mod review;
mod timers;
mod turns;

pub use crate::context::SanitizeLimits;
pub use crate::machine::{
    AgentConfig, CallSummary, CheckedLimits, ConfigError, RunError, RunResult, RunStatus, Usage,
};
pub use crate::scheduler::{CallStatus, Outcome, OutcomeKind};
pub use activities::Executor;
pub use agent::Agent;
pub use bound::DEFAULT_KEPT_RESULT_BYTES;
#[cfg(feature = "temporal")]
pub(crate) use bound::ResultBound;
pub use builder::{AgentBuilder, AgentDef};
pub use error::AgentError;
pub use exec::{AfterTool, BeforeTool, HookError, Hooks, OnError, RegistryExecutor};
pub use handle::{RunHandle, Subscription};
pub use journal::{ClaimFuture, JournalError, JournalFuture, JournalSink, RunNote};
pub use loading::config_with;
pub(crate) use machines::{MachineDef, MachineUse};
#[cfg(feature = "temporal")]
pub(crate) use remote::{Parts, config_at, config_path};
