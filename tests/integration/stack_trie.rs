//! The analysis's trie of stacks (`memtrace_rs::analysis::stacks`): it gives every
//! allocation the stack the reader decoded (several domains, shared prefixes, backtraces
//! cut by the writer's budget), and its memory is linear in a trace whose every stack is
//! one frame longer than the last, where whole stacks would be quadratic.
use std::collections::HashMap;
use std::io::Cursor;

use memtrace_rs::analysis::stacks::{NodeId, StackInterner};
use memtrace_rs::analysis::{self, Analysis, Grouping, Measure, Options};
use memtrace_rs::trace::{AllocSource, EventKind, NewAlloc, Reader, Writer};

use crate::util::counting_alloc::{live_bytes, peak_since, reset_peak};
use crate::util::handmade::ever_deeper;
use crate::util::traces::{locations_for, test_info, Rng};

/// A trace of random stacks on three domains: each domain's stack loses some inner frames
/// and gains new ones (codes from a small pool, so that stacks meet again), now and then
/// 500 new frames at once, past what the writer's 4096-byte budget encodes (FORMAT.md
/// §7.5), so that later stacks share more than the reader's cut copy holds (§7.7).
fn random_trace(seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let start = 1_700_000_000_000_000;
    let mut w = Writer::new(Vec::new(), &test_info(start, 4242)).unwrap();
    // Outermost first.
    let mut stacks: Vec<Vec<u64>> = vec![Vec::new(); 3];
    let mut fresh = 1 << 20;
    for i in 0..3_000 {
        let domain = rng.index(3);
        let stack = &mut stacks[domain];
        let keep = stack.len() - rng.index(stack.len().min(6) + 1);
        stack.truncate(keep);
        if rng.percent(1) {
            stack.extend((0..500).map(|_| {
                fresh += 1;
                fresh
            }));
        } else {
            stack.extend((0..rng.index(4)).map(|_| 0x1000 + rng.below(40)));
        }
        let callstack: Vec<u64> = stack.iter().rev().copied().collect();
        let alloc = NewAlloc { length: 1, nsamples: 1, source: AllocSource::External, callstack: &callstack, drop: 0 };
        w.put_alloc(domain as u16, start + i, &alloc, locations_for).unwrap();
    }
    w.close().unwrap()
}

#[test]
fn the_trie_gives_every_allocation_its_decoded_stack() {
    let mut cut = 0;
    for seed in 0..12 {
        let trace = random_trace(seed);
        let mut reader = Reader::new(Cursor::new(&trace)).unwrap();
        let mut interner = StackInterner::default();
        let mut node_of: HashMap<Vec<u64>, NodeId> = HashMap::new();
        let mut allocs: HashMap<Vec<u64>, u64> = HashMap::new();
        let mut previous: HashMap<u16, usize> = HashMap::new();
        while let Some(event) = reader.next_event().unwrap() {
            if let EventKind::Alloc(a) = event.kind {
                let node = interner.intern(event.domain, &a);
                assert_eq!(interner.trie().codes(node), a.backtrace, "seed {seed}");
                let flat = a.backtrace.to_vec();
                assert_eq!(*node_of.entry(flat.clone()).or_insert(node), node, "one node per stack (seed {seed})");
                *allocs.entry(flat).or_default() += 1;
                let before = previous.insert(event.domain, a.backtrace.len()).unwrap_or(0);
                cut += usize::from(a.common_prefix as usize > before);
            }
        }
        // The analysis's stacks are the same, with the same counts.
        let reader = Reader::new(Cursor::new(&trace)).unwrap();
        let a = Analysis::from_reader(reader, &Options { stacks: true, live_at: None }, |_| {}).unwrap();
        let stacks: HashMap<Vec<u64>, u64> = a.stacks.iter().map(|s| (a.trie.codes(s.node), s.stats.allocs)).collect();
        assert_eq!(stacks, allocs, "seed {seed}");
    }
    assert!(cut > 0, "no backtrace was cut by the writer's budget: §7.7 went untested");
}

/// Stacks of [`the_analysis_of_ever_deeper_stacks_takes_linear_memory`]'s trace.
const DEEPER: u64 = 40_000;

#[test]
fn the_analysis_of_ever_deeper_stacks_takes_linear_memory() {
    // 40 000 stacks of 1 to 40 000 frames: 800 million frames, 6.4 GB of location codes if
    // each stack were kept whole; each allocation adds one frame to the one before.
    let trace = ever_deeper(DEEPER);
    let base = live_bytes();
    reset_peak();
    let reader = Reader::new(Cursor::new(&trace)).unwrap();
    let a = Analysis::from_reader(reader, &Options { stacks: true, live_at: None }, |_| {}).unwrap();
    let sites = analysis::ranked(&a, Grouping { stacks: true, ..Default::default() }, Measure::Allocated);
    let peak = peak_since(base);
    assert_eq!(a.stacks.len(), DEEPER as usize);
    assert_eq!(sites.len(), DEEPER as usize);
    let codes: Vec<u64> = (0..DEEPER).map(|i| 0x10_0000 + i).collect();
    assert_eq!(a.trie.codes(a.stacks[DEEPER as usize - 1].node), codes);
    // About 60 bytes per node in the analysis and 50 per site: tens of MiB, not gigabytes.
    assert!(peak < 64 << 20, "analysing {DEEPER} ever deeper stacks took {} MiB", peak >> 20);
    eprintln!("{DEEPER} ever deeper stacks: {} MiB at the peak", peak >> 20);
}
