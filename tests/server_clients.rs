//! Clients generated from schemas/openapi.json, driving the real `dagloop serve`: the Python
//! client of openapi-python-client submits the delegate example with every call asked, follows
//! its events (each parsed into the client's typed event model), approves the call that waits,
//! and reads the typed result in one call (`wait`). tests/clients/flow.py is the program.
//!
//! Needs `scripts/setup-clients.sh` (`DAGLOOP_CLIENTS_PYTHON`, `DAGLOOP_CLIENTS_DIR`); without
//! them the test prints SKIPPED and passes (`scripts/test` sets them).

#[path = "common/bin.rs"]
mod bin;
#[path = "common/serve.rs"]
mod serve;

use std::path::PathBuf;
use std::process::Command;

use serve::Server;

#[test]
fn a_python_program_drives_a_run_through_the_generated_client() {
    let (Some(python), Some(clients)) = (
        std::env::var_os("DAGLOOP_CLIENTS_PYTHON"),
        std::env::var_os("DAGLOOP_CLIENTS_DIR"),
    ) else {
        println!(
            "SKIPPED: DAGLOOP_CLIENTS_PYTHON/DAGLOOP_CLIENTS_DIR unset (run scripts/setup-clients.sh)"
        );
        return;
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let clients = PathBuf::from(clients);
    assert!(
        clients.join("dagloop.d.ts").is_file(),
        "the TypeScript types were generated"
    );
    let dir = tempfile::tempdir().expect("tmp");
    let example = root.join("examples/delegate");
    let s = Server::start_with(&dir.path().join("runs.db"), None, |c| {
        c.current_dir(&example);
    });
    let out = Command::new(python)
        .arg(root.join("tests/clients/flow.py"))
        .arg(&s.base)
        .arg(example.join("goal.json"))
        .env("PYTHONPATH", clients.join("python"))
        .output()
        .expect("python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "the Python flow failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .expect("the flow's last line is its result as JSON");
    assert_eq!(last["status"], "succeeded", "{last}");
    assert_eq!(last["output"]["language"], "fr", "{last}");
    assert!(
        stdout.contains("ApprovalRequestedEvent") && stdout.contains("RunFinishedEvent"),
        "{stdout}"
    );
}
