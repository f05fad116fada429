//! Issue 49: docs/tutorial.md cannot drift. Its fenced blocks are run in order in an empty
//! folder through the real binary: ```` ```sh run ```` blocks as one shell script (so a variable
//! set in one block is there in the next), ```` ```json file=PATH ```` blocks written to PATH
//! first (or, for the files `dagloop init` writes, checked equal to them). A block marked
//! `no-run` needs the network or a real model and is only checked to name the tutorial's files;
//! a block with no marker fails the test.
//!
//! Also `dagloop init`: its files pass their own test in a fresh folder, and it overwrites
//! nothing.

#[path = "common/bin.rs"]
mod bin;

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One fenced block: its info string, its text, the line it starts on.
struct Block {
    info: String,
    text: String,
    line: usize,
}

fn blocks(md: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in md.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => {
                open = Some(Block {
                    info: info.trim().to_string(),
                    text: String::new(),
                    line: i + 1,
                })
            }
            (Some(_), Some("")) => out.extend(open.take()),
            (Some(b), _) => {
                b.text.push_str(line);
                b.text.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "an unclosed block");
    out
}

/// The binary's folder first on PATH, a store and data directory of this test's own.
fn shell(dir: &Path) -> Command {
    let bin_dir = Path::new(bin::BIN).parent().expect("the binary's folder");
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("sh");
    cmd.current_dir(dir)
        .env("PATH", path)
        .env("XDG_DATA_HOME", dir.join(".data"))
        .env("DAGLOOP_STORE", dir.join("runs.db"))
        .env_remove("DAGLOOP_TOKEN")
        .env_remove("DAGLOOP_CRASH_AFTER_ENTRIES")
        .env_remove("DAGLOOP_LEASE_MS")
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY");
    cmd
}

#[test]
fn every_block_of_the_tutorial_runs_as_written() {
    let md = std::fs::read_to_string(root().join("docs/tutorial.md")).expect("tutorial");
    let dir = tempfile::tempdir().expect("tempdir");
    let init_files: Vec<&str> = ["goal.json", "script.json", "tools.json", "test.json"].into();
    let mut script = String::from("set -e\n");
    let mut checked = Vec::new();
    let mut ran = 0;
    for b in blocks(&md) {
        let mut words = b.info.split_whitespace();
        let lang = words.next().unwrap_or_default();
        let marker = words.next().unwrap_or_default();
        if let Some(path) = marker.strip_prefix("file=") {
            let name = path.strip_prefix("first/").expect("a file of first/");
            if init_files.contains(&name) {
                // What the tutorial shows is what `dagloop init` writes.
                let shipped =
                    std::fs::read_to_string(root().join("examples/first-goal").join(name))
                        .expect("the init file");
                assert_eq!(
                    b.text, shipped,
                    "docs/tutorial.md line {}: {path} differs from examples/first-goal/{name}",
                    b.line
                );
                checked.push(name.to_string());
            } else {
                assert_eq!(lang, "json", "line {}", b.line);
                serde_json::from_str::<serde_json::Value>(&b.text)
                    .unwrap_or_else(|e| panic!("line {}: {path} is not JSON: {e}", b.line));
                script.push_str(&format!(
                    "echo '--- docs/tutorial.md line {}: {path}'\ncat > {path} <<'TUTORIAL_EOF'\n{}TUTORIAL_EOF\n",
                    b.line, b.text
                ));
            }
        } else if marker == "run" {
            assert_eq!(lang, "sh", "line {}", b.line);
            script.push_str(&format!(
                "echo '--- docs/tutorial.md line {}'\n{}",
                b.line, b.text
            ));
            ran += 1;
        } else if marker == "no-run" {
            assert!(
                b.text.contains("dagloop") && b.text.contains("first/"),
                "line {}: a no-run block about something else",
                b.line
            );
        } else {
            panic!(
                "docs/tutorial.md line {}: a block without `run`, `no-run` or `file=PATH`",
                b.line
            );
        }
    }
    assert_eq!(
        checked.len(),
        init_files.len(),
        "the tutorial shows every init file"
    );
    assert!(ran >= 6, "{ran} blocks run");
    let out = shell(dir.path())
        .arg("-c")
        .arg(&script)
        .output()
        .expect("sh");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "the tutorial failed (the last `---` line is the block):\n{stdout}\n{stderr}"
    );
    // What the prose says the commands show.
    for needle in [
        "\"status\": \"valid\"",
        "\"status\": \"identical\"",
        "test result: ok. 2 passed; 0 failed;",
        "c1 -- \"state.paris.current.temperature_2m\" --> c3",
    ] {
        assert!(stdout.contains(needle), "{needle}:\n{stdout}");
    }
    let result: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("result.json")).expect("result.json"),
    )
    .expect("the result is JSON");
    assert_eq!(result["status"], "succeeded", "{result:#}");
    assert_eq!(
        result["state"]["report"]["json"]["paris"], 14.2,
        "{result:#}"
    );
    // The exported run, run again from its cassette alone.
    let rerun: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("rerun.json")).expect("rerun.json"),
    )
    .expect("the rerun's result is JSON");
    assert_eq!(rerun["status"], "succeeded", "{rerun:#}");
    assert_eq!(rerun["output"], result["output"], "{rerun:#}");
    // `dagloop init` wrote the very files the tutorial shows.
    for name in init_files {
        assert_eq!(
            std::fs::read(dir.path().join("first").join(name)).expect("written"),
            std::fs::read(root().join("examples/first-goal").join(name)).expect("shipped"),
            "{name}"
        );
    }
}

#[test]
fn init_writes_a_first_goal_that_passes_its_test_and_overwrites_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let init = |args: &[&str]| {
        bin::dagloop()
            .current_dir(dir.path())
            .arg("init")
            .args(args)
            .output()
            .expect("dagloop init")
    };
    let out = init(&[]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("dagloop test ."), "{stdout}");
    let test = bin::dagloop()
        .current_dir(dir.path())
        .args(["test", "."])
        .output()
        .expect("dagloop test");
    let text = String::from_utf8_lossy(&test.stdout);
    assert!(test.status.success(), "{text}");
    assert!(
        text.contains("test result: ok. 1 passed; 0 failed;"),
        "{text}"
    );

    // A second init, here or where one file is taken, writes nothing.
    let goal = std::fs::read(dir.path().join("goal.json")).expect("goal");
    std::fs::write(dir.path().join("goal.json"), "mine").expect("write");
    let again = init(&[]);
    assert_eq!(again.status.code(), Some(2), "{again:?}");
    let err = String::from_utf8_lossy(&again.stderr).to_string()
        + &String::from_utf8_lossy(&again.stdout);
    assert!(err.contains("cli.exists"), "{err}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("goal.json")).expect("goal"),
        "mine"
    );
    let sub = dir.path().join("sub");
    std::fs::create_dir_all(&sub).expect("dir");
    std::fs::write(sub.join("test.json"), "{}").expect("write");
    let partly = init(&["sub"]);
    assert_eq!(partly.status.code(), Some(2), "{partly:?}");
    assert!(
        !sub.join("goal.json").exists(),
        "nothing is written when one file is taken"
    );
    assert_eq!(
        std::fs::read_to_string(sub.join("test.json")).expect("t"),
        "{}"
    );
    assert!(!goal.is_empty());
}
