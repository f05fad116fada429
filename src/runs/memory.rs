//! Workspace memory as a run is defined: the goal's `memory` folder, checked against the
//! granted file roots, read (its `.md`, `.markdown` and `.txt` files, in name order), cut into
//! chunks and ranked for the goal (`crate::context::memory`); the chunks chosen are recorded in
//! the run's definition record, so that the run, its replay and every reader of it see the
//! same chunks without the folder.
//!
//! Deliberately not here: the ranking and rendering (`context::memory`), and ranking again for
//! a stored run (never: a resumed or replayed run uses what it recorded).

use std::path::{Path, PathBuf};

use crate::context::memory::{self, Chunk, Index, MemorySource};
use crate::goal::Goal;
use crate::grants::{GrantError, Grants};

/// The most files a memory folder may hold.
pub const MAX_FILES: usize = 10_000;

/// The most bytes of all a memory folder's files together.
pub const MAX_BYTES: u64 = 64 * 1024 * 1024;

/// Extensions of the files read (others are skipped).
const EXTENSIONS: &[&str] = &["md", "markdown", "txt"];

/// Why a goal's memory could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryError {
    /// The folder is outside the granted file roots.
    #[error(transparent)]
    Grant(#[from] GrantError),
    /// The folder (or a file in it) cannot be read.
    #[error("memory folder `{path}` cannot be read: {reason}")]
    Unreadable {
        /// The folder as the goal wrote it.
        path: String,
        /// Why.
        reason: String,
    },
    /// The folder holds more than dagloop indexes.
    #[error(
        "memory folder `{path}` is too large: more than {MAX_FILES} files or {MAX_BYTES} bytes"
    )]
    TooLarge {
        /// The folder as the goal wrote it.
        path: String,
    },
}

crate::codes::has_code!(MemoryError);

impl MemoryError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            MemoryError::Grant(e) => e.code(),
            MemoryError::Unreadable { .. } => "memory.unreadable",
            MemoryError::TooLarge { .. } => "memory.too_large",
        }
    }
}

/// The query a goal's first step searches its memory for: its text and its input
/// ([`memory::step_query`]; later steps add what the step before brought).
pub fn query_of(goal: &Goal) -> String {
    memory::step_query(&goal.goal, goal.input.as_ref(), &[], None)
}

/// The goal's memory folder, indexed (the goal's own, held to the file roots; else the
/// operator's, from its config); `None` when there is neither.
pub fn index(goal: &Goal, grants: &Grants) -> Result<Option<(MemorySource, Index)>, MemoryError> {
    let (source, folder) = match (&goal.memory, &grants.memory) {
        (Some(own), _) => (
            own,
            grants.file("/memory/path", &own.path, &goal.base_dir)?,
        ),
        (None, Some(operator)) => (operator, PathBuf::from(&operator.path)),
        (None, None) => return Ok(None),
    };
    let chunks = read(&folder, &source.path)?;
    Ok(Some((source.clone(), Index::new(chunks))))
}

/// Every chunk of the files under `folder` (`written`: the folder as the goal wrote it, for
/// errors), files in name order. A file whose real path leaves the folder (a symbolic link out)
/// is skipped.
fn read(folder: &Path, written: &str) -> Result<Vec<Chunk>, MemoryError> {
    let unreadable = |reason: String| MemoryError::Unreadable {
        path: written.to_string(),
        reason,
    };
    let root = std::fs::canonicalize(folder).map_err(|e| unreadable(e.to_string()))?;
    if !root.is_dir() {
        return Err(unreadable("not a folder".into()));
    }
    let mut files = Vec::new();
    walk(&root, &root, &mut files).map_err(|e| unreadable(e.to_string()))?;
    if files.len() > MAX_FILES {
        return Err(MemoryError::TooLarge {
            path: written.to_string(),
        });
    }
    files.sort();
    let mut total = 0u64;
    let mut chunks = Vec::new();
    for (rel, path) in files {
        let meta = std::fs::metadata(&path).map_err(|e| unreadable(e.to_string()))?;
        total = total.saturating_add(meta.len());
        if total > MAX_BYTES {
            return Err(MemoryError::TooLarge {
                path: written.to_string(),
            });
        }
        let bytes = std::fs::read(&path).map_err(|e| unreadable(format!("{rel}: {e}")))?;
        chunks.extend(memory::chunks(&rel, &String::from_utf8_lossy(&bytes)));
    }
    Ok(chunks)
}

/// Collects `(relative path, path)` of the memory files under `dir`, up to one more than
/// [`MAX_FILES`]. Symbolic links to folders are not followed.
fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        if out.len() > MAX_FILES {
            return Ok(());
        }
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            walk(root, &path, out)?;
            continue;
        }
        let Ok(real) = std::fs::canonicalize(&path) else {
            continue;
        };
        let wanted = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()));
        if !wanted || !real.starts_with(root) || !real.is_file() {
            continue;
        }
        let rel = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/");
        out.push((rel, real));
    }
    Ok(())
}
