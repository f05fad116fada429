//! `dagloop init [DIR]`: writes a first goal into DIR (default `.`): `goal.json` (two `http`
//! calls in parallel feeding a third, an output schema), `script.json` (its scripted model),
//! `tools.json` (what the services answered, so it runs offline) and `test.json` (its test
//! case), ready for `dagloop run DIR/goal.json --tools-from DIR/tools.json` and `dagloop test
//! DIR`.
//!
//! The files are `examples/first-goal/`, included at build time: the tutorial
//! (docs/tutorial.md) shows the same files and its test checks that they are these.
//!
//! Deliberately not here: overwriting anything. When one of the files already exists, nothing is
//! written (`cli.exists`).

use super::*;

/// The files `init` writes, by name.
pub const FILES: [(&str, &str); 4] = [
    (
        "goal.json",
        include_str!("../../examples/first-goal/goal.json"),
    ),
    (
        "script.json",
        include_str!("../../examples/first-goal/script.json"),
    ),
    (
        "tools.json",
        include_str!("../../examples/first-goal/tools.json"),
    ),
    (
        "test.json",
        include_str!("../../examples/first-goal/test.json"),
    ),
];

pub(super) fn init(dir: &FsPath) -> Result<i32, CliError> {
    let taken: Vec<String> = FILES
        .iter()
        .map(|(name, _)| dir.join(name))
        .filter(|p| p.exists())
        .map(|p| p.display().to_string())
        .collect();
    if !taken.is_empty() {
        return Err(CliError::new(
            "cli.exists",
            format!(
                "`dagloop init` writes nothing over existing files: {} (choose another folder: dagloop init DIR)",
                taken.join(", ")
            ),
        ));
    }
    let unwritable = |p: &FsPath, e: std::io::Error| {
        CliError::new(
            "cli.unwritable",
            format!("cannot write {}: {e}", p.display()),
        )
    };
    std::fs::create_dir_all(dir).map_err(|e| unwritable(dir, e))?;
    for (name, text) in FILES {
        let path = dir.join(name);
        // `create_new`: a file that appeared since the check is still not overwritten.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| unwritable(&path, e))?;
        std::io::Write::write_all(&mut f, text.as_bytes()).map_err(|e| unwritable(&path, e))?;
        outln!("wrote {}", path.display());
    }
    let d = dir.display();
    outln!();
    outln!("next:");
    outln!(
        "  dagloop run {d}/goal.json --tools-from {d}/tools.json    (offline: tools.json answers the calls)"
    );
    outln!("  dagloop test {d}    (its test case)");
    outln!("  dagloop run {d}/goal.json    (the real services)");
    outln!("what each file says: docs/tutorial.md");
    Ok(0)
}
