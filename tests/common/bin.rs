//! The `dagloop` binary as the tests start it, kept away from the user's own runs.
//!
//! The binary's default run store lives under the user's data directory. A test that ran the
//! binary with that default would read, and write, whatever store the machine happens to have
//! (CI once failed because an earlier build had left a newer-schema store there). Every command
//! made here gets a data directory of its own test process (`XDG_DATA_HOME`) and no inherited
//! `DAGLOOP_STORE`; a test that wants a particular store still sets `DAGLOOP_STORE` or `--store`
//! itself, after this.
//!
//! Included with `#[path = "common/bin.rs"] mod bin;` so that it needs nothing but std.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// The binary cargo built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_dagloop");

/// A data directory private to this test process (created on first use).
pub fn data_home() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dagloop-test-data-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// `dagloop` with a private data directory and no inherited store, token or provider variables.
pub fn dagloop() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("XDG_DATA_HOME", data_home())
        .env_remove("DAGLOOP_STORE")
        .env_remove("DAGLOOP_TOKEN")
        .env_remove("DAGLOOP_CRASH_AFTER_ENTRIES")
        .env_remove("DAGLOOP_LEASE_MS")
        .env_remove("DAGLOOP_BUSY_TIMEOUT_MS");
    cmd
}

/// The same command for tokio's process API.
pub fn dagloop_tokio() -> tokio::process::Command {
    tokio::process::Command::from(dagloop())
}

/// An operator config that grants what the tests' goals use (scripted models and delegate goals
/// in temporary folders, http tools on loopback, MCP servers the goals define), written once
/// per test process. Servers and workers grant far less without one.
pub fn open_config() -> PathBuf {
    let path = data_home().join("open-config.json");
    if !path.exists() {
        let _ = std::fs::write(
            &path,
            r#"{"grants": {"tools": ["http", "delegate", "mcp", "shell", "rust"], "goal_mcp_servers": true, "env": ["DAGLOOP_MCP_NPM", "DAGLOOP_MCP_FILES_DIR"], "egress": {"private": true}, "files": ["/"]}}"#,
        );
    }
    path
}

/// `THP_enabled` as a `/proc/PID/status` text has it, when the kernel says (Linux 6.x): 0 when
/// the process turned transparent huge pages off (`PR_SET_THP_DISABLE`).
pub fn thp_enabled(status: &str) -> Option<u8> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .and_then(|v| v.trim().parse().ok())
}
