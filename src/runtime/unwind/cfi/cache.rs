//! The rule cache: a static, 2-way set-associative table of rules by code address, each slot a
//! sequence lock, with generations that an unload of a library starts anew.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use super::rule::Rule;
use super::tables::rule_from_tables;
use super::SUPPORTED;

/// log2 of the number of cache sets.
const SET_BITS: u32 = 14;
/// Slots per set.
const WAYS: usize = 2;

/// One cached rule, under a sequence lock: `seq` is odd while the slot is being written.
/// `key` is the code address tagged with the cache generation (see [`key`]).
#[repr(C, align(32))]
struct Slot {
    seq: AtomicU64,
    key: AtomicU64,
    rule: AtomicU64,
}

/// The slots an address may be cached in: one cache line.
#[repr(C, align(64))]
struct Set([Slot; WAYS]);

#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `CACHE`.
const EMPTY_SLOT: Slot = Slot { seq: AtomicU64::new(0), key: AtomicU64::new(0), rule: AtomicU64::new(0) };
#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `CACHE`.
const EMPTY_SET: Set = Set([EMPTY_SLOT; WAYS]);
/// 16 Ki sets of 2 slots (1 MiB), in `.bss`: only the pages of sets in use become resident.
/// A big program's sampled stacks hold thousands of return addresses; two ways keep a pair of
/// them that share a set from evicting each other on every sample.
static CACHE: [Set; 1 << SET_BITS] = [EMPTY_SET; 1 << SET_BITS];
/// Picks the slot a miss overwrites when both of its set's are in use.
static VICTIM: AtomicU64 = AtomicU64::new(0);
/// The cache generation: rules cached in an earlier one are misses.
static GENERATION: AtomicU64 = AtomicU64::new(1);
/// The number of libraries unloaded, as last seen by [`invalidate_if_unloaded`].
static UNLOADS: AtomicU64 = AtomicU64::new(0);

/// A code address tagged with the generation in the bits above 2^48 (user-space addresses
/// below 2^47 only: others are never cached).
fn key(pc: u64) -> u64 {
    pc | GENERATION.load(Ordering::Relaxed) << 48
}

fn set(pc: u64) -> &'static Set {
    &CACHE[(pc.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SET_BITS)) as usize]
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

    /// Whether the slot holds a rule of the current generation (`key`'s).
    fn in_use(&self, key: u64) -> bool {
        self.key.load(Ordering::Relaxed) >> 48 == key >> 48
    }
}

/// The rule for code address `pc`: cached, or computed from the unwind tables and cached.
pub(super) fn rule_for(pc: u64) -> Rule {
    if pc >> 47 != 0 {
        return rule_from_tables(pc).0;
    }
    let key = key(pc);
    let set = set(pc);
    match set.0.iter().find_map(|slot| slot.get(key)) {
        Some(rule) => rule,
        None => cache_miss(pc, key, set),
    }
}

#[cold]
#[inline(never)]
fn cache_miss(pc: u64, key: u64, set: &Set) -> Rule {
    let (rule, cacheable) = rule_from_tables(pc);
    // (Another thread may have cached it meanwhile: one slot is enough.)
    if cacheable && !set.0.iter().any(|slot| slot.get(key).is_some()) {
        // A slot with nothing of this generation in it, else either, in turn.
        let victim = match set.0.iter().position(|slot| !slot.in_use(key)) {
            Some(free) => free,
            None => VICTIM.fetch_add(1, Ordering::Relaxed) as usize % WAYS,
        };
        set.0[victim].put(key, rule);
    }
    rule
}

/// Start a new cache generation if a library was unloaded since the last call: its address
/// range may now hold other code. Called by the writer thread (it may take the dynamic
/// loader's lock).
pub(crate) fn invalidate_if_unloaded() {
    if !SUPPORTED {
        return;
    }
    let unloads = unloads();
    if UNLOADS.swap(unloads, Ordering::Relaxed) != unloads {
        // Wraps after 2^16 generations: an entry that old has long been overwritten.
        let next = (GENERATION.load(Ordering::Relaxed) + 1) & 0xFFFF;
        GENERATION.store(next.max(1), Ordering::Relaxed);
    }
}

/// The number of objects the dynamic loader has unloaded so far.
fn unloads() -> u64 {
    unsafe extern "C" fn first(info: *mut libc::dl_phdr_info, _size: libc::size_t, out: *mut libc::c_void) -> i32 {
        // SAFETY: the loader passes a valid `dl_phdr_info`, and `out` is the `u64` below.
        unsafe { *out.cast::<u64>() = (*info).dlpi_subs };
        1
    }
    let mut subs: u64 = 0;
    // SAFETY: the callback only reads the info it is given and writes the local `subs`.
    unsafe { libc::dl_iterate_phdr(Some(first), (&mut subs as *mut u64).cast()) };
    subs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::unwind::cfi::tables::rule_from_tables;
    use crate::runtime::unwind::cfi::SUPPORTED;

    /// Held by the tests that look into the cache or change its generation.
    static GENERATION_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn two_addresses_of_one_set_are_both_cached() {
        if !SUPPORTED {
            return;
        }
        let _lock = GENERATION_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let first = rule_for as *const () as u64 + 1;
        let index = |pc: u64| set(pc) as *const Set;
        // Another address of this program's code in the same set (one in 16 Ki is).
        let second = (first + 1..first + (64 << 20))
            .find(|&pc| index(pc) == index(first) && rule_from_tables(pc).1)
            .expect("an address sharing the set");
        // Empty the set (generation 0 is never current), which other tests' walks may use.
        for slot in &set(first).0 {
            slot.put(0, Rule::End);
        }
        let cached = |pc: u64| set(pc).0.iter().any(|slot| slot.get(key(pc)).is_some());
        assert_eq!(rule_for(first), rule_from_tables(first).0);
        assert_eq!(rule_for(second), rule_from_tables(second).0);
        assert!(cached(first) && cached(second));
    }

    #[test]
    fn unloading_a_library_starts_a_new_cache_generation() {
        if !SUPPORTED {
            return;
        }
        let _lock = GENERATION_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        invalidate_if_unloaded();
        let before = GENERATION.load(Ordering::Relaxed);
        invalidate_if_unloaded();
        assert_eq!(GENERATION.load(Ordering::Relaxed), before, "nothing unloaded");
        // A glibc library that nothing else loads, so that closing it unloads it.
        // SAFETY: loading and unloading a C library with no constructors of note.
        let handle = unsafe { libc::dlopen(c"libBrokenLocale.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            println!("libBrokenLocale.so.1 not found: not checked");
            return;
        }
        // SAFETY: the handle just returned by dlopen, closed once.
        unsafe { libc::dlclose(handle) };
        invalidate_if_unloaded();
        // (A writer thread of another test may have noticed the unload first.)
        assert_ne!(GENERATION.load(Ordering::Relaxed), before);
    }
}
