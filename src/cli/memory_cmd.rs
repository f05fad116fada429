//! `dagloop memory index|search GOAL [QUERY]`: what a goal's workspace memory folder holds and
//! which chunks a run of the goal would get, read and ranked by the code a run uses
//! (`runs::memory`), under the same grants. It only prints; it records nothing.

use std::path::PathBuf;

use serde_json::json;

use super::{CliError, pretty};
use crate::goal::Goal;
use crate::grants::Grants;
use crate::runs::memory;

/// `dagloop memory ...`.
#[derive(Debug, clap::Subcommand)]
pub enum MemoryArg {
    /// List the chunks the goal's memory folder is cut into (source, line, estimated tokens).
    Index {
        /// The goal file.
        goal: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Rank the folder's chunks for QUERY (default: the goal's text and input, as a run does)
    /// and print those a run's context would get (within the goal's `top` and token budget),
    /// with their scores.
    Search {
        /// The goal file.
        goal: PathBuf,
        /// What to search for (default: what a run searches for).
        query: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `dagloop memory`.
pub(super) fn memory(arg: MemoryArg, grants: &Grants) -> Result<i32, CliError> {
    let code = |e: &dyn crate::codes::HasCode, m: String| CliError::new(e.code(), m);
    let load = |path: &PathBuf| -> Result<Goal, CliError> {
        let goal = Goal::load_offline(path).map_err(|e| code(&e, e.to_string()))?;
        if goal.memory.is_none() && grants.memory.is_none() {
            return Err(CliError::new(
                "cli.usage",
                format!(
                    "{}: the goal has no `memory` folder (nor does the operator's config)",
                    path.display()
                ),
            ));
        }
        Ok(goal)
    };
    match arg {
        MemoryArg::Index { goal, json } => {
            let goal = load(&goal)?;
            let Some((source, index)) =
                memory::index(&goal, grants).map_err(|e| code(&e, e.to_string()))?
            else {
                return Ok(0);
            };
            let chunks = index.chunks();
            if json {
                let listed: Vec<_> = chunks
                    .iter()
                    .map(|c| json!({"source": c.source, "line": c.line, "tokens": c.tokens()}))
                    .collect();
                outln!(
                    "{}",
                    pretty(&json!({"folder": source.path, "chunks": listed}))
                );
            } else {
                let files: std::collections::BTreeSet<&str> =
                    chunks.iter().map(|c| c.source.as_str()).collect();
                outln!(
                    "{}: {} chunks in {} files",
                    source.path,
                    chunks.len(),
                    files.len()
                );
                for c in chunks {
                    outln!("  {}:{} ({} tokens)", c.source, c.line, c.tokens());
                }
            }
            Ok(0)
        }
        MemoryArg::Search { goal, query, json } => {
            let goal = load(&goal)?;
            let Some((source, index)) =
                memory::index(&goal, grants).map_err(|e| code(&e, e.to_string()))?
            else {
                return Ok(0);
            };
            let query = query.unwrap_or_else(|| memory::query_of(&goal));
            let chosen =
                crate::context::memory::select(index.search(&query), source.top(), source.budget());
            if json {
                outln!(
                    "{}",
                    pretty(&json!({"query": query, "budget_tokens": source.budget(),
                                   "top": source.top(), "chunks": chosen}))
                );
            } else {
                let used: u32 = chosen.iter().map(|f| f.tokens).sum();
                outln!(
                    "{} chunks, {used} of {} tokens",
                    chosen.len(),
                    source.budget()
                );
                for f in &chosen {
                    outln!(
                        "\n[{}:{}] score {:.3}, {} tokens\n{}",
                        f.chunk.source,
                        f.chunk.line,
                        f.score,
                        f.tokens,
                        f.chunk.text
                    );
                }
            }
            Ok(0)
        }
    }
}
