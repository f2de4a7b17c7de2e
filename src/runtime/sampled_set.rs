//! The set of live sampled blocks: a static, lock-free, set-associative table of addresses.
//!
//! A free reaches it only for a block that may have been sampled: one in the sampled-block
//! pool (`sampled_pool`), or one too large for the pool, whose `Layout` says so. It answers by
//! reading one 64-byte cache line (the address's bucket of 8 slots) and writes nothing when
//! the block was not sampled. Inserting CASes `0 → addr` into a free slot of the bucket (a
//! full bucket drops the sample, which the caller counts); removing CASes `addr → 0`.
//!
//! The table lives in `.bss` (2^15 buckets × 64 bytes = 2 MiB), page-aligned, and only the
//! pages of buckets that an insert has used are made resident: a short traced run that samples
//! a few blocks pays a few pages, not 2 MiB. An insert writes a page before anything reads it
//! (a read first would map the shared zero page, which the write would then fault out again,
//! with a TLB shoot-down that interrupts the program's other threads), and marks it in
//! [`TOUCHED`]; a lookup on a page no insert has marked answers at once, and [`clear`] reads
//! and wipes only the marked pages. Between sessions the table may keep stale entries (blocks
//! of a stopped session, an insert racing with the end of a session); they are harmless — a
//! stale hit only reports a free to a session that does not track the address, which the
//! writer ignores — and `clear` wipes them.
//!
//! Memory ordering: a block is inserted before its address is returned to the program, and
//! any thread that frees it got the address through some synchronisation that orders it after
//! that return; read-write coherence then guarantees the freeing thread's loads see the
//! insert (or later values), so relaxed loads suffice. Only the thread freeing a block
//! removes it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// log2 of the number of buckets.
const BUCKET_BITS: u32 = 15;
/// The smallest page size of the platforms we run on.
const PAGE_BYTES: usize = 4096;
/// Slots per bucket: 8 × 8 bytes = one cache line.
const SLOTS: usize = 8;
/// Buckets per page of the table.
const BUCKETS_PER_PAGE: usize = PAGE_BYTES / std::mem::size_of::<Bucket>();
/// Pages of the table.
const PAGES: usize = (1 << BUCKET_BITS) / BUCKETS_PER_PAGE;

/// One cache line of slots; 0 marks a free slot.
#[repr(C, align(64))]
struct Bucket([AtomicUsize; SLOTS]);

/// The buckets, page-aligned so that each page holds whole buckets of one [`TOUCHED`] bit.
#[repr(C, align(4096))]
struct Table([Bucket; 1 << BUCKET_BITS]);

#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `TABLE`.
const EMPTY_SLOT: AtomicUsize = AtomicUsize::new(0);
#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `TABLE`.
const EMPTY_BUCKET: Bucket = Bucket([EMPTY_SLOT; SLOTS]);

static TABLE: Table = Table([EMPTY_BUCKET; 1 << BUCKET_BITS]);

#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `TOUCHED`.
const NO_PAGES: AtomicU64 = AtomicU64::new(0);
/// One bit per page of the table: set once an insert has written the page (it is resident).
static TOUCHED: [AtomicU64; PAGES / 64] = [NO_PAGES; PAGES / 64];

/// The bucket index of `addr` (Fibonacci hashing of the address without its alignment bits).
#[inline(always)]
fn bucket_index(addr: usize) -> usize {
    (((addr as u64) >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - BUCKET_BITS)) as usize
}

#[inline(always)]
fn bucket(addr: usize) -> &'static Bucket {
    &TABLE.0[bucket_index(addr)]
}

/// Record `addr` as a live sampled block. Returns false (nothing recorded) when its bucket is
/// full or `addr` is null.
pub(crate) fn insert(addr: usize) -> bool {
    if addr == 0 {
        return false;
    }
    touch(bucket_index(addr));
    bucket(addr).0.iter().any(|slot| {
        slot.load(Ordering::Relaxed) == 0 && slot.compare_exchange(0, addr, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    })
}

/// Make the page of bucket `index` resident, if no insert has yet: by a write (exchanging 0
/// for 0 writes a free slot; a used slot's page is resident), then mark it in [`TOUCHED`].
fn touch(index: usize) {
    let page = index / BUCKETS_PER_PAGE;
    let (word, bit) = (&TOUCHED[page / 64], 1u64 << (page % 64));
    if word.load(Ordering::Relaxed) & bit == 0 {
        let _ = TABLE.0[page * BUCKETS_PER_PAGE].0[0].compare_exchange(0, 0, Ordering::Relaxed, Ordering::Relaxed);
        word.fetch_or(bit, Ordering::Relaxed);
    }
}

/// Whether the page of bucket `index` is marked in [`TOUCHED`].
fn touched(index: usize) -> bool {
    let page = index / BUCKETS_PER_PAGE;
    TOUCHED[page / 64].load(Ordering::Relaxed) & (1 << (page % 64)) != 0
}

/// The buckets of the pages marked in [`TOUCHED`], a page at a time: a session's start looks
/// at 512 bits, not at 32 Ki buckets.
fn touched_buckets() -> impl Iterator<Item = &'static Bucket> {
    TABLE
        .0
        .chunks(BUCKETS_PER_PAGE)
        .enumerate()
        .filter(|&(page, _)| touched(page * BUCKETS_PER_PAGE))
        .flat_map(|(_, b)| b)
}

/// If `addr` is a live sampled block, forget it and return true. Reads the address's bucket
/// (one cache line, none if no insert has used its page) and writes nothing when `addr` was
/// not sampled.
#[inline(never)]
pub(crate) fn remove(addr: usize) -> bool {
    // An untouched page holds no entry, and a read would map it (see the module doc).
    let index = bucket_index(addr);
    if !touched(index) {
        return false;
    }
    TABLE.0[index].0.iter().any(|slot| {
        slot.load(Ordering::Relaxed) == addr
            && slot.compare_exchange(addr, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    })
}

/// Forget every entry. Called when a session starts, before anything of the new session is
/// sampled. Reads and writes only the pages an insert has made resident. A straggler of the
/// previous session (a thread preempted inside [`insert`] through the stop and the restart)
/// may still add its entry afterwards: a free of that block then reports an address the new
/// session does not track, which its writer ignores.
pub(crate) fn clear() {
    for slot in touched_buckets().flat_map(|bucket| &bucket.0) {
        if slot.load(Ordering::Relaxed) != 0 {
            slot.store(0, Ordering::Relaxed);
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

    /// Whether `addr` is in the table.
    fn contains(addr: usize) -> bool {
        bucket(addr).0.iter().any(|s| s.load(Ordering::Relaxed) == addr)
    }

    fn assert_empty() {
        // Only the touched pages: an untouched one holds nothing, and reading it would map it
        // (see `only_pages_in_use_become_resident`).
        assert!(touched_buckets().flat_map(|b| b.0.iter()).all(|s| s.load(Ordering::Relaxed) == 0), "table not empty");
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
        assert!(contains(a));
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

    /// Threads inserting and removing disjoint sets of addresses that share buckets: every
    /// entry is found until removed, each removal succeeds exactly once, and the table ends
    /// empty.
    #[test]
    fn concurrent_inserts_and_removes() {
        const THREADS: usize = 4;
        const BUCKETS: usize = 96;
        const ROUNDS: usize = 300;
        let _lock = exclusive();
        clear();
        // Fill a few buckets exactly, each holding addresses of every thread: inserts never
        // find a bucket full, but compete for its slots.
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

    /// Whether the table's page `page` is resident.
    fn resident(page: usize) -> bool {
        resident_at(&TABLE.0[page * BUCKETS_PER_PAGE] as *const Bucket as usize)
    }

    /// Whether the page of the static at `addr` is resident (`mincore`).
    fn resident_at(addr: usize) -> bool {
        let mut flag = 0u8;
        let page = (addr & !(PAGE_BYTES - 1)) as *mut libc::c_void;
        // SAFETY: `page` is the page-aligned start of a page of this crate's statics, and
        // `flag` has room for that one page's answer.
        assert_eq!(unsafe { libc::mincore(page, PAGE_BYTES, &mut flag) }, 0);
        flag & 1 != 0
    }

    /// Only the pages an insert used become resident: `clear` neither reads nor writes the
    /// others (it used to make all 2 MiB resident), and an insert makes its page resident and
    /// marks it.
    #[test]
    fn only_pages_in_use_become_resident() {
        let _lock = exclusive();
        // A page that nothing in this process has read or written yet (most of them).
        let page = (0..PAGES).find(|&p| !touched(p * BUCKETS_PER_PAGE) && !resident(p)).expect("an untouched page");
        clear();
        assert!(!resident(page), "clear made page {page} resident");
        let addr = (0x7c00_0000_0000..).step_by(16).find(|&a| bucket_index(a) / BUCKETS_PER_PAGE == page).unwrap();
        assert!(insert(addr));
        assert!(resident(page) && touched(bucket_index(addr)));
        // A lookup whose bucket is on a table page nothing has used does not read it.
        let (other, other_page) = (addr..)
            .step_by(16)
            .map(|a| (a, bucket_index(a) / BUCKETS_PER_PAGE))
            .find(|&(_, p)| !touched(p * BUCKETS_PER_PAGE) && !resident(p))
            .expect("an address whose bucket is on an unused table page");
        assert!(!remove(other));
        assert!(!resident(other_page), "a lookup made table page {other_page} resident");
        assert!(remove(addr));
        clear();
        assert_empty();
    }

    /// `clear` forgets every entry, whatever page it is on.
    #[test]
    fn clear_forgets_every_entry() {
        let _lock = exclusive();
        let addrs = [0x7700_0000_0000, 0x7700_0000_1230, 0x7700_0400_0000];
        assert!(addrs.iter().all(|&a| insert(a)));
        clear();
        assert_empty();
        assert!(addrs.iter().all(|&a| !remove(a)));
    }

    #[test]
    fn table_is_one_cache_line_per_bucket() {
        assert_eq!(std::mem::size_of::<Bucket>(), 64);
        assert_eq!(std::mem::align_of::<Bucket>(), 64);
    }
}
