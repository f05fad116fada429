//! A delegate with scopes (protocol chapters 014–015): `translateReply` runs as a nested agent
//! (its own goal file and model) that sees only its params and the scopes the call grants
//! (`_scopes: ["state"]`), never the parent's `input` with its internal notes.
//!
//! Runs offline: `cargo run --example delegate`. With a real model, give a spec:
//! `cargo run --example delegate -- openai:gpt-4o-mini` and remove the `model` line of
//! `translator.goal.json` so the delegate uses the parent's model too.

use std::path::Path;
use std::sync::{Arc, Mutex};

use dagloop::RunDef;
use dagloop::engine::{AgentBuilder, Hooks};
use dagloop::goal::Goal;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/delegate/goal.json");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let hooks = Hooks {
        after_tool: Some(Arc::new(move |tool, _call, outcome| {
            if let Ok(mut s) = record.lock() {
                s.push(format!(
                    "{} -> {}",
                    tool.name,
                    if outcome.result.is_ok() {
                        "ok"
                    } else {
                        "failed"
                    }
                ));
            }
        })),
        ..Hooks::default()
    };
    let mut agent = AgentBuilder::new(RunDef::from_goal(Goal::load(&path)?)?).hooks(hooks);
    if let Some(spec) = std::env::args().nth(1) {
        agent = agent.model_spec(spec);
    }
    let result = agent.build()?.run().await;
    println!("{}", serde_json::to_string_pretty(&result)?);
    eprintln!(
        "activities: {:?}",
        seen.lock().map(|s| s.clone()).unwrap_or_default()
    );
    if !result.succeeded() {
        std::process::exit(1);
    }
    Ok(())
}
