//! Corrupt and truncated traces: every read ends in `Ok` or `Err`, never a panic, within
//! bounded time and memory; and a trace cut after its first packet still delivers every
//! event of its complete packets.
//!
//! The mutants come from a seeded PRNG (`util::traces::Rng`), so failures are reproducible: a
//! failure message names the mutant's seed and mutations.

use std::io::Read;
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::util::traces::{craft, generate_trace, Rng, TraceSpec};
use memtrace_rs::trace::{EventKind, Reader};

/// Number of mutants in [`random_mutations_never_panic`].
const MUTANTS: u64 = 10_000;
/// Most location lookups per read of a mutant (the cap is counted and reported). Only the
/// frames past each backtrace's common prefix are looked up: the others were looked up
/// with an earlier event, and a corrupt trace can make every event repeat a backtrace of
/// up to 2^20 frames through its common prefix.
const MAX_LOOKUPS: u64 = 2_000_000;
/// Limits that no read of a mutant may exceed.
const MAX_READ_TIME: Duration = Duration::from_secs(5);
const MAX_READ_MEMORY: i64 = 256 << 20;

fn data(name: &str) -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)).unwrap()
}

/// A small multi-domain trace from our writer: many packets (domain switches flush),
/// location packets, verifiers, short and long allocs, promotes and collects.
fn small_writer_trace() -> Vec<u8> {
    generate_trace(&TraceSpec::small(3)).bytes
}

struct Source {
    name: &'static str,
    bytes: Vec<u8>,
    /// Relative weight in the choice of what to mutate.
    weight: u64,
}

fn sources() -> Vec<Source> {
    vec![
        Source { name: "writer", bytes: small_writer_trace(), weight: 70 },
        Source { name: "lists_and_sets-v1", bytes: data("lists_and_sets-v1.ctf"), weight: 22 },
        Source { name: "ocamlopt-v2", bytes: data("ocamlopt-v2.ctf"), weight: 4 },
        Source { name: "ocamlopt", bytes: data("ocamlopt.ctf"), weight: 4 },
    ]
}

/// Offsets at which packets start, walking the declared sizes (stops at the first size
/// that does not make sense).
fn packet_starts(bytes: &[u8]) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut at = 0usize;
    while at + 8 <= bytes.len() {
        starts.push(at);
        let bits = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        if bits / 8 < 66 {
            break;
        }
        at += bits / 8;
    }
    starts
}

/// What one read of a trace did.
#[derive(Debug, Default)]
struct ReadSummary {
    opened: bool,
    ok: bool,
    events: u64,
    lookups: u64,
    lookup_cap_hit: bool,
}

/// Read the whole trace, optionally decoding backtraces and looking up every frame.
fn read_all(bytes: &[u8], decode: bool, lookups: bool) -> ReadSummary {
    let mut summary = ReadSummary::default();
    let Ok(mut reader) = Reader::new(bytes) else { return summary };
    summary.opened = true;
    reader.set_decode_backtraces(decode);
    loop {
        match reader.next_event() {
            Ok(Some(event)) => {
                summary.events += 1;
                if let (true, EventKind::Alloc(alloc)) = (lookups, event.kind) {
                    assert!(decode || alloc.backtrace.is_empty());
                    // The frames of the common prefix were looked up with an earlier event.
                    let new = alloc.backtrace.get(alloc.common_prefix as usize..).unwrap_or_default();
                    let mut previous = None;
                    for &code in new {
                        // Runs of one code (recursion, or a corrupt prediction loop) need
                        // one lookup.
                        if previous.replace(code) == Some(code) {
                            continue;
                        }
                        if summary.lookups == MAX_LOOKUPS {
                            summary.lookup_cap_hit = true;
                            break;
                        }
                        summary.lookups += 1;
                        if event.locations.get(code).is_err() {
                            break;
                        }
                    }
                }
            }
            Ok(None) => {
                summary.ok = true;
                break;
            }
            Err(e) => {
                // Errors must be displayable and carry an offset inside (or at the end of)
                // the input.
                let _ = e.to_string();
                if let Some(offset) = e.offset() {
                    assert!(offset <= bytes.len() as u64, "error offset {offset} past the end {}", bytes.len());
                }
                break;
            }
        }
    }
    // Everything else the reader offers must work after an error too.
    let _ = (reader.warnings().len(), reader.is_truncated(), reader.bytes_read(), reader.info().pid);
    for (code, _) in reader.locations().iter().take(100) {
        assert!(reader.lookup_location_code(code).is_ok());
    }
    assert!(reader.bytes_read() <= bytes.len() as u64);
    summary
}

/// Apply one random mutation; returns a description.
fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>) -> String {
    if bytes.is_empty() {
        bytes.push(rng.below(256) as u8);
        return "grow empty".into();
    }
    let len = bytes.len();
    let at = rng.index(len);
    let interesting = [0x00u8, 0x01, 0x02, 0x03, 0x1F, 0x7F, 0x80, 0xFC, 0xFD, 0xFE, 0xFF];
    match rng.below(100) {
        0..=24 => {
            let bit = rng.below(8);
            bytes[at] ^= 1 << bit;
            format!("flip bit {bit} at {at}")
        }
        25..=39 => {
            let v = if rng.percent(50) { interesting[rng.index(interesting.len())] } else { rng.below(256) as u8 };
            bytes[at] = v;
            format!("set byte {at} = {v:#x}")
        }
        40..=54 => {
            // A header field of some packet: most header corruption is caught by the
            // validation, the rest desynchronises decoder state.
            let starts = packet_starts(bytes);
            let p = starts[rng.index(starts.len())];
            let field = [4usize, 8, 16, 28, 30, 38, 40, 42, 44, 52, 60][rng.index(11)];
            let width = rng.index(8) + 1;
            let v = rng.next_u64();
            let mut n = 0;
            for (k, b) in bytes.iter_mut().skip(p + field).take(width).enumerate() {
                *b = if v & 1 == 0 { (v >> (8 * k)) as u8 } else { interesting[(v >> (3 * k)) as usize % 11] };
                n += 1;
            }
            format!("header field {field} of packet at {p}: {n} bytes from {v:#x}")
        }
        55..=64 => {
            let n = 1 + rng.index(8);
            let new: Vec<u8> = (0..n).map(|_| rng.below(256) as u8).collect();
            bytes.splice(at..at, new);
            format!("insert {n} bytes at {at}")
        }
        65..=74 => {
            let n = (1 + rng.index(16)).min(len - at);
            bytes.drain(at..at + n);
            format!("delete {n} bytes at {at}")
        }
        75..=82 => {
            let n = (1 + rng.index(200)).min(len - at);
            let chunk = bytes[at..at + n].to_vec();
            let to = rng.index(len + 1);
            bytes.splice(to..to, chunk);
            format!("duplicate {n} bytes from {at} to {to}")
        }
        83..=90 => {
            // Whole packets: duplicate, drop or swap, which keeps the framing but breaks
            // the decoders' shared state (caches, MTF tables, ids, times).
            let starts = packet_starts(bytes);
            if starts.len() < 3 {
                bytes[at] ^= 0x10;
                return format!("flip bit 4 at {at}");
            }
            let i = 1 + rng.index(starts.len() - 1);
            let end_of = |i: usize| if i + 1 < starts.len() { starts[i + 1] } else { len };
            let packet = bytes[starts[i]..end_of(i)].to_vec();
            match rng.below(3) {
                0 => {
                    let to = starts[1 + rng.index(starts.len() - 1)];
                    bytes.splice(to..to, packet);
                    format!("duplicate packet {i} before offset {to}")
                }
                1 => {
                    bytes.drain(starts[i]..end_of(i));
                    format!("drop packet {i}")
                }
                _ => {
                    let j = 1 + rng.index(starts.len() - 1);
                    let (a, b) = (i.min(j), i.max(j));
                    if a == b {
                        return "swap packet with itself".into();
                    }
                    let pa = bytes[starts[a]..end_of(a)].to_vec();
                    let pb = bytes[starts[b]..end_of(b)].to_vec();
                    let mut out = bytes[..starts[a]].to_vec();
                    out.extend_from_slice(&pb);
                    out.extend_from_slice(&bytes[end_of(a)..starts[b]]);
                    out.extend_from_slice(&pa);
                    out.extend_from_slice(&bytes[end_of(b)..]);
                    *bytes = out;
                    format!("swap packets {a} and {b}")
                }
            }
        }
        _ => {
            bytes.truncate(at);
            format!("truncate at {at}")
        }
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "<non-string panic>".into())
}

/// Totals over the mutants one thread read.
#[derive(Debug, Default)]
struct Tally {
    reads: u64,
    opened: u64,
    ok: u64,
    events: u64,
    lookups: u64,
    cap_hits: u64,
    slowest: Duration,
    largest: i64,
    failures: Vec<String>,
}

/// Mutate and read the mutants `first, first + step, …` below [`MUTANTS`].
fn run_mutants(sources: &[Source], first: u64, step: u64) -> Tally {
    let total_weight: u64 = sources.iter().map(|s| s.weight).sum();
    let mut tally = Tally::default();
    for seed in (first..MUTANTS).step_by(step as usize) {
        let mut rng = Rng::new(seed);
        let mut pick = rng.below(total_weight);
        let source = sources
            .iter()
            .find(|s| {
                let hit = pick < s.weight;
                pick = pick.saturating_sub(s.weight);
                hit
            })
            .unwrap();
        let mut bytes = source.bytes.clone();
        let max_mutations = if rng.percent(80) { 3 } else { 12 };
        let count = 1 + rng.index(max_mutations);
        let mutations: Vec<String> = (0..count).map(|_| mutate(&mut rng, &mut bytes)).collect();
        for decode in [true, false] {
            let base = crate::util::counting_alloc::live_bytes();
            crate::util::counting_alloc::reset_peak();
            let t = Instant::now();
            let result = panic::catch_unwind(AssertUnwindSafe(|| read_all(&bytes, decode, decode)));
            let elapsed = t.elapsed();
            let peak = crate::util::counting_alloc::peak_since(base);
            tally.reads += 1;
            tally.slowest = tally.slowest.max(elapsed);
            tally.largest = tally.largest.max(peak);
            let what = format!("mutant {seed} of {} ({mutations:?}), decode={decode}", source.name);
            match result {
                Ok(summary) => {
                    tally.opened += summary.opened as u64;
                    tally.ok += summary.ok as u64;
                    tally.events += summary.events;
                    tally.lookups += summary.lookups;
                    tally.cap_hits += summary.lookup_cap_hit as u64;
                }
                Err(payload) => tally.failures.push(format!("{what}: panicked: {}", panic_message(&*payload))),
            }
            if elapsed > MAX_READ_TIME {
                tally.failures.push(format!("{what}: took {elapsed:?}"));
            }
            if peak > MAX_READ_MEMORY {
                tally.failures.push(format!("{what}: used {peak} bytes"));
            }
        }
    }
    tally
}

/// 10 000 seeded random mutants of the test traces (mostly of the small ones) are each
/// read twice: decoding backtraces and looking up every new frame, and skipping
/// backtraces. No read may panic, take longer than 5 s, or use more than 256 MiB.
#[test]
fn random_mutations_never_panic() {
    let sources = &sources();
    let started = Instant::now();
    let threads = 2;
    let tallies: Vec<Tally> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads).map(|t| scope.spawn(move || run_mutants(sources, t, threads))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all = Tally::default();
    for t in tallies {
        all.reads += t.reads;
        all.opened += t.opened;
        all.ok += t.ok;
        all.events += t.events;
        all.lookups += t.lookups;
        all.cap_hits += t.cap_hits;
        all.slowest = all.slowest.max(t.slowest);
        all.largest = all.largest.max(t.largest);
        all.failures.extend(t.failures);
    }
    eprintln!(
        "{MUTANTS} mutants, {} reads in {:?}: {} opened, {} read to the end, {} events, {} lookups, \
         slowest read {:?}, most memory {} bytes, lookup cap hit {} times",
        all.reads,
        started.elapsed(),
        all.opened,
        all.ok,
        all.events,
        all.lookups,
        all.slowest,
        all.largest,
        all.cap_hits
    );
    assert_eq!(all.reads, 2 * MUTANTS);
    // The mutants must exercise both outcomes.
    assert!(all.ok > MUTANTS / 10 && all.opened - all.ok > MUTANTS / 10, "{all:?}");
    if !all.failures.is_empty() {
        let n = all.failures.len();
        all.failures.truncate(20);
        panic!("{n} failing reads, the first ones:\n{}", all.failures.join("\n"));
    }
}

/// An event of a complete read, with the end offset of its packet.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    packet_end: u64,
    time: u64,
    domain: u16,
    kind: String,
    backtrace: Vec<u64>,
}

fn read_events(bytes: &[u8]) -> (Vec<Seen>, bool) {
    let mut reader = Reader::new(bytes).unwrap();
    let mut out = Vec::new();
    while let Some(e) = reader.next_event().unwrap_or_else(|e| panic!("read failed: {e}")) {
        let (kind, backtrace) = match e.kind {
            EventKind::Alloc(a) => (
                format!("alloc {} {} {} {:?} {}", a.id, a.length, a.nsamples, a.source, a.common_prefix),
                a.backtrace.to_vec(),
            ),
            other => (format!("{other:?}"), Vec::new()),
        };
        out.push(Seen { packet_end: 0, time: e.time, domain: e.domain, kind, backtrace });
        let end = reader.bytes_read();
        out.last_mut().unwrap().packet_end = end;
    }
    (out, reader.is_truncated())
}

/// Cut the trace at each position of `cuts`: before the end of the first packet the
/// reader must fail to open it; from there on the read must succeed, deliver exactly the
/// events of the packets that are complete, and report truncation iff the cut is not at
/// a packet boundary.
fn check_truncations(name: &str, bytes: &[u8], cuts: impl Iterator<Item = usize>) -> usize {
    let (full, truncated) = read_events(bytes);
    assert!(!truncated);
    let starts = packet_starts(bytes);
    let first_end = starts[1];
    let mut checked = 0;
    for cut in cuts {
        let prefix = &bytes[..cut];
        if cut < first_end {
            assert!(Reader::new(prefix).is_err(), "{name} cut at {cut} inside the first packet opened");
            continue;
        }
        let (events, truncated) = read_events(prefix);
        let want: Vec<&Seen> = full.iter().filter(|e| e.packet_end <= cut as u64).collect();
        assert_eq!(events.len(), want.len(), "{name} cut at {cut}: wrong number of events");
        for (got, want) in events.iter().zip(want) {
            assert_eq!(got, want, "{name} cut at {cut}");
        }
        let at_boundary = starts.contains(&cut) || cut == bytes.len();
        assert_eq!(truncated, !at_boundary, "{name} cut at {cut}: is_truncated");
        checked += 1;
    }
    checked
}

/// Cut positions: every position from 4 bytes before to 72 bytes after each packet
/// boundary (cuts in headers and in first events) when `windows`, else a few positions
/// around each boundary and in each header; and every `step`-th position.
fn cuts(bytes: &[u8], step: usize, windows: bool) -> Vec<usize> {
    let starts = packet_starts(bytes);
    let mut cuts: Vec<usize> = (0..=bytes.len()).step_by(step).collect();
    for &s in starts.iter().chain(std::iter::once(&bytes.len())) {
        if windows {
            cuts.extend(s.saturating_sub(4)..s + 72);
        } else {
            cuts.extend([0, 1, 2, 3, 4, 5, 29, 30, 31, 37, 38, 39, 66, 67, 68, 69, 70, 73].map(|d| s + d));
            cuts.push(s.saturating_sub(1));
        }
    }
    cuts.retain(|&c| c <= bytes.len());
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}

#[test]
fn truncated_writer_trace_keeps_complete_packets() {
    let bytes = small_writer_trace();
    assert!(packet_starts(&bytes).len() > 10);
    let n = check_truncations("writer", &bytes, cuts(&bytes, 17, true).into_iter());
    assert!(n > 1000);
}

#[test]
fn truncated_v1_trace_keeps_complete_packets() {
    let bytes = data("lists_and_sets-v1.ctf");
    check_truncations("lists_and_sets-v1", &bytes, cuts(&bytes, 23, true).into_iter());
}

#[test]
fn truncated_ocamlopt_traces_keep_complete_packets() {
    for name in ["ocamlopt-v2.ctf", "ocamlopt.ctf"] {
        let bytes = data(name);
        check_truncations(name, &bytes, cuts(&bytes, 499, false).into_iter());
    }
}

/// A reader over a stream that returns a few bytes per `read` call sees the same events.
#[test]
fn short_reads_give_the_same_events() {
    struct Trickle<'a> {
        data: &'a [u8],
        rng: Rng,
    }
    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.rng.percent(10) {
                return Err(std::io::ErrorKind::Interrupted.into());
            }
            let n = (1 + self.rng.index(7)).min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }
    for bytes in [small_writer_trace(), data("lists_and_sets-v1.ctf")] {
        let (want, _) = read_events(&bytes);
        let mut reader = Reader::new(Trickle { data: &bytes, rng: Rng::new(1) }).unwrap();
        let mut n = 0;
        while let Some(e) = reader.next_event().unwrap() {
            assert_eq!((e.time, e.domain), (want[n].time, want[n].domain));
            if let EventKind::Alloc(a) = e.kind {
                assert_eq!(a.backtrace, &want[n].backtrace[..]);
            }
            n += 1;
        }
        assert_eq!(n, want.len());
    }
}

// ---------------------------------------------------------------------------------------
// Crafted inputs for specific arithmetic edge cases found while fuzzing. Each builds a
// minimal trace: the trace-info packet and one events packet.
// ---------------------------------------------------------------------------------------

fn read_crafted(trace: &[u8]) -> Result<Vec<String>, String> {
    let mut reader = Reader::new(trace).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    loop {
        match reader.next_event() {
            Ok(Some(e)) => out.push(format!("{:?}", e.kind)),
            Ok(None) => return Ok(out),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// `alloc_id_begin = u64::MAX`, `alloc_id_end = 0` passes the header check (−1 ≤ 0 as
/// i64); one alloc then overflows the reader's running id.
#[test]
fn alloc_id_at_u64_max_is_not_a_panic() {
    let (start, pid) = (1000, 9);
    let mut trace = craft::info_packet(start, pid);
    let mut h = craft::Header::new(pid, start);
    h.id_begin = u64::MAX;
    h.id_end = 0;
    let mut content = craft::event(101, start).to_vec(); // short alloc, length 1
    content.extend_from_slice(&[0, 0]); // common prefix 0, no codewords
    trace.extend(craft::packet(&h, &content));
    let result = panic::catch_unwind(|| read_crafted(&trace));
    assert!(result.is_ok(), "reader panicked on alloc id u64::MAX");
}

/// A packet starting at `u64::MAX` µs (valid: begin ≤ end, as i64 both −1): an event whose
/// low 25 bits are below the packet's wraps, and `begin & !mask + low` overflows.
#[test]
fn packet_time_at_u64_max_is_not_a_panic() {
    let (start, pid) = (1000, 9);
    let mut trace = craft::info_packet(start, pid);
    let mut h = craft::Header::new(pid, u64::MAX);
    h.time_end = u64::MAX;
    let mut content = craft::event(4, 0).to_vec(); // collect, low bits 0
    content.push(0);
    trace.extend(craft::packet(&h, &content));
    let result = panic::catch_unwind(|| read_crafted(&trace));
    assert!(result.is_ok(), "reader panicked on a packet time of u64::MAX");
}

/// `memtrace dump` prints times relative to the start: an event at 2^63 µs in a trace
/// starting at 1 µs must not overflow the subtraction.
#[cfg(feature = "analysis")]
#[test]
fn dump_of_event_times_past_i64_max_is_not_a_panic() {
    let (start, pid) = (1, 9);
    let mut trace = craft::info_packet(start, pid);
    let t = 1u64 << 63;
    let mut content = craft::event(4, t).to_vec(); // collect
    content.push(0);
    let mut h = craft::Header::new(pid, t);
    h.id_begin = 5;
    h.id_end = 5;
    trace.extend(craft::packet(&h, &content));
    assert_eq!(read_crafted(&trace), Ok(vec!["Collect { id: 4 }".to_string()]));
    let path = std::env::temp_dir().join(format!("memtrace-corruption-{}.ctf", std::process::id()));
    std::fs::write(&path, &trace).unwrap();
    let result = panic::catch_unwind(|| {
        let mut out = Vec::new();
        memtrace_rs::analysis::dump(&path, &mut out, &mut Vec::new()).map(|()| out)
    });
    std::fs::remove_file(&path).unwrap();
    assert!(result.is_ok(), "dump panicked on an event time past i64::MAX");
}
