//! Exact heap counts of measured scopes, for `memtrace_rs::testing::measure`: the table of the
//! scopes' shared counters, the scope current on each thread, and what the allocator's
//! out-of-line path does for a block allocated in a scope and for its free, on any thread.
//!
//! While a [`Scope`] runs on a thread, the thread's countdown is forced
//! ([`sampler::begin_forced`]), so that each of its allocations reaches the out-of-line path
//! (the session's countdown, kept aside, still picks the session's samples exactly), and
//! [`super::state::STATE`] counts the thread, so that the hot path takes that path with no
//! session too. There, a block allocated in the scope is credited to it ([`Current::allocated`])
//! and tracked in the sampled-block set like a sampled block, at an address the free tests as a
//! sampled block's (`allocator` serves a small one inside a larger inner block), with the
//! scope's slot in its entry, so that its free, on whatever thread, finds the slot and credits
//! it back ([`freed`]). Other threads, and the tracer's own allocations, are not measured.
//!
//! A slot's counters are atomics in a fixed table of 255 ([`SLOTS`]), reached by the slot
//! number from the entry: nothing on these paths allocates or takes a lock. A slot is in use
//! while anything refers to it (its scope running, each live block marked with it, each nested
//! scope's slot), counted in `refs`. A scope that ends with blocks still live moves their
//! entries to the enclosing scope (or to none, [`sampled_set::remark`]), so that a block freed
//! later counts there and the slot is free again at once.
//!
//! Each slot's counters include its nested scopes' blocks: a block is credited to its slot and
//! every slot enclosing it. To rank the allocating sites, the scope captures the stack of its
//! first [`FIRST_CAPTURES`] allocations and then of one per [`SITE_SAMPLE_BYTES`] it allocates
//! (the allocations that cross a multiple of it); the counts are exact whatever is captured.

use std::cell::{Cell, RefCell};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

use super::sampled_set::{self, ScopeSlot};
use super::sampler;
use super::state::{Entry, MAX_FRAMES, STATE};
use super::unwind;
use crate::format::hash::FastMap;

/// Allocations of a scope whose stacks are always captured.
const FIRST_CAPTURES: u64 = 64;
/// After the first allocations, the stack of one allocation per this many bytes is captured
/// (a capture costs far more than a measured allocation, so that a denser sampling of the
/// sites would dominate the scope's cost).
const SITE_SAMPLE_BYTES: u64 = 16 << 10;
/// Distinct stacks a scope keeps; the bytes of others are counted apart.
const MAX_STACKS: usize = 4096;

/// The shared counters of one scope's slot.
struct Counters {
    /// What refers to the slot (see the module doc); 0 when it is free.
    refs: AtomicU32,
    /// The enclosing scope's slot, 0 for none.
    parent: AtomicU8,
    total_bytes: AtomicU64,
    total_blocks: AtomicU64,
    live_bytes: AtomicU64,
    live_blocks: AtomicU64,
    peak_bytes: AtomicU64,
    untracked_blocks: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `SLOTS`.
const FREE: Counters = Counters {
    refs: AtomicU32::new(0),
    parent: AtomicU8::new(0),
    total_bytes: AtomicU64::new(0),
    total_blocks: AtomicU64::new(0),
    live_bytes: AtomicU64::new(0),
    live_blocks: AtomicU64::new(0),
    peak_bytes: AtomicU64::new(0),
    untracked_blocks: AtomicU64::new(0),
};

/// The slots, by number (0 is never used: it means "no scope" in an entry).
static SLOTS: [Counters; 256] = [FREE; 256];

/// The slot `slot` and those enclosing it, innermost first.
fn chain(slot: ScopeSlot) -> impl Iterator<Item = &'static Counters> {
    std::iter::successors((slot != 0).then(|| &SLOTS[slot as usize]), |c| {
        let parent = c.parent.load(Ordering::Relaxed);
        (parent != 0).then(|| &SLOTS[parent as usize])
    })
}

/// Drop one reference to `slot`; the last frees it, and drops its reference to its parent.
fn unref(mut slot: ScopeSlot) {
    while slot != 0 && SLOTS[slot as usize].refs.fetch_sub(1, Ordering::AcqRel) == 1 {
        slot = SLOTS[slot as usize].parent.load(Ordering::Relaxed);
    }
}

/// What a scope counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Figures {
    pub(crate) total_bytes: u64,
    pub(crate) total_blocks: u64,
    pub(crate) max_bytes: u64,
    pub(crate) curr_bytes: u64,
    pub(crate) curr_blocks: u64,
    /// Blocks whose free cannot be counted (no memory or room to track them).
    pub(crate) untracked_blocks: u64,
}

/// The stacks a scope captured, with the bytes each stands for (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct Sites {
    /// Frame addresses innermost first (as `unwind::capture` gives them), and bytes.
    pub(crate) stacks: FastMap<Box<[u64]>, u64>,
    /// The bytes of allocations whose stack could not be kept (too many stacks, or too little
    /// stack left to capture one).
    pub(crate) other_bytes: u64,
}

impl Sites {
    fn add(&mut self, frames: &[u64], bytes: u64) {
        if let Some(total) = self.stacks.get_mut(frames) {
            *total += bytes;
        } else if self.stacks.len() < MAX_STACKS {
            self.stacks.insert(frames.into(), bytes);
        } else {
            self.other_bytes += bytes;
        }
    }

    fn merge(&mut self, other: Sites) {
        for (frames, bytes) in other.stacks {
            self.add(&frames, bytes);
        }
        self.other_bytes += other.other_bytes;
    }
}

/// A measured scope on the thread that made it (see the module doc).
pub(crate) struct Scope {
    slot: ScopeSlot,
    /// The scope this one runs in on this thread, if any.
    parent: Option<NonNull<Scope>>,
    /// Bytes allocated in this scope so far, and allocations whose stacks were captured.
    allocated: Cell<u64>,
    captures: Cell<u64>,
    sites: RefCell<Sites>,
}

thread_local! {
    /// The innermost scope running on this thread (a `const` cell: reading it from inside the
    /// allocator never allocates).
    static CURRENT: Cell<Option<NonNull<Scope>>> = const { Cell::new(None) };
}

/// More scopes than the table has slots are running, or their blocks alive.
#[derive(Debug)]
pub(crate) struct NoSlot;

impl Scope {
    /// A new scope, nested in the one current on this thread if any (not current itself until
    /// [`Scope::run`]).
    pub(crate) fn new() -> Result<Scope, NoSlot> {
        let parent = CURRENT.with(Cell::get);
        // SAFETY: the current scope is alive while it runs (see `run`).
        let parent_slot = parent.map_or(0, |p| unsafe { p.as_ref() }.slot);
        let slot = (1..SLOTS.len())
            .find(|&i| SLOTS[i].refs.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed).is_ok())
            .ok_or(NoSlot)?;
        let counters = &SLOTS[slot];
        for counter in [
            &counters.total_bytes,
            &counters.total_blocks,
            &counters.live_bytes,
            &counters.live_blocks,
            &counters.peak_bytes,
            &counters.untracked_blocks,
        ] {
            counter.store(0, Ordering::Relaxed);
        }
        if parent_slot != 0 {
            SLOTS[parent_slot as usize].refs.fetch_add(1, Ordering::AcqRel);
        }
        counters.parent.store(parent_slot, Ordering::Release);
        Ok(Scope {
            slot: slot as ScopeSlot,
            parent,
            allocated: Cell::new(0),
            captures: Cell::new(0),
            sites: RefCell::default(),
        })
    }

    /// Run `f` with this scope current on this thread: its allocations are counted here.
    pub(crate) fn run<R>(&self, f: impl FnOnce() -> R) -> R {
        /// Makes the enclosing scope current again, even if `f` unwinds.
        struct Restore(Option<NonNull<Scope>>);
        impl Drop for Restore {
            fn drop(&mut self) {
                CURRENT.with(|c| c.set(self.0));
                if self.0.is_none() {
                    sampler::end_forced();
                    STATE.remove_measurer();
                }
            }
        }
        if self.parent.is_none() {
            STATE.add_measurer();
            sampler::begin_forced();
        }
        let _restore = Restore(self.parent);
        CURRENT.with(|c| c.set(Some(NonNull::from(self))));
        f()
    }

    /// End the scope: its figures, and the stacks it captured (the enclosing scope, if any,
    /// takes a copy of them, as its figures hold this one's). Its blocks still live count in
    /// the enclosing scope from now on, or nowhere.
    pub(crate) fn end(self) -> (Figures, Sites) {
        let c = &SLOTS[self.slot as usize];
        let figures = Figures {
            total_bytes: c.total_bytes.load(Ordering::Relaxed),
            total_blocks: c.total_blocks.load(Ordering::Relaxed),
            max_bytes: c.peak_bytes.load(Ordering::Relaxed),
            curr_bytes: c.live_bytes.load(Ordering::Relaxed),
            curr_blocks: c.live_blocks.load(Ordering::Relaxed),
            untracked_blocks: c.untracked_blocks.load(Ordering::Relaxed),
        };
        let parent_slot = c.parent.load(Ordering::Relaxed);
        if c.refs.load(Ordering::Acquire) > 1 {
            // Blocks marked with this slot are live: the parent (held by this slot until it is
            // freed) takes each one's reference before this slot drops it.
            sampled_set::remark(self.slot, parent_slot, || {
                if parent_slot != 0 {
                    SLOTS[parent_slot as usize].refs.fetch_add(1, Ordering::AcqRel);
                }
                unref(self.slot);
            });
        }
        unref(self.slot);
        let sites = self.sites.into_inner();
        if let Some(parent) = self.parent {
            // SAFETY: the enclosing scope runs (on this thread) until this one has ended.
            let parent = unsafe { parent.as_ref() };
            let copy = Sites { stacks: sites.stacks.clone(), other_bytes: sites.other_bytes };
            parent.sites.borrow_mut().merge(copy);
        }
        (figures, sites)
    }
}

/// The scope an allocation on this thread is made in, if any (none inside the tracer).
#[derive(Clone, Copy)]
pub(crate) struct Current(NonNull<Scope>);

/// The scope current on this thread, unless the thread runs tracer code.
#[inline]
pub(crate) fn current() -> Option<Current> {
    let scope = CURRENT.try_with(Cell::get).ok().flatten()?;
    (!sampler::inside_tracer()).then_some(Current(scope))
}

impl Current {
    fn scope(&self) -> &Scope {
        // SAFETY: a scope is current only inside its `run`, which borrows it; a `Current` is
        // used by the allocation that read it, inside that `run`.
        unsafe { self.0.as_ref() }
    }

    /// Credit a block of `size` bytes allocated in the scope to it (and those enclosing it),
    /// maybe capturing its stack: the marks its entry in the sampled-block set must carry.
    pub(crate) fn allocated(self, size: usize, entry: Entry) -> ScopeSlot {
        let scope = self.scope();
        SLOTS[scope.slot as usize].refs.fetch_add(1, Ordering::AcqRel);
        let size = size as u64;
        for c in chain(scope.slot) {
            // The totals have one writer, this thread (a scope and those enclosing it run on
            // the thread that made them), so they need no read-modify-write; the live figures
            // are also written by frees on other threads.
            c.total_bytes.store(c.total_bytes.load(Ordering::Relaxed) + size, Ordering::Relaxed);
            c.total_blocks.store(c.total_blocks.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            c.live_blocks.fetch_add(1, Ordering::Relaxed);
            let live = c.live_bytes.fetch_add(size, Ordering::Relaxed) + size;
            // The peak only grows: compared first, written only when passed.
            if live > c.peak_bytes.load(Ordering::Relaxed) {
                c.peak_bytes.fetch_max(live, Ordering::Relaxed);
            }
        }
        scope.sample_site(size, entry);
        scope.slot
    }

    /// The block just credited ([`Current::allocated`]) could not be tracked: its free will
    /// not be seen, so it leaves the live figures now, counted as untracked.
    pub(crate) fn untracked(self, size: usize) {
        let slot = self.scope().slot;
        for c in chain(slot) {
            c.live_blocks.fetch_sub(1, Ordering::Relaxed);
            c.live_bytes.fetch_sub(size as u64, Ordering::Relaxed);
            c.untracked_blocks.fetch_add(1, Ordering::Relaxed);
        }
        unref(slot);
    }
}

impl Scope {
    /// Capture the stack of an allocation of `size` bytes if the site sampling picks it.
    fn sample_site(&self, size: u64, entry: Entry) {
        let before = self.allocated.get();
        self.allocated.set(before + size);
        let bytes = if self.captures.get() < FIRST_CAPTURES {
            size
        } else {
            ((before + size) / SITE_SAMPLE_BYTES - before / SITE_SAMPLE_BYTES) * SITE_SAMPLE_BYTES
        };
        if bytes == 0 {
            return;
        }
        self.captures.set(self.captures.get() + 1);
        // Inside the tracer, as a sample's capture is: what the walk or the map allocates is
        // neither measured nor sampled, so it never comes back here.
        sampler::in_tracer(|| {
            let mut frames = [0u64; MAX_FRAMES];
            let n = if unwind::stack_left_for_capture() { unwind::capture(entry, false, &mut frames) } else { 0 };
            let mut sites = self.sites.borrow_mut();
            if n == 0 {
                sites.other_bytes += bytes;
            } else {
                sites.add(&frames[..n], bytes);
            }
        });
    }
}

/// Credit the free of a block of `size` bytes, whose entry in the sampled-block set had
/// `marks`, to the scope that measured it, if any (on any thread).
pub(crate) fn freed(marks: usize, size: usize) {
    let slot = sampled_set::scope_of(marks);
    if slot == 0 {
        return;
    }
    for c in chain(slot) {
        c.live_blocks.fetch_sub(1, Ordering::Relaxed);
        c.live_bytes.fetch_sub(size as u64, Ordering::Relaxed);
    }
    unref(slot);
}
