//! The async side of dagloop: the only module that spawns tasks, sleeps, reads clocks and talks
//! to the outside world. It performs the actions of the sans-IO core.
//!
//! `inner` drives one step's scheduler; `bus` stamps and delivers events.

pub mod bus;
pub mod inner;

mod agent;
mod builder;
mod delegate;
mod exec;

pub use agent::{Agent, CallSummary, RunResult, RunStatus, Usage};
pub use builder::{AgentBuilder, AgentError};
pub use exec::{AfterTool, BeforeTool, Hooks, OnError, RegistryExecutor};
