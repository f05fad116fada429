//! Issue 12: the published goal schema and the code agree. Every key the code's serde structs
//! accept is in `schemas/goal.schema.json` (and `tool.schema.json` for `_http`/`_shell`), and
//! every key the schema lists is accepted by the code; every example and goal fixture validates
//! against the schema and loads.
//!
//! The code's keys are read from the structs themselves: a `deny_unknown_fields` struct answers
//! an unknown key with "expected one of `a`, `b`, ...".

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use dagloop::schema::published::Document;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// The keys a struct accepts, from its unknown-field error.
fn code_keys<T: DeserializeOwned + std::fmt::Debug>() -> BTreeSet<String> {
    let e = serde_json::from_value::<T>(json!({"__probe__": 1})).expect_err("probe refused");
    let text = e.to_string();
    let list = text
        .split("expected one of ")
        .nth(1)
        .or_else(|| text.split("expected ").nth(1))
        .unwrap_or_else(|| panic!("no key list in {text}"));
    list.split(", ")
        .map(|k| k.trim().trim_matches('`').to_string())
        .filter(|k| !k.is_empty())
        .collect()
}

fn schema_keys(schema: &Value, pointer: &str) -> BTreeSet<String> {
    schema
        .pointer(pointer)
        .and_then(Value::as_object)
        .unwrap_or_else(|| panic!("no properties at {pointer}"))
        .keys()
        .cloned()
        .collect()
}

fn agree(what: &str, code: BTreeSet<String>, schema: BTreeSet<String>) {
    let missing: Vec<_> = code.difference(&schema).collect();
    let extra: Vec<_> = schema.difference(&code).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{what}: accepted by the code but not in the schema: {missing:?}; in the schema but refused by the code: {extra:?}"
    );
}

#[test]
fn every_key_the_code_accepts_is_in_the_schema_and_the_reverse() {
    let goal = Document::Goal.schema().unwrap();
    let tool = Document::Tool.schema().unwrap();
    agree(
        "goal",
        code_keys::<dagloop::goal::Goal>(),
        schema_keys(&goal, "/properties"),
    );
    agree(
        "limits",
        code_keys::<dagloop::goal::Limits>(),
        schema_keys(&goal, "/properties/limits/properties"),
    );
    agree(
        "approval",
        code_keys::<dagloop::approval::Policy>(),
        schema_keys(&goal, "/properties/approval/properties"),
    );
    for (doc, base) in [(&goal, "/$defs/tool/properties"), (&tool, "/properties")] {
        agree(
            "_http",
            code_keys::<dagloop::tools::HttpConfig>(),
            schema_keys(doc, &format!("{base}/_http/properties")),
        );
        agree(
            "_shell",
            code_keys::<dagloop::tools::ShellConfig>(),
            schema_keys(doc, &format!("{base}/_shell/properties")),
        );
    }
}

fn goal_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        let name = p.to_string_lossy().to_string();
        if p.is_dir() {
            // Deliberately broken goals live in `bad/` and `hostile/`.
            if !name.ends_with("/bad") && !name.ends_with("/hostile") {
                goal_files(&p, out);
            }
        } else if name.ends_with(".json") && !name.contains("invalid-") {
            let text = std::fs::read_to_string(&p).unwrap();
            if serde_json::from_str::<Value>(&text).is_ok_and(|v| v.get("output_schema").is_some())
            {
                out.push(p);
            }
        }
    }
}

#[test]
fn every_example_and_goal_fixture_validates_and_loads() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    goal_files(&root.join("examples"), &mut files);
    goal_files(&root.join("tests/fixtures"), &mut files);
    assert!(files.len() >= 10, "found {files:?}");
    let validator = Document::Goal.validator().unwrap();
    for f in &files {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
        let violations = validator.validate(&v);
        assert!(violations.is_empty(), "{}: {violations:?}", f.display());
        dagloop::goal::Goal::load(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    }
}
