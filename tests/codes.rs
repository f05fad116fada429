//! The registry of error codes (`src/codes.rs`, issue 23) is the one home of every code: each
//! code-shaped literal the source gives is registered, each registered code is given somewhere,
//! `docs/codes.md` is what the registry writes, and `dagloop codes` answers from it.

#[path = "common/bin.rs"]
mod bin;

use std::path::{Path, PathBuf};

use dagloop::codes::{AREAS, CODES};

/// Literals of code shape that are not codes: a field named in a message.
const NOT_CODES: &[&str] = &["approval.timeout_s"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every `"area.name"` literal in `src/` whose area is a registered one.
fn literals_in_source() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let areas: Vec<&str> = AREAS.iter().map(|(a, _)| *a).collect();
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read");
        // Each `"` followed by lowercase, digits, `_` and one `.`, then a closing `"`.
        for (start, _) in text.match_indices('"') {
            let rest = &text[start + 1..];
            let len = rest
                .find(|c: char| {
                    !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.')
                })
                .unwrap_or(rest.len());
            if !rest[len..].starts_with('"') {
                continue;
            }
            let piece = &rest[..len];
            let Some((area, name)) = piece.split_once('.') else {
                continue;
            };
            if !name.is_empty()
                && !name.contains('.')
                && areas.contains(&area)
                && !["json", "db"].contains(&name)
                && !NOT_CODES.contains(&piece)
            {
                let rel = file
                    .strip_prefix(root)
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                found.push((piece.to_string(), rel));
            }
        }
    }
    found
}

#[test]
fn every_code_the_source_gives_is_registered_and_every_registered_code_is_given() {
    let found = literals_in_source();
    let unregistered: Vec<String> = found
        .iter()
        .filter(|(code, _)| dagloop::codes::lookup(code).is_none())
        .map(|(code, file)| format!("{code} ({file})"))
        .collect();
    assert!(
        unregistered.is_empty(),
        "codes given in src/ but missing from src/codes.rs: {unregistered:#?}"
    );
    let unused: Vec<&str> = CODES
        .iter()
        .filter(|c| {
            !found
                .iter()
                .any(|(code, file)| code == c.code && file != "src/codes.rs")
        })
        .map(|c| c.code)
        .collect();
    assert!(
        unused.is_empty(),
        "codes registered in src/codes.rs that nothing gives: {unused:?}"
    );
}

#[test]
fn docs_codes_md_is_what_the_registry_writes() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/codes.md");
    let want = dagloop::codes::markdown();
    if std::env::var_os("DAGLOOP_UPDATE_CODES").is_some() {
        std::fs::write(&path, &want).expect("write docs/codes.md");
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/codes.md is stale: run `DAGLOOP_UPDATE_CODES=1 cargo test --test codes`"
    );
}

/// `dagloop ARGS`: exit code, stdout, stderr.
fn dagloop(args: &[&str]) -> (i32, String, String) {
    let out = bin::dagloop().args(args).output().expect("run dagloop");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn dagloop_codes_explains_a_code_and_suggests_the_closest_for_a_typo() {
    let (code, out, err) = dagloop(&["codes", "store.busy"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with("store.busy: Another process holds"),
        "{out}"
    );

    let (_, out, _) = dagloop(&["codes", "approval.no_reviewer", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["code"], "approval.no_reviewer");
    assert_eq!(
        v["meaning"],
        dagloop::codes::lookup("approval.no_reviewer")
            .expect("registered")
            .meaning
    );

    let (code, out, _) = dagloop(&["codes", "store.bussy"]);
    assert_eq!(code, 2, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["error"]["code"], "cli.unknown_code", "{out}");
    let message = v["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("did you mean `store.busy`?"), "{out}");

    let (_, out, _) = dagloop(&["codes", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v.as_array().map(Vec::len), Some(CODES.len()));
}
