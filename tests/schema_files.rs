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
        // The loader takes every file the schema accepts (a turn's `usage` included).
        dagloop::llm::Script::parse(&v.to_string(), &name).unwrap_or_else(|e| panic!("{e}"));
        for turn in v["turns"].as_array().cloned().unwrap_or_default() {
            if let Some(s) = turn.get("solution") {
                Solution::from_value(s.clone()).unwrap_or_else(|e| panic!("{name}: {e}"));
            }
        }
    }
}

/// The scripted-model loader refuses what its schema refuses (the two cannot drift apart in the
/// direction that lets a file pass the editor's check and then fail to load, or the reverse).
#[test]
fn invalid_scripted_models_are_refused_by_the_loader_too() {
    for (name, v) in fixtures(Document::ScriptedModel)
        .into_iter()
        .filter(|(n, _)| n.starts_with("invalid-"))
    {
        for turn in v["turns"].as_array().cloned().unwrap_or_default() {
            let one = serde_json::json!({ "turns": [turn] });
            let schema_ok = Document::ScriptedModel.validator().unwrap().is_valid(&one);
            let loader_ok = dagloop::llm::Script::parse(&one.to_string(), &name).is_ok();
            assert_eq!(schema_ok, loader_ok, "{name}: {turn}");
        }
        assert!(
            dagloop::llm::Script::parse(&v.to_string(), &name).is_err(),
            "{name}"
        );
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

/// Issue 23: the meta keys the schemas allow are the ones `protocol::meta` defines, and a meta
/// key dagloop does not define is refused by the schema and by the typed parsers alike.
#[test]
fn meta_keys_are_the_ones_the_parsers_define() {
    use dagloop::protocol::{CALL_META_KEYS, TOOL_META_KEYS};
    let allowed = |schema: &Value| -> Vec<String> {
        schema["anyOf"][1]["enum"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap().to_string())
            .collect()
    };
    let call = Document::Call.schema().unwrap();
    assert_eq!(allowed(&call["propertyNames"]), CALL_META_KEYS);
    let listed: Vec<&String> = call["properties"].as_object().unwrap().keys().collect();
    assert_eq!(listed, CALL_META_KEYS, "every call meta key is described");
    let tool = Document::Tool.schema().unwrap();
    assert_eq!(allowed(&tool["then"]["propertyNames"]), TOOL_META_KEYS);
    assert_eq!(
        allowed(&tool["properties"]["properties"]["propertyNames"]),
        CALL_META_KEYS
    );
    for k in TOOL_META_KEYS {
        assert!(tool["properties"].get(k).is_some(), "{k} is described");
    }

    let refused = |name: &str| -> Value {
        let (_, v) = fixtures(match name {
            "call" => Document::Call,
            "tool" => Document::Tool,
            _ => Document::Goal,
        })
        .into_iter()
        .find(|(n, _)| n.starts_with("invalid-unknown-meta-key"))
        .unwrap();
        v
    };
    let e = Call::parse(refused("call")).expect_err("refused");
    assert_eq!(e.code(), "protocol.unknown_meta_key");
    assert!(e.to_string().contains("did you mean `_outputPath`?"), "{e}");
    let e = Tool::from_value(refused("tool")).expect_err("refused");
    assert_eq!(e.code(), "protocol.unknown_meta_key");
    assert!(e.to_string().contains("did you mean `_approval`?"), "{e}");

    // The goal: refused on the goal itself first, then on each part as the typos are fixed.
    let mut goal = refused("goal");
    let load = |g: &Value| {
        dagloop::Goal::from_json(&g.to_string(), "g.json".as_ref(), PathBuf::new())
            .expect_err("refused")
    };
    let mut messages = Vec::new();
    for fix in ["/_approval", "/tools/0/_aproval", "/plan/0/_outputpath"] {
        let e = load(&goal);
        assert_eq!(e.code(), "goal.unknown_meta_key", "{e}");
        assert!(
            !Document::Goal.validator().unwrap().is_valid(&goal),
            "the schema refuses it too"
        );
        messages.push(e.to_string());
        let (parent, key) = fix.rsplit_once('/').unwrap();
        goal.pointer_mut(if parent.is_empty() { "" } else { parent })
            .and_then(Value::as_object_mut)
            .unwrap()
            .remove(key);
    }
    assert_eq!(
        messages,
        [
            "goal file g.json: the goal: unknown meta key `_approval` (did you mean `approval`?)",
            "goal file g.json: tools[0] (Refund): unknown meta key `_aproval` (did you mean `_approval`?)",
            "goal file g.json: plan[0]: unknown meta key `_outputpath` (did you mean `_outputPath`?)",
        ]
    );
    // What is left (a registered kind's `_upper` beside its `_activity`) loads.
    assert!(Document::Goal.validator().unwrap().is_valid(&goal));
    dagloop::Goal::from_json(&goal.to_string(), "g.json".as_ref(), PathBuf::new())
        .unwrap_or_else(|e| panic!("{e}"));
}
