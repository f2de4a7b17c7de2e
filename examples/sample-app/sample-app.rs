//! A small program with distinct allocation patterns, traced by memtrace-rs.
//!
//! ```text
//! MEMTRACE_FILE=trace.ctf cargo run --release --example sample-app
//! ```
//!
//! It runs for a second or so: an ingest stage keeps a growing `Vec` of records, a cache
//! evicts entries from a `HashMap`, a report stage builds strings, and a producer thread
//! allocates messages that a consumer thread frees. At exit it prints where the trace went
//! and the top allocation sites read back from it.

use std::time::{Duration, Instant};

use memtrace_rs::analysis::{ranked, Analysis, Grouping, Measure, Options};
use memtrace_rs::MemtraceAllocator;

#[global_allocator]
static GLOBAL: MemtraceAllocator = MemtraceAllocator::system();

/// Long-lived data: records accumulated in a growing vector.
mod ingest {
    /// One parsed input record.
    pub struct Record {
        pub id: u64,
        pub name: String,
        pub values: Vec<f64>,
    }

    /// Parse `n` synthetic records, keeping them all.
    #[inline(never)]
    pub fn load_records(n: u64) -> Vec<Record> {
        let mut records = Vec::new();
        for id in 0..n {
            let values = (0..(id % 32)).map(|v| v as f64 * 0.5).collect();
            records.push(Record { id, name: format!("record-{id:08}"), values });
        }
        records
    }
}

/// A bounded cache: inserts allocate, evictions free.
mod cache {
    use std::collections::HashMap;

    /// A cache of rendered values that evicts its oldest entries when full.
    pub struct Cache {
        entries: HashMap<u64, String>,
        order: std::collections::VecDeque<u64>,
        capacity: usize,
    }

    impl Cache {
        /// An empty cache of `capacity` entries.
        pub fn new(capacity: usize) -> Cache {
            Cache { entries: HashMap::new(), order: Default::default(), capacity }
        }

        /// The rendering of `key`, computed on a miss.
        #[inline(never)]
        pub fn get_or_render(&mut self, key: u64) -> usize {
            if let Some(v) = self.entries.get(&key) {
                return v.len();
            }
            let rendered = render(key);
            let len = rendered.len();
            self.entries.insert(key, rendered);
            self.order.push_back(key);
            if self.order.len() > self.capacity {
                if let Some(old) = self.order.pop_front() {
                    self.entries.remove(&old);
                }
            }
            len
        }
    }

    #[inline(never)]
    fn render(key: u64) -> String {
        "x".repeat(64 + (key % 512) as usize)
    }
}

/// Short-lived strings built and thrown away.
mod report {
    use std::fmt::Write;

    use super::ingest::Record;

    /// Render a summary line per record and return the total length.
    #[inline(never)]
    pub fn build_report(records: &[Record]) -> usize {
        let mut total = 0;
        for chunk in records.chunks(100) {
            let mut page = String::new();
            for r in chunk {
                let _ = writeln!(page, "{:>8} {:<16} {:>10.2}", r.id, r.name, r.values.iter().sum::<f64>());
            }
            total += page.len();
        }
        total
    }
}

/// A producer thread allocates messages; the consumer thread frees them.
mod pipeline {
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    #[inline(never)]
    fn make_message(i: usize) -> Vec<u8> {
        vec![(i % 251) as u8; 256 + (i * 37) % 4096]
    }

    /// Run the pipeline for `duration`; returns the bytes consumed.
    pub fn run(duration: Duration) -> usize {
        let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(1024);
        let producer = std::thread::spawn(move || {
            let end = Instant::now() + duration;
            let mut i = 0;
            while Instant::now() < end {
                if tx.send(make_message(i)).is_err() {
                    break;
                }
                i += 1;
            }
        });
        let consumer = std::thread::spawn(move || rx.iter().map(|m| m.len()).sum());
        let _ = producer.join();
        consumer.join().unwrap_or(0)
    }
}

fn main() {
    let trace_path = ["MEMTRACE_FILE", "MEMTRACE"].iter().find_map(|v| std::env::var_os(v).filter(|p| !p.is_empty()));
    let guard = memtrace_rs::trace_if_requested();
    let start = Instant::now();

    let records = ingest::load_records(200_000);
    let mut cache = cache::Cache::new(2_000);
    let mut cached = 0;
    let mut report_bytes = 0;
    let pipeline = std::thread::spawn(|| pipeline::run(Duration::from_millis(800)));
    for round in 0..4u64 {
        for key in 0..50_000u64 {
            cached += cache.get_or_render((key * 7919 + round) % 20_000);
        }
        report_bytes += report::build_report(&records);
    }
    let piped = pipeline.join().unwrap_or(0);
    println!(
        "{} records, {cached} cached bytes served, {report_bytes} report bytes, {piped} bytes piped, in {:.2?}",
        records.len(),
        start.elapsed()
    );
    let traced = guard.is_some();
    // Stop tracing first: the records are still alive, so the trace shows them as never freed.
    drop(guard);
    drop(records);
    match trace_path {
        Some(path) if traced => {
            println!("trace written to {}", path.to_string_lossy());
            if let Err(e) = summarize(path.as_ref()) {
                eprintln!("cannot read the trace back: {e}");
            }
        }
        _ => println!("not traced (set MEMTRACE_FILE=trace.ctf to trace)"),
    }
}

/// Print the top allocation sites of the trace at `path` by estimated bytes, grouped as
/// `memtrace hotspots` groups them.
fn summarize(path: &std::path::Path) -> memtrace_rs::Result<()> {
    let analysis = Analysis::run(path, &Options { stacks: true, live_at: None })?;
    let sites = ranked(&analysis, Grouping::default(), Measure::Allocated);
    let c = &analysis.counts;
    let total = analysis.bytes(c.samples);
    println!(
        "{} sampled blocks ({} samples at rate {}), {} freed; ~{:.1} MiB allocated in total",
        c.allocs(),
        c.samples,
        analysis.info.sample_rate,
        c.collects,
        total / (1 << 20) as f64
    );
    println!("top allocation sites by estimated bytes:");
    for site in sites.iter().take(8) {
        let bytes = analysis.bytes(site.stats.allocated.samples);
        let name = site.frames().next().map_or_else(
            || "<unknown>".to_owned(),
            |f| {
                let frame = &analysis.frames[f];
                let file = frame.file.rsplit_once("/examples/").map_or(&*frame.file, |(_, f)| f);
                format!("{}  ({file}:{})", frame.function, frame.line)
            },
        );
        println!("  {:>9.1} MiB  {name}", bytes / (1 << 20) as f64);
    }
    Ok(())
}
