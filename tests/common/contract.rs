//! The API's contract, checked on every answer the server tests receive: the body is validated
//! against the schema the committed schemas/openapi.json declares for the request's route
//! (path template and method) and status, `$ref`s resolved into its components. `serve::send`
//! and `serve::read_events` call it, so every test that talks to the server through them checks
//! the document without asking.
//!
//! An answer whose status the route does not declare must be a refusal (4xx/5xx) shaped as
//! `ApiError` (the guards and the auth layer answer every route); a success it does not declare
//! fails. Paths the document does not describe (the page, `/openapi.json`) are not checked.
//!
//! Included by `serve.rs` (`serve::contract`).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::{Value, json};

/// The committed document.
pub fn document() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("schemas/openapi.json");
        let text = std::fs::read_to_string(&file).expect("schemas/openapi.json");
        serde_json::from_str(&text).expect("schemas/openapi.json is JSON")
    })
}

/// The document's path template that `path` (a request's URL path) matches, if any: literal
/// segments equal, `{name}` segments match any one segment.
pub fn template(doc: &Value, path: &str) -> Option<String> {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    let paths = doc["paths"].as_object()?;
    // A literal segment beats a parameter (`/runs/x` before `/runs/{id}`): fewest parameters.
    paths
        .keys()
        .filter(|t| {
            let ts: Vec<&str> = t.split('/').collect();
            ts.len() == segs.len()
                && ts
                    .iter()
                    .zip(&segs)
                    .all(|(t, s)| (t.starts_with('{') && t.ends_with('}')) || t == s)
        })
        .min_by_key(|t| t.matches('{').count())
        .cloned()
}

/// Where the schema of `method path` answering `status` with `content_type` sits in the
/// document, as a JSON pointer; None for a path the document does not describe.
fn pointer(
    doc: &Value,
    method: &str,
    path: &str,
    status: u16,
    content_type: &str,
) -> Option<Result<String, String>> {
    let t = template(doc, path)?;
    let method = method.to_ascii_lowercase();
    let esc = |s: &str| s.replace('~', "~0").replace('/', "~1");
    let Some(op) = doc["paths"][&t].get(&method) else {
        return Some(Err(format!(
            "{} {t}: the document declares no such operation",
            method.to_uppercase()
        )));
    };
    match op["responses"].get(status.to_string()) {
        Some(resp) => {
            let Some(content) = resp["content"].as_object() else {
                return Some(Ok(String::new()));
            };
            match content.get(content_type) {
                Some(_) => Some(Ok(format!(
                    "/paths/{}/{method}/responses/{status}/content/{}/schema",
                    esc(&t),
                    esc(content_type)
                ))),
                None => Some(Err(format!(
                    "{} {t} {status}: answered {content_type}, the document declares {:?}",
                    method.to_uppercase(),
                    content.keys().collect::<Vec<_>>()
                ))),
            }
        }
        None if status >= 400 => Some(Ok("/components/schemas/ApiError".into())),
        None => Some(Err(format!(
            "{} {t}: status {status} is not declared",
            method.to_uppercase()
        ))),
    }
}

type Validators = BTreeMap<String, Arc<jsonschema::Validator>>;

/// The validator of the schema at `pointer` in `doc`, references resolved within `doc`.
fn validator(doc: &Value, pointer: &str) -> Arc<jsonschema::Validator> {
    static CACHE: OnceLock<Mutex<Validators>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = format!("{:p}{pointer}", doc as *const Value);
    if let Some(v) = cache.lock().expect("validators").get(&key) {
        return v.clone();
    }
    // The whole document as the root, so `#/components/schemas/...` resolves; its own keys are
    // not schema keywords (and `discriminator` is an annotation).
    let mut root = doc.clone();
    // A URI fragment: the braces of path templates are percent-encoded.
    let fragment = pointer.replace('{', "%7B").replace('}', "%7D");
    root["$ref"] = json!(format!("#{fragment}"));
    root["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
    let v = Arc::new(
        jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .build(&root)
            .unwrap_or_else(|e| panic!("the schema at {pointer} does not compile: {e}")),
    );
    cache.lock().expect("validators").insert(key, v.clone());
    v
}

/// Checks one answer against `doc`: Err says how it breaks the contract.
pub fn check_in(
    doc: &Value,
    method: &str,
    path: &str,
    status: u16,
    content_type: &str,
    body: &Value,
) -> Result<(), String> {
    let ct = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let ptr = match pointer(doc, method, path, status, &ct) {
        None => return Ok(()),
        Some(Err(e)) => {
            // An undeclared refusal the guards answered without a JSON body (a 405).
            if status >= 400 && ct != "application/json" {
                return Ok(());
            }
            return Err(e);
        }
        Some(Ok(p)) if p.is_empty() => return Ok(()),
        Some(Ok(p)) => p,
    };
    let errors: Vec<String> = validator(doc, &ptr)
        .iter_errors(body)
        .map(|e| format!("at {}: {e}", e.instance_path()))
        .take(5)
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{method} {path} {status}: the body does not match {ptr}:\n  {}\nbody: {body}",
            errors.join("\n  ")
        ))
    }
}

/// Checks one answer against the committed document; panics when it breaks the contract.
pub fn check(method: &str, path: &str, status: u16, content_type: &str, body: &Value) {
    if let Err(e) = check_in(document(), method, path, status, content_type, body) {
        panic!("the answer breaks the API's contract (schemas/openapi.json): {e}");
    }
}

/// Checks one event of `GET path` (an SSE frame's data) against the document's event schema.
pub fn check_event(path: &str, data: &Value) {
    check("GET", path, 200, "text/event-stream", data);
}
