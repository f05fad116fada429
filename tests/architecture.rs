//! The house's shape, checked: the sans-IO core (`protocol`, `state`, `graph`, `plan`,
//! `approval`, `scheduler`, `machine`, `context`, `schema`) never reaches up into the modules that
//! read files, start processes, drive runs or serve them (`engine`, `tools`, `runs`, `server`,
//! `store`, `goal`). A run's machine is built from what a goal *says* (`machine::AgentSpec`),
//! never from the goal file type.
//!
//! Nor do the modules import each other in a circle, even through others (a circle once ran
//! `goal → tools → grants → goal`, through eight files and four layers), and the engine's files
//! import each other without one (`builder ↔ loading` once did).
//!
//! The check reads the sources: every `crate::NAME` path and every `crate::{...}` group in a core
//! module's files, test code and comments excepted (files named `tests.rs` or `*_tests.rs`,
//! the part of a file from its `#[cfg(test)]` module on, and `//` lines: a doc link is no
//! dependency).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const CORE: [&str; 9] = [
    "protocol",
    "state",
    "graph",
    "plan",
    "approval",
    "scheduler",
    "machine",
    "context",
    "schema",
];
const ABOVE: [&str; 6] = ["engine", "tools", "runs", "server", "store", "goal"];

fn sources(module: &str) -> Vec<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    let file = src.join(format!("{module}.rs"));
    if file.exists() {
        out.push(file);
    }
    let mut dirs = vec![src.join(module)];
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn is_test_file(p: &Path) -> bool {
    let name = p.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    name == "tests" || name.ends_with("_tests")
}

/// The names a source's non-test code reaches through `crate::`.
fn reached(text: &str) -> Vec<String> {
    let code = match text.find("#[cfg(test)]\nmod ") {
        Some(i) => &text[..i],
        None => text,
    };
    // Comments (doc links included) make no dependency.
    let code: String = code
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut names = Vec::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        let after = &rest[i + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                names.push(name);
            }
        } else {
            names.push(
                after
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect(),
            );
        }
        rest = after;
    }
    names
}

#[test]
fn the_core_imports_nothing_above_it() {
    let mut found = Vec::new();
    let mut read = 0;
    for module in CORE {
        for file in sources(module) {
            if is_test_file(&file) {
                continue;
            }
            let text = std::fs::read_to_string(&file).expect("read a source");
            read += 1;
            for name in reached(&text) {
                if ABOVE.contains(&name.as_str()) {
                    found.push(format!("{} reaches crate::{name}", file.display()));
                }
            }
        }
    }
    assert!(read > 40, "read only {read} core source files");
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The check itself sees both spellings of an import, and ignores test code.
#[test]
fn the_check_sees_paths_and_groups() {
    assert_eq!(reached("use crate::goal::Goal;"), ["goal"]);
    assert_eq!(
        reached("use crate::{protocol::Call, engine::Agent};"),
        ["protocol", "engine"]
    );
    assert!(reached("fn f() {}\n#[cfg(test)]\nmod tests { use crate::goal::Goal; }").is_empty());
    assert!(reached("/// Built like [`crate::goal::Goal`] says.\nfn f() {}").is_empty());
}

/// The crate's top-level modules: `src/NAME.rs` and `src/NAME/`, the crate root and `main.rs`
/// left out.
fn modules() -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeSet::new();
    for e in std::fs::read_dir(&src).expect("src").flatten() {
        let p = e.path();
        let name = p
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("")
            .to_string();
        if p.is_dir()
            || (p.extension().is_some_and(|x| x == "rs") && name != "lib" && name != "main")
        {
            out.insert(name);
        }
    }
    out.into_iter().collect()
}

/// The non-test code of `file`, as [`reached`] reads it.
fn code_of(file: &Path) -> String {
    std::fs::read_to_string(file).expect("read a source")
}

/// A circle in `edges` (each name to the names it imports), as the names along it, first name
/// repeated at the end; None when there is none. Deterministic: names in order.
fn a_circle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut circle = path[i..].to_vec();
            circle.push(n.to_string());
            return Some(circle);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for next in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(next, edges, done, path) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|n| visit(n, edges, &mut done, &mut Vec::new()))
}

#[test]
fn no_two_modules_import_each_other_even_through_others() {
    let names = modules();
    assert!(names.len() > 20, "found only {names:?}");
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for m in &names {
        let mut to = BTreeSet::new();
        for file in sources(m) {
            if is_test_file(&file) {
                continue;
            }
            for name in reached(&code_of(&file)) {
                if &name != m && names.contains(&name) {
                    to.insert(name);
                }
            }
        }
        edges.insert(m.clone(), to);
    }
    // The circle of issue 45 is gone for good: the goal reaches neither tools nor grants.
    for above in ["tools", "grants", "runs"] {
        assert!(!edges["goal"].contains(above), "goal imports {above} again");
    }
    if let Some(c) = a_circle(&edges) {
        panic!("modules import each other in a circle: {}", c.join(" → "));
    }
}

/// The files of one module a file reaches: `super::NAME` and `crate::MODULE::NAME` where
/// `src/MODULE/NAME.rs` exists.
fn siblings_reached(module: &str, text: &str) -> BTreeSet<String> {
    let code = match text.find("#[cfg(test)]\nmod ") {
        Some(i) => &text[..i],
        None => text,
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(module);
    let mut out = BTreeSet::new();
    for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for prefix in ["super::".to_string(), format!("crate::{module}::")] {
            let mut rest = line;
            while let Some(i) = rest.find(&prefix) {
                let after = &rest[i + prefix.len()..];
                let name: String = after
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if dir.join(format!("{name}.rs")).exists() {
                    out.insert(name);
                }
                rest = after;
            }
        }
    }
    out
}

#[test]
fn the_engines_files_import_each_other_without_a_circle() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/engine");
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in sources("engine") {
        let name = file
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("")
            .to_string();
        if file.parent() != Some(dir.as_path()) || name == "mod" || is_test_file(&file) {
            continue;
        }
        let mut to = siblings_reached("engine", &code_of(&file));
        to.remove(&name);
        edges.insert(name, to);
    }
    assert!(edges.contains_key("builder") && edges.contains_key("loading"));
    assert!(
        !edges["loading"].contains("builder"),
        "engine/loading.rs imports engine/builder.rs again"
    );
    if let Some(c) = a_circle(&edges) {
        panic!(
            "the engine's files import each other in a circle: {}",
            c.join(" → ")
        );
    }
}

/// The circle finder finds a circle through others, and none where there is none.
#[test]
fn the_circle_finder_sees_a_circle_through_others() {
    let graph = |pairs: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in pairs {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    assert_eq!(
        a_circle(&graph(&[
            ("goal", "tools"),
            ("tools", "grants"),
            ("grants", "goal")
        ])),
        Some(vec![
            "goal".into(),
            "tools".into(),
            "grants".into(),
            "goal".into()
        ])
    );
    assert_eq!(
        a_circle(&graph(&[("a", "b"), ("a", "c"), ("b", "c")])),
        None
    );
    assert_eq!(
        siblings_reached("engine", "use super::loading::X;\n// super::builder\n"),
        BTreeSet::from(["loading".to_string()])
    );
}

/// The non-test, non-comment code of a source, as [`reached`] reads it.
fn live_code(text: &str) -> String {
    let code = match text.find("#[cfg(test)]\nmod ") {
        Some(i) => &text[..i],
        None => text,
    };
    code.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Issue 45: one way to a run's machine. Outside the core's `machine` module (and test code),
/// a `RunMachine` is made only by `engine::MachineDef` (`src/engine/machines.rs`), which the
/// engine's live run and `RunDef::machine`/`RunDef::replay` (every reader of a stored run) both
/// call: no front-end builds or replays one by hand.
#[test]
fn only_the_machine_def_makes_a_run_machine() {
    let mut found = Vec::new();
    let mut read = 0;
    for module in modules() {
        if module == "machine" {
            continue;
        }
        for file in sources(&module) {
            if is_test_file(&file) {
                continue;
            }
            read += 1;
            let code = live_code(&code_of(&file));
            let makes = ["RunMachine::new(", "RunMachine::replaying("]
                .iter()
                .any(|c| code.contains(c));
            if makes && !file.ends_with("src/engine/machines.rs") {
                found.push(file.display().to_string());
            }
        }
    }
    assert!(read > 100, "read only {read} source files");
    assert!(
        found.is_empty(),
        "a RunMachine made outside engine::MachineDef: {}",
        found.join(", ")
    );
    let def = live_code(&code_of(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src/engine/machines.rs"),
    ));
    assert!(
        def.contains("RunMachine::new("),
        "the check looks for the right name"
    );
}
