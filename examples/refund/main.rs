//! The refund workflow: a branching output path (`†state.receipt || †state.refundError`) and
//! replanning after a failed refund (protocol chapter 012).
//!
//! Runs offline on the scripted model: `cargo run --example refund`.
//! With a real model: `OPENAI_API_KEY=... cargo run --example refund -- openai:gpt-4o-mini`.

mod tools;

use std::path::Path;

use dagloop::RunDef;
use dagloop::engine::AgentBuilder;
use dagloop::goal::Goal;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/refund/goal.json");
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
