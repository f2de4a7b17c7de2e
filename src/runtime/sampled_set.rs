//! The set of live sampled blocks: a static, lock-free, set-associative table of addresses.
//!
//! `dealloc` must ask of every block "was this one sampled?". A filter answers most of the
//! time: 2^15 8-bit counters (32 KiB), each counting the entries whose 4 KiB page of memory
//! hashes to it, and a zero counter means "not sampled" at once. Otherwise the table answers
//! by reading one 64-byte cache line (the address's bucket of 8 slots). Either way nothing is
//! written, so the common case — an unsampled block — costs no lock, no shared-cache-line
//! write and, mostly, no cache miss (reading a random line of the 2 MiB table on every free
//! cost more than everything else tracing does at rate 1e-5). Inserting increments the
//! counter, then CASes `0 → addr` into a free slot of the bucket (a full bucket drops the
//! sample, which the caller counts, and undoes the increment); removing CASes `addr → 0`,
//! then decrements the counter. An entry's counter is thus nonzero while it is in the table.
//!
//! The filter is indexed by page, not by the address's bucket, so that it follows the
//! program's own locality: blocks freed together mostly lie on a few pages, whose counters
//! then stay in the cache, where counters indexed by bucket scattered every free over all of
//! the filter, which a large heap kept evicting (benches/alloc.rs has the figures). A free on
//! a page with a sampled block live reads the table for nothing, so the filter must be
//! fine-grained: a program's live sampled blocks number its live heap × rate / 8 (about
//! 1 250 for a 1 GB heap at 1e-5), a small share of its pages and of 2^15 counters. An
//! earlier filter of one counter per 32 buckets (2 KiB) had 70 % of its counters nonzero at
//! that size, which the allocation benchmark showed at rate 1e-4.
//!
//! Frees pay even less until a session samples its first block (tracing at a low rate, or
//! before the first sample) and once it stops: one flag, [`Filter::sampled`], is read first,
//! and while it is false it answers "not sampled" without hashing the address or reading the
//! filter, which a large heap keeps evicting from the cache. It is written once a session, by
//! the first insert, and cleared when the session stops (not counted up and down with every
//! sampled event, which would make every free on every core miss the line after a sample on
//! any thread). `dealloc` reads nothing before it: the flag and the counters are one static,
//! so that a free loads one address (a program reaches this crate's statics through its
//! global offset table) and two bytes.
//!
//! The table lives in `.bss` (2^15 buckets × 64 bytes = 2 MiB), page-aligned, and only the
//! pages of buckets that an insert has used are made resident: a short traced run that samples
//! a few blocks pays a few pages, not 2 MiB. An insert writes a page before anything reads it
//! (a read first would map the shared zero page, which the write would then fault out again,
//! with a TLB shoot-down that interrupts the program's other threads), and marks it in
//! [`TOUCHED`]; [`clear`] reads and wipes only the marked pages. It is not aligned to 2 MiB for
//! a transparent huge page: that made inserts and lookups cheaper but the whole workload no
//! faster beyond the noise (see `benches/alloc.rs`), and would have made the kernel load every
//! program that links this crate at a 2 MiB-aligned address, nine bits less of address-space
//! randomisation, traced or not. Between sessions the table may keep stale entries (an insert
//! racing with the end of a session); they are harmless — a stale hit only makes the writer
//! see a free for an address it does not track, which it ignores — and `clear` wipes them.
//!
//! Memory ordering: a block is inserted (counts, then slot) before its address is returned
//! to the program, and any thread that frees it got the address through some synchronisation
//! that orders it after that return; read-write coherence then guarantees the freeing
//! thread's loads see the increment and the insert (or later values), so relaxed loads
//! suffice. Only the thread freeing a block removes it, so its counter cannot drop to zero
//! while the block is live; [`Filter::sampled`] only goes back to false in [`clear`] and
//! [`close`].

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};

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

#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `FILTER`.
const ZERO: AtomicU8 = AtomicU8::new(0);

/// What a free reads, in one static (one address for the program to load: a program links
/// this crate's statics through its global offset table, a load for each static a free reads).
#[repr(C)]
struct Filter {
    /// Whether an entry has been added since the last [`clear`] or [`close`] (set before it is
    /// added): every free reads it, the first insert of a session writes it. On a cache line
    /// of its own, so that its write does not take away a line that other hot data shares,
    /// and inserts' and removals' counter updates do not take away its line.
    sampled: Sampled,
    /// The entries of the table on the pages that hash to each counter, plus the inserts into
    /// a full bucket and the removals in progress (and, after a [`clear`] that raced with one,
    /// one more). At most 255: an insert that would pass it is refused like one into a full
    /// bucket.
    counters: [AtomicU8; 1 << BUCKET_BITS],
}

#[repr(align(64))]
struct Sampled(AtomicBool);

static FILTER: Filter = Filter { sampled: Sampled(AtomicBool::new(false)), counters: [ZERO; 1 << BUCKET_BITS] };

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

/// The filter index of `addr` (Fibonacci hashing of its page number).
#[inline(always)]
fn filter_index(addr: usize) -> usize {
    (((addr as u64) >> 12).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - BUCKET_BITS)) as usize
}

/// The filter counter of `addr`'s page.
#[inline(always)]
fn counter(addr: usize) -> &'static AtomicU8 {
    &FILTER.counters[filter_index(addr)]
}

/// Record `addr` as a live sampled block. Returns false (nothing recorded) when its bucket is
/// full (or its counter saturated) or `addr` is null.
pub(crate) fn insert(addr: usize) -> bool {
    if addr == 0 {
        return false;
    }
    let counter = counter(addr);
    // Saturating, so that a counter never wraps to 0 while it counts entries: then the
    // insert is refused like one into a full bucket (it takes 255 live sampled blocks on the
    // pages of one counter: 16-byte blocks sampled at rates near 1).
    if counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_add(1)).is_err() {
        return false;
    }
    if !FILTER.sampled.0.load(Ordering::Relaxed) {
        FILTER.sampled.0.store(true, Ordering::Relaxed);
    }
    touch(bucket_index(addr));
    let inserted = bucket(addr).0.iter().any(|slot| {
        slot.load(Ordering::Relaxed) == 0 && slot.compare_exchange(0, addr, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    });
    if !inserted {
        forget_one(counter);
    }
    inserted
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

/// Whether `addr` may be a live sampled block: false before the session's first sample or
/// when `addr`'s page counter is 0, which is the answer for almost every block. Reads
/// [`Filter::sampled`] and then one counter of a 32 KiB array, and writes nothing.
#[inline(always)]
pub(crate) fn may_contain(addr: usize) -> bool {
    FILTER.sampled.0.load(Ordering::Relaxed) && counter(addr).load(Ordering::Relaxed) != 0
}

/// If `addr` is a live sampled block, forget it and return true. Reads the address's bucket
/// (one cache line) and writes nothing when `addr` was not sampled; callers ask
/// [`may_contain`] first.
#[inline(never)]
pub(crate) fn remove(addr: usize) -> bool {
    // A block on a page with a sampled one gets past the filter; its own bucket's page may be
    // one no insert has written, which a read would map (see the module doc).
    let index = bucket_index(addr);
    if !touched(index) {
        return false;
    }
    for slot in &TABLE.0[index].0 {
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
        forget_one(counter(addr));
    }
    removed
}

/// Count one entry less in a filter counter, never below 0: after a [`clear`]
/// that raced with an insert or a removal (see there), a count may be one lower than the
/// entries it counts, and a wrapped one would keep the filter open until the next clear.
#[inline]
fn forget_one(counter: &AtomicU8) {
    let _ = counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_sub(1));
}

/// Let frees past [`Filter::sampled`] no more, when a session stops: they need not look for
/// its blocks any longer (a free that still finds one records nothing: no session is
/// running). The next insert opens the gate again; one still finishing after the stop costs
/// frees a lookup until the next session's [`clear`], nothing more.
pub(crate) fn close() {
    FILTER.sampled.0.store(false, Ordering::Relaxed);
}

/// Forget every entry. Called when a session starts, before anything of the new session is
/// sampled. Reads and writes only the pages an insert has made resident (and the filter).
///
/// A thread still finishing a sample (or a free) of the previous session may be inside
/// [`insert`] or [`remove`] meanwhile, so the slots are wiped first and the counters are then
/// recounted from the slots, rather than only zeroed: a counter can then never be 0 while the
/// table holds an entry of its that the wipe missed (which `remove` would never find again),
/// nor wrap below 0 (decrements saturate). What remains is benign: such a straggler's own
/// counter update may land after the recount and leave its counter one off (and its page,
/// touched after the wipe looked, may be left out of it). One too high only makes frees on
/// that counter's pages read the table. One too low can only involve the straggler's entry,
/// which belongs to the previous session (the new session samples nothing before this
/// returns): that entry may then not be found, or another entry of its counter may be missed
/// once — a free the new trace does not show — which takes a thread preempted inside the
/// table for the whole stop and restart of a session. The next `clear` repairs it. [`Filter::sampled`]
/// is set again if any entry is left.
pub(crate) fn clear() {
    if touched_buckets().next().is_none() {
        // No insert has made a page resident, so none left an entry or a count (but a
        // straggler racing with this, as above): nothing to wipe or recount. Nor are the
        // counters written here, on the thread that starts tracing: the session's writer makes
        // them resident ([`make_filter_resident`]).
        FILTER.sampled.0.store(false, Ordering::Relaxed);
        return;
    }
    for slot in touched_buckets().flat_map(|bucket| &bucket.0) {
        if slot.load(Ordering::Relaxed) != 0 {
            slot.store(0, Ordering::Relaxed);
        }
    }
    recount();
}

/// Write every page of the filter's counters, each with an update that changes nothing (so it
/// may run beside inserts and removals): a free past [`Filter::sampled`] then reads a resident
/// page, not the shared zero page that a later insert's write would fault out again (see the
/// module doc). A session's writer thread calls it as it starts, off the program's threads and,
/// in the common case, before the session's first sample opens the filter.
pub(crate) fn make_filter_resident() {
    let counters = &FILTER.counters;
    let to_page = (PAGE_BYTES - counters.as_ptr() as usize % PAGE_BYTES) % PAGE_BYTES;
    for counter in std::iter::once(0).chain((to_page..counters.len()).step_by(PAGE_BYTES)).map(|i| &counters[i]) {
        counter.fetch_or(0, Ordering::Relaxed);
    }
}

/// Set each counter to the number of entries it counts (reading only the touched pages of the
/// table), and [`Filter::sampled`] to whether there is any.
fn recount() {
    for counter in &FILTER.counters {
        // Stored 0 or not: the filter is resident (see `make_filter_resident`).
        counter.store(0, Ordering::Relaxed);
    }
    let mut any = false;
    for slot in touched_buckets().flat_map(|bucket| &bucket.0) {
        let addr = slot.load(Ordering::Relaxed);
        if addr != 0 {
            let _ = counter(addr).fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_add(1));
            any = true;
        }
    }
    FILTER.sampled.0.store(any, Ordering::Relaxed);
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
        // Only the touched pages: an untouched one holds nothing, and reading it would map it
        // (see `only_pages_in_use_become_resident`).
        assert!(touched_buckets().flat_map(|b| b.0.iter()).all(|s| s.load(Ordering::Relaxed) == 0), "table not empty");
        for (bucket, counter) in FILTER.counters.iter().enumerate() {
            assert_eq!(counter.load(Ordering::Relaxed), 0, "counter of bucket {bucket}");
        }
    }

    /// Put `addr` into slot `slot` of its bucket behind the counters' back, as an insert of the
    /// previous session finishing after a `clear` may.
    fn plant(addr: usize, slot: usize) {
        touch(bucket_index(addr));
        bucket(addr).0[slot].store(addr, Ordering::Relaxed);
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

    /// One counter counts the entries on a page, whatever their buckets.
    #[test]
    fn filter_counts_the_entries_of_a_page() {
        let _lock = shared();
        let addrs = [0x6600_0000_0010, 0x6600_0000_0020, 0x6600_0000_0ff0];
        assert!(addrs.iter().all(|&a| filter_index(a) == filter_index(addrs[0])));
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
        assert!(bucket_index(a) != bucket_index(b) && filter_index(a) != filter_index(b));
        plant(a, 5);
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

    /// Every 16-byte block of a page sampled: the page's counter takes 255 of them and refuses
    /// the 256th, rather than wrap.
    #[test]
    fn a_full_page_counter_refuses_inserts() {
        let _lock = exclusive();
        clear();
        let page: Vec<usize> = (0..256).map(|i| 0x7d00_0000_0000 + i * 16).collect();
        for &a in &page[..255] {
            assert!(insert(a), "{a:#x}");
        }
        assert!(!insert(page[255]));
        assert_eq!(counter(page[0]).load(Ordering::Relaxed), u8::MAX);
        for &a in &page[..255] {
            assert!(remove(a), "{a:#x}");
        }
        assert_empty();
    }

    /// A removal whose counter is already 0 (a `clear` raced with it) leaves it at 0 instead
    /// of wrapping to 255.
    #[test]
    fn counter_decrements_saturate() {
        let _lock = exclusive();
        clear();
        let a = 0x7800_0000_0000;
        plant(a, 0);
        assert!(!may_contain(a), "a zero counter hides the entry");
        assert!(remove(a));
        assert_eq!(counter(a).load(Ordering::Relaxed), 0);
        // An insert that finds its bucket full undoes its increment.
        let addrs = same_bucket(0x7900_0000_0000, SLOTS + 1);
        for &x in &addrs[..SLOTS] {
            plant(x, bucket(x).0.iter().position(|s| s.load(Ordering::Relaxed) == 0).unwrap());
        }
        assert!(!insert(addrs[SLOTS]));
        assert_eq!(counter(addrs[SLOTS]).load(Ordering::Relaxed), 0);
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

    /// Until a session's first insert no free gets past the filter, whatever a counter says;
    /// the flag stays set through removals (it is written once a session), `close` resets it
    /// and `clear` sets it to whether entries are left.
    #[test]
    fn the_filter_is_closed_until_a_block_is_sampled() {
        let _lock = exclusive();
        clear();
        let [a, b] = [0x7b00_0000_0000, 0x7b00_0000_4560];
        counter(a).store(3, Ordering::Relaxed);
        assert!(!may_contain(a), "a stale counter before any sample");
        counter(a).store(0, Ordering::Relaxed);
        assert!(insert(a) && insert(b));
        assert!(FILTER.sampled.0.load(Ordering::Relaxed));
        assert!(may_contain(a) && may_contain(b));
        assert!(remove(a));
        assert!(remove(b) && !remove(b));
        assert!(!may_contain(a) && !may_contain(b), "their counters are back to 0");
        assert!(FILTER.sampled.0.load(Ordering::Relaxed), "set for the session");
        clear();
        assert!(!FILTER.sampled.0.load(Ordering::Relaxed), "reset by clear");
        assert!(insert(a) && may_contain(a));
        close();
        assert!(!may_contain(a), "closed when the session stops");
        assert!(insert(b) && may_contain(a) && may_contain(b), "opened again by an insert");
        assert!(remove(a) && remove(b));
        clear();
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

    /// Making the filter resident changes no count, and leaves every page of it resident.
    #[test]
    fn making_the_filter_resident_changes_no_count() {
        let _lock = exclusive();
        let addrs = [0x7b00_0000_0000, 0x7b00_0000_0010, 0x7b00_0040_0000];
        assert!(addrs.iter().all(|&a| insert(a)));
        let counts = || FILTER.counters.iter().map(|c| c.load(Ordering::Relaxed)).collect::<Vec<u8>>();
        let before = counts();
        assert!(before.iter().any(|&c| c != 0));
        make_filter_resident();
        assert_eq!(counts(), before);
        let start = FILTER.counters.as_ptr() as usize;
        let end = start + FILTER.counters.len();
        for page in (start & !(PAGE_BYTES - 1)..end).step_by(PAGE_BYTES) {
            assert!(resident_at(page), "the filter's page at {page:#x}");
        }
        assert!(addrs.iter().all(|&a| remove(a)));
        clear();
        assert_empty();
    }

    /// A session's start writes nothing when no insert ever used the table: it leaves the
    /// filter to the writer ([`make_filter_resident`]).
    #[test]
    fn a_clear_with_nothing_to_clear_writes_nothing() {
        let _lock = exclusive();
        clear();
        // Only the pages marked touched are wiped by a clear: with none marked, it returns at
        // once, even with a count left behind (a straggler of an earlier session, say).
        let saved: Vec<u64> = TOUCHED.iter().map(|w| w.swap(0, Ordering::Relaxed)).collect();
        let a = 0x7b10_0000_0000;
        counter(a).store(1, Ordering::Relaxed);
        clear();
        let left = counter(a).swap(0, Ordering::Relaxed);
        for (word, bits) in TOUCHED.iter().zip(saved) {
            word.fetch_or(bits, Ordering::Relaxed);
        }
        assert_eq!(left, 1, "the filter was recounted");
        assert!(!FILTER.sampled.0.load(Ordering::Relaxed));
        clear();
        assert_empty();
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
        // A block on the same memory page gets past the filter; its bucket, on a table page
        // nothing has used, is not read.
        let (neighbour, other) = (addr & !4095..(addr & !4095) + 4096)
            .step_by(16)
            .map(|a| (a, bucket_index(a) / BUCKETS_PER_PAGE))
            .find(|&(_, p)| !touched(p * BUCKETS_PER_PAGE) && !resident(p))
            .expect("a neighbour whose bucket is on an unused table page");
        assert!(may_contain(neighbour) && !remove(neighbour));
        assert!(!resident(other), "a free on a sampled block's page made table page {other} resident");
        assert!(remove(addr));
        clear();
        assert_empty();
    }

    #[test]
    fn table_is_one_cache_line_per_bucket() {
        assert_eq!(std::mem::size_of::<Bucket>(), 64);
        assert_eq!(std::mem::align_of::<Bucket>(), 64);
    }
}
