//! [`MemtraceAllocator`], the `#[global_allocator]` wrapper, and its hot path.
//!
//! Every unsampled call forwards to the inner allocator. While tracing is off, that is all an
//! allocation does after one relaxed load and a well-predicted branch, and all a free of less
//! than 64 KiB does after the pool test below (a larger one also looks in the sampled-block
//! table: one bit, and one cache line if samples have used its page). While tracing is on:
//!
//! - `alloc`/`alloc_zeroed`: the thread's byte countdown ([`crate::runtime::sampler`]) is decremented;
//!   when it crosses a sample point the block is recorded ([`record`] captures the
//!   stack, notes the block in the sampled-block table and sends an alloc message) **before**
//!   the pointer is returned. A sampled block of a small layout comes from the sampled-block
//!   pool ([`sampled_pool`]) rather than the inner allocator; a larger one from the inner
//!   allocator.
//! - `dealloc`, traced or not: a block outside the pool whose layout the pool would serve was
//!   not sampled, which one compare of the address against a value written once and one of
//!   the layout tell. Otherwise, out of line, the sampled-block table is read (one cache
//!   line). For a sampled block the entry is removed and the free message sent **before** the
//!   block is freed, so that a reuse of the address can never reach the writer ahead of the
//!   free. A pooled block goes back to the pool, sampled in this session or not.
//! - `realloc` of an unsampled block stays the inner `realloc`, unless its new size is sampled
//!   and the pool serves it: then it moves into the pool (alloc + copy + free). A pooled block
//!   stays in place if its new size is of its slot's class, or else moves (to the pool again
//!   if its new size is sampled, else out). For the trace a `realloc` counts as the old block being
//!   collected (if it was sampled; reported before the inner call, as for `dealloc`) and the
//!   new block being allocated, sampled on its new size. If the `realloc` fails, the old
//!   block — still alive — is no longer tracked: the trace shows it collected at the failed
//!   call.
//!
//! Each method's hot path ends in a tail call, of the inner allocator or of the method's
//! out-of-line half, so that it saves no registers and sets up no frame.
//!
//! Unwinding out of a `GlobalAlloc` method is undefined behaviour, so the sampled path (the
//! out-of-line functions below the countdown and the pool test) runs under
//! [`AbortOnUnwind`]: a panic there, which would be a bug, prints one `memtrace:` line and
//! aborts.

use std::alloc::{GlobalAlloc, Layout, System};

use super::record;
use super::sampled_pool;
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
        unsafe { sampled(nsamples, layout, Entry::Alloc, || self.inner.alloc(layout), |_| {}) }
    }

    /// `alloc_zeroed` whose countdown reached a sample point or checkpoint.
    ///
    /// # Safety
    /// As for [`GlobalAlloc::alloc_zeroed`].
    #[cold]
    #[inline(never)]
    unsafe fn alloc_zeroed_at_sample_point(&self, layout: Layout) -> *mut u8 {
        let nsamples = sampler::sample_points(layout.size());
        // SAFETY: the closure is the inner call under the caller's contract; the slot has room
        // for `layout.size()` bytes.
        unsafe {
            sampled(
                nsamples,
                layout,
                Entry::AllocZeroed,
                || self.inner.alloc_zeroed(layout),
                |slot| slot.write_bytes(0, layout.size()),
            )
        }
    }

    /// `realloc` whose countdown (already decremented by `new_size`) reached a sample point or
    /// checkpoint, of a block outside the pool, of a layout the pool serves.
    ///
    /// # Safety
    /// As for [`GlobalAlloc::realloc`].
    #[cold]
    #[inline(never)]
    unsafe fn realloc_at_sample_point(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let nsamples = sampler::sample_points(new_size);
        // SAFETY: under the caller's contract.
        unsafe { self.realloc_inner_block(nsamples, ptr, layout, new_size) }
    }

    /// `realloc` of a block outside the pool of a layout the pool would not serve (so it may
    /// be sampled; the countdown not yet decremented).
    ///
    /// # Safety
    /// As for [`GlobalAlloc::realloc`].
    #[cold]
    #[inline(never)]
    unsafe fn realloc_maybe_sampled(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        forget_if_sampled(ptr);
        let nsamples = sampler::take(new_size);
        // SAFETY: under the caller's contract.
        unsafe { self.realloc_inner_block(nsamples, ptr, layout, new_size) }
    }

    /// `realloc` of a block of the pool: in place if `new_size` is of its slot's class, else
    /// moved.
    ///
    /// # Safety
    /// As for [`GlobalAlloc::realloc`].
    #[cold]
    #[inline(never)]
    unsafe fn realloc_pooled(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        forget_if_sampled(ptr);
        let nsamples = if enabled() { sampler::take(new_size) } else { 0 };
        // SAFETY: the caller's contract makes `new_size` with `layout`'s alignment a layout.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if sampled_pool::fits(ptr as usize, new_layout) {
            if nsamples != 0 {
                record_alloc(ptr, new_size, nsamples, Entry::Realloc);
            }
            return ptr;
        }
        let moved = |new: *mut u8| {
            // SAFETY: `new` has room for `new_size` bytes and is not `ptr`'s slot, which holds
            // `layout.size()` bytes and is then the pool's again.
            unsafe { std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size)) };
            sampled_pool::free(ptr as usize);
        };
        let from_inner = || {
            // SAFETY: `new_layout` is a layout of nonzero size (the caller's contract).
            let new = unsafe { self.inner.alloc(new_layout) };
            if !new.is_null() {
                moved(new);
            }
            new
        };
        // SAFETY: the closures are the inner call under the caller's contract, and a move.
        unsafe { sampled(nsamples, new_layout, Entry::Realloc, from_inner, moved) }
    }

    /// The `realloc` of a block outside the pool whose new block covers `nsamples` sample
    /// points: the inner `realloc`, unless the pool serves a sampled new block.
    ///
    /// # Safety
    /// As for [`GlobalAlloc::realloc`].
    #[inline(always)]
    unsafe fn realloc_inner_block(&self, nsamples: u64, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract makes `new_size` with `layout`'s alignment a layout.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        let moved = |new: *mut u8| {
            // SAFETY: `new` is a fresh slot with room for `new_size` bytes; `ptr` holds
            // `layout.size()` and is freed with its layout under the caller's contract.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.inner.dealloc(ptr, layout);
            }
        };
        // SAFETY: the closures are the inner call under the caller's contract, and a move.
        unsafe { sampled(nsamples, new_layout, Entry::Realloc, || self.inner.realloc(ptr, layout, new_size), moved) }
    }

    /// `dealloc` of a block of the pool.
    #[cold]
    #[inline(never)]
    fn dealloc_pooled(&self, ptr: *mut u8) {
        forget_if_sampled(ptr);
        sampled_pool::free(ptr as usize);
    }

    /// `dealloc` of a block outside the pool of a layout the pool would not serve.
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

/// Make the block of `layout` that covers `nsamples` sample points (from [`sampler`]) and
/// record it if that is not 0: from the pool, where `fill` initialises it, if the pool serves
/// it and has room; else by `inner`, the inner allocator's call.
///
/// # Safety
/// `inner` must be a call of the inner allocator that is sound for the caller's arguments, and
/// `fill` sound for a fresh slot of the pool that holds `layout`.
#[inline(always)]
unsafe fn sampled(
    nsamples: u64,
    layout: Layout,
    entry: Entry,
    inner: impl FnOnce() -> *mut u8,
    fill: impl FnOnce(*mut u8),
) -> *mut u8 {
    if nsamples == 0 {
        // Kept apart from the sampled case, so that it compiles to a tail call.
        return inner();
    }
    // A calibration capture records no block, so its block need not be the pool's (and must
    // not be lost to a full class: calibration needs the capture).
    let ptr = if sampled_pool::serves(layout) && !sampler::calibration_pending() {
        match sampled_pool::alloc(layout) {
            Some(slot) => {
                fill(slot);
                slot
            }
            None => {
                // Served, but not tracked: its free would never look for it.
                record::pool_full();
                return inner();
            }
        }
    } else {
        inner()
    };
    if !ptr.is_null() {
        record_alloc(ptr, layout.size(), nsamples, entry);
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

/// For a block about to be freed that may have been sampled (pooled, or too large for the
/// pool): look it up
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

// SAFETY: every unsampled call forwards to the inner allocator with the caller's arguments
// unchanged and returns its result unchanged, so `A`'s guarantees carry over. A sampled block
// of a layout the pool serves is a slot of the pool instead: aligned to its size, a power of
// two no smaller than the layout's size and alignment; never handed out again until freed;
// in memory that stays mapped for the life of the process. Each block goes back to where it
// came from: a free or `realloc` of an address in the pool to the pool, any other to `A`
// (with its own layout; a block moved between the two is copied). The bookkeeping around the
// calls never touches the memory of the blocks but to copy or zero them.
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
        // No `enabled()`: a pooled block goes back to the pool whenever it is freed, and a free
        // that finds a sampled block after its session stopped records nothing.
        if sampled_pool::contains(ptr as usize) {
            return self.dealloc_pooled(ptr);
        }
        if !sampled_pool::serves(layout) {
            // SAFETY: forwarded under the caller's contract.
            return unsafe { self.dealloc_maybe_sampled(ptr, layout) };
        }
        // SAFETY: forwarded under the caller's contract.
        unsafe { self.inner.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if sampled_pool::contains(ptr as usize) {
            // SAFETY: under the caller's contract.
            return unsafe { self.realloc_pooled(ptr, layout, new_size) };
        }
        if enabled() {
            if !sampled_pool::serves(layout) {
                // SAFETY: under the caller's contract.
                return unsafe { self.realloc_maybe_sampled(ptr, layout, new_size) };
            }
            if sampler::count_down(new_size) {
                // SAFETY: under the caller's contract.
                return unsafe { self.realloc_at_sample_point(ptr, layout, new_size) };
            }
        }
        // SAFETY: forwarded under the caller's contract.
        unsafe { self.inner.realloc(ptr, layout, new_size) }
    }
}
