//! dagloop runs LLM agents whose tool calls execute as a dependency graph.
//!
//! A program submits a goal and an output schema; the model streams back calls; every call whose
//! inputs are ready runs at once, after an approval gate; results land in shared state (last
//! write wins); the loop ends when the model's `output` validates against the user's schema.
//!
//! The core (`protocol`, `state`, `schema`, `graph`, `approval`, `scheduler`, `machine`) is
//! sans-IO: plain state machines with no tokio, no clock and no randomness. The async `engine`
//! performs their actions. A started run is a [`RunHandle`]: ops in ([`Op`]), events out
//! ([`Event`], numbered, replayable from the run's journal).

#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

/// The README's examples, compiled as doctests so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The library guide's examples (docs/library.md), compiled as doctests too.
#[doc = include_str!("../docs/library.md")]
#[cfg(doctest)]
pub struct LibraryDoctests;

pub mod approval;
pub mod check;
/// The `dagloop` binary's front-end. Not part of the library API: it may change at any time.
#[doc(hidden)]
pub mod cli;
pub mod codes;
pub mod config;
pub mod context;
pub mod duration;
pub mod engine;
mod fxhash;
pub mod goal;
pub mod grants;
pub mod graph;
pub mod llm;
pub mod machine;
pub mod net;
pub mod notify;
pub mod plan;
pub mod protocol;
pub mod runs;
pub mod scheduler;
pub mod schema;
#[cfg(feature = "server")]
pub mod server;
pub mod state;
pub mod store;
pub mod telemetry;
#[cfg(feature = "temporal")]
pub mod temporal;
pub mod testcase;
pub mod tools;

pub use approval::{Approver, Policy, ScriptedApprover};
pub use engine::{
    Agent, AgentBuilder, AgentError, Executor, Hooks, JournalSink, RunHandle, Subscription,
};
pub use goal::{Goal, GoalError};
pub use machine::{CallSummary, JournalEntry, RunError, RunInput, RunResult, RunStatus, Usage};
pub use protocol::{Call, CallId, Decision, Event, EventKind, Op, OpError, Tool};
pub use tools::{Activity, ActivityError, Registry};
