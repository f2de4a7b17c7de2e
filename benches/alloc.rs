//! Cost of the sampling allocator: `cargo bench --bench alloc`.
//!
//! A process has one global allocator, so each configuration runs in a child process (this
//! binary re-executed with `MEMTRACE_BENCH_MODE` set). The global allocator of every child is
//! the same thin dispatcher, switched once at start-up, so all configurations pay the same
//! (perfectly predicted) dispatch branch. Configurations run interleaved, several rounds, and
//! the best round of each is kept. Prints one table.
//!
//! Every child turns off glibc's heap trimming (`M_TRIM_THRESHOLD`; set `MEMTRACE_BENCH_TRIM`
//! to keep glibc's default). With it on, this workload's arenas hover around the trim
//! threshold, and whether glibc gives pages back (`madvise`) and the workload faults them in
//! again is chaotic: one extra small allocation on a thread, or another workload seed, moves
//! System between about 42 and 96 thousand page faults and 56 and 71 ns per operation, which
//! swamped the tracer's own cost. The "faults" column counts the minor page faults of the
//! timed run, so that a change in how the tracer disturbs the heap stays visible.
//!
//! Each thread keeps 512 blocks live (about 340 KB), so that System runs at its fastest and
//! the tracer's cost shows at its largest; the last rows keep 20 000 live blocks per thread
//! (about 13 MB each, with some 30 sampled blocks live in all at rate 1e-5), where System,
//! like a real program, misses the cache more.
//!
//! What it measures of the free path: a free of a block whose address is not a multiple of the
//! sampled-block alignment (`src/runtime/sampled_set.rs`) costs one test of the address; the
//! few others look the block up in the set of live sampled blocks. (The designs it settled
//! before, the free filter and the sampled-block pool, are in the changelog
//! and in README.md at cfd4150, "Benchmarks".)

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use memtrace_rs::trace::{EventKind, Reader};
use memtrace_rs::{start_tracing, MemtraceAllocator, TraceConfig, Unwinder};

const MODE_VAR: &std::ffi::CStr = c"MEMTRACE_BENCH_MODE";
/// Set to keep glibc's default heap trimming in the children.
const TRIM_VAR: &str = "MEMTRACE_BENCH_TRIM";
const THREADS: usize = 2;
/// Allocations per thread in the workload (dhat runs a fraction of them: it is far slower).
const OPS_PER_THREAD: usize = 10_000_000;
const DHAT_DIVISOR: usize = 40;
/// Live blocks per thread; each operation frees one and allocates its replacement.
const LIVE: usize = 512;
/// Live blocks per thread in the modes ending in `-big`.
const BIG_LIVE: usize = 20_000;
const ROUNDS: usize = 5;
/// Stack depth and iterations of the sampled-allocation measurement.
const DEPTH: usize = 30;
const SAMPLED_ITERS: usize = 100_000;

// DHAT is 0, so that the dispatch tests it first: System and MemtraceAllocator are then each
// reached after the same two tests (with System at 0 it was reached after one, and every
// MemtraceAllocator configuration paid two more instructions a call than System).
const DHAT: u8 = 0;
const SYSTEM: u8 = 1;
const MEMTRACE: u8 = 2;
static ALLOCATOR: AtomicU8 = AtomicU8::new(MEMTRACE);
static MEMTRACE_ALLOC: MemtraceAllocator = MemtraceAllocator::system();
static DHAT_ALLOC: dhat::Alloc = dhat::Alloc;

/// Dispatches to the allocator chosen at start-up.
struct Bench;

macro_rules! dispatch {
    ($method:ident($($arg:expr),*)) => {
        match ALLOCATOR.load(Ordering::Relaxed) {
            SYSTEM => System.$method($($arg),*),
            DHAT => DHAT_ALLOC.$method($($arg),*),
            _ => MEMTRACE_ALLOC.$method($($arg),*),
        }
    };
}

// SAFETY: forwards every call unchanged to one allocator, chosen before any allocation that
// could be freed by another (the mode is set first thing in `main` and never changes).
unsafe impl GlobalAlloc for Bench {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded under the caller's contract.
        unsafe { dispatch!(alloc(layout)) }
    }
    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded under the caller's contract.
        unsafe { dispatch!(alloc_zeroed(layout)) }
    }
    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded under the caller's contract.
        unsafe { dispatch!(dealloc(ptr, layout)) }
    }
    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded under the caller's contract.
        unsafe { dispatch!(realloc(ptr, layout, new_size)) }
    }
}

#[global_allocator]
static GLOBAL: Bench = Bench;

/// The configurations of the throughput table. Modes ending in `-dwarf` force DWARF unwinding;
/// the others use the default unwinder (frame pointers in this repository's builds, which keep
/// them). Rate 1e-9 samples next to nothing: it measures the cost of the countdown and the
/// free-path check that every call pays while tracing is on. Modes ending in `-big` keep
/// [`BIG_LIVE`] blocks live, are compared with `system-big`, and come last.
const CONFIGS: [(&str, &str); 10] = [
    ("system", "System"),
    ("off", "MemtraceAllocator, tracing off"),
    ("1e-9", "rate 1e-9 (the per-call cost only)"),
    ("1e-5", "MemtraceAllocator, rate 1e-5"),
    ("1e-5-dwarf", "rate 1e-5, DWARF unwinding"),
    ("1e-4", "MemtraceAllocator, rate 1e-4"),
    ("dhat", "dhat heap profiler"),
    ("system-big", "System"),
    ("1e-5-big", "MemtraceAllocator, rate 1e-5"),
    ("1e-4-big", "MemtraceAllocator, rate 1e-4"),
];

fn main() {
    // Read without allocating: a child must choose its allocator before its first allocation.
    // SAFETY: the name is a NUL-terminated C string; no thread is running yet that could
    // change the environment, and the value is not used past `main`.
    let mode = unsafe { libc::getenv(MODE_VAR.as_ptr()) };
    if mode.is_null() {
        parent();
    } else {
        // SAFETY: getenv returned a valid NUL-terminated string (see above).
        child(unsafe { std::ffi::CStr::from_ptr(mode) }.to_str().expect("mode"));
    }
}

// ---------------------------------------------------------------------------------------------
// Children

fn child(mode: &str) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os(TRIM_VAR).is_none() {
        // SAFETY: mallopt only changes glibc's tuning; called before any thread is started.
        unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30) };
    }
    let full_mode = mode;
    let (mode, live) = match mode.strip_suffix("-big") {
        Some(mode) => (mode, BIG_LIVE),
        None => (mode, LIVE),
    };
    ALLOCATOR.store(
        match mode {
            "system" => SYSTEM,
            "dhat" => DHAT,
            _ => MEMTRACE,
        },
        Ordering::Relaxed,
    );
    let trace = trace_path(full_mode);
    let (mode, unwinder) = match mode.strip_suffix("-dwarf") {
        Some(mode) => (mode, Unwinder::Dwarf),
        None => (mode, Unwinder::default()),
    };
    match mode {
        "sampled" | "unsampled" => {
            let guard = (mode == "sampled").then(|| start(&trace, 1.0, unwinder));
            // Warm up: the writer symbolizes this stack's frames once.
            at_depth(DEPTH, &|| sampled_loop(SAMPLED_ITERS / 100));
            std::thread::sleep(Duration::from_millis(300));
            // The whole process's CPU time, the writer's included, until the writer has
            // written every sample (dropping the guard waits for it).
            let start = cpu_ns(libc::CLOCK_PROCESS_CPUTIME_ID);
            at_depth(DEPTH, &|| sampled_loop(SAMPLED_ITERS));
            drop(guard);
            let ns = (cpu_ns(libc::CLOCK_PROCESS_CPUTIME_ID) - start) as f64 / SAMPLED_ITERS as f64;
            let (samples, unwinder) = if mode == "sampled" {
                let (_, samples, unwinder) = trace_stats(&trace);
                (samples, unwinder)
            } else {
                (0, "-".into())
            };
            println!("{ns} {samples} 0 0 {unwinder}");
        }
        "dhat" => {
            let profiler = dhat::Profiler::builder().file_name(&trace).build();
            let (ns, faults) = workload(OPS_PER_THREAD / DHAT_DIVISOR, live);
            drop(profiler);
            println!("{ns} 0 0 {faults} -");
        }
        "system" | "off" => {
            let (ns, faults) = workload(OPS_PER_THREAD, live);
            println!("{ns} 0 0 {faults} -");
        }
        rate => {
            let guard = start(&trace, rate.parse().expect("rate"), unwinder);
            let (ns, faults) = workload(OPS_PER_THREAD, live);
            drop(guard);
            let (bytes, samples, unwinder) = trace_stats(&trace);
            println!("{ns} {samples} {bytes} {faults} {unwinder}");
        }
    }
    let _ = std::fs::remove_file(&trace);
}

fn trace_path(mode: &str) -> PathBuf {
    std::env::temp_dir().join(format!("memtrace-bench-{}-{mode}.out", std::process::id()))
}

fn start(path: &Path, rate: f64, unwinder: Unwinder) -> memtrace_rs::TraceGuard {
    start_tracing(TraceConfig::new(path).rate(rate).unwinder(unwinder)).expect("start tracing")
}

/// Run `ops` allocation/free pairs on each of [`THREADS`] threads, each keeping `live` blocks;
/// ns per operation and the minor page faults of the timed run.
fn workload(ops: usize, live: usize) -> (f64, u64) {
    // Warm up (allocator arenas; with tracing, the first symbolizations) before timing, on
    // threads started by the same code as the timed ones: their stacks (thread start-up,
    // scope closure) are the call sites the writer must symbolize once, a one-off cost of
    // milliseconds that would otherwise land in the timed run.
    on_threads(ops / 20, live);
    // Let a tracer's writer finish symbolizing the call sites seen so far.
    std::thread::sleep(Duration::from_millis(300));
    let start = cpu_ns(libc::CLOCK_PROCESS_CPUTIME_ID);
    let faults = minor_faults();
    on_threads(ops, live);
    let faults = minor_faults() - faults;
    ((cpu_ns(libc::CLOCK_PROCESS_CPUTIME_ID) - start) as f64 / (ops * THREADS) as f64, faults)
}

/// Minor page faults of the process so far.
fn minor_faults() -> u64 {
    // SAFETY: an all-zero rusage is valid; getrusage writes it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    usage.ru_minflt as u64
}

/// [`churn`] `ops` times on each of [`THREADS`] threads, keeping `live` blocks each.
#[inline(never)]
fn on_threads(ops: usize, live: usize) {
    std::thread::scope(|s| {
        for t in 0..THREADS {
            s.spawn(move || churn(t as u64 + 1, ops, live));
        }
    });
}

/// CPU time used so far by the process (`CLOCK_PROCESS_CPUTIME_ID`: all its threads, the
/// trace writer included) or by the calling thread (`CLOCK_THREAD_CPUTIME_ID`), in ns. CPU
/// time rather than wall-clock time, so that other processes on a shared machine disturb less.
fn cpu_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Mixed sizes from 8 B to 64 KiB, mostly small: 90 % under 256 B, 9 % under 4 KiB.
fn size(r: u64) -> usize {
    let r = r as usize;
    match r % 100 {
        0 => 4096 + (r >> 8) % (60 << 10),
        1..=9 => 256 + (r >> 8) % 3840,
        _ => 8 + (r >> 8) % 248,
    }
}

/// Replace random blocks of `blocks` live ones `ops` times.
#[inline(never)]
fn churn(seed: u64, ops: usize, blocks: usize) {
    let mut live: Vec<Vec<u8>> = (0..blocks).map(|_| Vec::new()).collect();
    let mut r = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for _ in 0..ops {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        // Like most programs, initialise what was allocated.
        let block = vec![r as u8; size(r)];
        // `r`'s top 24 bits scaled to `0..blocks`: a multiply, where `%` by a count known only
        // at run time would add a division to every operation of every configuration.
        live[(((r >> 40) * blocks as u64) >> 24) as usize] = block;
    }
    black_box(live);
}

/// Call `f` with `depth` more frames on the stack.
#[inline(never)]
fn at_depth(depth: usize, f: &dyn Fn()) {
    if depth == 0 {
        f()
    } else {
        at_depth(black_box(depth - 1), f);
        black_box(());
    }
}

/// `iters` 8-byte allocations + frees.
#[inline(never)]
fn sampled_loop(iters: usize) {
    let layout = Layout::new::<u64>();
    for _ in 0..iters {
        // SAFETY: nonzero-size layout, freed with the same layout.
        unsafe {
            let p = black_box(std::alloc::alloc(layout));
            std::alloc::dealloc(p, layout);
        }
    }
}

/// (bytes of event packets, excluding the trace-info and location packets; alloc events; the
/// unwinder named in the runtime parameters).
fn trace_stats(path: &Path) -> (u64, u64, String) {
    let data = std::fs::read(path).expect("read trace");
    let mut bytes = 0;
    let mut at = 0;
    let mut first = true;
    while at + 72 <= data.len() {
        let size = u32::from_le_bytes(data[at + 4..at + 8].try_into().unwrap()) as usize / 8;
        let first_event = u32::from_le_bytes(data[at + 68..at + 72].try_into().unwrap()) >> 25;
        if !first && first_event != 1 {
            bytes += size as u64;
        }
        first = false;
        at += size.max(1);
    }
    let mut reader = Reader::open(path).expect("open trace");
    let params = String::from_utf8_lossy(&reader.info().runtime_params).into_owned();
    let unwinder = params.split(',').find_map(|p| p.strip_prefix("unwinder=")).unwrap_or("?").to_owned();
    let mut allocs = 0;
    while let Some(event) = reader.next_event().expect("read trace") {
        if let EventKind::Alloc(_) = event.kind {
            allocs += 1;
        }
    }
    (bytes, allocs, unwinder)
}

// ---------------------------------------------------------------------------------------------
// Parent

/// One child run: ns per op, samples, event bytes, minor page faults, unwinder ("-": none).
struct Run(f64, u64, u64, u64, String);

fn run_child(mode: &str) -> Run {
    let out = Command::new(std::env::current_exe().unwrap())
        .env(MODE_VAR.to_str().unwrap(), mode)
        .output()
        .expect("spawn child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{mode}: {}{}", stdout, String::from_utf8_lossy(&out.stderr));
    let fields: Vec<&str> = stdout.split_whitespace().collect();
    Run(
        fields[0].parse().unwrap(),
        fields[1].parse().unwrap(),
        fields[2].parse().unwrap(),
        fields[3].parse().unwrap(),
        fields[4].to_owned(),
    )
}

fn parent() {
    let started = Instant::now();
    let mut best: Vec<Option<Run>> = CONFIGS.iter().map(|_| None).collect();
    // Short runs, interleaved, in a rotating order, keeping each configuration's best round:
    // on a shared machine the noise (other processes' load, heap layout) only ever adds time.
    for round in 0..ROUNDS {
        for j in 0..CONFIGS.len() {
            let i = (round + j) % CONFIGS.len();
            let run = run_child(CONFIGS[i].0);
            if best[i].as_ref().is_none_or(|b| run.0 < b.0) {
                best[i] = Some(run);
            }
        }
    }
    let best: Vec<Run> = best.into_iter().map(Option::unwrap).collect();
    let best_of = |mode: &str| (0..ROUNDS).map(|_| run_child(mode)).min_by(|a, b| a.0.total_cmp(&b.0)).unwrap();
    let sampled = best_of("sampled");
    let sampled_dwarf = best_of("sampled-dwarf");
    let unsampled = best_of("unsampled");

    // The System time each configuration is compared with: System's at the same heap size.
    let system = |mode: &str| {
        let baseline = if mode.ends_with("-big") { "system-big" } else { "system" };
        CONFIGS.iter().zip(&best).find(|((m, _), _)| *m == baseline).map(|(_, run)| run.0).unwrap()
    };
    let trim = if std::env::var_os(TRIM_VAR).is_some() { "glibc's default trimming" } else { "heap trimming off" };
    println!(
        "alloc benchmark: {THREADS} threads x {OPS_PER_THREAD} alloc+free (8 B-64 KiB, {LIVE} live blocks each; \
         dhat: 1/{DHAT_DIVISOR} of that), best of {ROUNDS}, {trim}"
    );
    println!(
        "{:<38} {:>10} {:>9} {:>10} {:>13} {:>7} {:>15}",
        "configuration", "CPU ns/op", "vs System", "samples", "bytes/sample", "faults", "unwinder"
    );
    for ((mode, name), Run(ns, samples, bytes, faults, unwinder)) in CONFIGS.iter().zip(&best) {
        if *mode == "system-big" {
            println!("with {BIG_LIVE} live blocks per thread:");
        }
        let per_sample = if *samples > 0 { format!("{:.1}", *bytes as f64 / *samples as f64) } else { "-".into() };
        println!(
            "{name:<38} {ns:>10.2} {:>8.3}x {samples:>10} {per_sample:>13} {faults:>7} {unwinder:>15}",
            ns / system(mode)
        );
    }
    for (name, run) in [("", sampled), (", DWARF", sampled_dwarf)] {
        println!(
            "{:<38} {:>10.0} {:>9} {:>10} {:>13} {:>7} {:>15}",
            format!("one sampled alloc+free, {DEPTH} frames{name}"),
            run.0 - unsampled.0,
            "ns",
            run.1,
            "-",
            "-",
            run.4
        );
    }
    println!(
        "(total {:.0?}; bytes/sample = event packets, collects included, location packets excluded)",
        Duration::from_secs(started.elapsed().as_secs())
    );
}
