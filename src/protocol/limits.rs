//! A run's limits as a goal writes them (DESIGN.md rule 16): steps, time, tokens, retries.
//!
//! Deliberately not here: checking their durations (the machine's `CheckedLimits`) or
//! enforcing them (the machine).

use serde::{Deserialize, Serialize};

/// Limits of one run (DESIGN.md rule 16). Every field has a default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Most Requests in a run.
    pub max_steps: u32,
    /// Wall-clock limit of the whole run, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// Most tokens (input + output) over the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_budget: Option<u64>,
    /// How many times an invalid output is sent back before the run fails.
    pub max_output_retries: u32,
    /// Consecutive steps with no calls and no output before the run stops.
    pub empty_turns: u32,
    /// Consecutive steps with the same calls before the run stops.
    pub doom_loop: u32,
    /// Time limit of one call, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call_timeout_s: Option<f64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_steps: 30,
            timeout_s: None,
            token_budget: None,
            max_output_retries: 2,
            empty_turns: 2,
            doom_loop: 3,
            call_timeout_s: None,
        }
    }
}
