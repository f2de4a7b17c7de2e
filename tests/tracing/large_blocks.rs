//! Large blocks, sampled or not, are served by the inner allocator's own call with the
//! program's layout (issue 44): a sparse zeroed block stays lazy (`calloc`'s fresh zero pages),
//! a buffer grown step by step keeps `mremap`, and blocks of every size from a byte to a GiB, at
//! alignments up to a page, keep their contents and layouts through `alloc_zeroed`, `realloc`
//! up and down, `dealloc` and C's `free`.
//!
//! The costs are compared with the same child run untraced, in CPU time and peak RSS (from
//! `wait4`), which another process on the machine barely moves: the allocator's old path (the
//! sampled-block alignment for every sampled block) made the sparse block cost seconds of
//! `memset` and GiBs of RSS, and the growth tens of seconds of copies, far past the bounds.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::io::Read;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use memtrace_rs::{trace_if_requested, MemtraceAllocator};

use super::{child, temp_path, Trace};

/// The sparse block's size, and how far apart its touched bytes are.
const SPARSE_BYTES: usize = 4 << 30;
const SPARSE_STRIDE: usize = 1 << 20;
/// The grown buffer's final size, and its growth step.
const GROWN_BYTES: usize = 1 << 30;
const GROWTH_STEP: usize = 8 << 20;

/// The child of the sparse test: a zeroed 4 GiB vector, one byte written per MiB.
pub(super) fn child_sparse() {
    let guard = trace_if_requested();
    assert_eq!(site_sparse(), SPARSE_BYTES / SPARSE_STRIDE);
    drop(guard);
}

#[inline(never)]
fn site_sparse() -> usize {
    let mut block = vec![0u8; SPARSE_BYTES];
    for i in (0..SPARSE_BYTES).step_by(SPARSE_STRIDE) {
        block[i] += 1;
    }
    black_box(&mut block);
    (0..SPARSE_BYTES).step_by(SPARSE_STRIDE).map(|i| usize::from(block[i])).sum()
}

/// The child of the growth test: a buffer grown to 1 GiB in `reserve_exact` steps of 8 MiB,
/// each step written.
pub(super) fn child_growth() {
    let guard = trace_if_requested();
    site_growth();
    drop(guard);
}

#[inline(never)]
fn site_growth() {
    let mut buffer: Vec<u8> = Vec::new();
    while buffer.len() < GROWN_BYTES {
        buffer.reserve_exact(GROWTH_STEP);
        let len = buffer.len();
        // SAFETY: `reserve_exact` made room for `GROWTH_STEP` more bytes, all written here.
        unsafe {
            buffer.as_mut_ptr().add(len).write_bytes((len / GROWTH_STEP) as u8, GROWTH_STEP);
            buffer.set_len(len + GROWTH_STEP);
        }
    }
    let steps = GROWN_BYTES / GROWTH_STEP;
    assert!((0..steps).all(|step| buffer[step * GROWTH_STEP + GROWTH_STEP - 1] == step as u8));
}

/// The tests of this module take turns: each runs children of a GiB or more, and measures them.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// What a child cost: its CPU time (user and system, all its threads) and its peak RSS.
struct Cost {
    cpu: Duration,
    peak_rss: u64,
}

/// Run the child `role` with `env` to its end (killed past a generous hang guard), require its
/// success, and measure it.
// The child is reaped by `wait4` below, which `Child::wait` cannot do: it gives no `rusage`.
#[allow(clippy::zombie_processes)]
fn cost_of(role: &str, env: &[(&str, &str)]) -> Cost {
    let mut proc = child(role, env).stdin(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let pid = proc.id() as libc::pid_t;
    let mut stderr = proc.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    // Polled rather than waited for, with a hang guard many times what the old path's copies
    // took on a loaded 2-core machine.
    let mut status = 0;
    // SAFETY: an all-zero `rusage` is a valid value, filled in by `wait4`.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    // SAFETY: waits for our own child, into locals.
    while unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) } == 0 {
        if std::time::Instant::now() > deadline {
            // SAFETY: a signal to our own child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("{role}: still running after 10 minutes");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let stderr = reader.join().unwrap();
    eprintln!("--- child {role} stderr:\n{stderr}");
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "{role}: status {status}: {stderr}");
    assert!(!stderr.contains("memtrace: "), "{role}: {stderr}");
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Cost { cpu: time(usage.ru_utime) + time(usage.ru_stime), peak_rss: usage.ru_maxrss as u64 * 1024 }
}

/// The child `role` run untraced and traced at the default rate: the traced run's CPU time is
/// within 1.5x + 0.5 s of the untraced one's, its peak RSS within `rss_allowance`, and its
/// trace holds the site `site`: the trace.
fn traced_costs_as_untraced(role: &str, site: &str, rss_allowance: u64) -> Trace {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let path = temp_path(role.trim_start_matches("large:"));
    let env = [("MEMTRACE_FILE", path.to_str().unwrap())];
    // Each run twice, interleaved, and the cheaper of the two kept: a passing burst of load
    // (page faults slowed by another process's) moves one run, seldom both.
    let (mut untraced, mut traced) = (cost_of(role, &[]), cost_of(role, &env));
    for (cost, env) in [(&mut untraced, &[][..]), (&mut traced, &env[..])] {
        let again = cost_of(role, env);
        cost.cpu = cost.cpu.min(again.cpu);
        cost.peak_rss = cost.peak_rss.min(again.peak_rss);
    }
    eprintln!(
        "{role}: CPU {:?} untraced, {:?} traced; peak RSS {} MiB untraced, {} MiB traced",
        untraced.cpu,
        traced.cpu,
        untraced.peak_rss >> 20,
        traced.peak_rss >> 20
    );
    assert!(
        traced.cpu <= untraced.cpu.mul_f64(1.5) + Duration::from_millis(500),
        "{role}: {:?} of CPU traced against {:?} untraced",
        traced.cpu,
        untraced.cpu
    );
    assert!(
        traced.peak_rss <= untraced.peak_rss + rss_allowance,
        "{role}: peak RSS {} MiB traced against {} MiB untraced",
        traced.peak_rss >> 20,
        untraced.peak_rss >> 20
    );
    let trace = Trace::read(&path);
    let _ = std::fs::remove_file(&path);
    assert!(trace.at_site(site).count() > 0, "{role}: no sample at {site}");
    trace
}

/// A sparse 4 GiB zeroed vector, touched once per MiB, costs no more traced than untraced:
/// its block is sampled (it covers some 5 000 sample points) and still comes from `calloc`'s
/// untouched zero pages.
#[test]
fn a_sparse_zeroed_block_stays_lazy_when_traced() {
    traced_costs_as_untraced("large:sparse", "::site_sparse", 64 << 20);
}

/// A buffer grown to 1 GiB in 8 MiB steps costs no more traced than untraced: every step is
/// sampled and is still the inner `realloc` (glibc's `mremap`), not a copy of the buffer.
#[test]
fn a_buffer_grown_by_realloc_keeps_its_cost_when_traced() {
    let trace = traced_costs_as_untraced("large:growth", "::site_growth", 64 << 20);
    // Every step's block covers about 100 sample points at least: all of them are sampled.
    let steps = GROWN_BYTES / GROWTH_STEP;
    assert!(trace.at_site("::site_growth").count() >= steps, "fewer samples than steps");
}

/// The inner allocator of [`TRACED`]: `System`, and a note of the last call it got.
struct Recorder;

/// The last allocating call [`Recorder`] got: which method, with which size and alignment, and
/// (for `realloc`) the new size; and the layout of the last `dealloc`.
static LAST_METHOD: AtomicUsize = AtomicUsize::new(0);
static LAST_SIZE: AtomicUsize = AtomicUsize::new(0);
static LAST_ALIGN: AtomicUsize = AtomicUsize::new(0);
static LAST_NEW_SIZE: AtomicUsize = AtomicUsize::new(0);
static LAST_FREED: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];
const ALLOC: usize = 1;
const ALLOC_ZEROED: usize = 2;
const REALLOC: usize = 3;

fn note(method: usize, layout: Layout, new_size: usize) {
    LAST_METHOD.store(method, Ordering::Relaxed);
    LAST_SIZE.store(layout.size(), Ordering::Relaxed);
    LAST_ALIGN.store(layout.align(), Ordering::Relaxed);
    LAST_NEW_SIZE.store(new_size, Ordering::Relaxed);
}

/// The last allocating call [`Recorder`] got, as (method, size, alignment, new size).
fn last_call() -> (usize, usize, usize, usize) {
    let load = |a: &AtomicUsize| a.load(Ordering::Relaxed);
    (load(&LAST_METHOD), load(&LAST_SIZE), load(&LAST_ALIGN), load(&LAST_NEW_SIZE))
}

/// The layout of the last `dealloc` [`Recorder`] got, as (size, alignment).
fn last_freed() -> (usize, usize) {
    (LAST_FREED[0].load(Ordering::Relaxed), LAST_FREED[1].load(Ordering::Relaxed))
}

// SAFETY: forwards every call to `System` unchanged.
unsafe impl GlobalAlloc for Recorder {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(ALLOC, layout, 0);
        // SAFETY: forwarded under the caller's contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(ALLOC_ZEROED, layout, 0);
        // SAFETY: forwarded under the caller's contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(REALLOC, layout, new_size);
        // SAFETY: forwarded under the caller's contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LAST_FREED[0].store(layout.size(), Ordering::Relaxed);
        LAST_FREED[1].store(layout.align(), Ordering::Relaxed);
        // SAFETY: forwarded under the caller's contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// A second `MemtraceAllocator`, called directly: it samples on the same countdown and set as
/// the global one, and its inner allocator says what it was asked.
static TRACED: MemtraceAllocator<Recorder> = MemtraceAllocator::new(Recorder);

/// Bytes of a block of `size` that the checks below write and read: its first and last bytes
/// and one in each 64 KiB between (so that a GiB block stays mostly untouched).
fn probes(size: usize) -> impl Iterator<Item = usize> {
    (0..size).step_by(64 << 10).chain([size - 1])
}

fn pattern(i: usize, seed: usize) -> u8 {
    (i / 7 + seed) as u8 | 1
}

/// The block `p` of `size` bytes, aligned at `align`, as `what`: aligned, and of a layout the
/// inner allocator got as the program's own wherever the block is large.
fn check_layout(p: *mut u8, size: usize, align: usize, what: &str) {
    assert!(!p.is_null() && (p as usize).is_multiple_of(align), "{what}: {p:?}");
    let (_, inner_size, inner_align, new_size) = last_call();
    let inner_size = if new_size != 0 { new_size } else { inner_size };
    assert_eq!(inner_size, size, "{what}: the inner allocator got another size");
    if size >= LARGE {
        assert_eq!(inner_align, align, "{what}: a large block's alignment changed");
    } else {
        assert!(inner_align >= align, "{what}: under-aligned");
    }
}

/// The threshold the allocator serves large blocks from with the program's layout (64 KiB).
const LARGE: usize = 64 << 10;

/// The child of the layouts test, at rate 1 (every allocation sampled): blocks of sizes from a
/// byte to a GiB, at alignments from 1 to a page, zeroed, grown, shrunk and freed through
/// [`TRACED`], half of them by C's `free`.
pub(super) fn child_layouts() {
    let guard = trace_if_requested();
    assert!(guard.is_some(), "not tracing");
    site_layouts();
    drop(guard);
}

#[inline(never)]
fn site_layouts() {
    let sizes = [1, 8, 100, 4096, LARGE - 1, LARGE, LARGE + 1, (1 << 20) + 3, 64 << 20, 1 << 30];
    let mut case = 0;
    for size in sizes {
        // A GiB block at an alignment past `malloc`'s is moved by `System`'s own `realloc`
        // (untraced too): a few alignments are enough there.
        let aligns: &[usize] = if size >= 64 << 20 { &[1, 16, 4096] } else { &[1, 2, 8, 16, 32, 64, 512, 1024, 4096] };
        for &align in aligns {
            case += 1;
            let what = format!("{size} bytes at {align}");
            let layout = Layout::from_size_align(size, align).unwrap();
            // SAFETY: nonzero sizes; each block is used within its size and freed once, with
            // the layout it has then (or by C's `free`, which `System`'s blocks allow).
            unsafe {
                let p = TRACED.alloc_zeroed(layout);
                check_layout(p, size, align, &format!("{what}, zeroed"));
                if size >= LARGE {
                    assert_eq!(last_call().0, ALLOC_ZEROED, "{what}: not the inner alloc_zeroed");
                }
                assert!(probes(size).all(|i| *p.add(i) == 0), "{what}: a zeroed block is not zero");
                probes(size).for_each(|i| *p.add(i) = pattern(i, case));
                let up = size * 2 + 5;
                let p = TRACED.realloc(p, layout, up);
                check_layout(p, up, align, &format!("{what}, grown"));
                if size >= LARGE {
                    assert_eq!(last_call().0, REALLOC, "{what}: not the inner realloc");
                }
                assert!(probes(size).all(|i| *p.add(i) == pattern(i, case)), "{what}: lost its bytes growing");
                let down = size.div_ceil(3);
                let p = TRACED.realloc(p, Layout::from_size_align(up, align).unwrap(), down);
                check_layout(p, down, align, &format!("{what}, shrunk"));
                assert!(
                    probes(size).filter(|&i| i < down).all(|i| *p.add(i) == pattern(i, case)),
                    "{what}: lost its bytes shrinking"
                );
                if case % 2 == 0 {
                    libc::free(p.cast());
                } else {
                    let layout = Layout::from_size_align(down, align).unwrap();
                    TRACED.dealloc(p, layout);
                    if down >= LARGE {
                        assert_eq!(last_freed(), (down, align), "{what}: freed with another layout");
                    }
                }
            }
        }
    }
}

/// Blocks of every size from a byte to a GiB, at alignments up to a page, sampled: zeroed,
/// grown and shrunk (across the large-block threshold both ways) keeping their bytes, each time
/// from the inner allocator with the program's layout if large, and freed by `dealloc` or by C.
#[test]
fn sampled_blocks_of_every_size_keep_their_contents_and_layouts() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let path = temp_path("large-layouts");
    let out = super::run("large:layouts", &[("MEMTRACE_FILE", path.to_str().unwrap()), ("MEMTRACE_RATE", "1")]);
    assert!(out.status.success(), "{:?}: {}", out.status, String::from_utf8_lossy(&out.stderr));
    assert_eq!(super::memtrace_messages(&out), Vec::<String>::new());
    let trace = Trace::read(&path);
    let _ = std::fs::remove_file(&path);
    // Three samples a case (zeroed, grown, shrunk) at least, at rate 1.
    assert!(trace.at_site("::site_layouts").count() >= 3 * 60, "the blocks were not sampled");
}
