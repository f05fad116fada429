//! How the binary's allocator (mimalloc, installed in `src/main.rs`) is set up before anything
//! runs. The benchmarks call the same function, so they time the allocator users run.
//!
//! Deliberately not here: choosing the allocator (that is `main.rs`'s `#[global_allocator]`), or
//! any option a user's own `MIMALLOC_*` variable sets (theirs wins).

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

/// Sets the allocator's options the `dagloop` binary runs with, unless the environment already
/// sets them (`MIMALLOC_PURGE_DELAY`). Call it first thing in `main`, before any thread starts:
/// mimalloc's options are not thread safe to change.
pub fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: a plain store into mimalloc's option table, made before other threads exist.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, PURGE_DELAY_MS as _) };
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
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            return;
        }
        assert_eq!(purge_delay_ms(), 1000);
        tune_allocator();
        assert_eq!(purge_delay_ms(), PURGE_DELAY_MS);
    }
}
