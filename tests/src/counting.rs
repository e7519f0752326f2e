//! A counting global allocator for the memory tests (`zero1_memory.rs`, `tcp_memory.rs`):
//! live heap bytes are attributed to the thread that allocates them (a free subtracts on the
//! freeing thread) and each thread keeps its high-water mark. A test binary installs it with
//! `#[global_allocator] static GLOBAL: Counting = Counting;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

pub struct Counting;

thread_local! {
    /// Bytes this thread allocated minus bytes it freed (negative if it frees others' memory).
    static LIVE: Cell<isize> = const { Cell::new(0) };
    /// The high-water mark of `LIVE` since the last [`reset_peak`].
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn add(delta: isize) {
    // try_with: a thread being torn down may still free memory after its TLS is gone.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: forwards to the system allocator; only counts (the thread-locals are const-initialised
// Cells without destructors, so touching them never allocates).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as isize);
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as isize);
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size as isize - layout.size() as isize);
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add(-(layout.size() as isize));
        System.dealloc(ptr, layout)
    }
}

/// This thread's live bytes.
pub fn live() -> isize {
    LIVE.with(Cell::get)
}

/// This thread's high-water mark since its last [`reset_peak`].
pub fn peak() -> isize {
    PEAK.with(Cell::get)
}

/// Starts a new high-water mark at this thread's live bytes.
pub fn reset_peak() {
    PEAK.with(|p| p.set(live()));
}
