//! The set of live sampled blocks: a static, lock-free, set-associative table of addresses.
//!
//! `dealloc` must ask of every block "was this one sampled?". A filter answers most of the
//! time: one 8-bit counter per bucket counts the entries in the bucket (32 KiB in all, so it
//! stays in cache), and a zero counter means "not sampled" at once. Otherwise the table
//! answers by reading one 64-byte cache line (the address's bucket of 8 slots). Either way
//! nothing is written, so the common case — an unsampled block — costs no lock, no
//! shared-cache-line write and, mostly, no cache miss (reading a random line of the 2 MiB
//! table on every free cost more than everything else tracing does at rate 1e-5). Inserting
//! increments the bucket's counter, then CASes `0 → addr` into a free slot of the bucket (a
//! full bucket drops the sample, which the caller counts, and undoes the increment); removing
//! CASes `addr → 0`, then decrements the counter. A bucket's counter is thus nonzero whenever
//! one of its entries is in the table.
//!
//! A free whose bucket holds other entries reads the table for nothing, so the filter must be
//! fine-grained: a program's live sampled blocks number its live heap × rate / 8 (about 1 250
//! for a 1 GB heap at 1e-5). An earlier filter of one counter per 32 buckets (2 KiB) had 70 %
//! of its counters nonzero at that size; one counter per bucket has under 4 %, which the
//! allocation benchmark shows at rate 1e-4 (the comparison is in `benches/alloc.rs`).
//!
//! The table lives in `.bss` (2^15 buckets × 64 bytes = 2 MiB). It is not aligned to 2 MiB
//! for a transparent huge page: it made inserts and lookups cheaper but the whole workload
//! no faster beyond the noise (see `benches/alloc.rs`), and the alignment would have made the kernel load every program that links this crate at a 2 MiB-aligned
//! address, nine bits less of address-space randomisation, traced or not. Each session
//! starts with [`clear`], which also makes all of it resident: left to fault in on demand,
//! each page costs a read fault and then, at its first insert, a write fault whose TLB
//! shoot-down interrupts the program's other threads. Between sessions the table may keep stale entries
//! (an insert racing with the end of a session); they are harmless — a stale hit only makes
//! the writer see a free for an address it does not track, which it ignores — and `clear`
//! wipes them.
//!
//! Memory ordering: a block is inserted (counter, then slot) before its address is returned
//! to the program, and any thread that frees it got the address through some synchronisation
//! that orders it after that return; read-write coherence then guarantees the freeing
//! thread's loads see the increment and the insert (or later values), so relaxed loads
//! suffice. Only the thread freeing a block removes it, so its counter cannot drop to zero
//! while the block is live.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// log2 of the number of buckets.
const BUCKET_BITS: u32 = 15;
/// The smallest page size of the platforms we run on.
const PAGE_BYTES: usize = 4096;
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

#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `FILTER`.
const ZERO: AtomicU8 = AtomicU8::new(0);
/// The entries of each bucket: at most [`SLOTS`], plus the inserts into a full bucket and the
/// removals in progress (and, after a [`clear`] that raced with one, one more).
static FILTER: [AtomicU8; 1 << BUCKET_BITS] = [ZERO; 1 << BUCKET_BITS];

/// The bucket index of `addr` (Fibonacci hashing of the address without its alignment bits).
#[inline(always)]
fn bucket_index(addr: usize) -> usize {
    (((addr as u64) >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - BUCKET_BITS)) as usize
}

#[inline(always)]
fn bucket(addr: usize) -> &'static Bucket {
    &TABLE[bucket_index(addr)]
}

/// The filter counter of `addr`'s bucket.
#[inline(always)]
fn counter(addr: usize) -> &'static AtomicU8 {
    &FILTER[bucket_index(addr)]
}

/// Record `addr` as a live sampled block. Returns false (nothing recorded) when its bucket is
/// full (or its counter saturated) or `addr` is null.
pub(crate) fn insert(addr: usize) -> bool {
    if addr == 0 {
        return false;
    }
    let counter = counter(addr);
    // Saturating, so that a counter never wraps to 0 while its bucket has entries: it exceeds
    // SLOTS only by the inserts and removals in progress (see `FILTER`), and reaching 255
    // would take some 246 of them at once. Then the insert is refused like one into a full
    // bucket.
    if counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_add(1)).is_err() {
        return false;
    }
    let inserted = bucket(addr).0.iter().any(|slot| {
        slot.load(Ordering::Relaxed) == 0 && slot.compare_exchange(0, addr, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    });
    if !inserted {
        decrement(counter);
    }
    inserted
}

/// Whether `addr` may be a live sampled block: false when its bucket has no entries, which is
/// the answer for almost every block. Reads one counter of a 32 KiB array and writes nothing.
#[inline(always)]
pub(crate) fn may_contain(addr: usize) -> bool {
    counter(addr).load(Ordering::Relaxed) != 0
}

/// If `addr` is a live sampled block, forget it and return true. Reads the address's bucket
/// (one cache line) and writes nothing when `addr` was not sampled; callers ask
/// [`may_contain`] first.
#[inline(never)]
pub(crate) fn remove(addr: usize) -> bool {
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
        decrement(counter(addr));
    }
    removed
}

/// Decrement a filter counter, never below 0: after a [`clear`] that raced with an insert or a
/// removal (see there), a counter may be one lower than the entries of its bucket, and a
/// wrapped counter (255) would keep the bucket's filter open until the next clear.
#[inline]
fn decrement(counter: &AtomicU8) {
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_sub(1));
}

/// Forget every entry, and make the table resident (one write per page). Called when a
/// session starts, before anything of the new session is sampled.
///
/// A thread still finishing a sample (or a free) of the previous session may be inside
/// [`insert`] or [`remove`] meanwhile, so the slots are wiped first and each bucket's counter
/// is then recounted from its slots, rather than zeroed: a counter can then never be 0 while
/// its bucket holds an entry that the wipe missed (which `remove` would never find again), nor
/// wrap below 0 (decrements saturate). What remains is benign: such a straggler's own counter
/// update may land after its bucket was recounted and leave that counter one off. One too high
/// only makes frees in that bucket read it. One too low can only involve the straggler's
/// entry, which belongs to the previous session (the new session samples nothing before this
/// returns): that entry may then not be found, or another entry of its bucket may be missed
/// once — a free the new trace does not show — which takes a thread preempted
/// inside the table for the whole stop and restart of a session. The next `clear` repairs it.
pub(crate) fn clear() {
    // The first bucket on each page (the table need not start on one): a write, not a load,
    // since reading first would map the shared zero page, which the first insert would then
    // fault out again. Exchanging 0 for 0 writes a free slot; a used slot's page is resident.
    let mut page = usize::MAX;
    for bucket in &TABLE {
        let here = bucket as *const Bucket as usize / PAGE_BYTES;
        if here != page {
            page = here;
            let _ = bucket.0[0].compare_exchange(0, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
    }
    for slot in TABLE.iter().flat_map(|b| b.0.iter()) {
        if slot.load(Ordering::Relaxed) != 0 {
            slot.store(0, Ordering::Relaxed);
        }
    }
    recount();
}

/// Set each bucket's counter to the number of its entries.
fn recount() {
    for (counter, bucket) in FILTER.iter().zip(&TABLE) {
        let entries = bucket.0.iter().filter(|slot| slot.load(Ordering::Relaxed) != 0).count();
        if counter.load(Ordering::Relaxed) as usize != entries {
            counter.store(entries as u8, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table is process-wide: tests that clear it or check that it is empty take this
    /// lock exclusively; the others share it.
    static TABLE_LOCK: std::sync::RwLock<()> = std::sync::RwLock::new(());

    fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
        TABLE_LOCK.read().unwrap_or_else(|e| e.into_inner())
    }

    fn exclusive() -> std::sync::RwLockWriteGuard<'static, ()> {
        TABLE_LOCK.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `addr` is in the table and its bucket's filter lets the allocator look for it.
    fn contains(addr: usize) -> bool {
        counter(addr).load(Ordering::Relaxed) != 0 && bucket(addr).0.iter().any(|s| s.load(Ordering::Relaxed) == addr)
    }

    fn assert_empty() {
        assert!(TABLE.iter().flat_map(|b| b.0.iter()).all(|s| s.load(Ordering::Relaxed) == 0), "table not empty");
        for (bucket, counter) in FILTER.iter().enumerate() {
            assert_eq!(counter.load(Ordering::Relaxed), 0, "counter of bucket {bucket}");
        }
    }

    /// Addresses that all land in one bucket (distinct from other tests' addresses).
    fn same_bucket(base: usize, n: usize) -> Vec<usize> {
        let target = bucket(base);
        (0..).map(|i| base + i * 16).filter(|&a| std::ptr::eq(bucket(a), target)).take(n).collect()
    }

    #[test]
    fn insert_find_remove() {
        let _lock = shared();
        let a = 0x7f00_1234_5670;
        assert!(!remove(a));
        assert!(insert(a));
        assert!(may_contain(a));
        assert!(remove(a));
        assert!(!remove(a));
        assert!(!insert(0));
    }

    #[test]
    fn full_bucket_refuses_inserts() {
        let _lock = shared();
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
    fn filter_counts_the_entries_of_a_bucket() {
        let _lock = shared();
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

    /// A slot filled behind the counter's back (an insert of the previous session finishing
    /// after the wipe) is counted again; a counter with no entries left (or wrapped) is reset.
    #[test]
    fn clear_recounts_the_filter_from_the_slots() {
        let _lock = exclusive();
        clear();
        let [a, b] = [0x7700_0000_0000, 0x7700_0000_1230];
        assert_ne!(bucket_index(a), bucket_index(b));
        bucket(a).0[5].store(a, Ordering::Relaxed);
        counter(b).store(u8::MAX, Ordering::Relaxed);
        recount();
        assert_eq!(counter(a).load(Ordering::Relaxed), 1);
        assert_eq!(counter(b).load(Ordering::Relaxed), 0);
        assert!(contains(a) && remove(a) && !remove(a));
        assert_empty();

        // `clear` itself: whatever the slots and counters held, all is zero afterwards.
        assert!(insert(a) && insert(b));
        counter(a).store(0, Ordering::Relaxed);
        counter(b).store(7, Ordering::Relaxed);
        clear();
        assert_empty();
        assert!(!remove(a) && !remove(b));
    }

    /// A saturated counter refuses inserts instead of wrapping to 0 (which would hide the
    /// bucket's entries from `may_contain`).
    #[test]
    fn saturated_counter_refuses_inserts() {
        let _lock = exclusive();
        clear();
        let a = 0x7a00_0000_0000;
        counter(a).store(u8::MAX, Ordering::Relaxed);
        assert!(!insert(a));
        assert_eq!(counter(a).load(Ordering::Relaxed), u8::MAX);
        assert!(!bucket(a).0.iter().any(|s| s.load(Ordering::Relaxed) == a));
        clear();
        assert_empty();
    }

    /// A removal whose counter is already 0 (a `clear` raced with it) leaves it at 0 instead
    /// of wrapping to 255.
    #[test]
    fn counter_decrements_saturate() {
        let _lock = exclusive();
        clear();
        let a = 0x7800_0000_0000;
        bucket(a).0[0].store(a, Ordering::Relaxed);
        assert!(!may_contain(a), "a zero counter hides the entry");
        assert!(remove(a));
        assert_eq!(counter(a).load(Ordering::Relaxed), 0);
        // An insert that finds its bucket full undoes its increment.
        let addrs = same_bucket(0x7900_0000_0000, SLOTS + 1);
        for &x in &addrs[..SLOTS] {
            bucket(x).0.iter().find(|s| s.load(Ordering::Relaxed) == 0).unwrap().store(x, Ordering::Relaxed);
        }
        assert!(!insert(addrs[SLOTS]));
        assert_eq!(counter(addrs[0]).load(Ordering::Relaxed), 0);
        clear();
        assert_empty();
    }

    /// Threads inserting and removing disjoint sets of addresses that share buckets (and so
    /// counters): every entry is found until removed, each removal succeeds exactly once, and
    /// the table and its filter end empty.
    #[test]
    fn concurrent_inserts_and_removes() {
        const THREADS: usize = 4;
        const BUCKETS: usize = 96;
        const ROUNDS: usize = 300;
        let _lock = exclusive();
        clear();
        // Fill a few buckets exactly, each holding addresses of every thread: inserts never
        // find a bucket full, but compete for its slots and counter.
        let first = 3200;
        let mut per_bucket = vec![0; BUCKETS];
        let mut sets = vec![Vec::new(); THREADS];
        let mut addrs = (0..).map(|i| 0x4200_0000_0000 + i * 16);
        while per_bucket.iter().any(|&n| n < SLOTS) {
            let addr = addrs.next().unwrap();
            let Some(n) = bucket_index(addr).checked_sub(first).and_then(|i| per_bucket.get_mut(i)) else { continue };
            if *n < SLOTS {
                sets[*n % THREADS].push(addr);
                *n += 1;
            }
        }
        std::thread::scope(|s| {
            for (t, set) in sets.iter().enumerate() {
                s.spawn(move || {
                    let mut rng = t as u64 + 1;
                    let mut live = vec![false; set.len()];
                    for _ in 0..ROUNDS {
                        for (i, &addr) in set.iter().enumerate() {
                            // Insert or remove about half of the set each round, in varying order.
                            if crate::runtime::sampler::next_u64(&mut rng).is_multiple_of(2) {
                                continue;
                            }
                            if live[i] {
                                assert!(remove(addr), "{addr:#x} not removed");
                                assert!(!remove(addr), "{addr:#x} removed twice");
                            } else {
                                assert!(insert(addr), "{addr:#x} not inserted");
                            }
                            live[i] = !live[i];
                        }
                        for (&addr, &live) in set.iter().zip(&live) {
                            assert_eq!(contains(addr), live, "{addr:#x}");
                        }
                    }
                    for (&addr, live) in set.iter().zip(live) {
                        assert_eq!(remove(addr), live, "{addr:#x}");
                    }
                });
            }
        });
        assert_empty();
    }

    #[test]
    fn table_is_one_cache_line_per_bucket() {
        assert_eq!(std::mem::size_of::<Bucket>(), 64);
        assert_eq!(std::mem::align_of::<Bucket>(), 64);
    }
}
