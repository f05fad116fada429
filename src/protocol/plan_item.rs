//! One entry of the `plan` message (protocol chapter 012): a call of the previous step with
//! what became of it. dagloop keeps the call itself and writes the JSON only when the request
//! is serialised, instead of copying every call into a JSON object at the end of each step.
//!
//! Deliberately not here: deciding what a plan shows (`context::assemble`) or sanitising
//! results (done before an item is made).

use std::borrow::Cow;
use std::sync::Arc;

use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::Call;

/// A call of the previous step as the next Request shows it: the call's fields as written
/// (`_tool`, its params, `_outputPath`, `_outputMethod`, `_instance`, `_scopes`), then
/// `_status`, then `_result` when its result is shown here. Read back from JSON, an item is
/// that JSON, unchanged.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum PlanItem {
    /// A call and what became of it.
    Call {
        /// The call (as the model wrote it, or as a reviewer revised it).
        call: Arc<Call>,
        /// `done`, `failed`, `rejected`, `unresolved`, `cancelled` or `refused`.
        status: Cow<'static, str>,
        /// The result shown with it (already sanitised), for a call without an output path.
        result: Option<Value>,
    },
    /// Any other entry: one read back from JSON, or a call that could not be read (`null`).
    Json(Value),
}

impl PlanItem {
    /// The item for `call` with `status` and `result`. A call whose params use the names
    /// `_status` or `_result` (a call refused for it) is written out as JSON at once, with the
    /// status and result in their place, so the item reads as it always did.
    pub fn new(call: Arc<Call>, status: Cow<'static, str>, result: Option<Value>) -> Self {
        if call.params.contains_key("_status") || call.params.contains_key("_result") {
            let mut v = call.to_value();
            if let Value::Object(m) = &mut v {
                m.insert("_status".into(), Value::String(status.into_owned()));
                if let Some(r) = result {
                    m.insert("_result".into(), r);
                }
            }
            return PlanItem::Json(v);
        }
        PlanItem::Call {
            call,
            status,
            result,
        }
    }

    /// The item as a JSON value (what it serialises to).
    pub fn to_value(&self) -> Value {
        match self {
            PlanItem::Json(v) => v.clone(),
            PlanItem::Call { .. } => serde_json::to_value(self).unwrap_or(Value::Null),
        }
    }
}

impl From<Value> for PlanItem {
    fn from(v: Value) -> Self {
        PlanItem::Json(v)
    }
}

impl PartialEq for PlanItem {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (PlanItem::Json(a), PlanItem::Json(b)) => a == b,
            _ => self.to_value() == other.to_value(),
        }
    }
}

impl Serialize for PlanItem {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (call, status, result) = match self {
            PlanItem::Json(v) => return v.serialize(s),
            PlanItem::Call {
                call,
                status,
                result,
            } => (call, status, result),
        };
        // The order `Call::to_value` gives, then the status and the result.
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("_tool", &call.tool)?;
        for (k, v) in &call.params {
            m.serialize_entry(k, v)?;
        }
        if let Some(p) = &call.output_path {
            m.serialize_entry("_outputPath", p)?;
        }
        if let Some(method) = call.output_method {
            m.serialize_entry("_outputMethod", method.as_str())?;
        }
        if let Some(i) = &call.instance {
            m.serialize_entry("_instance", i)?;
        }
        if let Some(scopes) = &call.scopes {
            m.serialize_entry("_scopes", scopes)?;
        }
        m.serialize_entry("_status", status.as_ref())?;
        if let Some(r) = result {
            m.serialize_entry("_result", r)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for PlanItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(PlanItem::Json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn item(call: Value, status: &'static str, result: Option<Value>) -> PlanItem {
        let call = Call::try_from(call).expect("call");
        PlanItem::new(Arc::new(call), Cow::Borrowed(status), result)
    }

    /// What the plan showed before items kept the call: `Call::to_value` with `_status` and
    /// `_result` inserted.
    fn as_before(call: Value, status: &str, result: Option<Value>) -> String {
        let mut v = Call::try_from(call).expect("call").to_value();
        if let Value::Object(m) = &mut v {
            m.insert("_status".into(), json!(status));
            if let Some(r) = result {
                m.insert("_result".into(), r);
            }
        }
        serde_json::to_string(&v).expect("json")
    }

    #[test]
    fn an_item_writes_what_the_call_as_json_with_its_status_wrote() {
        let calls = [
            (
                json!({"_tool": "t", "b": 1, "a": {"x": [1, "†state.y"]}}),
                None,
            ),
            (
                json!({"_tool": "t", "q": "s", "_outputPath": "†state.r",
                       "_outputMethod": "push", "_instance": "i1", "_scopes": ["docs"]}),
                Some(json!({"ok": true})),
            ),
            // A refused call whose params use the plan's own names.
            (
                json!({"_tool": "t", "_status": "mine", "z": 0}),
                Some(json!(2)),
            ),
            (json!({"_tool": "t", "_result": "mine"}), None),
        ];
        for (call, result) in calls {
            let it = item(call.clone(), "done", result.clone());
            assert_eq!(
                serde_json::to_string(&it).expect("json"),
                as_before(call, "done", result)
            );
        }
    }

    #[test]
    fn an_item_read_back_is_its_json_and_equal_to_the_call_it_was() {
        let it = item(json!({"_tool": "t", "n": 1}), "failed", None);
        let text = serde_json::to_string(&it).expect("json");
        let back: PlanItem = serde_json::from_str(&text).expect("read");
        assert_eq!(
            back,
            PlanItem::Json(json!({"_tool": "t", "n": 1, "_status": "failed"}))
        );
        assert_eq!(back, it);
        assert_ne!(back, item(json!({"_tool": "t", "n": 2}), "failed", None));
    }
}
