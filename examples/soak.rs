//! A soak run of the tracer: for a chosen time, a tokio multi-thread runtime and a churn of
//! short-lived threads allocate, free and pass blocks between each other, while the main
//! thread flips tracing sessions on and off at a high rate (varying the rate and the
//! unwinder, stopping by guard or by `stop_tracing`, now and then with a failing huge
//! allocation). Every trace is read back as soon as its session ends and checked: no reader
//! error (the backtrace cache's verifier included) or warning, every collect after its alloc
//! and none twice, and exactly the allocations and frees the session says it wrote; drops are
//! counted from the sessions' reports. Not part of CI:
//!
//! ```text
//! cargo run --release --example soak -- 600        # seconds; default 60
//! ```
//!
//! Exits with status 1 at the first trace that fails a check, naming it (and keeping it).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memtrace_rs::trace::{EventKind, Reader};
use memtrace_rs::{start_tracing, stop_tracing, MemtraceAllocator, TraceConfig, TraceStats, Unwinder};

#[global_allocator]
static GLOBAL: MemtraceAllocator = MemtraceAllocator::system();

/// A small generator for the workload's sizes and choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 17
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Mostly small blocks, some up to 256 KiB.
    fn size(&mut self) -> usize {
        if self.below(16) == 0 {
            1 + self.below(256 << 10) as usize
        } else {
            1 + self.below(512) as usize
        }
    }
}

/// Totals over the run.
#[derive(Default)]
struct Totals {
    sessions: u64,
    allocs: u64,
    collects: u64,
    dropped: u64,
    frees_lost: u64,
    bytes: u64,
}

fn main() {
    let seconds: u64 = std::env::args().nth(1).map_or(60, |s| s.parse().expect("seconds"));
    let dir = std::env::temp_dir().join(format!("memtrace-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let threads_started = Arc::new(AtomicU64::new(0));

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
    for task in 0..32 {
        runtime.spawn(async_worker(task, Arc::clone(&stop)));
    }
    let churn = {
        let (stop, started) = (Arc::clone(&stop), Arc::clone(&threads_started));
        std::thread::spawn(move || thread_churn(&stop, &started))
    };

    let end = Instant::now() + Duration::from_secs(seconds);
    let mut rng = Rng(0x5eed);
    let mut totals = Totals::default();
    while Instant::now() < end {
        let path = dir.join(format!("session-{}.ctf", totals.sessions));
        let stats = run_session(&path, &mut rng);
        if let Err(e) = check_trace(&path, &stats, &mut totals) {
            eprintln!("soak: {}: {e}", path.display());
            std::process::exit(1);
        }
        std::fs::remove_file(&path).unwrap();
        totals.sessions += 1;
    }
    stop.store(true, Ordering::Relaxed);
    churn.join().unwrap();
    runtime.shutdown_timeout(Duration::from_secs(5));
    let _ = std::fs::remove_dir(&dir);
    println!(
        "soak: {seconds} s, {} sessions checked, {} allocations and {} collects read back ({:.1} MB of trace), \
         {} samples dropped and {} frees lost (as reported), {} threads started",
        totals.sessions,
        totals.allocs,
        totals.collects,
        totals.bytes as f64 / 1e6,
        totals.dropped,
        totals.frees_lost,
        threads_started.load(Ordering::Relaxed),
    );
}

/// One session of 5–200 ms at a rate and with an unwinder chosen by `rng`; its stats.
fn run_session(path: &Path, rng: &mut Rng) -> TraceStats {
    let rate = [1e-5, 1e-4, 1e-3, 1e-2][rng.below(4) as usize];
    let unwinder = [Unwinder::Auto, Unwinder::FramePointers, Unwinder::Dwarf][rng.below(3) as usize];
    let config = TraceConfig::new(path).rate(rate).unwinder(unwinder).stop_timeout(Duration::from_secs(30));
    let guard = start_tracing(config).unwrap_or_else(|e| panic!("soak: cannot start tracing: {e}"));
    std::thread::sleep(Duration::from_millis(5 + rng.below(195)));
    if rng.below(8) == 0 {
        // A failing huge allocation: counted in O(1), not recorded.
        assert!(Vec::<u8>::new().try_reserve(isize::MAX as usize).is_err());
    }
    if rng.below(4) == 0 {
        // Stopped without the guard: its outcome comes from `finish` all the same.
        stop_tracing();
    }
    guard.finish().unwrap_or_else(|e| panic!("soak: session into {} failed: {e}", path.display()))
}

/// Read the trace at `path` back and check it against the session's `stats`.
fn check_trace(path: &PathBuf, stats: &TraceStats, totals: &mut Totals) -> Result<(), String> {
    let mut reader = Reader::open(path).map_err(|e| e.to_string())?;
    let mut live = HashSet::new();
    let mut seen = HashSet::new();
    let (mut allocs, mut collects) = (0, 0);
    while let Some(event) = reader.next_event().map_err(|e| e.to_string())? {
        match event.kind {
            EventKind::Alloc(a) => {
                if !seen.insert(a.id) {
                    return Err(format!("object {} allocated twice", a.id));
                }
                live.insert(a.id);
                allocs += 1;
            }
            EventKind::Collect { id } if live.remove(&id) => collects += 1,
            EventKind::Collect { id } if seen.contains(&id) => return Err(format!("object {id} collected twice")),
            EventKind::Collect { id } => return Err(format!("object {id} collected before its allocation")),
            EventKind::Promote { id } => return Err(format!("promotion of {id} in a Rust trace")),
        }
    }
    if !reader.warnings().is_empty() {
        return Err(format!("warnings: {:?}", reader.warnings()));
    }
    if (allocs, collects) != (stats.samples_written, stats.frees_written) {
        return Err(format!(
            "read {allocs} allocations and {collects} collects, the session wrote {} and {}",
            stats.samples_written, stats.frees_written
        ));
    }
    totals.allocs += allocs;
    totals.collects += collects;
    totals.dropped += stats.samples_dropped();
    totals.frees_lost += stats.frees_lost + stats.frees_lost_no_stack;
    totals.bytes += reader.bytes_read();
    Ok(())
}

/// A tokio task that keeps some blocks, replaces them, and hands some to the next task's
/// channel (freed there, on whichever worker runs it), now and then on a blocking thread.
async fn async_worker(task: u64, stop: Arc<AtomicBool>) {
    let mut rng = Rng(task * 7919 + 1);
    let mut kept: Vec<Vec<u8>> = Vec::new();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..64 {
            let block = vec![task as u8; rng.size()];
            match rng.below(4) {
                0 => {
                    let _ = tx.try_send(block);
                }
                1 if kept.len() < 256 => kept.push(block),
                _ if !kept.is_empty() => {
                    let at = rng.below(kept.len() as u64) as usize;
                    kept[at] = block;
                }
                _ => drop(block),
            }
        }
        while let Ok(block) = rx.try_recv() {
            drop(block);
        }
        if rng.below(32) == 0 {
            let moved = std::mem::take(&mut kept);
            let _ = tokio::task::spawn_blocking(move || drop(moved)).await;
        }
        tokio::time::sleep(Duration::from_micros(200 + rng.below(800))).await;
    }
}

/// Threads that live a few milliseconds: each allocates, frees, and leaves blocks for the next
/// one to free (some of them sampled in one session and freed in another, or untraced).
fn thread_churn(stop: &AtomicBool, started: &AtomicU64) {
    let mut rng = Rng(99);
    let mut handed: Vec<Vec<u8>> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let seed = rng.next();
        let inherited = std::mem::take(&mut handed);
        let thread = std::thread::Builder::new().stack_size(64 << 10).spawn(move || {
            drop(inherited);
            let mut rng = Rng(seed);
            let blocks: Vec<Vec<u8>> = (0..256).map(|_| vec![1u8; rng.size()]).collect();
            blocks.into_iter().filter(|_| rng.below(2) == 0).collect::<Vec<_>>()
        });
        started.fetch_add(1, Ordering::Relaxed);
        handed = thread.unwrap().join().unwrap();
    }
}
