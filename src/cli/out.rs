//! What the command line prints, written so that a closed stdout or stderr never panics.
//!
//! `println!` panics when its write fails, and a reader that goes away early (`dagloop show RUN
//! | head -1`) makes every later write fail with a broken pipe (Rust ignores SIGPIPE, so the
//! write returns `EPIPE` instead of killing the process). Every print of the command line goes
//! through [`outln!`], [`out!`] and [`errln!`] instead: a failed write is dropped, a broken pipe
//! on stdout is remembered, and the command ends as usual (destructors run, so the MCP servers
//! and shell tools a run started are still stopped) with exit code [`BROKEN_PIPE_EXIT`].
//!
//! SIGPIPE is deliberately not reset to its default action: a run writes to its MCP servers'
//! stdin, and a server that died would then kill dagloop without a word.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// The exit code of a command whose stdout was closed before it finished printing: the code a
/// shell shows for a process killed by SIGPIPE (128 + 13).
pub const BROKEN_PIPE_EXIT: i32 = 141;

static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// True once a write to stdout failed because its reader had gone.
pub fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(Ordering::Relaxed)
}

/// Writes to stdout; a failure is remembered when it is a broken pipe and otherwise dropped.
pub fn stdout(args: std::fmt::Arguments<'_>) {
    if stdout_closed() {
        return;
    }
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_fmt(args).and_then(|()| o.flush())
        && e.kind() == std::io::ErrorKind::BrokenPipe
    {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
    }
}

/// Writes to stderr; a failure is dropped (there is nowhere left to report it).
pub fn stderr(args: std::fmt::Arguments<'_>) {
    let mut e = std::io::stderr().lock();
    let _ = e.write_fmt(args).and_then(|()| e.flush());
}

/// `println!` that never panics (see the module's doc).
macro_rules! outln {
    () => { $crate::cli::out::stdout(format_args!("\n")) };
    ($($t:tt)*) => { $crate::cli::out::stdout(format_args!("{}\n", format_args!($($t)*))) };
}

/// `print!` that never panics.
macro_rules! out {
    ($($t:tt)*) => { $crate::cli::out::stdout(format_args!($($t)*)) };
}

/// `eprintln!` that never panics.
macro_rules! errln {
    () => { $crate::cli::out::stderr(format_args!("\n")) };
    ($($t:tt)*) => { $crate::cli::out::stderr(format_args!("{}\n", format_args!($($t)*))) };
}
