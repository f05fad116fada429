//! The published JSON Schemas in `schemas/`: each compiles, accepts the realistic documents in
//! `tests/fixtures/schemas/<kind>/valid-*.json`, refuses every `invalid-*.json` for the reasons
//! recorded in the snapshots, agrees with the typed parsers, and embeds identical copies of the
//! schemas it shares with the others.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use dagloop::protocol::{Call, Solution, Tool};
use dagloop::schema::published::Document;
use serde_json::Value;

fn fixtures(doc: Document) -> Vec<(String, Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/schemas")
        .join(doc.file_name().trim_end_matches(".schema.json"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&p).unwrap();
            let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, value)
        })
        .collect()
}

/// `pointer keyword` lines, deduplicated: the meta-schema can report one fault along several
/// schema paths, which says nothing more.
fn summary(violations: &[dagloop::schema::Violation]) -> Vec<String> {
    let set: BTreeSet<String> = violations
        .iter()
        .map(|v| {
            format!(
                "{} {}",
                if v.pointer.is_empty() {
                    "/"
                } else {
                    &v.pointer
                },
                v.keyword
            )
        })
        .collect();
    set.into_iter().collect()
}

#[test]
fn every_published_schema_compiles_and_is_a_2020_12_object() {
    for doc in Document::ALL {
        let schema = doc.schema().unwrap();
        assert_eq!(
            schema["$schema"],
            "https://json-schema.org/draft/2020-12/schema",
            "{}",
            doc.file_name()
        );
        assert!(schema["title"].is_string(), "{}", doc.file_name());
        doc.validator()
            .unwrap_or_else(|e| panic!("{}: {e}", doc.file_name()));
    }
}

#[test]
fn shipped_files_are_the_compiled_in_text() {
    for doc in Document::ALL {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("schemas")
            .join(doc.file_name());
        assert_eq!(std::fs::read_to_string(path).unwrap(), doc.text());
    }
}

#[test]
fn valid_fixtures_pass_and_invalid_fixtures_fail() {
    let mut report = String::new();
    for doc in Document::ALL {
        let validator = doc.validator().unwrap();
        let cases = fixtures(doc);
        assert!(
            cases.iter().any(|(n, _)| n.starts_with("valid-")),
            "{doc:?} has no valid fixture"
        );
        assert!(
            cases.iter().any(|(n, _)| n.starts_with("invalid-")),
            "{doc:?} has no invalid fixture"
        );
        for (name, value) in cases {
            let violations = validator.validate(&value);
            if name.starts_with("valid-") {
                assert_eq!(violations, vec![], "{doc:?} {name} should be valid");
            } else {
                assert!(!violations.is_empty(), "{doc:?} {name} should be invalid");
                assert!(!validator.is_valid(&value));
                report.push_str(&format!("{} {name}\n", doc.file_name()));
                for line in summary(&violations) {
                    report.push_str(&format!("  {line}\n"));
                }
            }
        }
    }
    insta::assert_snapshot!(report);
}

#[test]
fn valid_fixtures_are_accepted_by_the_typed_parsers() {
    for (name, v) in fixtures(Document::Call)
        .into_iter()
        .filter(|(n, _)| n.starts_with("valid-"))
    {
        Call::try_from(v).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    for (name, v) in fixtures(Document::Tool)
        .into_iter()
        .filter(|(n, _)| n.starts_with("valid-"))
    {
        Tool::from_value(v).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    for (name, v) in fixtures(Document::Solution)
        .into_iter()
        .filter(|(n, _)| n.starts_with("valid-"))
    {
        Solution::from_value(v).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    for (name, v) in fixtures(Document::Goal)
        .into_iter()
        .filter(|(n, _)| n.starts_with("valid-"))
    {
        for t in v["tools"].as_array().cloned().unwrap_or_default() {
            let tool = Tool::from_value(t).unwrap_or_else(|e| panic!("{name}: {e}"));
            // A tool accepted by the goal schema must also compose.
            dagloop::schema::compose(&[tool], &v["output_schema"])
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        for c in v["plan"].as_array().cloned().unwrap_or_default() {
            Call::try_from(c).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
    for (name, v) in fixtures(Document::ScriptedModel)
        .into_iter()
        .filter(|(n, _)| n.starts_with("valid-"))
    {
        for turn in v["turns"].as_array().cloned().unwrap_or_default() {
            if let Some(s) = turn.get("solution") {
                Solution::from_value(s.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
            }
        }
    }
}

/// Removes what only belongs at the root of a file.
fn body(schema: &Value) -> Value {
    let mut m = schema.as_object().cloned().unwrap();
    m.remove("$schema");
    m.remove("title");
    m.remove("$defs");
    Value::Object(m)
}

#[test]
fn embedded_copies_match_their_files() {
    // (file, definition name, file whose body it copies)
    let embeds = [
        (Document::Solution, "call", Document::Call),
        (Document::Goal, "call", Document::Call),
        (Document::Goal, "tool", Document::Tool),
        (Document::ScriptedModel, "solution", Document::Solution),
        (Document::ScriptedModel, "call", Document::Call),
    ];
    for (host, name, source) in embeds {
        let host_schema = host.schema().unwrap();
        let source_schema = source.schema().unwrap();
        assert_eq!(
            host_schema["$defs"][name],
            body(&source_schema),
            "{} $defs/{name} differs from {}",
            host.file_name(),
            source.file_name()
        );
        // The copy's own references must find the same definitions in the host.
        if let Some(defs) = source_schema["$defs"].as_object() {
            for (k, v) in defs {
                assert_eq!(
                    &host_schema["$defs"][k],
                    v,
                    "{} lacks $defs/{k}",
                    host.file_name()
                );
            }
        }
    }
}
