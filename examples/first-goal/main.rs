//! The tutorial's first goal (docs/tutorial.md, and what `dagloop init` writes): two `http`
//! calls in parallel feeding a third, with a failure branch and an output schema, on its
//! scripted model.
//!
//! Offline, every call answered from `tools.json`: `cargo run --example first-goal`.
//! Against the real services: `cargo run --example first-goal -- --live`; with a real model too:
//! `OPENAI_API_KEY=... cargo run --example first-goal -- --live openai:gpt-4o-mini`.

use std::path::Path;
use std::sync::Arc;

use dagloop::RunDef;
use dagloop::engine::AgentBuilder;
use dagloop::goal::Goal;
use dagloop::runs::{Cassette, CassetteExecutor};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/first-goal");
    let mut agent = AgentBuilder::new(RunDef::from_goal(Goal::load(&dir.join("goal.json"))?)?);
    let mut live = false;
    for arg in std::env::args().skip(1) {
        if arg == "--live" {
            live = true;
        } else {
            agent = agent.model_spec(arg);
        }
    }
    if !live {
        let path = dir.join("tools.json");
        let text = std::fs::read_to_string(&path)?;
        let cassette = Cassette::parse(&text, &path.display().to_string())?;
        agent = agent.executor(Arc::new(CassetteExecutor::new(Arc::new(cassette), None)));
    }
    let result = agent.build()?.run().await;
    println!("{}", serde_json::to_string_pretty(&result)?);
    if !result.succeeded() {
        std::process::exit(1);
    }
    Ok(())
}
