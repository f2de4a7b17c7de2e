//! The set of live sampled blocks: a static, lock-free, set-associative table of addresses.
//!
//! `dealloc` must ask of every block "was this one sampled?". A small filter answers most
//! of the time: one 16-bit counter per group of 32 buckets counts the entries in the group
//! (2 KiB in all, so it stays in cache), and a zero counter means "not sampled" at once.
//! Otherwise the table answers by reading one 64-byte cache line (the address's bucket of 8
//! slots). Either way nothing is written, so the common case — an unsampled block — costs no
//! lock, no shared-cache-line write and, mostly, no cache miss (reading a random line of the
//! 2 MiB table on every free cost more than everything else tracing does at rate 1e-5).
//! Inserting increments the group's counter, then CASes `0 → addr` into a free slot of the
//! bucket (a full bucket drops the sample, which the caller counts, and undoes the increment);
//! removing CASes `addr → 0`, then decrements the counter. A group's counter is thus nonzero
//! whenever one of its entries is in the table.
//!
//! The table lives in `.bss` (2^15 buckets × 64 bytes = 2 MiB of address space, touched only
//! where used). Between sessions it may keep stale entries (an insert racing with the end of a
//! session); they are harmless — a stale hit only makes the writer see a free for an address
//! it does not track, which it ignores — and [`clear`] wipes them when a new session starts.
//!
//! Memory ordering: a block is inserted (counter, then slot) before its address is returned
//! to the program, and any thread that frees it got the address through some synchronisation
//! that orders it after that return; read-write coherence then guarantees the freeing
//! thread's loads see the increment and the insert (or later values), so relaxed loads
//! suffice. Only the thread freeing a block removes it, so its counter cannot drop to zero
//! while the block is live.

use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};

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

/// log2 of the buckets per filter counter.
const GROUP_BITS: u32 = 5;
#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `FILTER`.
const ZERO: AtomicU16 = AtomicU16::new(0);
/// Entries in each group of `1 << GROUP_BITS` consecutive buckets (at most 256).
static FILTER: [AtomicU16; 1 << (BUCKET_BITS - GROUP_BITS)] = [ZERO; 1 << (BUCKET_BITS - GROUP_BITS)];

/// The bucket index of `addr` (Fibonacci hashing of the address without its alignment bits).
#[inline(always)]
fn bucket_index(addr: usize) -> usize {
    (((addr as u64) >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - BUCKET_BITS)) as usize
}

#[inline(always)]
fn bucket(addr: usize) -> &'static Bucket {
    &TABLE[bucket_index(addr)]
}

/// The filter counter of `addr`'s bucket group.
#[inline(always)]
fn counter(addr: usize) -> &'static AtomicU16 {
    &FILTER[bucket_index(addr) >> GROUP_BITS]
}

/// Record `addr` as a live sampled block. Returns false (nothing recorded) when its bucket is
/// full or `addr` is null.
pub(crate) fn insert(addr: usize) -> bool {
    if addr == 0 {
        return false;
    }
    let counter = counter(addr);
    counter.fetch_add(1, Ordering::Relaxed);
    let inserted = bucket(addr).0.iter().any(|slot| {
        slot.load(Ordering::Relaxed) == 0 && slot.compare_exchange(0, addr, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    });
    if !inserted {
        counter.fetch_sub(1, Ordering::Relaxed);
    }
    inserted
}

/// If `addr` is a live sampled block, forget it and return true. Reads one cached counter
/// (and, when the group has entries, one cache line of the table) and writes nothing when
/// `addr` was not sampled.
#[inline(always)]
pub(crate) fn remove(addr: usize) -> bool {
    if counter(addr).load(Ordering::Relaxed) == 0 {
        return false;
    }
    remove_in_bucket(addr)
}

#[inline(never)]
fn remove_in_bucket(addr: usize) -> bool {
    for slot in &bucket(addr).0 {
        if slot.load(Ordering::Relaxed) == addr {
            return remove_slot(slot, addr);
        }
    }
    false
}

#[cold]
#[inline(never)]
fn remove_slot(slot: &AtomicUsize, addr: usize) -> bool {
    let removed = slot.compare_exchange(addr, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok();
    if removed {
        counter(addr).fetch_sub(1, Ordering::Relaxed);
    }
    removed
}

/// Forget every entry. Called when a session starts, while nothing is being sampled.
pub(crate) fn clear() {
    for slot in TABLE.iter().flat_map(|b| b.0.iter()) {
        if slot.load(Ordering::Relaxed) != 0 {
            slot.store(0, Ordering::Relaxed);
        }
    }
    for counter in &FILTER {
        counter.store(0, Ordering::Relaxed);
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
    fn filter_counts_the_entries_of_a_group() {
        let addrs = same_bucket(0x6600_0000_0000, 3);
        let before = counter(addrs[0]).load(Ordering::Relaxed);
        for &a in &addrs {
            assert!(insert(a));
        }
        assert_eq!(counter(addrs[0]).load(Ordering::Relaxed), before + 3);
        for &a in &addrs {
            assert!(remove(a));
            assert!(!remove(a));
        }
        assert_eq!(counter(addrs[0]).load(Ordering::Relaxed), before);
    }

    #[test]
    fn table_is_one_cache_line_per_bucket() {
        assert_eq!(std::mem::size_of::<Bucket>(), 64);
        assert_eq!(std::mem::align_of::<Bucket>(), 64);
    }
}
