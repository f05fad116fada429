//! The API's OpenAPI document: generated from the routes (`utoipa::path` on each handler) and
//! the Rust types they take and return (`utoipa::ToSchema`), then given the one shape utoipa
//! cannot derive: the event stream's payload, a `oneOf` over the event types discriminated by
//! `type` (one named schema per type, so generated clients get one class each), and the same
//! for a decision's variants.
//!
//! `dagloop schema openapi` prints it, the server serves it at `/openapi.json`, and
//! schemas/openapi.json is the committed copy (tests/server_api.rs fails when they differ).
//! Deliberately not here: the routes themselves (`super::api_routes`).

use serde_json::{Map, Value, json};
use utoipa::OpenApi;

use super::auth::BearerScheme;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "dagloop",
        description = "Submit goals, follow runs as they happen, and decide the calls that wait for a reviewer."
    ),
    components(schemas(crate::protocol::Event, crate::protocol::EventKind)),
    modifiers(&BearerScheme),
    security(("bearer" = []))
)]
pub(super) struct ApiDoc;

/// The document of the routes `api` describes, as JSON, with the events' `oneOf`.
pub(super) fn finish(api: utoipa::openapi::OpenApi) -> Value {
    let mut doc = serde_json::to_value(&api).unwrap_or(Value::Null);
    events_one_of(&mut doc);
    disk_full_everywhere(&mut doc);
    doc
}

/// Every operation may answer 507 (`store.io`, the disk under the store is full): any of them
/// may write (a run's record, a lease, a decision), so it is declared once here rather than on
/// each route.
fn disk_full_everywhere(doc: &mut Value) {
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for item in paths.values_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for (method, op) in item.iter_mut() {
            if !["get", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                continue;
            }
            if let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) {
                responses.entry("507").or_insert_with(|| {
                    json!({
                        "description": "The disk under the run store is full (`store.io`): nothing was recorded; retry once there is room",
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ApiError"}}}
                    })
                });
            }
        }
    }
}

/// Replaces the derived `Event` (the common fields, flattened with the `EventKind` enum) by a
/// `oneOf` of one schema per event type (`CallReceivedEvent`, ...: the common fields and the
/// type's own), discriminated by `type`; `EventKind` goes. `Decision` gets the same: one schema
/// per decision (`ApproveDecision`, ...), discriminated by `decision`.
fn events_one_of(doc: &mut Value) {
    let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    if let (Some(event), Some(kinds)) = (schemas.remove("Event"), schemas.remove("EventKind")) {
        // The common fields: the object part of the derived `Event`.
        let common = event["allOf"]
            .as_array()
            .and_then(|parts| parts.iter().find(|p| p.get("properties").is_some()))
            .cloned()
            .unwrap_or(event);
        let one_of = named_variants(schemas, &kinds, "type", "Event", &common);
        schemas.insert(
            "Event".into(),
            json!({
                "description": "One event of a run, as `GET /runs/{id}/events` sends it in an SSE frame's `data` (the frame's `event` is its `type`, its `id` its `seq`).",
                "oneOf": one_of.0,
                "discriminator": {"propertyName": "type", "mapping": one_of.1},
            }),
        );
    }
    if let Some(decision) = schemas.remove("Decision") {
        let one_of = named_variants(schemas, &decision, "decision", "Decision", &json!({}));
        let mut named = json!({
            "oneOf": one_of.0,
            "discriminator": {"propertyName": "decision", "mapping": one_of.1},
        });
        if let Some(d) = decision.get("description") {
            named["description"] = d.clone();
        }
        schemas.insert("Decision".into(), named);
    }
    schemas.sort_keys();
}

/// Puts each variant of the internally tagged `oneOf` in `tagged` into `schemas` as its own
/// object schema (`common`'s fields and its own), named after its `tag` value and `suffix`;
/// returns the references to them and the discriminator's mapping.
fn named_variants(
    schemas: &mut Map<String, Value>,
    tagged: &Value,
    tag: &str,
    suffix: &str,
    common: &Value,
) -> (Vec<Value>, Map<String, Value>) {
    let mut refs = Vec::new();
    let mut mapping = Map::new();
    for variant in tagged["oneOf"].as_array().into_iter().flatten() {
        let Some(value) = variant["properties"][tag]["enum"][0].as_str() else {
            continue;
        };
        let name = format!("{}{suffix}", camel(value));
        let mut properties = common["properties"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let mut required: Vec<Value> = common["required"].as_array().cloned().unwrap_or_default();
        if let Some(own) = variant["properties"].as_object() {
            properties.extend(own.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        required.extend(variant["required"].as_array().cloned().unwrap_or_default());
        let mut schema = json!({"type": "object", "properties": properties, "required": required});
        if let Some(d) = variant.get("description") {
            schema["description"] = d.clone();
        }
        let reference = format!("#/components/schemas/{name}");
        mapping.insert(value.to_string(), json!(reference));
        refs.push(json!({"$ref": reference}));
        schemas.insert(name, schema);
    }
    (refs, mapping)
}

/// `call_received` -> `CallReceived`.
fn camel(tag: &str) -> String {
    tag.split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}
