//! The rule cache: a static, 2-way set-associative table of rules by code address, each slot a
//! sequence lock, with generations that an unload of a library starts anew, and only as many
//! sets in use (and so resident) as the program's evictions show it needs.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use super::rule::Rule;
use super::tables::rule_from_tables;
use super::SUPPORTED;

/// log2 of the number of sets the table has room for.
const MAX_SET_BITS: u32 = 14;
/// log2 of the number of sets in use at first: 64 sets, one page, room for the few dozen
/// return addresses of a short program's stacks (its calibration's and its first samples').
/// Every page in use takes two page faults when a program's first stacks are walked, a read
/// of the zero page and then a copy for the first rule cached there: 64 KiB at first took 29
/// of them from `jaq -n 1` (README.md at cfd4150, "Benchmarks"), where a program whose stacks outgrow the
/// sets doubles them after as many evictions, a few times, at the cost of the rules missed
/// again after each doubling.
const START_SET_BITS: u32 = 6;
/// Slots per set.
const WAYS: usize = 2;
/// The bits of a key that hold the code address.
const PC_BITS: u64 = (1 << 48) - 1;

/// One cached rule, under a sequence lock: `seq` is odd while the slot is being written.
/// `key` is the code address tagged with the cache generation (see [`Cache::key`]).
#[repr(C, align(32))]
struct Slot {
    seq: AtomicU64,
    key: AtomicU64,
    rule: AtomicU64,
}

/// The slots an address may be cached in: one cache line.
#[repr(C, align(64))]
struct Set([Slot; WAYS]);

/// The table and what its lookups read besides: page-aligned, so that the sets in use are
/// whole pages at its start; all zero when new, so that it lies in `.bss` (not 1 MiB of the
/// program file) and its pages become resident only when used.
#[repr(C, align(4096))]
struct Cache {
    /// Room for 16 Ki sets of 2 slots (1 MiB); only the first `1 << set_bits()` are used, so
    /// only their pages become resident. A big program's sampled stacks hold thousands of
    /// return addresses; two ways keep a pair of them that share a set from evicting each
    /// other on every sample.
    sets: [Set; 1 << MAX_SET_BITS],
    /// The number of generations started since the first, modulo 2^16 − 1: rules cached in
    /// an earlier generation are misses.
    generation: AtomicU64,
    /// How many times the number of sets in use has doubled from 2^[`START_SET_BITS`] (up to
    /// 2^[`MAX_SET_BITS`]): each time the evictions since the last doubling reached the
    /// number of sets in use.
    doublings: AtomicU32,
    /// The fills that overwrote a live rule (see [`Cache::evicted`]). Written on misses only,
    /// but on a cache line of its own, away from the fields every lookup reads.
    evictions: Evictions,
}

#[repr(align(64))]
struct Evictions(AtomicU64);

#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `CACHE`.
const EMPTY_SLOT: Slot = Slot { seq: AtomicU64::new(0), key: AtomicU64::new(0), rule: AtomicU64::new(0) };
#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `CACHE`.
const EMPTY_SET: Set = Set([EMPTY_SLOT; WAYS]);
/// The process's rule cache.
static CACHE: Cache = Cache {
    sets: [EMPTY_SET; 1 << MAX_SET_BITS],
    generation: AtomicU64::new(0),
    doublings: AtomicU32::new(0),
    evictions: Evictions(AtomicU64::new(0)),
};
/// The number of libraries unloaded, as last seen by [`invalidate_if_unloaded`].
static UNLOADS: AtomicU64 = AtomicU64::new(0);

/// The set of code address `pc` when `1 << set_bits` sets are in use: the top bits of a
/// multiplicative hash, which spread runs of nearby addresses evenly over the sets. When the
/// sets in use double, the rules of set `i` belong in sets `2i` and `2i + 1`: they are misses
/// until cached again, once per doubling (at most four times). (Keeping half of them where
/// they are takes a hash whose low bits spread as well, such as these bits reversed: a dozen
/// more instructions on every lookup.)
fn set_index(pc: u64, set_bits: u32) -> usize {
    // In two shifts, so that the compiler sees an index below 2^MAX_SET_BITS (no bounds check).
    (pc.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - MAX_SET_BITS) >> (MAX_SET_BITS - set_bits)) as usize
}

impl Slot {
    /// The slot's rule if it holds `key`'s (a slot being written holds nothing).
    #[inline(always)]
    fn get(&self, key: u64) -> Option<Rule> {
        let seq = self.seq.load(Ordering::Acquire);
        let (cached_key, rule) = (self.key.load(Ordering::Relaxed), self.rule.load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        (seq.is_multiple_of(2) && cached_key == key && self.seq.load(Ordering::Relaxed) == seq)
            .then(|| Rule::unpack(rule))
    }

    /// Store `key`'s rule unless another thread is writing the slot (then it is not cached).
    fn put(&self, key: u64, rule: Rule) {
        let seq = self.seq.load(Ordering::Relaxed);
        if seq.is_multiple_of(2)
            && self.seq.compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed).is_ok()
        {
            fence(Ordering::Release);
            self.key.store(key, Ordering::Relaxed);
            self.rule.store(rule.pack(), Ordering::Relaxed);
            self.seq.store(seq + 2, Ordering::Release);
        }
    }

    /// Whether the slot, in set `index` of `1 << set_bits`, holds a rule that a lookup can
    /// find: one of the current generation (`key`'s), of an address of this set (after the
    /// sets in use doubled, a set's rules are of addresses that now look elsewhere).
    fn is_live(&self, key: u64, index: usize, set_bits: u32) -> bool {
        let cached = self.key.load(Ordering::Relaxed);
        cached >> 48 == key >> 48 && set_index(cached & PC_BITS, set_bits) == index
    }
}

impl Cache {
    /// A code address tagged with the generation in the bits above 2^48 (user-space addresses
    /// below 2^47 only: others are never cached), counted from 1: an empty slot, all zero,
    /// holds no one's rule.
    fn key(&self, pc: u64) -> u64 {
        pc | (self.generation.load(Ordering::Relaxed) + 1) << 48
    }

    /// log2 of the number of sets in use.
    fn set_bits(&self) -> u32 {
        START_SET_BITS + self.doublings.load(Ordering::Relaxed)
    }

    /// The rule for code address `pc`: cached, or computed from the unwind tables and cached.
    #[inline(always)]
    fn rule_for(&self, pc: u64) -> Rule {
        if pc >> 47 != 0 {
            return uncached_rule(pc);
        }
        let key = self.key(pc);
        let set_bits = self.set_bits();
        let index = set_index(pc, set_bits);
        match self.cached(key, index) {
            Some(rule) => rule,
            None => self.miss(pc, key, index, set_bits),
        }
    }

    /// The rule cached for `key` in set `index`, if any.
    #[inline(always)]
    fn cached(&self, key: u64, index: usize) -> Option<Rule> {
        self.sets[index].0.iter().find_map(|slot| slot.get(key))
    }

    #[cold]
    #[inline(never)]
    fn miss(&self, pc: u64, key: u64, index: usize, set_bits: u32) -> Rule {
        let (rule, cacheable) = rule_from_tables(pc);
        let set = &self.sets[index];
        // (Another thread may have cached it meanwhile: one slot is enough.)
        if cacheable && self.cached(key, index).is_none() {
            let victim = match set.0.iter().position(|slot| !slot.is_live(key, index, set_bits)) {
                Some(free) => free,
                None => self.evicted(set_bits),
            };
            set.0[victim].put(key, rule);
        }
        rule
    }

    /// Count a fill that overwrites a live rule, and double the sets in use (from
    /// `1 << set_bits`) when the evictions since they last doubled reach their number: a
    /// program whose stacks' addresses no longer fit. Returns the way to overwrite: either,
    /// in turn.
    fn evicted(&self, set_bits: u32) -> usize {
        let evictions = self.evictions.0.fetch_add(1, Ordering::Relaxed) + 1;
        // The evictions before `1 << set_bits` sets were in use: 2^START + … + 2^(set_bits−1).
        let before = (1 << set_bits) - (1 << START_SET_BITS);
        if set_bits < MAX_SET_BITS && evictions >= before + (1 << set_bits) {
            // (A lookup or fill that read the old number meanwhile uses a set of the old
            // size: a rule it finds there is still right, keys being whole addresses.)
            let doublings = set_bits - START_SET_BITS;
            let _ = self.doublings.compare_exchange(doublings, doublings + 1, Ordering::Relaxed, Ordering::Relaxed);
        }
        evictions as usize % WAYS
    }

    /// Make every cached rule a miss.
    fn start_generation(&self) {
        // Wraps after 2^16 − 1 generations: an entry that old has long been overwritten.
        let next = (self.generation.load(Ordering::Relaxed) + 1) % 0xFFFF;
        self.generation.store(next, Ordering::Relaxed);
    }
}

/// The rule for an address above user space, which is never cached (the key's generation takes
/// its top bits): out of line, so that a lookup saves no registers for the call.
#[cold]
#[inline(never)]
fn uncached_rule(pc: u64) -> Rule {
    rule_from_tables(pc).0
}

/// The rule for code address `pc`, from the process's cache.
pub(super) fn rule_for(pc: u64) -> Rule {
    CACHE.rule_for(pc)
}

/// Start a new cache generation if a library was unloaded since the last call: its address
/// range may now hold other code. Called by the writer thread and at a start, not on the
/// sampled path (it takes the dynamic loader's lock).
pub(crate) fn invalidate_if_unloaded() {
    if !SUPPORTED {
        return;
    }
    let unloads = crate::runtime::loader::counters().map_or(0, |(_, subs)| subs);
    if UNLOADS.swap(unloads, Ordering::Relaxed) != unloads {
        CACHE.start_generation();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;

    /// A cache of a test's own, new, in a mapping of its own: no page of it is resident until
    /// used (an allocation this aligned would be zeroed by writing it).
    struct Fresh(*mut libc::c_void);

    fn fresh() -> Fresh {
        // SAFETY: a new private anonymous mapping, which nothing else refers to.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                std::mem::size_of::<Cache>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        Fresh(map)
    }

    // SAFETY: a `Fresh` only gives out its `Cache`, whose fields are atomics, as `CACHE`'s are.
    unsafe impl Sync for Fresh {}

    impl std::ops::Deref for Fresh {
        type Target = Cache;
        fn deref(&self) -> &Cache {
            // SAFETY: the mapping is page-aligned, as large as a `Cache` and all zero when new,
            // which is a valid, new `Cache` (atomics only); it lives as long as `self`.
            unsafe { &*(self.0 as *const Cache) }
        }
    }

    impl Drop for Fresh {
        fn drop(&mut self) {
            // SAFETY: the mapping `fresh` made, no longer borrowed.
            unsafe { libc::munmap(self.0, std::mem::size_of::<Cache>()) };
        }
    }

    /// `n` distinct code addresses of this program whose rules may be cached, with the rules.
    fn code_addresses(n: usize) -> Vec<(u64, Rule)> {
        let code = code_addresses as *const () as u64;
        let found: Vec<_> = (code.saturating_sub(32 << 20)..code + (32 << 20))
            .step_by(7)
            .filter_map(|pc| match rule_from_tables(pc) {
                (rule, true) => Some((pc, rule)),
                _ => None,
            })
            .take(n)
            .collect();
        assert_eq!(found.len(), n, "not enough code in this program");
        found
    }

    /// The rule `cache` holds for `pc`, without computing or caching one.
    fn cached(cache: &Cache, pc: u64) -> Option<Rule> {
        cache.cached(cache.key(pc), set_index(pc, cache.set_bits()))
    }

    /// The pages of `cache`'s sets that are resident (`mincore`), and the pages of the sets in
    /// use.
    fn resident_pages(cache: &Cache) -> (usize, usize) {
        const PAGES: usize = std::mem::size_of::<[Set; 1 << MAX_SET_BITS]>() / PAGE;
        let mut flags = [0u8; PAGES];
        let sets = cache.sets.as_ptr() as *mut libc::c_void;
        // SAFETY: `sets` is the page-aligned start of `PAGES` pages of `cache`, and `flags`
        // has room for one answer per page.
        assert_eq!(unsafe { libc::mincore(sets, PAGES * PAGE, flags.as_mut_ptr()) }, 0);
        let in_use = (std::mem::size_of::<Set>() << cache.set_bits()).div_ceil(PAGE);
        (flags.iter().filter(|&&flag| flag & 1 != 0).count(), in_use)
    }

    /// A cache starts with one page of sets in use, which a short program's few dozen
    /// addresses keep it at; a few hundred double it a few times. The sets not in use are
    /// never read or written, so they never become resident.
    #[test]
    fn a_cache_grows_only_as_its_addresses_need() {
        if !SUPPORTED {
            return;
        }
        let cache = fresh();
        let addresses = code_addresses(300);
        let fill = |addresses: &[(u64, Rule)]| {
            for &(pc, rule) in addresses {
                assert_eq!(cache.rule_for(pc), rule);
                assert_eq!(cache.rule_for(pc), rule);
            }
        };
        fill(&addresses[..40]);
        assert_eq!(cache.set_bits(), START_SET_BITS);
        assert_eq!(resident_pages(&cache), (1, 1));
        fill(&addresses[40..]);
        let (resident, in_use) = resident_pages(&cache);
        println!("300 addresses: {} sets in use, {resident} of their {in_use} pages resident", 1 << cache.set_bits());
        assert!((START_SET_BITS + 1..=START_SET_BITS + 3).contains(&cache.set_bits()), "{}", cache.set_bits());
        assert!(resident <= in_use, "{resident} pages resident, {in_use} in use");
    }

    /// The process's cache, however the walks of this process's tests grew it, is resident
    /// only where its sets are in use.
    #[test]
    fn the_process_cache_is_resident_only_where_in_use() {
        if !SUPPORTED {
            return;
        }
        for (pc, rule) in code_addresses(40) {
            assert_eq!(rule_for(pc), rule);
        }
        let (resident, in_use) = resident_pages(&CACHE);
        println!("{resident} of the cache's pages resident, {in_use} in use");
        assert!(resident <= in_use, "{resident} pages resident, {in_use} in use");
    }

    #[test]
    fn two_addresses_of_one_set_are_both_cached() {
        if !SUPPORTED {
            return;
        }
        let cache = fresh();
        let first = rule_for as *const () as u64 + 1;
        let index = |pc: u64| set_index(pc, START_SET_BITS);
        // Another address of this program's code in the same set (one in 64 is).
        let second = (first + 1..first + (64 << 20))
            .find(|&pc| index(pc) == index(first) && rule_from_tables(pc).1)
            .expect("an address sharing the set");
        assert_eq!(cache.rule_for(first), rule_from_tables(first).0);
        assert_eq!(cache.rule_for(second), rule_from_tables(second).0);
        assert_eq!(cached(&cache, first), Some(rule_from_tables(first).0));
        assert_eq!(cached(&cache, second), Some(rule_from_tables(second).0));
    }

    /// Filling more addresses than the sets in use hold evicts, and evicting doubles them,
    /// up to the whole table; the rules cached since are found and right.
    #[test]
    fn many_distinct_addresses_grow_the_cache_and_keep_their_rules() {
        if !SUPPORTED {
            return;
        }
        let cache = fresh();
        let addresses = code_addresses(80_000);
        let mut grew_at = Vec::new();
        for (n, &(pc, rule)) in addresses.iter().enumerate() {
            let before = cache.set_bits();
            assert_eq!(cache.rule_for(pc), rule);
            if cache.set_bits() != before {
                grew_at.push(n);
            }
        }
        println!("the sets in use doubled after filling addresses {grew_at:?}");
        assert_eq!(cache.set_bits(), MAX_SET_BITS);
        assert_eq!(grew_at.len(), (MAX_SET_BITS - START_SET_BITS) as usize, "one step at a time");
        // Not before there were about as many addresses as the sets in use have slots.
        assert!(grew_at[0] > 1 << START_SET_BITS, "{grew_at:?}");
        // The last addresses filled (a quarter of the full table's slots) are nearly all
        // still cached, each with its own rule; and every address still gets its rule.
        let recent = &addresses[addresses.len() - (WAYS << MAX_SET_BITS) / 4..];
        let hits = recent
            .iter()
            .filter(|&&(pc, rule)| cached(&cache, pc).inspect(|&got| assert_eq!(got, rule)).is_some())
            .count();
        assert!(hits * 10 >= recent.len() * 9, "{hits} of {} recent addresses cached", recent.len());
        for &(pc, rule) in &addresses {
            assert_eq!(cache.rule_for(pc), rule);
        }
    }

    /// Threads filling and looking up rules while the cache grows, and while new generations
    /// start, only ever get each address's own rule.
    #[test]
    fn concurrent_fills_and_lookups_during_growth_give_only_correct_rules() {
        if !SUPPORTED {
            return;
        }
        let cache = fresh();
        let addresses = code_addresses(40_000);
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..4)
                .map(|t| {
                    let (cache, addresses) = (&cache, &addresses);
                    scope.spawn(move || {
                        // Each thread its own order: some addresses hit, some miss, some race.
                        for round in 0..3 {
                            let stride = [1, 7, 13, 29][(t + round) % 4];
                            for i in 0..addresses.len() {
                                let (pc, rule) = addresses[i * stride % addresses.len()];
                                assert_eq!(cache.rule_for(pc), rule, "at {pc:#x}");
                            }
                        }
                    })
                })
                .collect();
            scope.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    cache.start_generation();
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            });
            for worker in workers {
                let result = worker.join();
                done.store(true, Ordering::Relaxed);
                result.unwrap();
            }
        });
        assert!(cache.set_bits() > START_SET_BITS, "the cache grew meanwhile");
    }

    #[test]
    fn unloading_a_library_starts_a_new_cache_generation() {
        if !SUPPORTED {
            return;
        }
        let generation = || CACHE.generation.load(Ordering::Relaxed);
        invalidate_if_unloaded();
        let before = generation();
        invalidate_if_unloaded();
        assert_eq!(generation(), before, "nothing unloaded");
        // A glibc library that nothing else loads, so that closing it unloads it.
        // SAFETY: loading and unloading a C library with no constructors of note.
        let handle = unsafe { libc::dlopen(c"libBrokenLocale.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            crate::test_skip::skip("libBrokenLocale.so.1 not found (glibc's libc6 package)");
            return;
        }
        // SAFETY: the handle just returned by dlopen, closed once.
        unsafe { libc::dlclose(handle) };
        invalidate_if_unloaded();
        // (A writer thread of another test may have noticed the unload first.)
        assert_ne!(generation(), before);
    }
}
