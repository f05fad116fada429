//! What a long-lived thread does when it has nothing to do: it hands the memory it freed back
//! to the process's allocator, so that memory returns to the system after a burst of work.
//!
//! An allocator with per-thread caches (mimalloc, the binary's) keeps a block another thread
//! freed in the owning thread's pages until that thread looks at them again; a thread that
//! allocated much during a burst (a tokio worker, the store's writer, the span worker) and then
//! sleeps keeps all of it. Measured: a server that drove 300 runs to their wait held about
//! 250 KiB per run until its threads collected their pages. The threads the library starts
//! call [`release`] when they go idle; the binary registers how ([`on_release`],
//! `src/cli/alloc.rs`), and calls it itself when tokio's workers park.
//!
//! Deliberately not here: which allocator, how often a thread really collects (the registered
//! function decides, e.g. at most once a second per thread), or any allocator call: a program
//! that embeds the library registers nothing and [`release`] does nothing.

use std::sync::OnceLock;

static RELEASE: OnceLock<fn()> = OnceLock::new();

/// Registers what [`release`] does (the first registration stays).
pub fn on_release(f: fn()) {
    let _ = RELEASE.set(f);
}

/// Called by a thread that goes idle: hands the memory it freed back (see the module's doc).
/// Cheap when called often: the registered function keeps its own pace.
pub fn release() {
    if let Some(f) = RELEASE.get() {
        f();
    }
}
