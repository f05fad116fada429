//! `dagloop export RUN --cassette DIR` and the `--tools-from` recording of `dagloop run`: a
//! stored run as an offline test (the rules are `runs::cassette`'s).

use std::path::Path as FsPath;
use std::sync::Arc;

use serde_json::json;

use super::{CliError, pretty};
use crate::store::RunStore;

/// Writes the cassette of run `id` into `dir`.
pub(super) fn export(store: &dyn RunStore, id: &str, dir: &FsPath) -> Result<i32, CliError> {
    let stored = store.load(id).map_err(|e| CliError::new(e.code(), &e))?;
    let c = crate::runs::export(&stored.record, &stored.journal)
        .map_err(|e| CliError::new(e.code(), &e))?;
    let write_err = |path: &FsPath, e: std::io::Error| {
        CliError::new(
            "cli.unwritable",
            format!("cannot write {}: {e}", path.display()),
        )
    };
    std::fs::create_dir_all(dir).map_err(|e| write_err(dir, e))?;
    let model = dir.join("model.json");
    let tools = dir.join("tools.json");
    std::fs::write(&model, pretty(&c.model)).map_err(|e| write_err(&model, e))?;
    std::fs::write(&tools, pretty(&c.tools)).map_err(|e| write_err(&tools, e))?;
    outln!(
        "{}",
        pretty(&json!({
            "status": "exported",
            "run_id": id,
            "model": model.display().to_string(),
            "tools": tools.display().to_string(),
            "turns": c.model["turns"].as_array().map_or(0, Vec::len),
            "calls": c.tools["calls"].as_array().map_or(0, Vec::len),
        }))
    );
    Ok(0)
}

/// The recording `--tools-from` names, if any.
pub(super) fn load_tools(
    path: Option<&FsPath>,
    passthrough: bool,
) -> Result<Option<(Arc<crate::runs::Cassette>, bool)>, CliError> {
    let Some(path) = path else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        let code = if e.kind() == std::io::ErrorKind::NotFound {
            "cli.not_found"
        } else {
            "cli.unreadable"
        };
        CliError::new(code, format!("cannot read {}: {e}", path.display()))
    })?;
    let c = crate::runs::Cassette::parse(&text, &path.display().to_string())
        .map_err(|e| CliError::new(e.code(), &e))?;
    Ok(Some((Arc::new(c), passthrough)))
}
