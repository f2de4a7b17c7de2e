//! A global allocator wrapper that counts, per thread, allocations and live / peak bytes: the
//! integration tests' global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

pub struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    static LIVE_BYTES: Cell<i64> = const { Cell::new(0) };
    static PEAK_BYTES: Cell<i64> = const { Cell::new(0) };
}

fn note(count: u64, bytes: i64) {
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + count));
    let _ = LIVE_BYTES.try_with(|live| {
        live.set(live.get() + bytes);
        let _ = PEAK_BYTES.try_with(|peak| peak.set(peak.get().max(live.get())));
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(1, layout.size() as i64);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(1, layout.size() as i64);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(1, new_size as i64 - layout.size() as i64);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(0, -(layout.size() as i64));
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Allocations (including reallocations) made by this thread so far.
pub fn allocations() -> u64 {
    ALLOCATIONS.with(|c| c.get())
}

/// Start measuring this thread's peak memory from now.
pub fn reset_peak() {
    let live = LIVE_BYTES.with(|l| l.get());
    PEAK_BYTES.with(|p| p.set(live));
}

/// This thread's peak live bytes since [`reset_peak`], relative to the live bytes then
/// (pass the value of [`live_bytes`] taken at the reset).
pub fn peak_since(base: i64) -> i64 {
    PEAK_BYTES.with(|p| p.get()) - base
}

/// Bytes this thread allocated and has not freed (may be negative when it frees memory
/// allocated by other threads).
pub fn live_bytes() -> i64 {
    LIVE_BYTES.with(|l| l.get())
}
