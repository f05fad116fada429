//! `dagloop codes [CODE]`: the registry of stable error codes (`crate::codes`) on the command
//! line, so a code in a result can be looked up where it was met. It only prints.

use serde_json::json;

use super::{CliError, pretty};
use crate::codes::{AREAS, CODES, lookup};

/// Prints one code's meaning, or every code grouped by area; `--json` prints JSON.
pub(super) fn codes(code: Option<&str>, json_out: bool) -> Result<i32, CliError> {
    let Some(code) = code else {
        if json_out {
            let all: Vec<_> = CODES
                .iter()
                .map(|c| json!({"code": c.code, "meaning": c.meaning}))
                .collect();
            outln!("{}", pretty(&serde_json::Value::Array(all)));
            return Ok(0);
        }
        for (area, about) in AREAS {
            outln!("{area}: {about}");
            let prefix = format!("{area}.");
            for c in CODES.iter().filter(|c| c.code.starts_with(&prefix)) {
                outln!("  {:<34} {}", c.code, c.meaning);
            }
        }
        return Ok(0);
    };
    match lookup(code) {
        Some(c) if json_out => {
            outln!("{}", pretty(&json!({"code": c.code, "meaning": c.meaning})));
            Ok(0)
        }
        Some(c) => {
            outln!("{}: {}", c.code, c.meaning);
            Ok(0)
        }
        None => {
            let hint = crate::protocol::meta::closest(code, CODES.iter().map(|c| c.code))
                .map(|s| format!(" (did you mean `{s}`?)"))
                .unwrap_or_default();
            Err(CliError::new(
                "cli.unknown_code",
                format!("`{code}` is not a dagloop error code{hint}; `dagloop codes` lists them"),
            ))
        }
    }
}
