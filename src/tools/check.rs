//! The static check of a tool's activity: the same rules the run applies, before anything runs.
//!
//! [`Registry::check`] finds the tool's kind (its `_activity`, or `delegate` when `_delegate` is
//! given), refuses an unknown kind (`activity.unknown_kind`, listing the registered ones) and a
//! config key of a kind the tool does not name (`_http` without `"_activity": "http"`), then lets
//! the kind check its configuration ([`super::ActivityKind::check`]). [`check_tool`] does the same
//! with the built-in kinds only: what `dagloop validate` knows. It does not know which Rust
//! functions a program registers: `"rust"` passes here and is the builder's concern.

use std::path::Path as FsPath;
use std::sync::LazyLock;

use super::{ActivityError, Registry};
use crate::protocol::Tool;

pub use crate::protocol::{KINDS, kind_of};

impl Registry {
    /// Checks a tool's activity kind and configuration by this registry's kinds. `base_dir` is the
    /// goal's folder (delegate goal paths are relative to it). Tools registered by name pass.
    pub fn check(&self, tool: &Tool, base_dir: &FsPath) -> Result<(), ActivityError> {
        if self.has(&tool.name) {
            return Ok(());
        }
        let Some(kind) = kind_of(tool) else {
            // A latent tool carrying some kind's configuration: `_activity` was forgotten.
            for name in self.kinds() {
                let key = format!("_{name}");
                if tool.schema.contains_key(&key) {
                    return Err(ActivityError::Config {
                        tool: tool.name.clone(),
                        reason: format!(
                            "`{key}` is given but `_activity` is not set (add `\"_activity\": \"{name}\"`)"
                        ),
                    });
                }
            }
            return Ok(());
        };
        match self.kind(kind) {
            Some(k) => k.check(tool, base_dir),
            None => Err(ActivityError::UnknownKind {
                tool: tool.name.clone(),
                kind: kind.to_string(),
                known: self.kinds().join(", "),
            }),
        }
    }
}

/// Checks a tool's activity kind and configuration against the built-in kinds. `base_dir` is the
/// goal's folder. `dagloop validate` calls this; the builder calls [`Registry::check`] on its own
/// registry (the same rule, plus the kinds a program registered).
pub fn check_tool(tool: &Tool, base_dir: &FsPath) -> Result<(), ActivityError> {
    static BUILT_IN: LazyLock<Registry> = LazyLock::new(Registry::new);
    BUILT_IN.check(tool, base_dir)
}
