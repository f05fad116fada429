//! A step's signature for the doom-loop rule (rule 16): two steps have the same signature when
//! they made the same calls, in any order, whatever order each object's keys were written in.
//!
//! Each call is hashed to 64 bits by walking it (object keys sorted, every value and type
//! told apart), with no canonical copy built or printed; the step's signature is its calls'
//! hashes, sorted. Deliberately not a security hash: it only compares a run's own steps.

use std::hash::{DefaultHasher, Hash, Hasher};

use serde_json::{Map, Value};

use crate::protocol::Call;

/// A 64-bit SipHash stream with fixed keys (the same calls always give the same signature).
/// One stream is enough: a step is only ever compared with the step before it, and two
/// different calls share a hash with odds of one in 2^64.
struct Signer(DefaultHasher);

impl Signer {
    fn new() -> Self {
        Signer(DefaultHasher::new())
    }

    fn u8(&mut self, b: u8) {
        self.0.write_u8(b);
    }

    fn u64(&mut self, n: u64) {
        self.0.write_u64(n);
    }

    fn str(&mut self, s: &str) {
        s.hash(&mut self.0);
    }

    fn opt_str(&mut self, s: Option<&str>) {
        match s {
            None => self.u8(0),
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
        }
    }

    fn finish(&self) -> u64 {
        self.0.finish()
    }

    fn object(&mut self, m: &Map<String, Value>) {
        let mut entries: Vec<(&String, &Value)> = m.iter().collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
        self.u8(8);
        self.u64(entries.len() as u64);
        for (k, v) in entries {
            self.str(k);
            self.value(v);
        }
    }

    fn value(&mut self, v: &Value) {
        match v {
            Value::Null => self.u8(0),
            Value::Bool(b) => {
                self.u8(1);
                self.u8(u8::from(*b));
            }
            Value::Number(n) => {
                // Told apart as they print: 1, -1 and 1.0 are three different numbers.
                if let Some(u) = n.as_u64() {
                    self.u8(2);
                    self.u64(u);
                } else if let Some(i) = n.as_i64() {
                    self.u8(3);
                    self.u64(i as u64);
                } else {
                    self.u8(4);
                    self.u64(n.as_f64().map_or(0, f64::to_bits));
                }
            }
            Value::String(s) => {
                self.u8(5);
                self.str(s);
            }
            Value::Array(a) => {
                self.u8(6);
                self.u64(a.len() as u64);
                for x in a {
                    self.value(x);
                }
            }
            Value::Object(m) => self.object(m),
        }
    }
}

/// One call's hash: its tool, params and underscore fields.
fn of_call(call: &Call) -> u64 {
    let mut h = Signer::new();
    h.str(&call.tool);
    h.object(&call.params);
    h.opt_str(call.output_path.as_deref());
    h.opt_str(call.output_method.map(|m| m.as_str()));
    h.opt_str(call.instance.as_deref());
    match &call.scopes {
        None => h.u8(0),
        Some(scopes) => {
            h.u8(1);
            h.u64(scopes.len() as u64);
            for s in scopes {
                h.str(s);
            }
        }
    }
    h.finish()
}

/// The step's signature: its calls' hashes, sorted (the order calls were written in does not
/// matter).
pub(super) fn of_step(calls: &[std::sync::Arc<Call>]) -> Vec<u64> {
    let mut sig: Vec<u64> = calls.iter().map(|c| of_call(c)).collect();
    sig.sort_unstable();
    sig
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    fn call(v: Value) -> Call {
        Call::try_from(v).expect("call")
    }

    #[test]
    fn same_calls_in_any_order_and_key_order_sign_alike() {
        let a =
            call(json!({"_tool": "t", "q": {"x": 1, "y": [1, "a"]}, "_outputPath": "†state.a"}));
        let a2 =
            call(json!({"_outputPath": "†state.a", "q": {"y": [1, "a"], "x": 1}, "_tool": "t"}));
        let b = call(json!({"_tool": "u"}));
        let (a, a2, b) = (Arc::new(a), Arc::new(a2), Arc::new(b));
        assert_eq!(of_step(&[a.clone(), b.clone()]), of_step(&[b, a2]));
        assert_eq!(of_step(&[a]).len(), 1);
    }

    #[test]
    fn any_difference_changes_the_signature() {
        let base = json!({"_tool": "t", "q": {"x": 1, "y": [1, "a"]}, "_outputPath": "†state.a"});
        let variants = [
            json!({"_tool": "u", "q": {"x": 1, "y": [1, "a"]}, "_outputPath": "†state.a"}),
            json!({"_tool": "t", "q": {"x": 2, "y": [1, "a"]}, "_outputPath": "†state.a"}),
            json!({"_tool": "t", "q": {"x": 1.0, "y": [1, "a"]}, "_outputPath": "†state.a"}),
            json!({"_tool": "t", "q": {"x": "1", "y": [1, "a"]}, "_outputPath": "†state.a"}),
            json!({"_tool": "t", "q": {"x": 1, "y": ["a", 1]}, "_outputPath": "†state.a"}),
            json!({"_tool": "t", "q": {"x": 1, "y": [1, "a"]}, "_outputPath": "†state.b"}),
            json!({"_tool": "t", "q": {"x": 1, "y": [1, "a"]}}),
            json!({"_tool": "t", "q": {"x": 1, "y": [1, "a"]}, "_outputPath": "†state.a", "_instance": "i"}),
            json!({"_tool": "t", "q": {"x": 1, "y": [1, "a"], "z": null}, "_outputPath": "†state.a"}),
        ];
        let s = of_step(&[Arc::new(call(base))]);
        for v in variants {
            assert_ne!(of_step(&[Arc::new(call(v.clone()))]), s, "{v}");
        }
    }
}
