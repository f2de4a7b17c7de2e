//! The read loop allocates nothing per event: a counting global allocator shows that reading
//! a trace with twice the events costs no more allocations than reading the first half,
//! with and without backtrace decoding, and with every frame looked up.
//!
//! The allocator counts per thread, so the tests of this file can run in parallel.

use crate::util::counting_alloc::allocations;
use crate::util::traces::{craft, generate_trace, TraceSpec};
use memtrace_rs::trace::{EventKind, Reader};

/// Read every event of `bytes`, looking up every frame; returns (events, allocations made
/// during the read loop, i.e. after `Reader::new`).
fn count_read(bytes: &[u8], decode: bool) -> (u64, u64) {
    let mut reader = Reader::new(bytes).unwrap();
    reader.set_decode_backtraces(decode);
    let before = allocations();
    let mut events = 0u64;
    let mut frames = 0u64;
    while let Some(event) = reader.next_event().unwrap() {
        events += 1;
        if let EventKind::Alloc(alloc) = event.kind {
            for &code in alloc.backtrace {
                frames += event.locations.get(code).unwrap().len() as u64 + 1;
            }
        }
    }
    let used = allocations() - before;
    assert!(reader.warnings().is_empty());
    assert_eq!(frames > 0, decode);
    (events, used)
}

#[test]
fn reading_allocates_nothing_per_event() {
    // The generator is deterministic, so the first `n` events of the larger trace are the
    // events of the smaller one.
    let n = 100_000;
    let small = generate_trace(&TraceSpec::large(n));
    let large = generate_trace(&TraceSpec::large(2 * n));
    assert_eq!(small.events, n as u64);
    for decode in [true, false] {
        let (small_events, small_allocs) = count_read(&small.bytes, decode);
        let (large_events, large_allocs) = count_read(&large.bytes, decode);
        // Reading the same trace again costs exactly the same.
        assert_eq!(count_read(&large.bytes, decode), (large_events, large_allocs));
        assert_eq!((small_events, large_events), (n as u64, 2 * n as u64));
        eprintln!(
            "decode={decode}: {small_events} events -> {small_allocs} allocations, \
             {large_events} events -> {large_allocs} allocations ({} location codes)",
            small.locations.len()
        );
        // Allocations come from location events (a new code's list is stored; a code
        // re-sent after a cache eviction is decoded into fresh name buffers and compared)
        // and from growing buffers, never from alloc/promote/collect events themselves:
        // the second half of the events must cost almost nothing (< 1 per 100 events;
        // measured: ~180 for 100 000 events, all from re-sent location codes).
        let extra = large_allocs.saturating_sub(small_allocs);
        assert!(
            extra <= (large_events - small_events) / 100,
            "allocations grow with events: {small_allocs} for {small_events} events, \
             {large_allocs} for {large_events}"
        );
        // And what the first half costs is bounded by the distinct location codes (a
        // handful of allocations per stored list), not by the events.
        let codes = small.locations.len() as u64;
        assert!(small_allocs < 8 * codes + 1000, "{small_allocs} allocations for {codes} location codes");
    }
}

/// A location list whose records all refer (with 6-byte records) to one long file name
/// already in the move-to-front table must not cost the name's length per record: the
/// decoded location table would otherwise be hundreds of times larger than the input,
/// so a few megabytes of crafted (or corrupt) trace could claim gigabytes.
#[test]
fn location_memory_is_proportional_to_input() {
    let (start, pid) = (1_000_000u64, 7u64);
    let mut trace = craft::info_packet(start, pid);
    let long_name = vec![b'x'; 60_000];
    let mut content = Vec::new();
    for code in 0..16u64 {
        content.extend_from_slice(&craft::event(1, start));
        content.extend_from_slice(&(0x1000 + code).to_le_bytes());
        content.push(255);
        for i in 0..255 {
            // line 1; file code 31 (new) for the very first record, else 0; defname the same.
            let codes: u64 = if code == 0 && i == 0 { 31 << 38 | 31 << 43 } else { 0 };
            let packed = 1 | codes;
            content.extend_from_slice(&(packed as u32).to_le_bytes());
            content.extend_from_slice(&((packed >> 32) as u16).to_le_bytes());
            if code == 0 && i == 0 {
                content.extend_from_slice(&long_name);
                content.push(0);
                content.extend_from_slice(b"f\0");
            }
        }
    }
    trace.extend(craft::packet(&craft::Header::new(pid, start), &content));
    let input = trace.len() as i64;

    let base = crate::util::counting_alloc::live_bytes();
    crate::util::counting_alloc::reset_peak();
    let mut reader = Reader::new(&trace[..]).unwrap();
    let result = reader.next_event().map(|e| e.is_none());
    let peak = crate::util::counting_alloc::peak_since(base);
    drop(reader);
    eprintln!("input {input} bytes, peak memory while reading {peak} bytes, result {result:?}");
    assert!(peak < 64 * input + (4 << 20), "reading {input} bytes of trace took {peak} bytes of memory");
}
