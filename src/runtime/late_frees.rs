//! Frees of sampled blocks that found the hand-off queue full, or too little stack to send a
//! message (a coroutine's stack, of unknown extent): a lock-free set of addresses that the
//! writer takes them from, so that a block's free is not lost (and the block left alive in the
//! trace) when the writer is far behind or the freeing thread short of stack.
//!
//! A free never waits for the writer (see `handoff`); when the queue has no room, the freeing
//! thread puts the block's key, tagged with its session ([`SessionTag`]: the low bits a
//! block's key leaves free), in a free slot near the address's hash, and the
//! writer writes the free later: at a round after it has written the block's alloc (queued
//! before the free), or before a sampled block at the same address, so that a reuse of the
//! address never reaches the trace ahead of the free. Only when every slot near the address
//! is taken is the free lost, and counted.
//!
//! The slots live in `.bss` (512 KiB), and only those a free has used become resident; the
//! writer looks through them only while [`PENDING`] says some are taken.

use std::sync::atomic::{AtomicUsize, Ordering};

#[cfg(test)]
use super::sampled_set::SAMPLED_ALIGN;
use super::sampled_set::{address_hash, SessionTag, FIBONACCI, TAG_MASK};

/// Slots in all.
const SLOTS: usize = 1 << 16;
/// Slots a free tries, from its address's hash on.
const PROBES: usize = 64;

#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `LATE`.
const EMPTY: AtomicUsize = AtomicUsize::new(0);
/// The addresses of late frees, tagged with their session; 0 marks a free slot.
static LATE: [AtomicUsize; SLOTS] = [EMPTY; SLOTS];
/// Slots taken (an upper bound while a free is being put in).
static PENDING: AtomicUsize = AtomicUsize::new(0);

/// The first slot `addr` tries.
fn home(addr: usize) -> usize {
    address_hash(addr, FIBONACCI, SLOTS.trailing_zeros())
}

/// The slots `addr` may be in.
fn probes(addr: usize) -> impl Iterator<Item = &'static AtomicUsize> {
    let start = home(addr);
    (0..PROBES).map(move |i| &LATE[(start + i) % SLOTS])
}

/// Note the free of the sampled block of key `addr` (`sampled_set::block_key`) of the
/// session of `tag`, for the writer. False when no slot near the address is free.
pub(crate) fn put(addr: usize, tag: SessionTag) -> bool {
    let entry = addr | tag;
    PENDING.fetch_add(1, Ordering::AcqRel);
    let put = probes(addr).any(|slot| {
        slot.load(Ordering::Relaxed) == 0
            && slot.compare_exchange(0, entry, Ordering::Release, Ordering::Relaxed).is_ok()
    });
    if !put {
        PENDING.fetch_sub(1, Ordering::AcqRel);
    }
    put
}

/// Take the late free of the block at `addr` of the session of `tag`, if there is one: the
/// writer asks before it writes a sampled block at an address it still holds alive.
pub(crate) fn take(addr: usize, tag: SessionTag) -> bool {
    if PENDING.load(Ordering::Acquire) == 0 {
        return false;
    }
    let entry = addr | tag;
    let taken = probes(addr).any(|slot| {
        slot.load(Ordering::Acquire) == entry
            && slot.compare_exchange(entry, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    });
    if taken {
        PENDING.fetch_sub(1, Ordering::AcqRel);
    }
    taken
}

/// Take the late frees of the session of `tag` that `written` writes: it is called with the
/// address of each, and says whether it wrote the free (a late free whose block's alloc is still
/// queued behind stays for later). Those of other sessions are dropped: their sessions are
/// over. Looks at the slots only if some are taken; only the writer takes them.
pub(crate) fn drain(tag: Option<SessionTag>, mut written: impl FnMut(usize) -> bool) {
    if PENDING.load(Ordering::Acquire) == 0 {
        return;
    }
    for slot in &LATE {
        let entry = slot.load(Ordering::Acquire);
        if entry == 0 {
            continue;
        }
        let (addr, of) = (entry & !TAG_MASK, entry & TAG_MASK);
        if Some(of) != tag || written(addr) {
            slot.store(0, Ordering::Release);
            PENDING.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The set is process-wide: the tests take turns.
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn late_frees_are_taken_once_by_address_or_drained_by_session() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let (a, b, c) = (0x7100_0000_1000, 0x7100_0000_2000, 0x7100_0000_3000);
        assert!(put(a, 3) && put(b, 3) && put(c, 4));
        assert!(take(a, 3));
        assert!(!take(a, 3), "taken twice");
        assert!(!take(c, 3), "another session's");
        let mut offered = Vec::new();
        // Not written the first time: kept for the next drain.
        drain(Some(3), |addr| {
            offered.push(addr);
            false
        });
        drain(Some(3), |addr| {
            offered.push(addr);
            true
        });
        assert_eq!(offered, [b, b]);
        assert_eq!(PENDING.load(Ordering::Relaxed), 0);
        drain(Some(4), |_| panic!("drained twice"));
    }

    /// Frees of addresses that share a slot go to the next ones, up to [`PROBES`] of them.
    #[test]
    fn a_crowded_neighbourhood_refuses_only_past_its_probes() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let first = 0x7200_0000_0000;
        let same: Vec<usize> =
            (0..).map(|i| first + i * SAMPLED_ALIGN).filter(|&a| home(a) == home(first)).take(PROBES + 1).collect();
        for &addr in &same[..PROBES] {
            assert!(put(addr, 1));
        }
        assert!(!put(same[PROBES], 1), "more than the probes");
        assert!(same[..PROBES].iter().all(|&addr| take(addr, 1)));
        assert_eq!(PENDING.load(Ordering::Relaxed), 0);
    }
}
