//! The signals a long-running command listens for, on every platform: SIGTERM (what service
//! managers send: stop, leave runs resumable) and SIGINT (Ctrl-C). On Unix they are tokio's
//! Unix signals; on Windows Ctrl-C is the console's Ctrl-C event and there is no SIGTERM (the
//! listener never fires).
//!
//! Deliberately not here: what a command does on a signal.

/// A signal listened for from the moment it was made.
#[derive(Debug)]
pub(crate) struct Signal {
    #[cfg(unix)]
    inner: tokio::signal::unix::Signal,
    #[cfg(windows)]
    inner: tokio::signal::windows::CtrlC,
}

impl Signal {
    /// The next delivery; `None` once no more can come.
    pub(crate) async fn recv(&mut self) -> Option<()> {
        self.inner.recv().await
    }
}

/// SIGTERM, from now on; `None` where it cannot be listened for (and on Windows, which has none).
pub(crate) fn terminate() -> Option<Signal> {
    #[cfg(unix)]
    {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .ok()
            .map(|inner| Signal { inner })
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// SIGINT (Ctrl-C), from now on; `None` where it cannot be listened for (only the CLI's `run`
/// listens for it).
#[cfg(feature = "cli")]
pub(crate) fn interrupt() -> Option<Signal> {
    #[cfg(unix)]
    {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .ok()
            .map(|inner| Signal { inner })
    }
    #[cfg(windows)]
    {
        tokio::signal::windows::ctrl_c()
            .ok()
            .map(|inner| Signal { inner })
    }
}
