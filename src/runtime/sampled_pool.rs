//! The address range that sampled blocks of small layouts are served from, so that a free can
//! tell from the address alone that its block was not sampled.
//!
//! `dealloc` must ask of every block "was this one sampled?", and almost every answer is no.
//! A sampled block whose size and alignment are both below [`POOLED_BELOW`] is not taken from
//! the inner allocator but from this pool, one reservation of address space made when tracing
//! first starts and kept for the life of the process; so a free of a small block whose address
//! lies outside it (one subtraction and one compare against a value written once) was not
//! sampled. Larger sampled blocks come from the inner allocator as before, and a free tells
//! them by the size its `Layout` gives (`sampled_set` then looks them up): frees that large
//! are few, and cost far more than a lookup anyway. This is GWP-ASan's design, without its
//! guard pages.
//!
//! The pool holds one region per size class (powers of two from 16 bytes to
//! [`POOLED_BELOW`]), each slot aligned to its size, so any alignment below `POOLED_BELOW` is
//! met. A region is reserved inaccessible and made readable and writable a chunk at a time as
//! it is first needed, so untouched address space costs neither memory nor commit charge.
//! Free slots are kept on a lock-free stack per class (the link is stored in the free slot;
//! a counter beside the top guards against a slot popped and pushed again in between, and
//! the memory is never unmapped, so reading a stale link is harmless), and a chunk's
//! untouched slots are handed out in order, so a short run makes resident only the pages of
//! the slots it used. Nothing takes a lock, so a fork at any moment leaves a pool the child
//! can use (a slot being handed out when the fork came is lost, nothing more).
//!
//! A class whose region is full (its live sampled blocks fill it) answers `None`; the caller
//! then serves the block from the inner allocator untracked and counts the sample as lost.
//! Blocks stay in the pool after their session stops, and are freed into it whenever the
//! program frees them. A pooled block's layout is always one the pool serves (a `realloc` to
//! another size class moves the block), so no block is both in the pool and looked up by size.

use std::alloc::Layout;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// A sampled block comes from the pool if its size and alignment are both below this (a
/// power of two, so that `size | align` below it says both).
pub(crate) const POOLED_BELOW: usize = 64 << 10;
/// The smallest slot.
const MIN_SLOT: usize = 16;
/// Size classes: 16, 32, … `POOLED_BELOW` bytes (a block just below it takes a slot of it).
const CLASSES: usize = (POOLED_BELOW / MIN_SLOT).trailing_zeros() as usize + 1;
/// The address space of one class: at most 1 Mi blocks of 16 bytes, 256 of 64 KiB, live at
/// once (only rates near 1 come near it).
const CLASS_BYTES: usize = if usize::BITS == 64 { 16 << 20 } else { 1 << 20 };
/// The address space of the pool.
const POOL_BYTES: usize = CLASSES * CLASS_BYTES;
/// What is made accessible at a time: a multiple of every slot size.
const CHUNK_BYTES: usize = POOLED_BELOW;
/// The address space reserved: one chunk more than the pool, to align its regions to a chunk
/// (and so every slot to its size).
const RESERVATION: usize = POOL_BYTES + CHUNK_BYTES;
/// Chunks per class.
const CHUNKS: u32 = (CLASS_BYTES / CHUNK_BYTES) as u32;

/// The pool's first address. Until the pool is reserved, the start of a range no block can lie
/// in, so that [`contains`] needs no second test: the top of the address space, the kernel's
/// on 64-bit targets (and the stack's, above the heap's mappings, in a 32-bit process).
static BASE: AtomicUsize = AtomicUsize::new(UNRESERVED);
const UNRESERVED: usize = usize::MAX - POOL_BYTES + 1;

/// One size class's bookkeeping.
struct Class {
    /// The stack of free slots: the top's index + 1 (0: empty) in the low half, a count of the
    /// stack's changes in the high half.
    free: AtomicU64,
    /// The untouched slots of the newest chunk: the next one's index in the low half, the
    /// end's in the high half.
    fresh: AtomicU64,
    /// Chunks made accessible (or lost to a failed attempt).
    chunks: AtomicU32,
}

#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `CLASS_STATE`.
const NEW_CLASS: Class = Class { free: AtomicU64::new(0), fresh: AtomicU64::new(0), chunks: AtomicU32::new(0) };
static CLASS_STATE: [Class; CLASSES] = [NEW_CLASS; CLASSES];

/// Whether `addr` lies in the pool: one load of a value written once, and a compare.
#[inline(always)]
pub(crate) fn contains(addr: usize) -> bool {
    addr.wrapping_sub(BASE.load(Ordering::Relaxed)) < POOL_BYTES
}

/// Whether a sampled block of `layout` comes from the pool (else from the inner allocator).
#[inline(always)]
pub(crate) fn serves(layout: Layout) -> bool {
    layout.size() | layout.align() < POOLED_BELOW
}

/// The address space [`reserve`] would take: none once the pool is reserved.
pub(crate) fn bytes_to_reserve() -> usize {
    if BASE.load(Ordering::Acquire) == UNRESERVED {
        RESERVATION
    } else {
        0
    }
}

/// Reserve the pool's address space, once a process. False if it cannot be had (little
/// address space left, say).
pub(crate) fn reserve() -> bool {
    if BASE.load(Ordering::Acquire) != UNRESERVED {
        return true;
    }
    let bytes = RESERVATION;
    // SAFETY: a fresh private anonymous mapping, inaccessible, that nothing else refers to.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if map == libc::MAP_FAILED {
        return false;
    }
    let base = (map as usize).next_multiple_of(CHUNK_BYTES);
    if BASE.compare_exchange(UNRESERVED, base, Ordering::AcqRel, Ordering::Acquire).is_err() {
        // Another start reserved it first.
        // SAFETY: unmapping the mapping made above, which nothing has used.
        unsafe { libc::munmap(map, bytes) };
    }
    true
}

/// The class of a block of `layout` (one [`serves`]).
fn class_of(layout: Layout) -> usize {
    (layout.size().max(layout.align()).max(MIN_SLOT).next_power_of_two() / MIN_SLOT).trailing_zeros() as usize
}

/// The slot size of `class`.
fn slot_bytes(class: usize) -> usize {
    MIN_SLOT << class
}

/// The address of slot `index` of `class`.
fn slot(class: usize, index: u32) -> usize {
    BASE.load(Ordering::Relaxed) + class * CLASS_BYTES + index as usize * slot_bytes(class)
}

/// The class and index of the slot at `addr` (one [`contains`]).
fn slot_at(addr: usize) -> (usize, u32) {
    let offset = addr - BASE.load(Ordering::Relaxed);
    let class = offset / CLASS_BYTES;
    (class, ((offset % CLASS_BYTES) / slot_bytes(class)) as u32)
}

/// The link of free slot `index` of `class` (stored in the slot).
fn link(class: usize, index: u32) -> &'static AtomicU32 {
    // SAFETY: the slot lies in an accessible chunk of the pool (it was handed out), which is
    // never unmapped, and is aligned to at least 16 bytes. While the slot is free nothing but
    // this stack uses it. A stale read in `pop` (the slot handed out again meanwhile) may
    // race with the program's own, non-atomic writes to it: a data race in Rust's memory
    // model, as in every allocator that keeps its free lists in free blocks, which the
    // hardware makes a read of some value, which the stack's counter then makes `pop` discard.
    unsafe { AtomicU32::from_ptr(slot(class, index) as *mut u32) }
}

/// A slot for a sampled block of `layout` (one [`serves`]), or `None` if the pool is not
/// reserved or the class is full. Its contents are unspecified.
pub(crate) fn alloc(layout: Layout) -> Option<*mut u8> {
    if BASE.load(Ordering::Acquire) == UNRESERVED {
        return None;
    }
    let class = class_of(layout);
    let state = &CLASS_STATE[class];
    let index = pop(class, state).or_else(|| take_fresh(state)).or_else(|| new_chunk(class, state))?;
    Some(slot(class, index) as *mut u8)
}

/// Whether `layout` is of the class of the pooled block at `addr` (one [`contains`]): a
/// `realloc` to it keeps the block where it is. (Not any layout the slot holds: a block shrunk
/// in place would keep a slot its new size does not need.)
pub(crate) fn fits(addr: usize, layout: Layout) -> bool {
    serves(layout) && class_of(layout) == slot_at(addr).0
}

/// Return the pooled block at `addr` (one [`contains`], handed out by [`alloc`]) to the pool.
pub(crate) fn free(addr: usize) {
    let (class, index) = slot_at(addr);
    let state = &CLASS_STATE[class];
    let mut top = state.free.load(Ordering::Relaxed);
    loop {
        link(class, index).store(top as u32, Ordering::Relaxed);
        let new = ((top >> 32).wrapping_add(1) << 32) | u64::from(index + 1);
        match state.free.compare_exchange_weak(top, new, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => return,
            Err(now) => top = now,
        }
    }
}

/// Take the top of `class`'s stack of free slots.
fn pop(class: usize, state: &Class) -> Option<u32> {
    let mut top = state.free.load(Ordering::Acquire);
    loop {
        let index = (top as u32).checked_sub(1)?;
        let next = link(class, index).load(Ordering::Relaxed);
        let new = ((top >> 32).wrapping_add(1) << 32) | u64::from(next);
        match state.free.compare_exchange_weak(top, new, Ordering::Acquire, Ordering::Acquire) {
            Ok(_) => return Some(index),
            Err(now) => top = now,
        }
    }
}

/// Take the next untouched slot of the newest chunk.
fn take_fresh(state: &Class) -> Option<u32> {
    state
        .fresh
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |range| {
            ((range as u32) < (range >> 32) as u32).then_some(range + 1)
        })
        .ok()
        .map(|range| range as u32)
}

/// Make the class's next chunk accessible and take its first slot; its others become the
/// untouched slots (or, if another thread's chunk got there first, free ones).
#[cold]
fn new_chunk(class: usize, state: &Class) -> Option<u32> {
    let chunk =
        state.chunks.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < CHUNKS).then_some(n + 1)).ok()?;
    let per_chunk = (CHUNK_BYTES / slot_bytes(class)) as u32;
    let first = chunk * per_chunk;
    // SAFETY: the chunk lies in the pool's reservation, and no one else uses it yet (its
    // number was this thread's to take).
    let made = unsafe {
        libc::mprotect(slot(class, first) as *mut libc::c_void, CHUNK_BYTES, libc::PROT_READ | libc::PROT_WRITE)
    };
    if made != 0 {
        return None;
    }
    let rest = (u64::from(first + per_chunk) << 32) | u64::from(first + 1);
    let installed = state.fresh.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |range| {
        ((range as u32) >= (range >> 32) as u32).then_some(rest)
    });
    if installed.is_err() {
        for index in first + 1..first + per_chunk {
            free(slot(class, index));
        }
    }
    Some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(size: usize, align: usize) -> Layout {
        Layout::from_size_align(size, align).unwrap()
    }

    #[test]
    fn classes_cover_every_pooled_layout() {
        assert_eq!(CLASSES, 13);
        assert_eq!(slot_bytes(CLASSES - 1), POOLED_BELOW);
        assert!(serves(layout(POOLED_BELOW - 1, 8)) && serves(layout(1, POOLED_BELOW / 2)));
        assert!(!serves(layout(POOLED_BELOW, 8)) && !serves(layout(8, POOLED_BELOW)));
        for (size, align, slot) in [
            (1, 1, 16),
            (16, 8, 16),
            (17, 8, 32),
            (24, 64, 64),
            (4096, 8, 4096),
            (40_000, 8, 64 << 10),
            (8, 32 << 10, 32 << 10),
        ] {
            assert_eq!(slot_bytes(class_of(layout(size, align))), slot, "{size}/{align}");
        }
    }

    /// Blocks are aligned and disjoint, freed slots are reused, and all of it lies in the pool,
    /// which nothing outside it is taken for.
    #[test]
    fn slots_are_aligned_disjoint_and_reused() {
        assert!(reserve() && reserve());
        assert!(!contains(0) && !contains(usize::MAX) && !contains(&CLASS_STATE as *const _ as usize));
        let mut blocks: Vec<(usize, usize)> = Vec::new();
        for i in 0..3000 {
            let l = layout(1 + i * 37 % 9000, 1 << (i % 10));
            let addr = alloc(l).unwrap() as usize;
            assert!(contains(addr) && addr.is_multiple_of(l.align()) && fits(addr, l), "{l:?} at {addr:#x}");
            let slot = l.size().max(l.align()).max(16).next_power_of_two();
            assert!(fits(addr, layout(slot, l.align())) && !fits(addr, layout(slot + 1, l.align())));
            assert!(slot == 16 || !fits(addr, layout(slot / 2, l.align().min(slot / 2))), "{l:?}: shrunk in place");
            // SAFETY: the slot is accessible and this test's alone.
            unsafe { std::ptr::write_bytes(addr as *mut u8, 0xa5, l.size()) };
            blocks.push((addr, l.size()));
        }
        let mut sorted = blocks.clone();
        sorted.sort();
        assert!(sorted.windows(2).all(|w| w[0].0 + w[0].1 <= w[1].0), "overlapping blocks");
        let (addr, size) = blocks[1234];
        free(addr);
        assert_eq!(alloc(layout(size, 1)).map(|p| p as usize), Some(addr), "a freed slot is taken first");
        for (addr, _) in blocks {
            free(addr);
        }
    }

    /// Threads allocating and freeing in one class never get a slot another holds.
    #[test]
    fn concurrent_allocs_and_frees_never_share_a_slot() {
        assert!(reserve());
        std::thread::scope(|s| {
            for t in 0..4u8 {
                s.spawn(move || {
                    let mut held = Vec::new();
                    for round in 0..20_000 {
                        if round % 3 == 2 {
                            let addr: usize = held.swap_remove(round % held.len());
                            // SAFETY: a slot this thread holds.
                            assert_eq!(unsafe { *(addr as *const [u8; 24]) }, [t; 24], "{addr:#x} shared");
                            free(addr);
                        } else {
                            let addr = alloc(layout(24, 8)).unwrap() as usize;
                            // SAFETY: a slot this thread was just given.
                            unsafe { *(addr as *mut [u8; 24]) = [t; 24] };
                            held.push(addr);
                        }
                    }
                    held.into_iter().for_each(free);
                });
            }
        });
    }

    /// A class whose region is full answers `None` (and takes slots again once one is freed).
    #[test]
    fn a_full_class_refuses() {
        assert!(reserve());
        let big = layout(POOLED_BELOW / 2, 8);
        let held: Vec<usize> = std::iter::from_fn(|| alloc(big).map(|p| p as usize)).collect();
        assert!(held.len() <= CLASS_BYTES / (POOLED_BELOW / 2) && held.len() > 100, "{}", held.len());
        assert!(alloc(big).is_none());
        free(held[7]);
        assert_eq!(alloc(big).map(|p| p as usize), Some(held[7]));
        held.into_iter().for_each(free);
    }
}
