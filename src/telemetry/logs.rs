//! Logs on stderr, filtered by `RUST_LOG` (nothing unless it is set: the progress view and the
//! result stay as they are), as text or as one JSON object a line (`--log-format json`).
//!
//! Deliberately not here: spans (derived from runs' events in `spans`), or anything on stdout.

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object a line.
    Json,
}

/// Installs the process's log subscriber when `RUST_LOG` is set (once; later calls do nothing).
pub fn init(format: LogFormat) {
    let Ok(filter) = tracing_subscriber::EnvFilter::try_from_default_env() else {
        return;
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
