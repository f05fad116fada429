//! The house's shape, checked: the sans-IO core (`protocol`, `state`, `graph`, `plan`,
//! `approval`, `scheduler`, `machine`, `context`, `schema`) never reaches up into the modules that
//! read files, start processes, drive runs or serve them (`engine`, `tools`, `runs`, `server`,
//! `store`, `goal`). A run's machine is built from what a goal *says* (`machine::AgentSpec`),
//! never from the goal file type.
//!
//! The check reads the sources: every `crate::NAME` path and every `crate::{...}` group in a core
//! module's files, test code and comments excepted (files named `tests.rs` or `*_tests.rs`,
//! the part of a file from its `#[cfg(test)]` module on, and `//` lines: a doc link is no
//! dependency).

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
