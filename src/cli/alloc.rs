//! How the binary's allocator (mimalloc, installed in `src/main.rs`) is set up before anything
//! runs, and how an idle thread hands memory back to it ([`release_idle`], registered as
//! [`crate::idle`]'s hook and called when tokio's workers park). The benchmarks call the same
//! function, so they time the allocator users run.
//!
//! What a server that drove a burst of runs to their wait kept, measured (300 runs, 15 s idle,
//! 16 clients): 176 to 536 KiB per run more than a server restarted on the same store, though
//! its live heap (heaptrack) held under 4 MiB in all. Three things kept it: blocks freed by
//! another thread stay in the allocating thread's pages until that thread collects them, and a
//! worker that sleeps after the burst never does; transparent huge pages, which make each
//! touched 2 MiB of the allocator's arena resident whole (and the kernel's khugepaged fills
//! purged ranges in again), so a 1,500-run burst peaked at 929 MB against 325 MB without them;
//! and glibc's malloc, which SQLite uses, keeps freed chunks in its per-thread arenas.
//!
//! Deliberately not here: choosing the allocator (that is `main.rs`'s `#[global_allocator]`), or
//! any option a user's own `MIMALLOC_*` variable sets (theirs wins).

use std::cell::Cell;
use std::time::{Duration, Instant};

/// mimalloc's `mi_option_purge_delay` (its place in `mi_option_t`; `libmimalloc-sys` does not
/// name it). `tests` pin it to mimalloc's documented default, so a renumbering fails a test.
const PURGE_DELAY: i32 = 15;

/// How long memory the run freed stays with the process before it goes back to the OS.
///
/// mimalloc's default (one second) hands a freed page back while a long run still allocates:
/// the next allocation faults it in again, and with transparent huge pages the kernel zeroes
/// 2 MiB for it. Measured on `cargo bench --bench scheduler` (fanout0, 100,000 calls): 113,000
/// to 218,000 page faults per process with the default against 1,200 to 5,300 with 10 s, and a
/// quarter less CPU time. Ten seconds outlasts a run's bursts and still returns an idle
/// server's memory.
pub const PURGE_DELAY_MS: i64 = 10_000;

/// mimalloc's `mi_option_allow_thp` (its place in `mi_option_t`, pinned by a test like
/// [`PURGE_DELAY`]).
const ALLOW_THP: i32 = 43;

/// Sets the allocator's options the `dagloop` binary runs with, unless the environment already
/// sets them (`MIMALLOC_PURGE_DELAY`, `MIMALLOC_ALLOW_THP`), and registers [`release_idle`] as
/// what an idle thread does. Call it first thing in `main`, before any thread starts:
/// mimalloc's options are not thread safe to change.
///
/// Transparent huge pages are turned off for the process (as `MIMALLOC_ALLOW_THP=0` would:
/// `PR_SET_THP_DISABLE`; the programs its tools start get them back, see
/// [`crate::tools::huge_pages_for_children`]): see the module's doc for what they cost a
/// server. Page faults are 4 KiB again, which the purge delay keeps rare.
pub fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: a plain store into mimalloc's option table, made before other threads exist.
        unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, PURGE_DELAY_MS as _) };
    }
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: as above.
        unsafe { libmimalloc_sys::mi_option_set(ALLOW_THP, 0) };
        // The arena mimalloc may already have reserved was advised for huge pages: the process
        // flag covers it too (and khugepaged leaves the process alone).
        // Only this process: the programs its tools start get them back (unless they were off
        // already when it started, as its parent left them).
        #[cfg(target_os = "linux")]
        // SAFETY: prctl with integer arguments only.
        unsafe {
            let inherited = nix::libc::prctl(nix::libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) > 0;
            if nix::libc::prctl(nix::libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0 && !inherited {
                crate::tools::huge_pages_for_children();
            }
        }
    }
    crate::idle::on_release(release_idle);
}

/// How often one thread collects at most ([`release_idle`]).
const COLLECT_EVERY: Duration = Duration::from_secs(1);

/// How often the process gives glibc's free memory back at most.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_EVERY: Duration = Duration::from_secs(10);

thread_local! {
    /// When this thread last collected its allocator pages.
    static COLLECTED: Cell<Option<Instant>> = const { Cell::new(None) };
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
static TRIMMED: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);

/// A thread with nothing to do hands the memory it freed back: mimalloc collects this thread's
/// pages (blocks other threads freed in them are counted free, empty pages go back to the arena,
/// which returns them to the system after the purge delay), at most once a second per thread;
/// and at most every 10 s, glibc's malloc (SQLite's) returns its free pages (`malloc_trim`).
/// Cheap when called more often: one clock read.
pub fn release_idle() {
    let now = Instant::now();
    if COLLECTED.with(|c| {
        c.get()
            .is_some_and(|t| now.duration_since(t) < COLLECT_EVERY)
    }) {
        return;
    }
    COLLECTED.with(|c| c.set(Some(now)));
    // SAFETY: collects the calling thread's own heap.
    unsafe { libmimalloc_sys::mi_collect(false) };
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if let Ok(mut last) = TRIMMED.try_lock()
        && !last.is_some_and(|t| now.duration_since(t) < TRIM_EVERY)
    {
        *last = Some(now);
        // SAFETY: glibc's malloc_trim takes its own locks.
        unsafe { nix::libc::malloc_trim(0) };
    }
}

/// The most blocking threads the binary's runtime keeps at once: 16 per core, at least 32 and
/// at most tokio's default (512).
///
/// The blocking pool serves store reads and file IO, each a few milliseconds; more threads than
/// that do not read faster on a few cores, but each one a burst starts leaves memory behind
/// when it goes (pages of its allocator heap that still hold a live block, its glibc arena, its
/// shard of the tracing registry): with tokio's default, a server that drove 5,000 submitted
/// runs to their wait had started 346 and kept 4 KiB per run over a restarted server.
pub fn max_blocking_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
    cores.saturating_mul(16).clamp(32, 512)
}

/// The allocator's purge delay now in force, in milliseconds.
// `c_long` is `i64` here and `i32` elsewhere (Windows): the conversion is not always a no-op.
#[allow(clippy::useless_conversion)]
pub fn purge_delay_ms() -> i64 {
    // SAFETY: reads mimalloc's option table.
    i64::from(unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Option 15 is the purge delay: before tuning it holds mimalloc v3's documented default
    /// (1000 ms), after it the binary's. (This test binary does not allocate with mimalloc, so
    /// changing the option affects no other test.)
    #[test]
    fn tuning_sets_the_purge_delay_mimalloc_documents() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some()
            || std::env::var_os("MIMALLOC_ALLOW_THP").is_some()
        {
            return;
        }
        // SAFETY: reads mimalloc's option table.
        let thp = || unsafe { libmimalloc_sys::mi_option_get(ALLOW_THP) };
        assert_eq!(purge_delay_ms(), 1000);
        // allow_thp's documented default is 1, and the option after it (minimal_purge_size)
        // defaults to 0: a renumbering shows.
        assert_eq!(thp(), 1);
        // SAFETY: as above.
        assert_eq!(unsafe { libmimalloc_sys::mi_option_get(ALLOW_THP + 1) }, 0);
        tune_allocator();
        assert_eq!(purge_delay_ms(), PURGE_DELAY_MS);
        assert_eq!(thp(), 0);
        #[cfg(target_os = "linux")]
        // SAFETY: prctl with integer arguments only.
        assert_eq!(
            unsafe { nix::libc::prctl(nix::libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) },
            1
        );
    }
}
