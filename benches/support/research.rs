//! The research example run to its end, shared by the benchmarks that time it (`runs`,
//! `temporal`). Include with `#[path = "support/research.rs"] mod research;`.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Instant;

use dagloop::engine::AgentBuilder;
use dagloop::goal::Goal;

#[path = "../../examples/research/tools.rs"]
pub mod tools;

/// One embedded research run of `goal` to its end; its latency in ms.
pub async fn run_once(goal: Arc<Goal>) -> f64 {
    let t = Instant::now();
    let mut agent =
        AgentBuilder::new(dagloop::RunDef::from_goal((*goal).clone()).expect("defined"));
    tools::register(agent.registry_mut());
    let result = agent.build().expect("agent").run().await;
    assert!(result.succeeded(), "{:?}", result.error);
    t.elapsed().as_secs_f64() * 1000.0
}
