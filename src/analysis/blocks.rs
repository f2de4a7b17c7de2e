//! Sampled blocks: each sampled allocation of a trace with when it was allocated and when
//! it was freed, streamed in one pass, and the one definition of the peak of the live total.
//!
//! A block is what the [filter](super::filter) judges and what the report page embeds.
//! Times are µs since the trace start. A block is complete, and handed on, when it is
//! collected (or its id is reused by a new allocation, which frees it at that time) and,
//! for the blocks still live, at the end of the trace; so memory grows with the live
//! blocks and the distinct stacks (a [`StackTrie`]), not with the trace's length.
//!
//! # The peak
//!
//! Events at one timestamp happen at once: the live total *at* a time counts every event
//! with that timestamp, the same rule as [`Block::live_at`]. The peak is the first time
//! whose live total is the highest ([`PeakFinder`]); the analysis pass uses the same
//! finder, so "live at the peak" selects exactly the blocks whose samples make the peak.

use std::io::Read;

use super::stacks::{StackInterner, StackTrie};
use crate::format::hash::FastMap;
use crate::format::trace::{AllocSource, EventKind, ObjectId, Reader, Timestamp};
use crate::Result;

/// Events between two progress updates (of this stream and of the analysis pass).
pub(super) const PROGRESS_EVERY: u64 = 1 << 14;

/// A sampled allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// When it was allocated, µs since the trace start.
    pub alloc_us: u64,
    /// When it was freed, µs since the trace start; `None` if it is live at the end.
    pub free_us: Option<u64>,
    /// Size in words (the format's unit; [`crate::trace::Info::word_size`] bits each).
    pub words: u64,
    /// Samples (the byte estimate is [`crate::trace::Info::bytes_for_samples`]).
    pub nsamples: u64,
    /// The block's stack: a node of [`Stacks::trie`] (the same node as in an analysis of
    /// the same trace, [`Analysis::trie`](super::Analysis::trie)).
    pub stack: u32,
    /// Allocated before the trace began: one of the blocks live at its start, which it begins
    /// with ([`Info::begins_with_live_blocks`](crate::trace::Info::begins_with_live_blocks)),
    /// live but not allocated in it.
    pub carried: bool,
}

impl Block {
    /// Allocated at or before `t` and not freed by `t` (a block freed at `t` is gone).
    pub fn live_at(&self, t: u64) -> bool {
        self.alloc_us <= t && self.free_us.is_none_or(|f| f > t)
    }

    /// Time from allocation to free, `None` (infinite) if never freed.
    pub fn lifetime(&self) -> Option<u64> {
        self.free_us.map(|f| f.saturating_sub(self.alloc_us))
    }
}

/// Finds the peak of a live total that changes event by event (see the
/// [module documentation](self)): the state after the last event of a timestamp counts.
#[derive(Debug, Clone, Copy)]
pub struct PeakFinder {
    /// The timestamp of the events seen last, whose total is not yet final.
    current: Option<Timestamp>,
    /// The highest final total so far, and when it was first reached.
    best: u128,
    best_time: Timestamp,
}

impl PeakFinder {
    /// A finder whose peak is zero at `start` until a higher total is seen.
    pub fn new(start: Timestamp) -> PeakFinder {
        PeakFinder { current: None, best: 0, best_time: start }
    }

    /// Call before applying an event at `time` (or with `None` after the last event), with
    /// the live total after every earlier event. True when that total, now final for the
    /// previous timestamp, is a new peak.
    pub fn settle(&mut self, time: Option<Timestamp>, live: u128) -> bool {
        if time.is_some() && time == self.current {
            return false;
        }
        let raised = match self.current {
            Some(t) if live > self.best => {
                self.best = live;
                self.best_time = t;
                true
            }
            _ => false,
        };
        self.current = time;
        raised
    }

    /// The highest total (exact) and when it was first reached.
    pub fn peak(&self) -> (u128, Timestamp) {
        (self.best, self.best_time)
    }
}

/// The distinct stacks of the streamed blocks and what the stream saw.
#[derive(Debug, Clone, Default)]
pub struct Stacks {
    /// The location codes of the stacks.
    pub trie: StackTrie,
    /// Time of the last event, µs since the start.
    pub end_us: u64,
    /// Events read.
    pub events: u64,
    /// The peak of the live total, µs since the start, and its samples.
    pub peak_us: u64,
    /// Live samples at the peak (saturating at `u64::MAX`).
    pub peak_samples: u64,
    /// Whether the trace has OCaml events (minor or major allocations, promotions) and
    /// external allocations: what [`Origin::of`](super::Origin::of) needs.
    pub ocaml_events: bool,
    /// See `ocaml_events`.
    pub external_allocs: bool,
}

/// Read every event of `reader` and hand each complete block to `each`, calling `progress` now and then with the number of bytes read (as
/// [`Analysis::from_reader`](super::Analysis::from_reader) does). The reader's locations
/// and warnings are left for the caller.
pub fn stream<R: Read>(
    reader: &mut Reader<R>,
    mut each: impl FnMut(&Block),
    mut progress: impl FnMut(u64),
) -> Result<Stacks> {
    reader.set_decode_backtraces(true);
    let start = reader.info().start_time;
    let carries = reader.info().begins_with_live_blocks();
    let mut interner = StackInterner::default();
    let mut stacks = Stacks::default();
    let mut live: FastMap<ObjectId, Block> = FastMap::default();
    let mut live_total: u128 = 0;
    let mut peak = PeakFinder::new(start);
    let free = |block: &mut Block, t: u64, live_total: &mut u128| {
        block.free_us = Some(t);
        *live_total = live_total.saturating_sub(u128::from(block.nsamples));
    };
    while let Some(event) = reader.next_event()? {
        peak.settle(Some(event.time), live_total);
        stacks.events += 1;
        let t = event.time.saturating_sub(start);
        stacks.end_us = t;
        match event.kind {
            EventKind::Alloc(a) => {
                match a.source {
                    _ if carries && a.source == AllocSource::Major => {}
                    AllocSource::External => stacks.external_allocs = true,
                    AllocSource::Minor | AllocSource::Major => stacks.ocaml_events = true,
                }
                let stack = interner.intern(event.domain, &a);
                let carried = carries && a.source == AllocSource::Major;
                let block = Block { alloc_us: t, free_us: None, words: a.length, nsamples: a.nsamples, stack, carried };
                live_total = live_total.saturating_add(u128::from(a.nsamples));
                if let Some(mut old) = live.insert(a.id, block) {
                    // A reused id: the old object is gone.
                    free(&mut old, t, &mut live_total);
                    each(&old);
                }
            }
            EventKind::Collect { id } => {
                if let Some(mut block) = live.remove(&id) {
                    free(&mut block, t, &mut live_total);
                    each(&block);
                }
            }
            EventKind::Promote { .. } => stacks.ocaml_events = true,
        }
        if stacks.events.is_multiple_of(PROGRESS_EVERY) {
            progress(reader.bytes_read());
        }
    }
    peak.settle(None, live_total);
    let (samples, time) = peak.peak();
    stacks.peak_us = time.saturating_sub(start);
    stacks.peak_samples = u64::try_from(samples).unwrap_or(u64::MAX);
    let mut remaining: Vec<Block> = live.into_values().collect();
    remaining.sort_unstable_by_key(|b| b.alloc_us);
    remaining.iter().for_each(each);
    stacks.trie = interner.finish();
    Ok(stacks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_counts_every_event_at_its_timestamp() {
        let mut p = PeakFinder::new(0);
        // At t=5: +3 then −3 at the same time; the total at 5 is 0, not 3.
        assert!(!p.settle(Some(5), 0));
        assert!(!p.settle(Some(5), 3));
        assert!(!p.settle(Some(6), 0));
        // At t=6: +2; final when t=7 arrives.
        assert!(p.settle(Some(7), 2));
        assert!(!p.settle(None, 2), "an equal total later is not a new peak");
        assert_eq!(p.peak(), (2, 6));
    }

    #[test]
    fn live_at_and_lifetime() {
        let b = Block { alloc_us: 10, free_us: Some(20), words: 1, nsamples: 1, stack: 0, carried: false };
        assert!(!b.live_at(9) && b.live_at(10) && b.live_at(19) && !b.live_at(20));
        assert_eq!(b.lifetime(), Some(10));
        assert_eq!(Block { free_us: None, ..b }.lifetime(), None);
    }
}
