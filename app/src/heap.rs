//! A counting global allocator: the system allocator, with the bytes live and their
//! highest mark counted exactly (heap bytes, not RSS or a wasm memory's size). A binary or
//! a wasm module that wants the counts installs it:
//! `#[global_allocator] static A: allocsim_app::heap::Counting = allocsim_app::heap::Counting;`
//! (the browser build's page and workers, web/src/lib.rs; the worker's probe,
//! scripts/wasm-decode-probe; `bench_memory`). Without it the counts stay 0.

// A global allocator is an unsafe trait: every call forwards to `System` unchanged.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system allocator, counting (see the module).
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call goes to `System` with the caller's pointer and layout unchanged;
// only the counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let q = unsafe { System.realloc(ptr, layout, new_size) };
        if !q.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        q
    }
}

/// The heap bytes live now.
#[must_use]
pub fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Their highest mark since the start or the last [`restart_peak`].
#[must_use]
pub fn peak() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Starts the highest mark again from the bytes live now; returns the mark it had.
pub fn restart_peak() -> usize {
    PEAK.swap(live(), Ordering::Relaxed)
}
