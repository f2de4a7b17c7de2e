//! [`MemtraceAllocator`], the `#[global_allocator]` wrapper, and its hot path.
//!
//! Every call forwards to the inner allocator. While tracing is off that is all it does, after
//! one relaxed load and a well-predicted branch. While tracing is on:
//!
//! - `alloc`/`alloc_zeroed`: the thread's byte countdown ([`crate::runtime::sampler`]) is decremented;
//!   when it crosses a sample point the block is recorded ([`record`] captures the
//!   stack, notes the block in the sampled-block table and sends an alloc message) **before**
//!   the pointer is returned.
//! - `dealloc`: one read of the count of live sampled blocks, which rules out every block
//!   while none is live; otherwise one read of the sampled-block filter (a 32 KiB array),
//!   which rules out almost every block; otherwise, out of line, one cache-line read of the
//!   table. For a sampled block the entry is removed and the free message sent **before** the
//!   inner `dealloc`, so that a reuse of the address can never reach the writer ahead of the
//!   free.
//! - `realloc` stays the inner `realloc` (never alloc + copy + free). For the trace it counts
//!   as the old block being collected (if it was sampled; reported before the inner call, as
//!   for `dealloc`) and the new block being allocated, sampled on its new size. If the inner
//!   `realloc` fails, the old block — still alive — is no longer tracked: the trace shows it
//!   collected at the failed call.
//!
//! Each method's hot path ends in a tail call, of the inner allocator or of the method's
//! out-of-line half, so that it saves no registers and sets up no frame.
//!
//! Unwinding out of a `GlobalAlloc` method is undefined behaviour, so the sampled path (the
//! out-of-line functions below the countdown and the filter) runs under [`AbortOnUnwind`]: a
//! panic there, which would be a bug, prints one `memtrace:` line and aborts.

use std::alloc::{GlobalAlloc, Layout, System};

use super::record;
use super::sampled_set;
use super::sampler;
use super::state::{enabled, Entry};

/// A global allocator that forwards to `A` and, while a trace is running, samples allocations
/// into a memtrace trace.
///
/// ```no_run
/// use memtrace_rs::MemtraceAllocator;
///
/// #[global_allocator]
/// static GLOBAL: MemtraceAllocator = MemtraceAllocator::system();
///
/// fn main() {
///     let _trace = memtrace_rs::trace_if_requested();
///     // ... the program ...
/// }
/// ```
#[derive(Debug, Default)]
pub struct MemtraceAllocator<A: GlobalAlloc = System> {
    inner: A,
}

impl<A: GlobalAlloc> MemtraceAllocator<A> {
    /// Wrap the allocator `inner`.
    pub const fn new(inner: A) -> Self {
        MemtraceAllocator { inner }
    }
}

/// The out-of-line halves of the [`GlobalAlloc`] methods: each is reached by a tail call from
/// the method's hot path, so that the common case saves no registers and tail-calls `inner`.
impl<A: GlobalAlloc> MemtraceAllocator<A> {
    /// `alloc` whose countdown reached a sample point or checkpoint.
    ///
    /// # Safety
    /// As for [`GlobalAlloc::alloc`].
    #[cold]
    #[inline(never)]
    unsafe fn alloc_at_sample_point(&self, layout: Layout) -> *mut u8 {
        let nsamples = sampler::sample_points(layout.size());
        // SAFETY: the closure is the inner call under the caller's contract.
        unsafe { sampled(nsamples, layout.size(), Entry::Alloc, || self.inner.alloc(layout)) }
    }

    /// `alloc_zeroed` whose countdown reached a sample point or checkpoint.
    ///
    /// # Safety
    /// As for [`GlobalAlloc::alloc_zeroed`].
    #[cold]
    #[inline(never)]
    unsafe fn alloc_zeroed_at_sample_point(&self, layout: Layout) -> *mut u8 {
        let nsamples = sampler::sample_points(layout.size());
        // SAFETY: the closure is the inner call under the caller's contract.
        unsafe { sampled(nsamples, layout.size(), Entry::AllocZeroed, || self.inner.alloc_zeroed(layout)) }
    }

    /// `realloc` whose countdown (already decremented by `new_size`) reached a sample point or
    /// checkpoint, of a block the sampled-block filter rules out.
    ///
    /// # Safety
    /// As for [`GlobalAlloc::realloc`].
    #[cold]
    #[inline(never)]
    unsafe fn realloc_at_sample_point(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let nsamples = sampler::sample_points(new_size);
        // SAFETY: the closure is the inner call under the caller's contract.
        unsafe { sampled(nsamples, new_size, Entry::Realloc, || self.inner.realloc(ptr, layout, new_size)) }
    }

    /// `realloc` of a block that the sampled-block filter does not rule out (the countdown not
    /// yet decremented).
    ///
    /// # Safety
    /// As for [`GlobalAlloc::realloc`].
    #[cold]
    #[inline(never)]
    unsafe fn realloc_maybe_sampled(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        forget_if_sampled(ptr);
        let nsamples = sampler::take(new_size);
        // SAFETY: the closure is the inner call under the caller's contract.
        unsafe { sampled(nsamples, new_size, Entry::Realloc, || self.inner.realloc(ptr, layout, new_size)) }
    }

    /// `dealloc` of a block that the sampled-block filter does not rule out.
    ///
    /// # Safety
    /// As for [`GlobalAlloc::dealloc`].
    #[cold]
    #[inline(never)]
    unsafe fn dealloc_maybe_sampled(&self, ptr: *mut u8, layout: Layout) {
        forget_if_sampled(ptr);
        // SAFETY: forwarded under the caller's contract.
        unsafe { self.inner.dealloc(ptr, layout) }
    }
}

impl MemtraceAllocator<System> {
    /// Wrap the system allocator.
    pub const fn system() -> Self {
        MemtraceAllocator { inner: System }
    }
}

/// Run the inner allocation `inner` of `size` bytes that covers `nsamples` sample points
/// (from [`sampler`]), and record it if that is not 0.
///
/// # Safety
/// `inner` must be a call of the inner allocator that is sound for the caller's arguments.
#[inline(always)]
unsafe fn sampled(nsamples: u64, size: usize, entry: Entry, inner: impl FnOnce() -> *mut u8) -> *mut u8 {
    if nsamples == 0 {
        // Kept apart from the sampled case, so that it compiles to a tail call.
        return inner();
    }
    let ptr = inner();
    if !ptr.is_null() {
        record_alloc(ptr, size, nsamples, entry);
    }
    ptr
}

/// Aborts the process if dropped: armed around the sampled path and defused when the path
/// returns, so it is only dropped while a panic unwinds through it. It costs nothing when
/// nothing panics (the abort is in the unwinding landing pad), and it is armed only out of
/// line, never on the unsampled path.
struct AbortOnUnwind;

impl AbortOnUnwind {
    /// Run `f`, aborting instead of unwinding if it panics.
    #[inline(always)]
    fn around<R>(f: impl FnOnce() -> R) -> R {
        let guard = AbortOnUnwind;
        let result = f();
        std::mem::forget(guard);
        result
    }
}

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        const MESSAGE: &[u8] = b"memtrace: a panic in the allocator's sampled path (a bug in memtrace-rs); \
            aborting, since a panic must not unwind out of a global allocator\n";
        // SAFETY: writes a static buffer to stderr; a direct write, because the allocator is
        // in the middle of a call and the panic may have come from anywhere under it.
        unsafe { libc::write(libc::STDERR_FILENO, MESSAGE.as_ptr().cast(), MESSAGE.len()) };
        std::process::abort();
    }
}

/// The test hook behind `__internals::panic_in_next_sample` (debug builds only): the next
/// sampled allocation panics inside the sampled path.
#[cfg(debug_assertions)]
pub(crate) static PANIC_IN_NEXT_SAMPLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The address of [`record_alloc`]: in every capture of a sampled allocation, the frame after
/// its own is the out-of-line half of the allocator method that was called, the last of the
/// tracer's frames (see `unwind::calibrate`).
pub(crate) fn record_alloc_address() -> u64 {
    record_alloc as *const () as u64
}

/// Record a sampled block (never recurses into sampling; aborts if it panics).
#[cold]
#[inline(never)]
fn record_alloc(ptr: *mut u8, size: usize, nsamples: u64, entry: Entry) {
    AbortOnUnwind::around(|| {
        sampler::in_tracer(|| {
            #[cfg(debug_assertions)]
            if PANIC_IN_NEXT_SAMPLE.swap(false, std::sync::atomic::Ordering::Relaxed) {
                panic!("deliberate panic in the sampled path");
            }
            record::sampled_alloc(ptr as usize, size, nsamples, entry)
        })
    });
}

/// Report the end of sampled block `ptr`.
#[cold]
#[inline(never)]
fn record_free(ptr: *mut u8) {
    sampler::in_tracer(|| record::sampled_free(ptr as usize));
}

/// For a block about to be freed that the sampled-block filter does not rule out: look it up
/// in the table, and if it was sampled, forget it and report its end (aborts if it panics).
#[cold]
#[inline(never)]
fn forget_if_sampled(ptr: *mut u8) {
    AbortOnUnwind::around(|| {
        if sampled_set::remove(ptr as usize) {
            record_free(ptr);
        }
    });
}

// SAFETY: every method forwards to the inner allocator with the caller's arguments unchanged
// and returns its result unchanged, so `A`'s guarantees carry over; the bookkeeping around the
// calls never touches the memory of the blocks.
unsafe impl<A: GlobalAlloc> GlobalAlloc for MemtraceAllocator<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if enabled() && sampler::count_down(layout.size()) {
            // SAFETY: forwarded under the caller's contract.
            return unsafe { self.alloc_at_sample_point(layout) };
        }
        // SAFETY: forwarded under the caller's contract.
        unsafe { self.inner.alloc(layout) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if enabled() && sampler::count_down(layout.size()) {
            // SAFETY: forwarded under the caller's contract.
            return unsafe { self.alloc_zeroed_at_sample_point(layout) };
        }
        // SAFETY: forwarded under the caller's contract.
        unsafe { self.inner.alloc_zeroed(layout) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // No `enabled()` first: the filter is closed when a session stops (and a free that gets
        // past it then records nothing), and every static a free reads is one more load.
        if sampled_set::may_contain(ptr as usize) {
            // SAFETY: forwarded under the caller's contract.
            return unsafe { self.dealloc_maybe_sampled(ptr, layout) };
        }
        // SAFETY: forwarded under the caller's contract.
        unsafe { self.inner.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if enabled() {
            if sampled_set::may_contain(ptr as usize) {
                // SAFETY: forwarded under the caller's contract.
                return unsafe { self.realloc_maybe_sampled(ptr, layout, new_size) };
            }
            if sampler::count_down(new_size) {
                // SAFETY: forwarded under the caller's contract.
                return unsafe { self.realloc_at_sample_point(ptr, layout, new_size) };
            }
        }
        // SAFETY: forwarded under the caller's contract.
        unsafe { self.inner.realloc(ptr, layout, new_size) }
    }
}
