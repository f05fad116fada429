//! What a run may touch, granted by whoever runs the process, never by the goal (DESIGN.md
//! section 3.3): activity kinds, MCP servers (the operator's, by name, and whether a goal may
//! start its own), environment variables, HTTP egress and the file roots scripted models,
//! delegate goals and workspace memory folders are read from.
//!
//! A goal only *asks*. Comparing what a goal asks with what is granted, before anything is
//! spawned, opened or connected, is goal admission (`crate::runs::check_goal`, called by
//! `runs::define`); this module holds the granted values it compares with, and the refusals
//! ([`GrantError`]) both report. The `http` activity checks every request again at
//! connection time ([`egress`]), since a URL may be built from a call's params, and checks that
//! a request carrying a `${VAR}` value goes only where the variable is granted ([`secrets`]).
//!
//! A refusal is a [`GrantError`] with a stable `grant.*` code and the JSON pointer of what asked.
//! A path outside the roots is refused with the same message whether it exists or not, and
//! before it is opened, so a refusal never reveals a file's existence or content.
//!
//! Deliberately not here: goal admission (`crate::runs::check_goal`), reading the operator's
//! config file (`crate::config`), building agents, and starting anything.

pub mod egress;
pub mod secrets;

#[cfg(feature = "mcp")]
use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

pub use egress::{Egress, EgressError};
pub use secrets::{SecretHostError, SecretHosts};

#[cfg(feature = "mcp")]
use crate::protocol::McpServerConfig;

/// What a grant may name besides the built-in activity kinds (`tools::KINDS`): `mcp`, the
/// tools of MCP servers.
pub const MCP: &str = "mcp";

/// Which environment variables a goal may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvGrant {
    /// Any variable the goal lists in `env` (the command line's default).
    Any,
    /// Only these.
    Only(BTreeSet<String>),
}

/// Where scripted-model files and delegate goals may be read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileRoots {
    /// Anywhere (the command line's default).
    Anywhere,
    /// Under these folders (canonical paths).
    Under(Vec<PathBuf>),
}

/// What runs in this process may touch.
#[derive(Debug, Clone)]
pub struct Grants {
    /// Activity kinds a goal's tools may use (`None`: every kind the registry knows).
    pub kinds: Option<BTreeSet<String>>,
    /// A goal may define MCP servers of its own (a command to run, a URL to connect to).
    pub goal_mcp_servers: bool,
    /// MCP servers the operator defines, by name; a goal names them with `{"name": "..."}`.
    #[cfg(feature = "mcp")]
    pub mcp_servers: BTreeMap<String, McpServerConfig>,
    /// Environment variables a goal may read.
    pub env: EnvGrant,
    /// Where their values may be sent in an `http` request (`secrets`).
    pub secrets: SecretHosts,
    /// Where `http` tools may connect.
    pub egress: Egress,
    /// Where files named by a goal may be read from.
    pub files: FileRoots,
    /// The most bytes of tool results one run keeps (`kept_result_bytes`; None: the engine's
    /// default, [`crate::engine::DEFAULT_KEPT_RESULT_BYTES`]). Recorded with each run.
    pub kept_result_bytes: Option<u64>,
    /// The operator's workspace memory (an absolute folder), for goals that name none.
    pub memory: Option<crate::context::memory::MemorySource>,
}

/// What a goal asked that is not granted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GrantError {
    /// A tool's activity kind is not granted.
    #[error(
        "{pointer}: tool `{tool}` uses the `{kind}` activity, which this process does not grant{hint}"
    )]
    Kind {
        /// Where the goal asked.
        pointer: String,
        /// The tool.
        tool: String,
        /// Its kind.
        kind: String,
        /// How to grant it.
        hint: &'static str,
    },
    /// The goal defines an MCP server of its own where only the operator's may be named.
    #[error(
        "{pointer}: MCP server `{name}` is defined by the goal; this process runs only the MCP servers its operator configured{known}"
    )]
    McpServer {
        /// Where the goal asked.
        pointer: String,
        /// The server's name.
        name: String,
        /// The operator's servers, listed for the user.
        known: String,
    },
    /// The goal names an MCP server the operator did not configure.
    #[error("{pointer}: no MCP server named `{name}` is configured by the operator{known}")]
    UnknownMcpServer {
        /// Where the goal asked.
        pointer: String,
        /// The name.
        name: String,
        /// The operator's servers, listed for the user.
        known: String,
    },
    /// An environment variable is not granted.
    #[error("{pointer}: environment variable `{var}` is not granted to goals")]
    Env {
        /// Where the goal asked.
        pointer: String,
        /// The variable.
        var: String,
    },
    /// A URL the goal names is not reachable under the egress grant.
    #[error("{pointer}: {reason}")]
    Egress {
        /// Where the goal asked.
        pointer: String,
        /// Why.
        reason: EgressError,
    },
    /// A file the goal names is outside the granted roots.
    #[error("{pointer}: `{path}` is outside the folders this process may read goal files from")]
    File {
        /// Where the goal asked.
        pointer: String,
        /// The path as the goal wrote it.
        path: String,
    },
}

crate::codes::has_code!(GrantError);

impl GrantError {
    /// A stable code.
    pub fn code(&self) -> &'static str {
        match self {
            GrantError::Kind { .. } => "grant.tool_kind",
            GrantError::McpServer { .. } => "grant.mcp_server",
            GrantError::UnknownMcpServer { .. } => "grant.unknown_mcp_server",
            GrantError::Env { .. } => "grant.env",
            GrantError::Egress { .. } => "grant.egress",
            GrantError::File { .. } => "grant.file",
        }
    }

    /// The JSON pointer (into the submitted goal) of what asked.
    pub fn pointer(&self) -> &str {
        match self {
            GrantError::Kind { pointer, .. }
            | GrantError::McpServer { pointer, .. }
            | GrantError::UnknownMcpServer { pointer, .. }
            | GrantError::Env { pointer, .. }
            | GrantError::Egress { pointer, .. }
            | GrantError::File { pointer, .. } => pointer,
        }
    }
}

/// A path with `.` and `..` taken out without touching the file system (`..` above the root
/// stays at the root).
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

impl FileRoots {
    /// Roots from folders (made absolute against `base`, canonicalised; a folder that does not
    /// exist is an error, named).
    pub fn under(folders: &[PathBuf], base: &Path) -> Result<FileRoots, String> {
        let mut roots = Vec::new();
        for f in folders {
            let abs = if f.is_absolute() {
                f.clone()
            } else {
                base.join(f)
            };
            let c = std::fs::canonicalize(&abs)
                .map_err(|e| format!("file root {}: {e}", abs.display()))?;
            roots.push(c);
        }
        Ok(FileRoots::Under(roots))
    }

    /// The path to read for `written` (relative to `base`), or `None` when it is outside the
    /// roots: first by its text (`..` taken out), then with symbolic links resolved. A path
    /// inside the roots that does not exist is returned as is (its reader reports it).
    pub fn resolve(&self, written: &str, base: &Path) -> Option<PathBuf> {
        let p = Path::new(written);
        let joined = if p.is_absolute() {
            p.to_path_buf()
        } else {
            base.join(p)
        };
        let FileRoots::Under(roots) = self else {
            return Some(joined);
        };
        let abs = if joined.is_absolute() {
            joined
        } else {
            std::env::current_dir().ok()?.join(joined)
        };
        let lex = lexical(&abs);
        let inside = |p: &Path| roots.iter().any(|r| p.starts_with(r));
        if !inside(&lex) {
            return None;
        }
        match std::fs::canonicalize(&lex) {
            Ok(c) if inside(&c) => Some(c),
            Ok(_) => None,
            Err(_) => {
                // Not there (or not readable): its parent, resolved, must still be inside.
                let parent = lex.parent().and_then(|d| std::fs::canonicalize(d).ok());
                match parent {
                    Some(d) if !inside(&d) => None,
                    _ => Some(lex),
                }
            }
        }
    }
}

impl Grants {
    /// Everything (a program embedding dagloop, the command line with `--allow-shell`): every
    /// kind, MCP servers from goals, any listed variable, any address, any file.
    pub fn open() -> Grants {
        Grants {
            kinds: None,
            goal_mcp_servers: true,
            #[cfg(feature = "mcp")]
            mcp_servers: BTreeMap::new(),
            env: EnvGrant::Any,
            secrets: SecretHosts::anywhere(),
            egress: Egress::open(),
            files: FileRoots::Anywhere,
            kept_result_bytes: None,
            memory: None,
        }
    }

    /// The command line's default, where the user is the operator: everything but the shell
    /// activity, which `--allow-shell` grants.
    pub fn cli(allow_shell: bool) -> Grants {
        let mut g = Grants::open();
        if !allow_shell {
            g.kinds = Some(
                crate::protocol::KINDS
                    .iter()
                    .chain([&MCP])
                    .filter(|k| **k != "shell")
                    .map(|k| k.to_string())
                    .collect(),
            );
        }
        g
    }

    /// What a server or worker grants without a config: `http` and `delegate` tools, no shell,
    /// no MCP server but the operator's (none), no environment variable, public addresses only,
    /// files under `base` only.
    pub fn closed(base: &Path) -> Grants {
        Grants {
            kinds: Some(
                ["delegate", "http", "mcp"]
                    .into_iter()
                    .map(String::from)
                    .collect(),
            ),
            goal_mcp_servers: false,
            #[cfg(feature = "mcp")]
            mcp_servers: BTreeMap::new(),
            env: EnvGrant::Only(BTreeSet::new()),
            secrets: SecretHosts::default(),
            egress: Egress::default(),
            files: FileRoots::under(&[base.to_path_buf()], base)
                .unwrap_or_else(|_| FileRoots::Under(vec![base.to_path_buf()])),
            kept_result_bytes: None,
            memory: None,
        }
    }

    /// The kind is granted.
    pub fn grants_kind(&self, kind: &str) -> bool {
        self.kinds.as_ref().is_none_or(|k| k.contains(kind))
    }

    /// The `shell` activity is granted.
    pub fn allows_shell(&self) -> bool {
        self.grants_kind("shell")
    }

    /// The file to read for a path the goal wrote (relative to its folder), or the refusal.
    pub fn file(&self, pointer: &str, written: &str, base: &Path) -> Result<PathBuf, GrantError> {
        self.files
            .resolve(written, base)
            .ok_or_else(|| GrantError::File {
                pointer: pointer.to_string(),
                path: written.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_outside_the_roots_are_refused_whether_or_not_they_exist() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("sub")).expect("mkdir");
        std::fs::write(root.join("sub/s.json"), "{}").expect("write");
        std::fs::write(dir.path().join("secret.json"), "{}").expect("write");
        #[cfg(unix)]
        std::os::unix::fs::symlink(dir.path().join("secret.json"), root.join("link.json"))
            .expect("symlink");
        let roots = FileRoots::under(std::slice::from_ref(&root), dir.path()).expect("roots");
        assert!(roots.resolve("sub/s.json", &root).is_some());
        assert!(roots.resolve("sub/missing.json", &root).is_some());
        for bad in [
            "../secret.json",
            "../missing.json",
            "/etc/shadow",
            "/nonexistent/x.json",
            "sub/../../secret.json",
            "link.json",
        ] {
            assert_eq!(roots.resolve(bad, &root), None, "{bad}");
        }
        assert!(FileRoots::Anywhere.resolve("/etc/shadow", &root).is_some());
    }

    #[test]
    fn the_cli_grants_the_shell_only_when_asked() {
        assert!(!Grants::cli(false).allows_shell());
        assert!(Grants::cli(true).allows_shell());
        assert!(Grants::cli(false).grants_kind("http"));
        assert!(!Grants::closed(Path::new("/")).allows_shell());
    }
}
