//! `dagloop schema GOAL [--mode structured|tools]`: prints exactly what the model is sent to
//! constrain its answer, composed by the same code a run uses. Useful to check a goal against a
//! server's grammar engine; the grammar-engine tests (`tests/grammar_engines.rs`) read it.

use std::path::Path as FsPath;

use super::{CliError, ModeArg, pretty};
use crate::goal::Goal;
use crate::llm::{Mode, function_definitions};

/// Prints the composed Solution schema (structured mode) or the function definitions (tool
/// mode: an array of `{"name", "description", "parameters"}`, `final_output` last).
pub(super) fn schema(goal_path: &FsPath, mode: Option<ModeArg>) -> Result<i32, CliError> {
    let goal = Goal::load(goal_path).map_err(|e| CliError::new(e.code(), &e))?;
    let mode = mode.map(Mode::from).or(goal.mode).unwrap_or_default();
    let composed = crate::schema::compose(&goal.tools, &goal.output_schema)
        .map_err(|e| CliError::new(e.code(), &e))?;
    let out = match mode {
        Mode::StructuredOutput => composed,
        Mode::ToolCalls => serde_json::Value::Array(function_definitions(&goal.tools, &composed)),
    };
    outln!("{}", pretty(&out));
    Ok(0)
}
