//! [`MemtraceAllocator`], the `#[global_allocator]` wrapper, and its hot path.
//!
//! Every unsampled call forwards to the inner allocator. While tracing is off, that is all an
//! allocation does after one relaxed load and a well-predicted branch, and all a free does
//! after one test of its address (below). While tracing is on:
//!
//! - `alloc`/`alloc_zeroed`: the thread's byte countdown ([`crate::runtime::sampler`]) is
//!   decremented; when it crosses a sample point the block is allocated at its sampled layout
//!   ([`sampled_set::sampled_layout`]: the sampled-block alignment below
//!   [`sampled_set::LARGE_BLOCK`], the program's own layout from there on, so that a large
//!   block is served, zeroed and grown by the same inner call as untraced), noted in the
//!   sampled-block set, and recorded ([`record`] captures the stack and sends an alloc
//!   message) **before** the pointer is returned.
//! - `dealloc`, traced or not: a block smaller than [`sampled_set::LARGE_BLOCK`] whose address
//!   is not a multiple of [`sampled_set::SAMPLED_ALIGN`] was not sampled (one AND, one compare
//!   of the size, no memory read), nor one whose slot of the set's counting filter is empty
//!   ([`sampled_set::may_hold`], one byte read). Otherwise, out of line, the set is asked; a
//!   sampled block is removed, its free sent **before** the block is freed (so that a reuse of
//!   the address can never reach the writer ahead of the free), and freed with the layout it
//!   was allocated with.
//! - `realloc`: the old block is looked up as for `dealloc`, and the new block sampled on its
//!   new size. Where the old and the new block's layouts have one alignment (both unsampled,
//!   both sampled and small, or large) it is the inner `realloc` (which may grow in place or
//!   `mremap`); otherwise the block moves (alloc, copy, free) between the two layouts. For the
//!   trace a `realloc` counts as the old block being freed (if it was sampled) and the new
//!   block being allocated.
//!
//! On a thread that measures a scope (`testing::measure`, [`measure`]) every allocation
//! reaches the out-of-line half (its countdown is forced there), and a block allocated in the
//! scope is credited to it and tracked like a sampled block, with the scope's slot in its
//! entry, so that its free on any thread credits the scope back. A small one not sampled is
//! served at the first multiple of the sampled-block alignment inside an inner block larger by
//! that alignment (an offset block, [`offset_layout`]; the offset is in its entry's tag),
//! which costs the inner allocator no more than a plain block, where an over-aligned block
//! costs glibc several times that. While any thread measures, the others run their countdown
//! even with no session (one out-of-line call per 4 MiB they allocate, `sampler`), and
//! nothing else changes for them.
//!
//! A sample is never lost silently: where its block cannot be allocated at the sampled
//! alignment or tracked, the block is served as unsampled and the loss recorded
//! ([`record::lost`]), in the trace itself.
//!
//! Each method's hot path ends in a tail call, of the inner allocator or of the method's
//! out-of-line half, so that it saves no registers and sets up no frame.
//!
//! Unwinding out of a `GlobalAlloc` method is undefined behaviour, so the sampled path (the
//! out-of-line functions below the countdown and the address test) runs under
//! [`AbortOnUnwind`]: a panic there, which would be a bug, prints one `memtrace:` line and
//! aborts.

use std::alloc::{GlobalAlloc, Layout, System};

use super::measure::{self, Current};
use super::record::{self, Loss};
use super::sampled_set::{self, may_be_sampled, sampled_layout, LARGE_BLOCK, OFFSET_BLOCK, OFFSET_UNIT, SAMPLED_ALIGN};
use super::sampler;
use super::state::{enabled, write_stderr, Entry};

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
        let (nsamples, scope) = (sampler::sample_points(layout.size()), measure::current());
        // SAFETY: the closure is the inner call, for `layout` or a larger alignment of it.
        unsafe { self.sampled(nsamples, scope, layout, Entry::Alloc, |layout| self.inner.alloc(layout)) }
    }

    /// `alloc_zeroed` whose countdown reached a sample point or checkpoint.
    ///
    /// # Safety
    /// As for [`GlobalAlloc::alloc_zeroed`].
    #[cold]
    #[inline(never)]
    unsafe fn alloc_zeroed_at_sample_point(&self, layout: Layout) -> *mut u8 {
        let (nsamples, scope) = (sampler::sample_points(layout.size()), measure::current());
        // SAFETY: the closure is the inner call, for `layout` or a larger alignment of it.
        unsafe { self.sampled(nsamples, scope, layout, Entry::AllocZeroed, |layout| self.inner.alloc_zeroed(layout)) }
    }

    /// A new block of `layout` that covers `nsamples` sample points (from [`sampler`]), made by
    /// `make` (the inner allocator's call for a layout) in the measured `scope` if any: as is if
    /// neither, else at the sampled layout (the program's own for a large block), tracked,
    /// recorded if sampled and credited to the scope if measured.
    ///
    /// # Safety
    /// `make` must be a call of the inner allocator that is sound for `layout` and for its
    /// sampled layout, as for the caller's method.
    #[inline(always)]
    unsafe fn sampled(
        &self,
        nsamples: u64,
        scope: Option<Current>,
        layout: Layout,
        entry: Entry,
        make: impl Fn(Layout) -> *mut u8,
    ) -> *mut u8 {
        let nsamples =
            if nsamples != 0 && record::lost_for_want_of_stack(nsamples, layout.size()) { 0 } else { nsamples };
        if nsamples == 0 && scope.is_none() {
            // Kept apart from the sampled case, so that it compiles to a tail call.
            return make(layout);
        }
        if let (0, Some(scope), Some(padded)) = (nsamples, scope, offset_layout(layout)) {
            // SAFETY: under the caller's contract, `make` is sound for the larger `padded`.
            return unsafe { self.offset_block(scope, layout, padded, entry, make) };
        }
        let sampled = sampled_layout(layout);
        let ptr = make(sampled);
        if ptr.is_null() {
            if sampled == layout {
                // The program's own request failed: it fails as it would untraced.
                return ptr;
            }
            // The sampled layout asks for more than the program did: serve the program's own
            // (a sample lost if that can be had; if not, the allocation fails as it would).
            let ptr = make(layout);
            if !ptr.is_null() {
                untracked(nsamples, scope, Loss::NoMemory, layout.size(), entry);
            }
            return ptr;
        }
        let slot = credit(scope, layout.size(), entry);
        match track(ptr, layout.size(), sampled_set::scope_bits(slot)) {
            Some((key, inserted)) => {
                if nsamples != 0 {
                    record_alloc(key, layout.size(), nsamples, entry, inserted);
                }
                ptr
            }
            None => {
                uncredit(scope, layout.size());
                untracked(nsamples, None, Loss::Untracked, layout.size(), entry);
                if sampled == layout {
                    return ptr;
                }
                // SAFETY: `ptr` was just allocated with `sampled`, and is not the program's yet.
                unsafe { self.inner.dealloc(ptr, sampled) };
                make(layout)
            }
        }
    }

    /// A new block of `layout` measured by `scope` and not sampled, made by `make` (as for
    /// [`MemtraceAllocator::sampled`]) at an offset inside a block of `padded`
    /// ([`offset_layout`]): the program's block starts at its first multiple of the sampled-block
    /// alignment, which its free tests as a sampled block's, and the entry's tag holds the
    /// offset. (An inner block at that alignment costs the inner allocator several times a
    /// plain one: glibc splits a larger chunk and frees the rest.)
    ///
    /// # Safety
    /// `make` must be a call of the inner allocator that is sound for `layout` and `padded`.
    #[inline(always)]
    unsafe fn offset_block(
        &self,
        scope: Current,
        layout: Layout,
        padded: Layout,
        entry: Entry,
        make: impl Fn(Layout) -> *mut u8,
    ) -> *mut u8 {
        let base = make(padded);
        if base.is_null() {
            let ptr = make(layout);
            if !ptr.is_null() {
                untracked(0, Some(scope), Loss::NoMemory, layout.size(), entry);
            }
            return ptr;
        }
        let offset = (SAMPLED_ALIGN - (base as usize & (SAMPLED_ALIGN - 1))) & (SAMPLED_ALIGN - 1);
        // SAFETY: `padded` holds `layout.size()` bytes past any offset below `SAMPLED_ALIGN`, and
        // `base`'s alignment (at least `OFFSET_UNIT`, and `layout`'s) is kept by the offset, a
        // multiple of both (`SAMPLED_ALIGN` is a multiple of every alignment `offset_layout`
        // takes).
        let ptr = unsafe { base.add(offset) };
        let slot = credit(Some(scope), layout.size(), entry);
        let marks = sampled_set::scope_bits(slot) | OFFSET_BLOCK | (offset / OFFSET_UNIT);
        if track(ptr, layout.size(), marks).is_some() {
            return ptr;
        }
        uncredit(Some(scope), layout.size());
        // SAFETY: `base` was just allocated with `padded`, and is not the program's yet.
        unsafe { self.inner.dealloc(base, padded) };
        make(layout)
    }

    /// `realloc` of a block not sampled (its address and size say so) whose countdown, already
    /// decremented by `new_size`, reached a sample point or checkpoint.
    ///
    /// # Safety
    /// As for [`GlobalAlloc::realloc`].
    #[cold]
    #[inline(never)]
    unsafe fn realloc_at_sample_point(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let (nsamples, scope) = (sampler::sample_points(new_size), measure::current());
        // SAFETY: under the caller's contract.
        unsafe { self.realloc_block(nsamples, scope, ptr, layout, None, new_size) }
    }

    /// `realloc` of a block whose address and size say it may have been sampled (the countdown
    /// not yet decremented).
    ///
    /// # Safety
    /// As for [`GlobalAlloc::realloc`].
    #[cold]
    #[inline(never)]
    unsafe fn realloc_maybe_sampled(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let marks = forget_if_sampled(ptr, layout.size());
        let nsamples = if enabled() { sampler::take(new_size) } else { 0 };
        let scope = measure::current();
        // SAFETY: under the caller's contract.
        unsafe { self.realloc_block(nsamples, scope, ptr, layout, marks, new_size) }
    }

    /// The `realloc` of `ptr`, allocated with `layout` (as its entry's `marks` say if it was in
    /// the sampled-block set, [`inner_block`]; no longer tracked), to a new block that covers
    /// `nsamples` sample points,
    /// in the measured `scope` if any (as dhat counts a `realloc`: a new block of the new size,
    /// the old one freed if it was the scope's).
    /// Whenever the old and the new block's layouts have one alignment (both unsampled, both
    /// sampled and small, or either sampled and large, which keeps the program's layout), this
    /// is the inner allocator's own `realloc`, which may grow in place or `mremap`; otherwise
    /// the block moves between the two layouts.
    ///
    /// # Safety
    /// As for [`GlobalAlloc::realloc`].
    #[inline(always)]
    unsafe fn realloc_block(
        &self,
        nsamples: u64,
        scope: Option<Current>,
        ptr: *mut u8,
        layout: Layout,
        marks: Option<usize>,
        new_size: usize,
    ) -> *mut u8 {
        let nsamples = if nsamples != 0 && record::lost_for_want_of_stack(nsamples, new_size) { 0 } else { nsamples };
        // SAFETY: the caller's contract makes `new_size` with `layout`'s alignment a layout.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        let (old_base, old_layout) = marks.map_or((ptr, layout), |marks| inner_block(ptr, layout, marks));
        if nsamples != 0 || scope.is_some() {
            let sampled = sampled_layout(new_layout);
            // SAFETY: `ptr` holds the program's block in `old_base`'s of `old_layout`.
            let new = unsafe { self.resize(ptr, old_base, old_layout, layout.size(), sampled) };
            if !new.is_null() {
                let slot = credit(scope, new_size, Entry::Realloc);
                let Some((key, inserted)) = track(new, new_size, sampled_set::scope_bits(slot)) else {
                    uncredit(scope, new_size);
                    untracked(nsamples, None, Loss::Untracked, new_size, Entry::Realloc);
                    if sampled == new_layout {
                        return new;
                    }
                    // Back to the program's layout; if there is no memory for that, the one case
                    // a block keeps its sampled layout untracked, and is later freed with the
                    // program's (which `System`, whose `free` takes no layout, and most
                    // allocators accept).
                    // SAFETY: `new` is a fresh block of `sampled`, not the program's yet.
                    let out = unsafe { self.resize(new, new, sampled, new_size, new_layout) };
                    return if out.is_null() { new } else { out };
                };
                if nsamples != 0 {
                    record_alloc(key, new_size, nsamples, Entry::Realloc, inserted);
                }
                return new;
            }
            // No memory for the sampled layout: the block as an unsampled one if the memory is
            // there (a sample lost), else the `realloc` fails as it would.
        }
        // SAFETY: `ptr` holds the program's block in `old_base`'s of `old_layout`.
        let out = unsafe { self.resize(ptr, old_base, old_layout, layout.size(), new_layout) };
        if out.is_null() {
            if (old_base, old_layout) != (ptr, layout) {
                // The old block stays the program's in its inner block: tracked again (by no
                // session, no scope), so that its free finds that block.
                let offset_tag = marks.map_or(0, |m| if m & OFFSET_BLOCK != 0 { m & sampled_set::TAG_MASK } else { 0 });
                track(ptr, layout.size(), offset_tag);
            }
        } else {
            untracked(nsamples, scope, Loss::NoMemory, new_size, Entry::Realloc);
        }
        out
    }

    /// The `size` bytes at `ptr`, in the inner allocator's block `base` of layout `from` (where
    /// `ptr` is `base` but for an offset block), as a block of layout `to` (of the same size or
    /// another) holding them: the inner `realloc` where the program's block is the inner one and
    /// the two layouts have one alignment, so that the inner allocator grows or shrinks it as it
    /// would untraced, else a move (alloc, copy, free). Null, with the block left as it was,
    /// when there is no memory.
    ///
    /// # Safety
    /// `base` must be a block of the inner allocator allocated with `from`, holding `size` bytes
    /// from `ptr` on, and `to` a layout of nonzero size.
    #[inline(always)]
    unsafe fn resize(&self, ptr: *mut u8, base: *mut u8, from: Layout, size: usize, to: Layout) -> *mut u8 {
        if ptr == base && from.align() == to.align() {
            // SAFETY: `ptr` was allocated with `from`; `to.size()` with `from`'s alignment is
            // the layout `to`.
            return unsafe { self.inner.realloc(ptr, from, to.size()) };
        }
        // SAFETY: `to` is a layout of nonzero size.
        let new = unsafe { self.inner.alloc(to) };
        if !new.is_null() {
            // SAFETY: `new` is a fresh block with room for `to.size()` bytes; `ptr` holds `size`,
            // and `base` is freed with the layout it was allocated with.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, new, size.min(to.size()));
                self.inner.dealloc(base, from);
            }
        }
        new
    }

    /// `dealloc` of a block whose address and size say it may have been sampled.
    ///
    /// # Safety
    /// As for [`GlobalAlloc::dealloc`].
    #[cold]
    #[inline(never)]
    unsafe fn dealloc_maybe_sampled(&self, ptr: *mut u8, layout: Layout) {
        let (block, layout) = match forget_if_sampled(ptr, layout.size()) {
            Some(marks) => inner_block(ptr, layout, marks),
            None => (ptr, layout),
        };
        // SAFETY: forwarded under the caller's contract, with the inner block `ptr` is in and
        // the layout it was allocated with.
        unsafe { self.inner.dealloc(block, layout) }
    }
}

impl MemtraceAllocator<System> {
    /// Wrap the system allocator.
    pub const fn system() -> Self {
        MemtraceAllocator { inner: System }
    }
}

/// Note the new sampled or measured block of `size` bytes at `ptr` in the sampled-block set,
/// with `marks` (see [`sampled_set::insert`]): its key and where the set holds it, or `None`
/// where it cannot be tracked.
#[inline(always)]
fn track(ptr: *mut u8, size: usize, marks: usize) -> Option<(usize, sampled_set::Inserted)> {
    let key = sampled_set::block_key(ptr as usize, size)?;
    Some((key, sampled_set::insert(key, marks)?))
}

/// The layout of the inner block that holds a measured block of `layout` at an offset, for
/// those small enough (and no more aligned than the sampled-block alignment): room for the
/// block at any offset below that alignment.
#[inline(always)]
fn offset_layout(layout: Layout) -> Option<Layout> {
    if layout.size() >= LARGE_BLOCK || layout.align() > SAMPLED_ALIGN {
        return None;
    }
    Layout::from_size_align(layout.size() + SAMPLED_ALIGN, layout.align().max(OFFSET_UNIT)).ok()
}

/// The bits of a tag below [`OFFSET_BLOCK`]: a session's tag, or an offset block's offset.
const SESSION_TAGS: usize = OFFSET_BLOCK - 1;

/// The inner allocator's block, and its layout, that holds the program's block `ptr` of `layout`
/// whose entry in the sampled-block set had `marks`: an offset block's, or a sampled block's at
/// its sampled layout.
#[inline(always)]
fn inner_block(ptr: *mut u8, layout: Layout, marks: usize) -> (*mut u8, Layout) {
    match offset_layout(layout) {
        Some(padded) if marks & OFFSET_BLOCK != 0 => (ptr.wrapping_sub((marks & SESSION_TAGS) * OFFSET_UNIT), padded),
        _ => (ptr, sampled_layout(layout)),
    }
}

/// Credit a block of `size` bytes to the measured `scope`, if any (aborts if it panics): the
/// slot its entry carries, 0 for none.
#[inline(always)]
fn credit(scope: Option<Current>, size: usize, entry: Entry) -> sampled_set::ScopeSlot {
    scope.map_or(0, |scope| AbortOnUnwind::around(|| scope.allocated(size, entry)))
}

/// Take back [`credit`]'s block from the live figures: it cannot be tracked, so its free
/// will not be seen.
#[inline(always)]
fn uncredit(scope: Option<Current>, size: usize) {
    if let Some(scope) = scope {
        scope.untracked(size);
    }
}

/// A new block of `size` bytes served untracked: the sample lost to `cause` if it covered
/// `nsamples` points, and the block counted untracked by the measured `scope` if any.
#[inline(always)]
fn untracked(nsamples: u64, scope: Option<Current>, cause: Loss, size: usize, entry: Entry) {
    if nsamples != 0 {
        record::lost(cause, nsamples, size);
    }
    if let Some(scope) = scope {
        credit(Some(scope), size, entry);
        scope.untracked(size);
    }
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
        // A direct write (no formatting, no allocation), because the allocator is in the middle
        // of a call and the panic may have come from anywhere under it; only to the program's
        // stderr, as every message of the tracer.
        write_stderr(MESSAGE);
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

/// Record a sampled block (never recurses into sampling; aborts if it panics), and tag its
/// entry in the sampled-block set with the session that recorded it (a calibration capture
/// leaves it to none).
#[cold]
#[inline(never)]
fn record_alloc(key: usize, size: usize, nsamples: u64, entry: Entry, inserted: sampled_set::Inserted) {
    AbortOnUnwind::around(|| {
        let tag = sampler::in_tracer(|| {
            #[cfg(debug_assertions)]
            if PANIC_IN_NEXT_SAMPLE.swap(false, std::sync::atomic::Ordering::Relaxed) {
                panic!("deliberate panic in the sampled path");
            }
            record::sampled_alloc(key, size, nsamples, entry)
        });
        if let Some(Some(tag)) = tag {
            inserted.tag(tag);
        }
    });
}

/// Report the end of the sampled block of key `key`, if its session is the running one.
#[cold]
#[inline(never)]
fn record_free(key: usize, tag: sampled_set::SessionTag) {
    sampler::in_tracer(|| record::sampled_free(key, tag));
}

/// For a block of `size` bytes about to be freed whose address and size say it may have been
/// sampled: look it up in the sampled-block set, and if it was sampled or measured, forget it,
/// report its end if a session recorded it or credit it to the scope that measured it, and
/// return its entry's marks (aborts if it panics).
#[cold]
#[inline(never)]
fn forget_if_sampled(ptr: *mut u8, size: usize) -> Option<usize> {
    let key = sampled_set::block_key(ptr as usize, size)?;
    AbortOnUnwind::around(|| {
        let marks = sampled_set::remove(key)?;
        let tag = marks & sampled_set::TAG_MASK;
        if tag != 0 && tag & OFFSET_BLOCK == 0 {
            record_free(key, tag);
        }
        measure::freed(marks, size);
        Some(marks)
    })
}

// SAFETY: every unsampled call forwards to the inner allocator with the caller's arguments
// unchanged and returns its result unchanged, so `A`'s guarantees carry over. A sampled block
// is the inner allocator's block of the caller's size at its sampled layout (the caller's, or a
// larger alignment, which meets the caller's), noted in the sampled-block set until it is
// freed, and freed (or reallocated) with that layout; a block moved between two layouts is
// copied. The bookkeeping around the
// calls never touches the memory of the blocks but to copy them.
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
        // No `enabled()`: a sampled block is freed with its sampled layout whenever it is freed,
        // and a free that finds a block of a stopped session records nothing.
        if may_be_sampled(ptr as usize, layout.size()) && sampled_set::may_hold(ptr as usize) {
            // SAFETY: forwarded under the caller's contract.
            return unsafe { self.dealloc_maybe_sampled(ptr, layout) };
        }
        // SAFETY: forwarded under the caller's contract.
        unsafe { self.inner.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if may_be_sampled(ptr as usize, layout.size()) && sampled_set::may_hold(ptr as usize) {
            // SAFETY: under the caller's contract.
            return unsafe { self.realloc_maybe_sampled(ptr, layout, new_size) };
        }
        if enabled() && sampler::count_down(new_size) {
            // SAFETY: under the caller's contract.
            return unsafe { self.realloc_at_sample_point(ptr, layout, new_size) };
        }
        // SAFETY: forwarded under the caller's contract.
        unsafe { self.inner.realloc(ptr, layout, new_size) }
    }
}
