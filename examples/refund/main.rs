//! The refund workflow: a branching output path (`†state.receipt || †state.refundError`) and
//! replanning after a failed refund (protocol chapter 012).
//!
//! Runs offline on the scripted model: `cargo run --example refund`.
//! With a real model: `OPENAI_API_KEY=... cargo run --example refund -- openai:gpt-4o-mini`.

use std::path::Path;

use dagloop::engine::AgentBuilder;
use dagloop::goal::Goal;
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Deserialize)]
struct Billing {
    #[serde(rename = "customerId")]
    customer_id: String,
}

#[derive(Deserialize)]
struct Refund {
    #[serde(rename = "orderId")]
    order_id: String,
    amount: f64,
}

/// The payment system: order `ord_981` has 40.00 left to refund.
const REFUNDABLE: f64 = 40.0;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/refund/goal.json");
    let mut agent = AgentBuilder::new(Goal::load(&path)?);
    if let Some(spec) = std::env::args().nth(1) {
        agent = agent.model_spec(spec);
    }
    let tools = agent.registry_mut();
    tools.register_fn("checkBillingHistory", |p: Billing| async move {
        Ok::<Value, String>(json!({
            "customerId": p.customer_id,
            "orders": 5,
            "lastChargeback": "2025-09-10",
            "lastOrder": {"id": "ord_981", "total": 50.0, "refundable": REFUNDABLE}
        }))
    });
    tools.register_fn("issueRefund", |p: Refund| async move {
        if p.amount > REFUNDABLE {
            return Err(format!(
                "amount {:.2} exceeds the refundable balance {REFUNDABLE:.2} of {}",
                p.amount, p.order_id
            ));
        }
        Ok(json!({"refundId": format!("rf_{}_{}", p.order_id, p.amount), "amount": p.amount}))
    });
    let result = agent.build()?.run().await;
    println!("{}", serde_json::to_string_pretty(&result)?);
    if !result.succeeded() {
        std::process::exit(1);
    }
    Ok(())
}
