//! A research brief: parallel fan-out searches joined by a ranking step, then a latent draft.
//!
//! The three searches start together (their inputs are ready); `rankSources` reads
//! `†state.results`, which all three write, so it waits for every one of them; `writeBrief` waits
//! for the ranking. Runs offline: `cargo run --example research`.
//! With a real model: `OPENAI_API_KEY=... cargo run --example research -- openai:gpt-4o-mini`.

use std::path::Path;

use dagloop::RunDef;
use dagloop::engine::AgentBuilder;
use dagloop::goal::Goal;

mod tools;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/research/goal.json");
    let mut agent = AgentBuilder::new(RunDef::from_goal(Goal::load(&path)?)?);
    if let Some(spec) = std::env::args().nth(1) {
        agent = agent.model_spec(spec);
    }
    tools::register(agent.registry_mut());
    let result = agent.build()?.run().await;
    println!("{}", serde_json::to_string_pretty(&result)?);
    if !result.succeeded() {
        std::process::exit(1);
    }
    Ok(())
}
