//! The set of live sampled blocks: a static, lock-free, set-associative table of addresses.
//!
//! `dealloc` must ask of every block "was this one sampled?". The table answers by reading
//! one 64-byte cache line (the address's bucket of 8 slots) without writing anything, so the
//! common case — an unsampled block — costs no lock and no shared-cache-line write. Inserting
//! is a CAS `0 → addr` in a free slot of the bucket (a full bucket drops the sample, which
//! the caller counts); removing is a CAS `addr → 0`.
//!
//! The table lives in `.bss` (2^15 buckets × 64 bytes = 2 MiB of address space, touched only
//! where used). Between sessions it may keep stale entries (an insert racing with the end of a
//! session); they are harmless — a stale hit only makes the writer see a free for an address
//! it does not track, which it ignores — and [`clear`] wipes them when a new session starts.
//!
//! Memory ordering: a block is inserted before its address is returned to the program, and
//! any thread that frees it got the address through some synchronisation that orders it after
//! that return; read-write coherence then guarantees the freeing thread's load sees the insert
//! (or a later value), so relaxed loads suffice.

use std::sync::atomic::{AtomicUsize, Ordering};

/// log2 of the number of buckets.
const BUCKET_BITS: u32 = 15;
/// Slots per bucket: 8 × 8 bytes = one cache line.
const SLOTS: usize = 8;

/// One cache line of slots; 0 marks a free slot.
#[repr(C, align(64))]
struct Bucket([AtomicUsize; SLOTS]);

#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `TABLE`.
const EMPTY_SLOT: AtomicUsize = AtomicUsize::new(0);
#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `TABLE`.
const EMPTY_BUCKET: Bucket = Bucket([EMPTY_SLOT; SLOTS]);

static TABLE: [Bucket; 1 << BUCKET_BITS] = [EMPTY_BUCKET; 1 << BUCKET_BITS];

/// The bucket of `addr` (Fibonacci hashing of the address without its alignment bits).
#[inline(always)]
fn bucket(addr: usize) -> &'static Bucket {
    let hash = ((addr as u64) >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - BUCKET_BITS);
    &TABLE[hash as usize]
}

/// Record `addr` as a live sampled block. Returns false (nothing recorded) when its bucket is
/// full or `addr` is null.
pub(crate) fn insert(addr: usize) -> bool {
    if addr == 0 {
        return false;
    }
    bucket(addr).0.iter().any(|slot| {
        slot.load(Ordering::Relaxed) == 0 && slot.compare_exchange(0, addr, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    })
}

/// If `addr` is a live sampled block, forget it and return true. Reads one cache line and
/// writes nothing when `addr` was not sampled.
#[inline(always)]
pub(crate) fn remove(addr: usize) -> bool {
    let slots = &bucket(addr).0;
    for slot in slots {
        if slot.load(Ordering::Relaxed) == addr {
            return remove_slot(slot, addr);
        }
    }
    false
}

#[cold]
#[inline(never)]
fn remove_slot(slot: &AtomicUsize, addr: usize) -> bool {
    slot.compare_exchange(addr, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok()
}

/// Forget every entry. Called when a session starts, while nothing is being sampled.
pub(crate) fn clear() {
    for slot in TABLE.iter().flat_map(|b| b.0.iter()) {
        if slot.load(Ordering::Relaxed) != 0 {
            slot.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Addresses that all land in one bucket (distinct from other tests' addresses).
    fn same_bucket(base: usize, n: usize) -> Vec<usize> {
        let target = bucket(base);
        (0..).map(|i| base + i * 16).filter(|&a| std::ptr::eq(bucket(a), target)).take(n).collect()
    }

    #[test]
    fn insert_find_remove() {
        let a = 0x7f00_1234_5670;
        assert!(!remove(a));
        assert!(insert(a));
        assert!(remove(a));
        assert!(!remove(a));
        assert!(!insert(0));
    }

    #[test]
    fn full_bucket_refuses_inserts() {
        let addrs = same_bucket(0x5500_0000_0000, SLOTS + 1);
        for &a in &addrs[..SLOTS] {
            assert!(insert(a));
        }
        assert!(!insert(addrs[SLOTS]));
        assert!(remove(addrs[3]));
        assert!(insert(addrs[SLOTS]));
        for &a in addrs.iter().filter(|&&a| a != addrs[3]) {
            assert!(remove(a));
        }
    }

    #[test]
    fn table_is_one_cache_line_per_bucket() {
        assert_eq!(std::mem::size_of::<Bucket>(), 64);
        assert_eq!(std::mem::align_of::<Bucket>(), 64);
    }
}
