//! A global allocator that counts live bytes (over the one the binary uses) (and their peak), shared by the benchmarks that
//! report memory. Include with `#[path = "support/alloc.rs"] mod alloc;`; it installs itself.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout};

/// The allocator the `dagloop` binary installs (src/main.rs), so that benchmarks time the same
/// allocator users run.
use mimalloc::MiMalloc as Inner;
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicU64, Ordering};

pub struct Counting;
/// Bytes allocated and not yet freed.
pub static LIVE: AtomicIsize = AtomicIsize::new(0);
/// Allocations made (reallocations included) while counting.
pub static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
/// The highest `LIVE` since the last [`reset_peak`].
pub static PEAK: AtomicIsize = AtomicIsize::new(0);

/// Whether allocations are counted (on unless [`counting`] turned it off). The counters are
/// shared atomics every thread updates on every allocation: a benchmark that times work turns
/// counting off while it times, or it times the counter's cache-line traffic too.
static ON: AtomicBool = AtomicBool::new(true);

/// Turns counting on or off. Only differences between two readings taken while it is on mean
/// anything, and only for memory allocated while it was on.
pub fn counting(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// Live bytes now.
pub fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// Allocations made while counting, so far.
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// Starts a new peak measurement from the current live bytes.
pub fn reset_peak() {
    PEAK.store(live(), Ordering::Relaxed);
}

/// The peak since [`reset_peak`].
pub fn peak() -> isize {
    PEAK.load(Ordering::Relaxed)
}

fn grew(by: isize) {
    if !ON.load(Ordering::Relaxed) {
        return;
    }
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: forwards every request to the binary's allocator unchanged; only counts bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { Inner.alloc(l) };
        if !p.is_null() {
            grew(l.size() as isize);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { Inner.dealloc(p, l) };
        if ON.load(Ordering::Relaxed) {
            LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let q = unsafe { Inner.realloc(p, l, new) };
        if !q.is_null() {
            grew(new as isize - l.size() as isize);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;
