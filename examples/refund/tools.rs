//! The refund example's two Rust tools, shared by `main.rs` and `tests/temporal.rs`:
//! `checkBillingHistory` and `issueRefund` (which fails above the refundable balance).

use dagloop::tools::Registry;
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

/// Registers both tools.
pub fn register(tools: &mut Registry) {
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
}
