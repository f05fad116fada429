//! dagloop runs LLM agents whose tool calls execute as a dependency graph.
//!
//! A program submits a goal and an output schema; the model streams back calls; every call whose
//! inputs are ready runs at once, after an approval gate; results land in shared state (last
//! write wins); the loop ends when the model's `output` validates against the user's schema.
//!
//! The core (`protocol`, `state`, `schema`, `graph`, `approval`, `scheduler`) is sans-IO: plain
//! state machines with no tokio, no clock and no randomness. The async `engine` performs their
//! actions.

#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

/// The README's examples, compiled as doctests so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub mod approval;
pub mod check;
pub mod cli;
pub mod context;
pub mod duration;
pub mod engine;
mod fxhash;
pub mod goal;
pub mod graph;
pub mod llm;
pub mod plan;
pub mod protocol;
pub mod scheduler;
pub mod schema;
pub mod state;
pub mod tools;
