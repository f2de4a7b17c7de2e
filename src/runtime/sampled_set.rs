//! The set of live sampled blocks, and the rule that lets a free skip it: lock-free,
//! set-associative tables of block keys that grow with the number of live samples.
//!
//! A sampled block smaller than [`LARGE_BLOCK`] is allocated from the inner allocator at an
//! alignment of at least [`SAMPLED_ALIGN`] ([`sampled_layout`]), so a free of such a block
//! whose address is not a multiple of it was not sampled: one AND and a branch, no memory read.
//! A larger sampled block keeps the program's own layout, so that the inner allocator serves,
//! zeroes, grows and frees it exactly as it would untraced (`calloc`'s untouched zero pages and
//! `realloc`'s `mremap` survive tracing); its free, which receives the size in the `Layout`,
//! always looks in the set, at a cost negligible next to such an allocation. A free that passes
//! (the sampled blocks, the large ones, and the few small unsampled blocks the inner allocator
//! placed at an aligned address by chance) looks the block up here, and a sampled block is freed
//! with the layout it was allocated with. Sampled blocks stay ordinary blocks of the inner
//! allocator (C's `free` of one still works over `System`), and the set tracks any number of
//! them, whatever their sizes.
//!
//! A block is known by its key ([`block_key`]): a small block's address (a multiple of
//! [`SAMPLED_ALIGN`]); a large block's address rounded down to that multiple, with
//! [`LARGE_KEY_BIT`] set. Keys of live blocks never collide: two live large blocks are at least
//! [`LARGE_BLOCK`] bytes apart, and the bit tells a large block from a small one. The key is
//! also the block's identity in the writer and the late frees. Each entry is the key with, in
//! its low bits ([`TAG_MASK`]), the tag of the session that recorded it ([`SessionTag`]; 0 for
//! a block no session recorded). Entries outlive their session: a block allocated over-aligned
//! must be freed so, whenever it is. A block allocated in a measured scope (`testing::measure`)
//! is tracked here too, with the scope's slot ([`ScopeSlot`]) in the entry's top bits
//! ([`SCOPE_SHIFT`]), above any user-space address of the 64-bit platforms we run on; one the
//! allocator serves inside a larger inner block has [`OFFSET_BLOCK`] and its offset for a tag.
//!
//! The tables are generations, each four times the buckets of the one before, mapped (not
//! allocated: this runs inside the allocator) when the live entries reach twice the newest
//! one's buckets, so a table stays about a quarter full; inserts go to the newest generation
//! (to an older one if the key's bucket there is full), a lookup reads the key's bucket in each
//! generation (one 64-byte cache line each, none where no insert has touched the bucket's
//! page). Only the pages inserts have written become resident. Nothing takes a lock, so a fork
//! at any moment leaves a set the child can use. An insert fails only when the key's bucket is
//! full in every generation, all [`GENERATIONS`] of them mapped (some 89 million live entries),
//! or the address space for a new one cannot be had; the caller then allocates the block
//! unsampled and records the loss.
//!
//! Before any of that, a free that may be of a sampled block asks [`may_hold`]: a counting
//! filter of the set's entries, 64 KiB in all, so the frees of unsampled blocks at aligned
//! addresses (many of them over allocators whose blocks of a size class lie at multiples of its
//! size, as mimalloc's do) and of unsampled large blocks mostly read one byte there rather than
//! a bucket of a table of megabytes.
//!
//! Memory ordering: a block is inserted before its address is returned to the program, and
//! any thread that frees it got the address through some synchronisation that orders it after
//! that return; read-write coherence then guarantees the freeing thread's loads see the insert
//! (and the generation it went to), so relaxed loads suffice. Only the thread freeing a block
//! removes it.

use std::alloc::Layout;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// The alignment of every sampled block smaller than [`LARGE_BLOCK`]: a power of two whose low
/// bits hold an entry's tag and [`LARGE_KEY_BIT`]. An address is a multiple of it by chance for
/// about 1 in 32 of glibc's small blocks, whose frees then look in the set (a byte of its
/// filter, mostly). Not larger: glibc serves an aligned block from a chunk larger by the
/// alignment and frees the rest, so the program's peak memory grows with the alignment times
/// the live samples (docs/BENCHMARKS.md, "Whole processes").
pub(crate) const SAMPLED_ALIGN: usize = 512;
/// The smallest block that is sampled with the program's own layout (see the module doc).
/// Below it, the over-aligned block's costs are bounded by the block's size (a `memset` of a
/// zeroed block, a copy on `realloc`), and the free of any unsampled block at an unaligned
/// address needs no lookup; at and above it, the lookup on every free costs little next to
/// the allocation, while over-aligning would cost the inner allocator's fast paths for large
/// blocks (fresh zero pages, `mremap`).
pub(crate) const LARGE_BLOCK: usize = 64 << 10;
/// The bit of a key that marks a large block (see [`block_key`]).
const LARGE_KEY_BIT: usize = SAMPLED_ALIGN / 2;
/// The low bits of an entry that hold its tag: those below [`LARGE_KEY_BIT`].
pub(crate) const TAG_MASK: usize = LARGE_KEY_BIT - 1;
/// The bit of an entry's tag that marks a measured block the allocator serves at an offset
/// inside a larger block of the inner allocator (see `allocator`): the bits below it hold the
/// offset in [`OFFSET_UNIT`]s, and session tags stay below it.
pub(crate) const OFFSET_BLOCK: usize = 1 << 7;
/// The unit of an offset block's offset: the inner block is aligned to it at least.
pub(crate) const OFFSET_UNIT: usize = 16;
/// The lowest of the entry's bits that hold the slot of the scope that measured its block
/// (user-space addresses stay below 2^56 on x86_64, even with 5-level paging, and aarch64).
const SCOPE_SHIFT: u32 = 56;
/// The bits of an entry that hold its block's key.
const KEY_MASK: usize = ((1 << SCOPE_SHIFT) - 1) & !TAG_MASK;

/// The slot of a measured scope (`runtime::measure`), 1..=255, in an entry's top bits; 0 for a
/// block no scope measured.
pub(crate) type ScopeSlot = u8;

/// The bits of an entry (what [`remove`] returns) that hold the scope's slot.
pub(crate) fn scope_bits(scope: ScopeSlot) -> usize {
    (scope as usize) << SCOPE_SHIFT
}

/// The slot of the scope in an entry's `marks` (from [`remove`]): 0 for none.
pub(crate) fn scope_of(marks: usize) -> ScopeSlot {
    (marks >> SCOPE_SHIFT) as ScopeSlot
}

/// The layout a sampled block of `layout` is allocated with (and must be freed with).
#[inline(always)]
pub(crate) fn sampled_layout(layout: Layout) -> Layout {
    if layout.size() >= LARGE_BLOCK {
        return layout;
    }
    // Below `LARGE_BLOCK` the size can always be over-aligned; the fallback is never taken.
    Layout::from_size_align(layout.size(), layout.align().max(SAMPLED_ALIGN)).unwrap_or(layout)
}

/// Whether a block of `size` bytes at `addr` may have been sampled: a small block only at a
/// multiple of [`SAMPLED_ALIGN`], a large one wherever it is.
#[inline(always)]
pub(crate) fn may_be_sampled(addr: usize, size: usize) -> bool {
    addr & (SAMPLED_ALIGN - 1) == 0 || size >= LARGE_BLOCK
}

/// The key of a sampled block of `size` bytes at `addr` (see the module doc); `None` for a
/// small block the inner allocator did not place at its sampled alignment, which can then not
/// be tracked.
#[inline(always)]
pub(crate) fn block_key(addr: usize, size: usize) -> Option<usize> {
    if addr & !KEY_MASK & !(SAMPLED_ALIGN - 1) != 0 {
        // An address that reaches the scope's bits cannot be told from them.
        return None;
    }
    if size >= LARGE_BLOCK {
        Some(addr & !(SAMPLED_ALIGN - 1) | LARGE_KEY_BIT)
    } else {
        (addr & (SAMPLED_ALIGN - 1) == 0).then_some(addr)
    }
}

/// What an entry records of the session that sampled its block: 0 for none (a block allocated
/// for a sample that was then lost), else 1..[`OFFSET_BLOCK`] from the session's id.
pub(crate) type SessionTag = usize;

/// The tag of the session whose hand-off tag is `session` (never 0).
pub(crate) fn session_tag(session: u32) -> SessionTag {
    session as usize % (OFFSET_BLOCK - 1) + 1
}

/// log2 of the first generation's buckets (2 MiB of address space).
const FIRST_BUCKET_BITS: u32 = 15;
/// Each generation has 2^this times the buckets of the one before.
const GROWTH_BITS: u32 = 2;
/// Generations at most: the last has 2^25 buckets (2 GiB of address space).
pub(crate) const GENERATIONS: usize = 6;
/// The live entries, per bucket of the newest generation, at which the next one is mapped.
const ENTRIES_PER_BUCKET_BEFORE_GROWTH: usize = 2;
/// Slots per bucket: 8 × 8 bytes = one cache line.
const SLOTS: usize = 8;
/// The smallest page size of the platforms we run on.
const PAGE_BYTES: usize = 4096;
/// Buckets per page.
const BUCKETS_PER_PAGE: usize = PAGE_BYTES / std::mem::size_of::<Bucket>();

/// One cache line of slots; 0 marks a free slot.
#[repr(C, align(64))]
struct Bucket([AtomicUsize; SLOTS]);

/// One generation: `1 << bits` buckets, then one bit per page of buckets, set once an insert
/// has written the page (made it resident).
struct Generation {
    base: *mut u8,
    bits: u32,
}

/// log2 of the counting filter's slots.
const FILTER_BITS: u32 = 16;
/// A filter slot's count that stays: more entries than it counts may hash to the slot.
const FILTER_STUCK: u8 = u8::MAX;

/// The counting filter in front of the set: for each slot, how many of the set's entries hash
/// to it, so a slot at 0 holds none and a free there goes straight to the inner allocator.
/// Counts are changed only on the sampled path (an insert, a removal); a count that reaches
/// [`FILTER_STUCK`] stays there, which can only cost lookups, never miss an entry. Static and
/// zero-initialised: a program that never samples only ever reads it.
#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `FILTER`.
const EMPTY: AtomicU8 = AtomicU8::new(0);
static FILTER: [AtomicU8; 1 << FILTER_BITS] = [EMPTY; 1 << FILTER_BITS];

/// The multiplier of Fibonacci hashing (2^64 over the golden ratio).
pub(crate) const FIBONACCI: u64 = 0x9E37_79B9_7F4A_7C15;
/// The filter's multiplier, another odd constant: a filter slot's addresses spread over the
/// generations' buckets.
const FILTER_MULTIPLIER: u64 = 0xD6E8_FEB8_6659_FD93;

/// `bits` bits of a multiplicative hash of `addr` above its alignment bits: how the set's
/// buckets, its filter's slots and the late frees' slots are picked.
#[inline(always)]
pub(crate) fn address_hash(addr: usize, multiplier: u64, bits: u32) -> usize {
    (((addr / SAMPLED_ALIGN) as u64).wrapping_mul(multiplier) >> (64 - bits)) as usize
}

/// The filter slot of the block at `addr`.
#[inline(always)]
fn filter_slot(addr: usize) -> &'static AtomicU8 {
    &FILTER[address_hash(addr, FILTER_MULTIPLIER, FILTER_BITS)]
}

/// Add one entry to `slot`'s count (`by` 1) or take one from it (`by` -1), unless it is stuck.
fn count(slot: &AtomicU8, by: i8) {
    let _ = slot
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n != FILTER_STUCK).then(|| n.wrapping_add_signed(by)));
}

/// Whether the block at `addr` (a multiple of [`SAMPLED_ALIGN`]) may be in the set: false only
/// if no entry of the set hashes to its filter slot. One relaxed load; the ordering argument of
/// the module doc holds for the count an insert added as for the entry itself.
#[inline(always)]
pub(crate) fn may_hold(addr: usize) -> bool {
    filter_slot(addr).load(Ordering::Relaxed) != 0
}

/// The generations mapped so far, oldest first: a null pointer past the last.
#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `MAPPED`.
const UNMAPPED: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static MAPPED: [AtomicPtr<u8>; GENERATIONS] = [UNMAPPED; GENERATIONS];
/// Entries in the set (approximately, under concurrent updates).
static LIVE: AtomicUsize = AtomicUsize::new(0);

#[inline(always)]
fn bucket_bits(generation: usize) -> u32 {
    FIRST_BUCKET_BITS + GROWTH_BITS * generation as u32
}

/// The bytes a generation of `bits` maps: its buckets and its page bits.
fn generation_bytes(bits: u32) -> usize {
    let buckets = 1usize << bits;
    let pages = buckets / BUCKETS_PER_PAGE;
    buckets * std::mem::size_of::<Bucket>() + (pages / 64).max(1) * 8
}

/// The capacity the generations give at the density that maps the next one: the number of
/// live sampled blocks the set holds before its last generation fills (a unit test checks the
/// issue's figures against it).
#[cfg(test)]
fn planned_capacity() -> usize {
    (0..GENERATIONS).map(|g| (1usize << bucket_bits(g)) * ENTRIES_PER_BUCKET_BEFORE_GROWTH).sum()
}

impl Generation {
    /// Generation `g`, if mapped.
    fn get(g: usize) -> Option<Generation> {
        let base = MAPPED.get(g)?.load(Ordering::Acquire);
        (!base.is_null()).then(|| Generation { base, bits: bucket_bits(g) })
    }

    #[inline(always)]
    fn index(&self, addr: usize) -> usize {
        address_hash(addr, FIBONACCI, self.bits)
    }

    #[inline(always)]
    fn bucket(&self, index: usize) -> &'static Bucket {
        // SAFETY: `index < 1 << bits` (from `index`), and the mapping holds that many buckets,
        // zero-initialised (free slots), and is never unmapped.
        unsafe { &*self.base.cast::<Bucket>().add(index) }
    }

    /// The word of page bits holding `index`'s page, and its bit.
    #[inline(always)]
    fn page_bit(&self, index: usize) -> (&AtomicU64, u64) {
        let page = index / BUCKETS_PER_PAGE;
        let bits_at = (1usize << self.bits) * std::mem::size_of::<Bucket>();
        // SAFETY: the page bits follow the buckets in the mapping (see `generation_bytes`),
        // 8-byte aligned, zero-initialised, and `page / 64` is within them.
        let word = unsafe { &*self.base.add(bits_at).cast::<AtomicU64>().add(page / 64) };
        (word, 1 << (page % 64))
    }

    /// Whether an insert has written `index`'s page: a page no insert wrote holds no entry, and
    /// reading it would map the shared zero page, which a later write faults out again with a
    /// TLB shoot-down that interrupts the program's other threads.
    #[inline(always)]
    fn touched(&self, index: usize) -> bool {
        let (word, bit) = self.page_bit(index);
        word.load(Ordering::Relaxed) & bit != 0
    }

    /// Write `index`'s page (exchanging 0 for 0 writes a free slot; a used slot's page is
    /// resident), then mark it.
    fn touch(&self, index: usize) {
        let (word, bit) = self.page_bit(index);
        if word.load(Ordering::Relaxed) & bit == 0 {
            let first = index / BUCKETS_PER_PAGE * BUCKETS_PER_PAGE;
            let _ = self.bucket(first).0[0].compare_exchange(0, 0, Ordering::Relaxed, Ordering::Relaxed);
            word.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// Put `entry` (the block at `addr`, tagged) in a free slot of `addr`'s bucket.
    fn insert(&self, addr: usize, entry: usize) -> Option<&'static AtomicUsize> {
        let index = self.index(addr);
        self.touch(index);
        self.bucket(index).0.iter().find(|slot| {
            slot.load(Ordering::Relaxed) == 0
                && slot.compare_exchange(0, entry, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        })
    }

    /// The slot holding the entry of the block at `addr`, if any.
    fn find(&self, addr: usize) -> Option<&'static AtomicUsize> {
        let index = self.index(addr);
        if !self.touched(index) {
            return None;
        }
        self.bucket(index).0.iter().find(|slot| slot.load(Ordering::Relaxed) & KEY_MASK == addr)
    }

    /// Remove the block at `addr`, returning its entry's marks (see [`remove`]). An entry of
    /// the block's key is its own (only the thread freeing a block removes it), so a failed
    /// exchange means [`remark`] changed its marks: it is tried again. (Loops rather than
    /// iterator adapters: on the free path of a thread with little stack left, an unoptimised
    /// build's adapter frames overflowed it.)
    #[inline(always)]
    fn remove(&self, addr: usize) -> Option<usize> {
        let index = self.index(addr);
        if !self.touched(index) {
            return None;
        }
        for slot in &self.bucket(index).0 {
            let mut entry = slot.load(Ordering::Relaxed);
            while entry & KEY_MASK == addr {
                match slot.compare_exchange(entry, 0, Ordering::AcqRel, Ordering::Relaxed) {
                    Ok(_) => return Some(entry & !KEY_MASK),
                    Err(now) => entry = now,
                }
            }
        }
        None
    }
}

/// Map generation `g` unless another thread has; false if the address space cannot be had.
#[cold]
fn map_generation(g: usize) -> bool {
    let Some(published) = MAPPED.get(g) else { return false };
    if !published.load(Ordering::Acquire).is_null() {
        return true;
    }
    let bytes = generation_bytes(bucket_bits(g));
    // SAFETY: a fresh private anonymous mapping (zero-filled), that nothing else refers to.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if map == libc::MAP_FAILED {
        return false;
    }
    if published.compare_exchange(std::ptr::null_mut(), map.cast(), Ordering::AcqRel, Ordering::Acquire).is_err() {
        // Another thread mapped it first; nothing was published of this one.
        // SAFETY: `map` is the mapping of `bytes` just made, unused.
        unsafe { libc::munmap(map, bytes) };
    }
    true
}

/// How many generations are mapped (they are mapped in order).
#[inline(always)]
fn mapped() -> usize {
    let mut n = 0;
    while n < GENERATIONS && !MAPPED[n].load(Ordering::Acquire).is_null() {
        n += 1;
    }
    n
}

/// The generations mapped, newest first.
fn generations() -> impl Iterator<Item = Generation> {
    (0..mapped()).rev().filter_map(Generation::get)
}

/// Where an insert put its entry: the sampled path sets the session's tag once it knows whether
/// the sample was recorded.
pub(crate) struct Inserted {
    slot: &'static AtomicUsize,
    /// The entry without its tag: the key and the scope's bits.
    untagged: usize,
}

impl Inserted {
    /// Tag the entry as recorded by the session of `tag`.
    pub(crate) fn tag(self, tag: SessionTag) {
        self.slot.store(self.untagged | (tag & TAG_MASK), Ordering::Relaxed);
    }
}

/// Record the block of key `addr` (from [`block_key`]) as live and sampled, so far by no
/// session, with `marks` (the scope's bits, [`scope_bits`], and an offset block's tag). `None`
/// only when no generation has room for it (see the module doc).
pub(crate) fn insert(addr: usize, marks: usize) -> Option<Inserted> {
    debug_assert!(addr != 0 && addr & !KEY_MASK == 0 && marks & KEY_MASK == 0);
    let untagged = addr | marks;
    // An entry of the same address is stale: its block was freed behind the allocator's back
    // (C's `free` of a Rust block), and the address reused. The new block takes its place,
    // rather than leave the old entry to fill the bucket as the address comes back.
    if let Some(slot) = generations().find_map(|g| g.find(addr)) {
        slot.store(untagged, Ordering::Relaxed);
        return Some(Inserted { slot, untagged });
    }
    // Counted before the entry is written, so that a free that finds the entry finds the count.
    count(filter_slot(addr), 1);
    let live = LIVE.fetch_add(1, Ordering::Relaxed) + 1;
    let generations_mapped = mapped();
    let newest_bucket_bits = bucket_bits(generations_mapped.saturating_sub(1));
    if generations_mapped == 0 || live > (1 << newest_bucket_bits) * ENTRIES_PER_BUCKET_BEFORE_GROWTH {
        map_generation(generations_mapped);
    }
    loop {
        if let Some(slot) = generations().find_map(|g| g.insert(addr, untagged)) {
            return Some(Inserted { slot, untagged });
        }
        // The address's bucket is full in every generation: a new one, whatever the count.
        if !map_generation(mapped()) {
            LIVE.fetch_sub(1, Ordering::Relaxed);
            count(filter_slot(addr), -1);
            return None;
        }
    }
}

/// If the block at `addr` is in the set, remove it and return its entry's marks: its session's
/// tag (`marks & TAG_MASK`) and its scope's slot ([`scope_of`]); both 0 for a block no session
/// recorded and no scope measured. Reads the address's bucket in each generation whose page
/// of it an insert has written.
#[inline(never)]
pub(crate) fn remove(addr: usize) -> Option<usize> {
    let mut g = mapped();
    while g > 0 {
        g -= 1;
        let generation = Generation { base: MAPPED[g].load(Ordering::Acquire), bits: bucket_bits(g) };
        if let Some(tag) = generation.remove(addr) {
            LIVE.fetch_sub(1, Ordering::Relaxed);
            count(filter_slot(addr), -1);
            return Some(tag);
        }
    }
    None
}

/// Move every entry measured by the scope of slot `from` to the scope of slot `to` (0: none),
/// calling `moved` after each: the blocks still live when a scope ends. Reads every page of
/// buckets an insert has written (a scope that ends with no live block skips this).
pub(crate) fn remark(from: ScopeSlot, to: ScopeSlot, mut moved: impl FnMut()) {
    debug_assert!(from != 0);
    for g in generations() {
        for first in (0..1usize << g.bits).step_by(BUCKETS_PER_PAGE) {
            if !g.touched(first) {
                continue;
            }
            for slot in (first..first + BUCKETS_PER_PAGE).flat_map(|index| &g.bucket(index).0) {
                let mut entry = slot.load(Ordering::Relaxed);
                while entry != 0 && scope_of(entry) == from {
                    let remarked = entry & !scope_bits(ScopeSlot::MAX) | scope_bits(to);
                    match slot.compare_exchange(entry, remarked, Ordering::AcqRel, Ordering::Relaxed) {
                        Ok(_) => {
                            moved();
                            break;
                        }
                        // Freed meanwhile (0), or its tag set.
                        Err(now) => entry = now,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Addresses for a test: distinct multiples of the alignment from `base`, spread so that
    /// tests running at once never share one.
    fn addresses(base: usize, n: usize) -> impl Iterator<Item = usize> {
        (0..n).map(move |i| base + i * SAMPLED_ALIGN)
    }

    #[test]
    fn insert_tag_find_remove() {
        let a = 0x7f00_1234_5000;
        assert_eq!(remove(a), None);
        insert(a, 0).unwrap().tag(session_tag(7));
        assert_eq!(remove(a), Some(session_tag(7)));
        assert_eq!(remove(a), None);
        insert(a, 0).unwrap();
        assert_eq!(remove(a), Some(0), "an untagged entry is found, with no session");
    }

    /// A measured block's entry keeps its scope's slot through its session's tag and a
    /// removal; a remark moves exactly the entries of one scope to another.
    #[test]
    fn a_measured_entry_keeps_its_scope_through_its_tag_and_a_remark() {
        let (a, b, c) = (0x7f00_2468_0000, 0x7f00_2468_0200, 0x7f00_2468_0400);
        insert(a, scope_bits(200)).unwrap().tag(session_tag(9));
        insert(b, scope_bits(200) | OFFSET_BLOCK | 3).unwrap();
        insert(c, scope_bits(202)).unwrap();
        let mut moved = 0;
        remark(200, 201, || moved += 1);
        assert_eq!(moved, 2);
        let marks = remove(a).unwrap();
        assert_eq!((marks & TAG_MASK, scope_of(marks)), (session_tag(9), 201));
        assert_eq!(remove(b), Some(scope_bits(201) | OFFSET_BLOCK | 3), "an offset block's tag kept");
        assert_eq!(remove(c).map(scope_of), Some(202), "another scope's entry moved");
        remark(201, 0, || moved += 1);
        assert_eq!(moved, 2, "removed entries are not moved");
        assert_eq!(block_key(1 << SCOPE_SHIFT, 16), None, "an address in the scope's bits");
    }

    /// An address inserted again without a removal between (its block freed by C's `free`)
    /// takes the stale entry's place: one removal then finds none left.
    #[test]
    fn a_stale_entry_gives_way_to_its_address_reused() {
        let a = 0x7f00_5678_9000;
        for tag in 1..=3 * SLOTS {
            insert(a, 0).expect("room").tag(tag);
        }
        assert_eq!(remove(a), Some(3 * SLOTS));
        assert_eq!(remove(a), None);
    }

    #[test]
    fn session_tags_are_never_zero_and_fit_the_alignment() {
        for session in [0, 1, 126, 127, 510, 511, 512, 4096, u32::MAX] {
            let tag = session_tag(session);
            assert!(tag != 0 && tag < OFFSET_BLOCK, "{session}: {tag}");
        }
    }

    /// Only small blocks at multiples of the alignment and large blocks anywhere may be sampled;
    /// a small block's sampled layout keeps its size, has at least the alignment, and keeps a
    /// larger one; a large block's is the program's own.
    #[test]
    fn the_sampled_layout_is_what_the_free_rule_relies_on() {
        assert!(may_be_sampled(0x7000_0000_1000, 24) && !may_be_sampled(0x7000_0000_1010, 24));
        assert!(may_be_sampled(0x7000_0000_1010, LARGE_BLOCK) && !may_be_sampled(0x7000_0000_1010, LARGE_BLOCK - 1));
        for (size, align) in [(1, 1), (24, 8), (512, 512), (4096, 4096), (64, 8192), (LARGE_BLOCK - 1, 16)] {
            let sampled = sampled_layout(Layout::from_size_align(size, align).unwrap());
            assert_eq!((sampled.size(), sampled.align()), (size, align.max(SAMPLED_ALIGN)));
        }
        for (size, align) in [(LARGE_BLOCK, 1), (100_000, 16), (1 << 20, 1 << 21), (isize::MAX as usize - 8, 8)] {
            let layout = Layout::from_size_align(size, align).unwrap();
            assert_eq!(sampled_layout(layout), layout, "a large block keeps the program's layout");
        }
    }

    /// Keys of blocks that can be live at once never collide: a small block at an aligned
    /// address and a large one starting within the same alignment unit, large blocks at any
    /// offset; a key leaves the tag's bits free; a small block off its alignment has none.
    #[test]
    fn keys_of_live_blocks_are_distinct_and_leave_the_tag_bits_free() {
        let base = 0x7f00_0000_0000;
        let small = block_key(base, 16).unwrap();
        let large = block_key(base + 16, LARGE_BLOCK).unwrap();
        let next_large = block_key(base + 16 + LARGE_BLOCK, LARGE_BLOCK).unwrap();
        assert_eq!(small, base);
        assert!(small != large && large != next_large && small != next_large);
        for key in [small, large, next_large] {
            assert_eq!(key & TAG_MASK, 0, "{key:#x}");
        }
        assert_eq!(block_key(base + 16, 24), None);
        insert(large, 0).unwrap().tag(session_tag(3));
        assert_eq!(remove(small), None, "a small block's key found a large block's entry");
        assert_eq!(remove(large), Some(session_tag(3)));
    }

    /// The set holds the live samples of the heaps it is made for (issue 36: 64 GiB live at the
    /// default rate, 4 GiB at 1e-3) many times over, in blocks of any size: a block covers one
    /// entry whatever its size, and the most live entries a heap gives are its words times the
    /// rate (each word a sample point with that probability), for blocks of one word.
    #[test]
    fn capacity_covers_the_largest_heaps_at_their_rates() {
        let entries_for = |heap_bytes: f64, rate: f64| (heap_bytes / 8.0 * rate) as usize;
        let gib = (1u64 << 30) as f64;
        for (heap, rate) in [(64.0 * gib, 1e-5), (4.0 * gib, 1e-3), (64.0 * gib, 1e-4)] {
            let needed = entries_for(heap, rate);
            assert!(planned_capacity() >= 8 * needed, "{heap} B at {rate}: {needed} entries");
        }
    }

    /// Many more entries than the first generation holds: each one is found and removed once,
    /// with its tag, and new generations were mapped on demand (one at a time).
    #[test]
    fn the_set_grows_past_its_first_generation() {
        let n = (1usize << FIRST_BUCKET_BITS) * SLOTS * 2;
        let addrs: Vec<usize> = addresses(0x5100_0000_0000, n).collect();
        for (i, &a) in addrs.iter().enumerate() {
            insert(a, 0).expect("room").tag(session_tag(i as u32));
        }
        assert!(generations().count() >= 2, "no generation was added");
        assert!(addrs.iter().all(|&a| may_hold(a)), "the filter turned away a held block");
        for (i, &a) in addrs.iter().enumerate() {
            assert_eq!(remove(a), Some(session_tag(i as u32)), "{a:#x}");
        }
        assert!(addrs.iter().all(|&a| remove(a).is_none()));
    }

    /// Addresses that all land in one bucket of generation 0 fill it, and then go to another
    /// generation rather than being refused.
    #[test]
    fn a_full_bucket_sends_inserts_to_another_generation() {
        map_generation(0);
        let first = Generation::get(0).unwrap();
        let target = first.index(0x5500_0000_0000);
        let addrs: Vec<usize> =
            addresses(0x5500_0000_0000, 1 << 26).filter(|&a| first.index(a) == target).take(3 * SLOTS).collect();
        for &a in &addrs {
            insert(a, 0).expect("room in some generation").tag(1);
        }
        assert!(generations().count() >= 2);
        for &a in &addrs {
            assert_eq!(remove(a), Some(1));
        }
    }

    /// Threads inserting and removing disjoint sets of addresses: every entry is found until
    /// removed, and each removal succeeds exactly once.
    #[test]
    fn concurrent_inserts_and_removes() {
        const THREADS: usize = 4;
        const ROUNDS: usize = 200;
        std::thread::scope(|s| {
            for t in 0..THREADS {
                s.spawn(move || {
                    let set: Vec<usize> = addresses(0x4200_0000_0000 + (t << 32), 500).collect();
                    let mut rng = t as u64 + 1;
                    let mut live = vec![false; set.len()];
                    for _ in 0..ROUNDS {
                        for (i, &addr) in set.iter().enumerate() {
                            if crate::runtime::sampler::next_u64(&mut rng).is_multiple_of(2) {
                                continue;
                            }
                            if live[i] {
                                assert_eq!(remove(addr), Some(3), "{addr:#x} not removed");
                                assert_eq!(remove(addr), None, "{addr:#x} removed twice");
                            } else {
                                insert(addr, 0).expect("room").tag(3);
                            }
                            live[i] = !live[i];
                        }
                    }
                    for (&addr, live) in set.iter().zip(live) {
                        assert_eq!(remove(addr).is_some(), live, "{addr:#x}");
                    }
                });
            }
        });
    }

    /// Whether the page at `addr` is resident (`mincore`).
    fn resident(addr: usize) -> bool {
        let mut flag = 0u8;
        let page = (addr & !(PAGE_BYTES - 1)) as *mut libc::c_void;
        // SAFETY: `page` is the page-aligned start of a page of a generation's mapping, and
        // `flag` has room for that one page's answer.
        assert_eq!(unsafe { libc::mincore(page, PAGE_BYTES, &mut flag) }, 0);
        flag & 1 != 0
    }

    /// Only the pages an insert used become resident, and a lookup whose bucket is on a page no
    /// insert has used does not read it (on a generation of its own: the set's are shared by
    /// the tests running at once).
    #[test]
    fn only_pages_in_use_become_resident() {
        let bits = FIRST_BUCKET_BITS;
        // SAFETY: a fresh private anonymous mapping of a generation's size, left mapped.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                generation_bytes(bits),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let g = Generation { base: base.cast(), bits };
        let page_of = |a: usize| g.index(a) / BUCKETS_PER_PAGE;
        let page_addr = |a: usize| g.bucket(page_of(a) * BUCKETS_PER_PAGE) as *const Bucket as usize;
        let a = 0x7c00_0000_0000;
        let b = addresses(a, 1 << 10).find(|&b| page_of(b) != page_of(a)).unwrap();
        assert!(!resident(page_addr(a)) && !resident(page_addr(b)));
        assert_eq!(g.remove(b), None);
        assert!(!resident(page_addr(b)), "a lookup made its page resident");
        g.insert(a, a | 5).expect("room");
        assert!(resident(page_addr(a)) && g.touched(g.index(a)));
        assert!(!resident(page_addr(b)), "an insert made another page resident");
        assert_eq!(g.remove(a), Some(5));
    }

    /// A filter slot counts its entries up and down, until it is stuck: then it stays, since
    /// it no longer knows how many hash to it.
    #[test]
    fn a_filter_slot_counts_until_it_sticks() {
        let slot = AtomicU8::new(0);
        count(&slot, 1);
        count(&slot, 1);
        count(&slot, -1);
        assert_eq!(slot.load(Ordering::Relaxed), 1);
        count(&slot, -1);
        assert_eq!(slot.load(Ordering::Relaxed), 0);
        for _ in 0..FILTER_STUCK as usize + 10 {
            count(&slot, 1);
        }
        count(&slot, -1);
        assert_eq!(slot.load(Ordering::Relaxed), FILTER_STUCK);
    }

    #[test]
    fn a_bucket_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Bucket>(), 64);
        assert_eq!(std::mem::align_of::<Bucket>(), 64);
    }
}
