//! Benchmarks of the trace format: backtrace encoding and decoding, reading a large trace
//! (with and without backtrace decoding) and `memtrace dump`.
//!
//! ```sh
//! cargo bench --bench codec --all-features -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! The trace is generated with the writer by `tests/integration/util/traces.rs` (shared with
//! the tests): 1 000 000 events from 400 call stacks of depth 10–40 sharing prefixes, allocs
//! interleaved with collects and a few promotes.

#[path = "../tests/integration/util/traces.rs"]
#[allow(dead_code)] // The tests use the crafting helpers; the benchmark only generates.
mod common;

use std::hint::black_box;

use common::{generate_trace, realistic_stacks, Rng, TraceSpec};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use memtrace_rs::__internals::backtrace_codec;
use memtrace_rs::__internals::buf::{ReadCursor, WriteBuf};
use memtrace_rs::trace::{EventKind, Reader};

/// Events in the generated trace.
const EVENTS: usize = 1_000_000;
/// Backtraces per pass of the codec benchmarks.
const BACKTRACES: usize = 10_000;

/// A sequence of backtraces (writer orientation) as a program would produce them: a few
/// hundred distinct stacks, hot ones more often.
fn backtrace_sequence() -> Vec<Vec<u64>> {
    let mut rng = Rng::new(1);
    let stacks = realistic_stacks(&mut rng, 400);
    (0..BACKTRACES)
        .map(|_| {
            let a = rng.index(stacks.len());
            stacks[rng.index(a + 1)].clone()
        })
        .collect()
}

/// Frames shared with the previous callstack, counted from the outer end (FORMAT.md §6.2).
fn common_prefix(stack: &[u64], prev: &[u64]) -> usize {
    stack.iter().rev().zip(prev.iter().rev()).take_while(|(a, b)| a == b).count()
}

/// One encoded backtrace: where its codewords are in the shared buffer, how many there
/// are, and the common prefix the reader needs.
struct Encoded {
    start: usize,
    end: usize,
    nencoded: usize,
    common_prefix: usize,
}

/// Encode `seq` with one encoder, as the writer does: whole stacks when `incremental` is
/// false, else only the frames after the common prefix with the previous stack.
fn encode_all(seq: &[Vec<u64>], incremental: bool) -> (Vec<u8>, Vec<Encoded>) {
    let mut w = backtrace_codec::Writer::new();
    let mut buf = WriteBuf::with_capacity(backtrace_codec::Writer::MAX_LENGTH + 16);
    let mut bytes = Vec::new();
    let mut out = Vec::with_capacity(seq.len());
    let mut prev: &[u64] = &[];
    for (id, stack) in seq.iter().enumerate() {
        let cpl = if incremental { common_prefix(stack, prev) } else { 0 };
        buf.clear();
        let nencoded = w.put_backtrace(&mut buf, id as u64, stack, 0, stack.len() - cpl, |_| {});
        let start = bytes.len();
        bytes.extend_from_slice(buf.as_bytes());
        out.push(Encoded { start, end: bytes.len(), nencoded, common_prefix: cpl });
        prev = stack;
    }
    (bytes, out)
}

fn bench_backtraces(c: &mut Criterion) {
    let seq = backtrace_sequence();
    let frames: usize = seq.iter().map(Vec::len).sum();
    let mut group = c.benchmark_group("backtrace");
    group.throughput(Throughput::Elements(seq.len() as u64));
    for incremental in [false, true] {
        let name = if incremental { "with_common_prefix" } else { "whole_stack" };
        let (bytes, encoded) = encode_all(&seq, incremental);
        println!(
            "backtrace/{name}: {} backtraces, {:.1} frames and {:.2} bytes per backtrace ({:.2} bytes per frame)",
            seq.len(),
            frames as f64 / seq.len() as f64,
            bytes.len() as f64 / seq.len() as f64,
            bytes.len() as f64 / frames as f64,
        );
        group.bench_function(format!("encode/{name}"), |b| {
            let mut buf = WriteBuf::with_capacity(backtrace_codec::Writer::MAX_LENGTH + 16);
            b.iter(|| {
                let mut w = backtrace_codec::Writer::new();
                let mut prev: &[u64] = &[];
                let mut total = 0;
                for (id, stack) in seq.iter().enumerate() {
                    let cpl = if incremental { common_prefix(stack, prev) } else { 0 };
                    buf.clear();
                    total += w.put_backtrace(&mut buf, id as u64, stack, 0, stack.len() - cpl, |_| {});
                    prev = stack;
                }
                black_box(total)
            })
        });
        // Check once that decoding gives the stacks back.
        let mut r = backtrace_codec::Reader::new();
        for (e, stack) in encoded.iter().zip(&seq) {
            let mut cur = ReadCursor::new(&bytes[e.start..e.end], 0);
            let bt = r.get_backtrace(&mut cur, e.nencoded, e.common_prefix).unwrap();
            assert!(bt.iter().eq(stack.iter().rev()));
        }
        group.bench_function(format!("decode/{name}"), |b| {
            b.iter(|| {
                let mut r = backtrace_codec::Reader::new();
                let mut total = 0;
                for e in &encoded {
                    let mut cur = ReadCursor::new(&bytes[e.start..e.end], 0);
                    total += r.get_backtrace(&mut cur, e.nencoded, e.common_prefix).unwrap().len();
                }
                black_box(total)
            })
        });
    }
    group.finish();
}

/// Read every event; with `decode`, also touch every frame.
fn read_trace(bytes: &[u8], decode: bool) -> u64 {
    let mut reader = Reader::new(bytes).unwrap();
    reader.set_decode_backtraces(decode);
    let mut sum = 0u64;
    while let Some(event) = reader.next_event().unwrap() {
        sum = sum.wrapping_add(match event.kind {
            // Touch the backtrace without walking it: walking is the consumer's cost.
            EventKind::Alloc(a) => a.id ^ a.backtrace.len() as u64 ^ a.backtrace.last().copied().unwrap_or(0),
            EventKind::Promote { id } | EventKind::Collect { id } => id,
        });
    }
    sum
}

/// Frames decoded anew per trace (backtrace length minus the common prefix), summed.
fn new_frames(bytes: &[u8]) -> u64 {
    let mut reader = Reader::new(bytes).unwrap();
    let mut frames = 0;
    while let Some(event) = reader.next_event().unwrap() {
        if let EventKind::Alloc(a) = event.kind {
            frames += (a.backtrace.len() as u64).saturating_sub(a.common_prefix);
        }
    }
    frames
}

fn bench_read(c: &mut Criterion) {
    let trace = generate_trace(&TraceSpec::large(EVENTS));
    let hot = generate_trace(&TraceSpec::large_with_hot_sites(EVENTS));
    for (name, t) in [("trace", &trace), ("hot-sites trace", &hot)] {
        println!(
            "{name}: {} events ({} allocs, {:.1} new frames per alloc), {} distinct stacks, {} location codes, \
             {} bytes ({:.2} bytes per event)",
            t.events,
            t.allocs,
            new_frames(&t.bytes) as f64 / t.allocs as f64,
            t.stacks.len(),
            t.locations.len(),
            t.bytes.len(),
            t.bytes.len() as f64 / t.events as f64
        );
    }
    let mut group = c.benchmark_group("read");
    group.sample_size(20);
    group.throughput(Throughput::Elements(trace.events));
    group.bench_function("decode_backtraces", |b| b.iter(|| black_box(read_trace(&trace.bytes, true))));
    group.bench_function("skip_backtraces", |b| b.iter(|| black_box(read_trace(&trace.bytes, false))));
    group.throughput(Throughput::Elements(hot.events));
    group.bench_function("decode_backtraces_hot_sites", |b| b.iter(|| black_box(read_trace(&hot.bytes, true))));
    group.finish();

    #[cfg(feature = "analysis")]
    bench_dump(c, &trace);
    #[cfg(feature = "analysis")]
    bench_analysis(c, &trace);
}

/// The analysis pass over the generated trace with its stacks (the trie of
/// `memtrace_rs::analysis::stacks`), and the ranking of its sites by whole stack: what
/// `memtrace hotspots --stacks` does before printing.
#[cfg(feature = "analysis")]
fn bench_analysis(c: &mut Criterion, trace: &common::Generated) {
    use memtrace_rs::analysis::{ranked, Analysis, Grouping, Measure, Options};
    let options = Options { stacks: true, live_at: None };
    let analyse = || {
        let reader = Reader::new(std::io::Cursor::new(&trace.bytes)).unwrap();
        Analysis::from_reader(reader, &options, |_| {}).unwrap()
    };
    let mut group = c.benchmark_group("analysis");
    group.sample_size(10);
    group.throughput(Throughput::Elements(trace.events));
    group.bench_function("pass", |b| b.iter(|| black_box(analyse())));
    let analysis = analyse();
    let whole = Grouping { stacks: true, ..Default::default() };
    group.bench_function("ranked_stacks", |b| b.iter(|| black_box(ranked(&analysis, whole, Measure::Allocated))));
    group.finish();
}

/// `memtrace dump` of the generated trace (from a temporary file) into a sink; one line
/// per event.
#[cfg(feature = "analysis")]
fn bench_dump(c: &mut Criterion, trace: &common::Generated) {
    let path = std::env::temp_dir().join(format!("memtrace-bench-{}.ctf", std::process::id()));
    std::fs::write(&path, &trace.bytes).unwrap();
    let mut counter = LineCounter::default();
    memtrace_rs::analysis::dump(&path, &mut counter, &mut std::io::sink()).unwrap();
    assert_eq!(counter.lines, trace.events);
    println!("dump: {} lines, {} bytes ({:.1} bytes per line)", counter.lines, counter.bytes, {
        counter.bytes as f64 / counter.lines as f64
    });
    let mut group = c.benchmark_group("dump");
    group.sample_size(10);
    group.throughput(Throughput::Elements(trace.events));
    group.bench_function("lines", |b| {
        b.iter(|| memtrace_rs::analysis::dump(&path, &mut std::io::sink(), &mut std::io::sink()).unwrap())
    });
    group.finish();
    std::fs::remove_file(&path).unwrap();
}

/// A sink that counts lines and bytes.
#[cfg(feature = "analysis")]
#[derive(Default)]
struct LineCounter {
    lines: u64,
    bytes: u64,
}

#[cfg(feature = "analysis")]
impl std::io::Write for LineCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.lines += buf.iter().filter(|&&b| b == b'\n').count() as u64;
        self.bytes += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

criterion_group!(benches, bench_backtraces, bench_read);
criterion_main!(benches);
