//! The terminal reviewer for `--approve ask`: approve, edit (in $EDITOR) or reject with a reason.
//!
//! Without a terminal on stdin nobody can answer, so every request is rejected with a reason
//! that says so (the model is told; nothing runs unreviewed).

use std::io::{BufRead, Write};

use serde_json::{Map, Value};
use tokio::sync::mpsc;

use crate::approval::{Decision, PendingApproval};

/// Answers approval requests until the channel closes.
pub(super) async fn serve(mut rx: mpsc::Receiver<PendingApproval>, interactive: bool) {
    while let Some(p) = rx.recv().await {
        let decision = if interactive {
            let req = p.request.to_value();
            tokio::task::spawn_blocking(move || ask(&req))
                .await
                .unwrap_or(Decision::Reject {
                    reason: "the reviewer prompt failed".into(),
                })
        } else {
            Decision::Reject {
                reason: "approval required but no interactive reviewer is attached (stdin is not a terminal)".into(),
            }
        };
        let _ = p.reply.send(decision);
    }
}

fn ask(req: &Value) -> Decision {
    let mut err = std::io::stderr();
    let _ = writeln!(
        err,
        "\n── approval requested ──\n{}",
        serde_json::to_string_pretty(req).unwrap_or_default()
    );
    loop {
        let _ = write!(err, "[a]pprove, [e]dit, [r]eject? ");
        let _ = err.flush();
        let Some(line) = read_line() else {
            return Decision::Reject {
                reason: "the reviewer closed the terminal".into(),
            };
        };
        match line.trim() {
            "a" | "approve" | "y" | "yes" => return Decision::Approve,
            "r" | "reject" | "n" | "no" => {
                let _ = write!(err, "reason: ");
                let _ = err.flush();
                let reason = read_line().unwrap_or_default().trim().to_string();
                return Decision::Reject {
                    reason: if reason.is_empty() {
                        "rejected by the reviewer".into()
                    } else {
                        reason
                    },
                };
            }
            "e" | "edit" => match edit(req.get("call").unwrap_or(req)) {
                Ok(params) => return Decision::Edit { params },
                Err(e) => {
                    let _ = writeln!(err, "edit failed: {e}");
                }
            },
            _ => {}
        }
    }
}

fn read_line() -> Option<String> {
    let mut s = String::new();
    match std::io::stdin().lock().read_line(&mut s) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(s),
    }
}

fn edit(call: &Value) -> Result<Map<String, Value>, String> {
    let params: Map<String, Value> = call
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| !k.starts_with('_'))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("dagloop-edit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let file = dir.join("params.json");
    let text = serde_json::to_string_pretty(&Value::Object(params)).map_err(|e| e.to_string())?;
    std::fs::write(&file, text).map_err(|e| e.to_string())?;
    let editor = std::env::var("VISUAL")
        .or_else(|_| std::env::var("EDITOR"))
        .unwrap_or_else(|_| "vi".into());
    let status = std::process::Command::new(&editor)
        .arg(&file)
        .status()
        .map_err(|e| format!("cannot start {editor}: {e}"))?;
    if !status.success() {
        return Err(format!("{editor} exited with {status}"));
    }
    let edited = std::fs::read_to_string(&file).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    serde_json::from_str(&edited)
        .map_err(|e| format!("the edited params are not a JSON object: {e}"))
}
