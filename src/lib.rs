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
#![warn(unnameable_types)]
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

/// Declares the crate's internal modules: the sans-IO core and the pieces the front-ends share.
/// They are part of no stable API: private in a normal build, public with the `test-util`
/// feature, which this crate's own tests and benchmarks turn on to reach them. What a program
/// needs of them is re-exported below or from the public modules.
macro_rules! internal {
    ($($(#[$meta:meta])* mod $name:ident;)*) => {$(
        $(#[$meta])*
        #[cfg(feature = "test-util")]
        pub mod $name;
        $(#[$meta])*
        #[cfg(not(feature = "test-util"))]
        #[allow(dead_code, unused_imports)]
        mod $name;
    )*};
}

internal! {
    mod config;
    mod context;
    mod duration;
    mod graph;
    mod machine;
    mod notify;
    mod plan;
    mod runs;
    mod scheduler;
    mod schema;
    mod testcase;
}

pub mod approval;
pub mod check;
/// The `dagloop` binary's front-end. Not part of the library API: it may change at any time.
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod cli;
pub mod codes;
pub mod engine;
mod fxhash;
pub mod goal;
pub mod grants;
pub mod idle;
pub mod llm;
pub mod net;
pub mod protocol;
#[cfg(feature = "server")]
pub mod server;
#[cfg(any(feature = "cli", feature = "server"))]
mod signals;
pub mod state;
pub mod store;
pub mod telemetry;
// The SDK's macros generate a marker type per activity, signal and query, reachable from
// the workflow and activity types but named only inside their modules.
#[cfg(feature = "temporal")]
#[allow(unnameable_types)]
pub mod temporal;
pub mod tools;

/// Sessions: a follow-up run on a finished run, in the same session (docs/sessions.md,
/// docs/library.md). [`sessions::continue_run`] plans the follow-up from the stored run (whole
/// or compacted), lets the caller check it, and records it in the store for the caller to
/// drive; [`sessions::follow_up`] only plans it.
pub mod sessions {
    pub use crate::runs::{
        Carry, Continue, DefRecord, Fork, ForkedFrom, Next, Parent, RunOptions, RunsError,
        SessionOf, continue_run, follow_up, seed, session_of,
    };
}

pub use approval::{Approver, Policy, ScriptedApprover};
pub use engine::{
    Agent, AgentBuilder, AgentDef, AgentError, Executor, Hooks, JournalSink, RunHandle,
    Subscription,
};
pub use goal::{Goal, GoalError};
pub use machine::{
    AgentConfig, AgentSpec, CallSummary, ConfigError, JournalEntry, RunError, RunInput, RunResult,
    RunStatus, Timer, Usage,
};
pub use protocol::{Call, CallId, Decision, Event, EventKind, Op, OpError, Tool};
/// A run's definition: what a goal asks, checked against what the process grants, with
/// everything the run will use recorded. A program gets one from [`RunDef::from_goal`] (open
/// grants) and builds its agent from it with [`AgentBuilder::new`].
pub use runs::RunDef;
/// Why a goal's memory folder could not be read (once `goal::MemoryError`; the goal no longer
/// reaches up into `runs` for it).
pub use runs::memory::MemoryError;
pub use scheduler::{CallStatus, Outcome, OutcomeKind, Parsed};
pub use tools::{Activity, ActivityError, Registry};
