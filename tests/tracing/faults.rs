//! Faults an adversarial run found (issue #12), each in a child process under a time limit: a
//! failing huge allocation, a FIFO nobody reads, a reader that stops reading, a thread close
//! to its stack limit, a start that fails after choosing its file; and a program traced under
//! heaptrack, whose `malloc` unwinds every call.

use crate::skip::skip;
use std::hint::black_box;
use std::os::fd::AsRawFd;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use memtrace_rs::{currently_tracing, trace_if_requested};

use super::{
    assert_one_message, child, fifo_reader, memtrace_messages, output_within, run_within, site_freed, temp_path, Trace,
};

/// Environment variable: where a `restarts` child writes its traces.
const DIR_VAR: &str = "MEMTRACE_TEST_DIR";
/// The sessions a `restarts` child traces, one after the other.
const RESTARTS: usize = 2;

/// Environment variable: the stack a `small_stack` child leaves when it allocates, in bytes.
const STACK_LEFT_VAR: &str = "MEMTRACE_TEST_STACK_LEFT";

/// The roles of this module's children; `false` for a role that is not one of them.
pub(crate) fn child_role(role: &str) -> bool {
    match role {
        "huge" => {
            let guard = trace_if_requested();
            assert!(guard.is_some());
            for size in [isize::MAX as usize, 1 << 50, 1 << 48] {
                let start = Instant::now();
                let mut v: Vec<u8> = Vec::new();
                assert!(black_box(v.try_reserve(size)).is_err(), "{size} bytes reserved");
                let took = start.elapsed();
                assert!(took < Duration::from_millis(100), "a failing {size}-byte allocation took {took:?}");
            }
            drop(guard);
        }
        "busy_stop" => {
            // Every allocation sampled, then a stop with a timeout far shorter than the writer
            // needs to name the frames of the last samples and write them. The session's first
            // sample wakes the writer, which then goes back to its polls: the samples of the
            // sites below, made within a few of them, leave most of their 1 024 new frames to
            // name at the stop.
            let sites = busy_sites();
            let path = std::env::var("MEMTRACE_FILE").unwrap();
            let config = memtrace_rs::TraceConfig::new(path).rate(1.0).stop_timeout(Duration::from_millis(1));
            let guard = memtrace_rs::start_tracing(config).unwrap();
            drop(black_box(Box::new(0u8)));
            std::thread::sleep(Duration::from_millis(50));
            let blocks: Vec<Box<[u64; 4]>> = sites.iter().cycle().take(BUSY_STOP_BLOCKS).map(|site| site()).collect();
            let stopping = Instant::now();
            let stats = guard.finish().expect("the writer, busy but working, was waited for");
            // Else the test did not test the wait past the timeout.
            assert!(stopping.elapsed() > Duration::from_millis(1), "stopped within the timeout");
            assert!(stats.samples_written >= BUSY_STOP_BLOCKS as u64, "{stats:?}");
            let lost = stats.dropped_writer_behind + stats.dropped_untracked + stats.dropped_no_memory;
            assert_eq!(lost, 0, "{stats:?}");
            drop(blocks);
        }
        "restarts" => {
            let dir = std::path::PathBuf::from(std::env::var_os(DIR_VAR).unwrap());
            // Threads allocating at sites new to heaptrack's unwinder (each of its cache misses
            // asks the loader) while the sessions start.
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let stop = std::sync::Arc::clone(&stop);
                    std::thread::spawn(move || {
                        let sites = busy_sites();
                        while !stop.load(Ordering::Relaxed) {
                            sites.iter().for_each(|site| drop(black_box(site())));
                        }
                    })
                })
                .collect();
            for round in 0..RESTARTS {
                // The default rate, at which the writer gets ready while the start calibrates.
                let config = memtrace_rs::TraceConfig::new(dir.join(format!("{round}.ctf")));
                let guard = memtrace_rs::start_tracing(config).unwrap();
                site_freed();
                guard.finish().unwrap();
            }
            stop.store(true, Ordering::Relaxed);
            threads.into_iter().for_each(|t| t.join().unwrap());
        }
        "stalled" | "stalled_exit" => {
            let guard = trace_if_requested();
            assert!(guard.is_some());
            // Enough samples to fill the pipe, over more than a flush interval.
            let end = Instant::now() + Duration::from_millis(1500);
            while Instant::now() < end {
                site_freed();
                std::thread::sleep(Duration::from_millis(50));
            }
            if role == "stalled_exit" {
                std::mem::forget(guard);
                std::process::exit(0);
            }
            let error = guard.unwrap().finish().unwrap_err();
            assert!(matches!(error.kind(), memtrace_rs::ErrorKind::WriterStalled(_)), "{error}");
            assert!(!currently_tracing());
        }
        "small_stack" => {
            let left: usize = std::env::var(STACK_LEFT_VAR).unwrap().parse().unwrap();
            let guard = trace_if_requested();
            let thread = std::thread::Builder::new().stack_size(128 << 10).spawn(move || {
                // The thread's first allocation (its malloc arena; for the tracer, its stack
                // bounds) near the top of its stack, and a block to free at the bottom.
                let shallow = black_box(Box::new([1u8; 64]));
                descend_and_allocate(left, stack_low(), shallow)
            });
            let allocated = thread.unwrap().join().unwrap();
            assert!(allocated > 0);
            eprintln!("allocated with {} bytes of stack left", STACK_LEFT_DEEPEST.load(Ordering::Relaxed));
            drop(guard);
        }
        "stack_use" => {
            // Bytes of stack below the caller: starting (and stopping) a session, an allocation
            // and a free untraced, a sampled allocation (on a thread's first sample: its stack
            // bounds asked for, unwind rules looked up; and later), the free of a sampled block,
            // and libgcc's unwinder, which the DWARF walk falls back to.
            let start = on_new_thread(|| {}, start_and_stop);
            let untraced = on_new_thread(|| {}, alloc_and_free);
            let guard = trace_if_requested();
            assert!(guard.is_some());
            let first = on_new_thread(|| {}, alloc_and_free);
            let sample = on_new_thread(alloc_and_free, alloc_and_free);
            let free = on_new_thread(keep_a_block, free_the_block);
            drop(guard);
            let libgcc = on_new_thread(|| {}, libgcc_trace);
            let libgcc_warm = on_new_thread(libgcc_trace, libgcc_trace);
            println!(
                "stack start={start} untraced={untraced} first-sample={first} sample={sample} free={free} \
                 libgcc-first={libgcc} libgcc={libgcc_warm}"
            );
        }
        _ => return false,
    }
    true
}

fn alloc_and_free() {
    drop(black_box(Box::new([3u8; 40])));
}

fn start_and_stop() {
    let path = std::env::var_os(super::SECOND_FILE_VAR).unwrap();
    drop(memtrace_rs::start_tracing(memtrace_rs::TraceConfig::new(path)).unwrap());
}

thread_local! {
    static KEPT: std::cell::Cell<Option<Box<[u8; 40]>>> = const { std::cell::Cell::new(None) };
}

fn keep_a_block() {
    KEPT.set(Some(black_box(Box::new([4u8; 40]))));
}

fn free_the_block() {
    drop(KEPT.take());
}

fn libgcc_trace() {
    // SAFETY: walks this thread's stack; the callback only counts.
    unsafe { backtrace::trace_unsynchronized(|frame| black_box(frame.ip()) as usize != 0) };
}

/// On a new thread with a 1 MiB stack, after `setup`: the bytes of stack `f` uses.
fn on_new_thread(setup: fn(), f: fn()) -> usize {
    let thread = std::thread::Builder::new().stack_size(1 << 20).spawn(move || {
        setup();
        stack_used(f)
    });
    thread.unwrap().join().unwrap()
}

/// The bytes of stack `f` uses below this function's frame: the stack below is painted with a
/// pattern first, and the lowest word `f` changed is looked for after.
#[inline(never)]
fn stack_used(f: fn()) -> usize {
    const PATTERN: u64 = 0x5a5a_a5a5_5a5a_a5a5;
    let marker = 0u64;
    let here = black_box(std::ptr::addr_of!(marker) as usize);
    let (bottom, top) = ((stack_low() + 4096) & !7, (here - 256) & !7);
    for at in (bottom..top).step_by(8) {
        // SAFETY: an aligned word of this thread's stack, between its low end and well below
        // the current frame: mapped, and in use by nobody.
        unsafe { std::ptr::write_volatile(at as *mut u64, PATTERN) };
    }
    f();
    // SAFETY: as above: words of this thread's stack below this frame.
    let lowest = (bottom..top).step_by(8).find(|&at| unsafe { std::ptr::read_volatile(at as *const u64) } != PATTERN);
    here - lowest.unwrap_or(top)
}

/// The lowest address of this thread's stack.
fn stack_low() -> usize {
    // SAFETY: `attr` is initialised by pthread_getattr_np before use and destroyed after; the
    // out-pointers are valid for writes.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        assert_eq!(libc::pthread_getattr_np(libc::pthread_self(), &mut attr), 0);
        let (mut addr, mut size) = (std::ptr::null_mut(), 0);
        assert_eq!(libc::pthread_attr_getstack(&attr, &mut addr, &mut size), 0);
        libc::pthread_attr_destroy(&mut attr);
        addr as usize
    }
}

/// The stack `deepest` had left, for the record.
pub(crate) static STACK_LEFT_DEEPEST: AtomicUsize = AtomicUsize::new(0);

/// Recurse until about `left` bytes of stack are left (give or take a frame, a hundred bytes),
/// then allocate and free there (and free `shallow`, allocated near the top); returns the
/// address allocated.
#[inline(never)]
pub(crate) fn descend_and_allocate(left: usize, low: usize, shallow: Box<[u8; 64]>) -> usize {
    let pad = black_box([0u8; 32]);
    let here = std::ptr::addr_of!(pad) as usize;
    if here - low > left + 160 {
        return descend_and_allocate(left, low, shallow) + pad[0] as usize;
    }
    deepest(low, shallow)
}

#[inline(never)]
fn deepest(low: usize, shallow: Box<[u8; 64]>) -> usize {
    let marker = 0u8;
    STACK_LEFT_DEEPEST.store(std::ptr::addr_of!(marker) as usize - low, Ordering::Relaxed);
    let block = black_box(Box::new([2u8; 48]));
    let at = &*block as *const [u8; 48] as usize;
    drop(block);
    drop(shallow);
    at
}

#[test]
fn a_failing_huge_allocation_returns_at_once() {
    let path = temp_path("huge");
    // The default rate, a higher one, and every word sampled.
    for rate in ["", "1e-3", "1"] {
        let env = [("MEMTRACE_FILE", path.to_str().unwrap()), ("MEMTRACE_RATE", rate)];
        let (out, _) = run_within("huge", &env, Duration::from_secs(60));
        assert!(out.status.success(), "rate {rate:?}");
        assert!(memtrace_messages(&out).is_empty(), "{:?}", memtrace_messages(&out));
        let trace = Trace::read(&path);
        assert!(trace.warnings.is_empty(), "{:?}", trace.warnings);
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_fifo_nobody_reads_is_reported_and_ignored() {
    let fifo = temp_path("fifo-unread");
    let c_fifo = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0);
    let (out, _) = run_within("untraced", &[("MEMTRACE_FILE", fifo.to_str().unwrap())], Duration::from_secs(30));
    assert!(out.status.success());
    assert_one_message(&out, "is a FIFO that no process is reading");
    let _ = std::fs::remove_file(&fifo);
}

/// heaptrack (Debian's package) runs a program with a `malloc` of its own that unwinds the
/// stack of every call with libunwind, under a lock of its own, and libunwind asks the loader
/// for the objects (`dl_iterate_phdr`, under the loader's lock). The writer thread scanned the
/// loaded objects when a session started and allocated in the loader's callback, under the
/// loader's lock, while the program's thread allocated (calibrating): each held the lock the
/// other waited for, and a `jaq -n 1` traced under heaptrack hung at its start.
#[test]
fn a_program_traced_under_heaptrack_runs_to_its_end() {
    let found = std::env::var_os("PATH")
        .and_then(|path| std::env::split_paths(&path).map(|dir| dir.join("heaptrack")).find(|p| p.is_file()));
    let Some(heaptrack) = found else {
        skip("heaptrack is not installed (apt-get install heaptrack)");
        return;
    };
    // heaptrack unwinds every `malloc` of its program: a CPU-heavy run, kept apart from the
    // stress tests, whose writer must keep up.
    let _alone = super::cpu_heavy();
    // The race is the first start's: a few programs, each starting twice.
    for run in 0..4 {
        let dir = tempfile::tempdir().unwrap();
        let traced = child("restarts", &[(DIR_VAR, dir.path().to_str().unwrap())]);
        let mut cmd = std::process::Command::new(&heaptrack);
        cmd.arg("-o").arg(dir.path().join("heaptrack")).arg(traced.get_program()).args(traced.get_args());
        for (var, value) in traced.get_envs() {
            match value {
                Some(value) => cmd.env(var, value),
                None => cmd.env_remove(var),
            };
        }
        cmd.stdout(Stdio::null());
        let (out, _) = output_within(cmd, &format!("restarts under heaptrack, run {run}"), Duration::from_secs(60));
        assert!(out.status.success(), "run {run}: {:?}", out.status);
        let traces: Vec<Trace> =
            (0..RESTARTS).map(|round| Trace::read(&dir.path().join(format!("{round}.ctf")))).collect();
        assert!(traces.iter().all(|trace| trace.warnings.is_empty()), "run {run}: a trace has warnings");
        assert!(traces.iter().any(|trace| !trace.allocs.is_empty()), "run {run}: nothing sampled");
    }
}

/// The blocks the `busy_stop` child allocates, each sampled.
const BUSY_STOP_BLOCKS: usize = 2048;

/// An allocation site of its own for each `N`: a frame address that the writer names anew.
#[inline(never)]
fn busy_site<const N: u64>() -> Box<[u64; 4]> {
    black_box(Box::new([N; 4]))
}

/// 1 024 allocation sites, each of distinct code.
fn busy_sites() -> Vec<fn() -> Box<[u64; 4]>> {
    let mut sites: Vec<fn() -> Box<[u64; 4]>> = Vec::with_capacity(1024);
    macro_rules! push {
        ($a:literal; $($b:literal)*) => { $( sites.push(busy_site::<{ $a * 32 + $b }>); )* };
    }
    macro_rules! row {
        ($($a:literal)*) => {
            $( push!($a; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31); )*
        };
    }
    row!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31);
    sites
}

/// A stop timeout (1 ms) far shorter than the writer needs to drain a queue of samples: the
/// writer, busy naming frames and writing, is waited for, and the trace has every sample.
/// (A timeout on the total time would give it up.)
#[test]
fn a_busy_writer_is_waited_for_past_the_stop_timeout() {
    let path = temp_path("busy-stop");
    let (out, _) = run_within("busy_stop", &[("MEMTRACE_FILE", path.to_str().unwrap())], Duration::from_secs(60));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(memtrace_messages(&out).is_empty(), "{:?}", memtrace_messages(&out));
    let trace = Trace::read(&path);
    assert!(trace.warnings.is_empty(), "{:?}", trace.warnings);
    assert!(trace.allocs.len() >= BUSY_STOP_BLOCKS, "{} samples", trace.allocs.len());
    let _ = std::fs::remove_file(&path);
}

/// A reader that opens the FIFO and never reads: the writer blocks once the pipe is full, and
/// the program still ends, after the stop timeout, with one message (from the guard's
/// `finish`, which says the writer stalled, or from the exit hook after `process::exit`).
#[test]
fn a_fifo_whose_reader_stalls_lets_the_program_finish() {
    for role in ["stalled", "stalled_exit"] {
        let fifo = temp_path(&format!("fifo-{role}"));
        let reader = fifo_reader(&fifo);
        let env = [("MEMTRACE_FILE", fifo.to_str().unwrap()), ("MEMTRACE_RATE", "1e-3")];
        let (out, took) = run_within(role, &env, Duration::from_secs(30));
        assert!(out.status.success(), "{role}");
        // 1.5 s of work and the default 1 s stop timeout, with slack for a loaded machine.
        assert!(took < Duration::from_secs(10), "{role}: took {took:?}");
        let messages = memtrace_messages(&out);
        assert_eq!(messages.len(), 1, "{role}: {messages:?}");
        assert!(messages[0].contains("gave up waiting"), "{role}: {messages:?}");
        assert!(messages[0].contains(fifo.to_str().unwrap()), "{role}: {messages:?}");
        // The cause the stop saw: the writer asleep in its write.
        assert!(messages[0].contains("blocked in a read or write of a file"), "{role}: {messages:?}");
        // Nothing read: the pipe is full.
        let mut available: libc::c_int = 0;
        // SAFETY: FIONREAD on a descriptor we own, into an int.
        assert_eq!(unsafe { libc::ioctl(reader.as_raw_fd(), libc::FIONREAD, &mut available) }, 0);
        assert!(available > 0);
        drop(reader);
        let _ = std::fs::remove_file(&fifo);
    }
}

/// A thread with little stack left allocates under tracing (at rate 1, where every allocation
/// is sampled) as it does untraced: the sample it has no stack for is dropped and reported; the
/// free of a sampled block there, with no stack to send its message, is kept for the writer
/// (`late_frees`), not lost. Optimised, both work with a few hundred bytes left;
/// unoptimised, the allocator's frame before the stack check holds the locals of every path
/// inlined into it (sampled, measured, offset blocks), some 2.5 KiB more than the system
/// allocator takes, so the traced run gets 3 KiB more (a capture there would take 3 KiB with
/// frame pointers, 6 KiB for a first DWARF walk, and overflow).
#[test]
fn a_thread_near_its_stack_limit_allocates_as_untraced() {
    let (left, debug_frames) = if cfg!(debug_assertions) { (1280, 3072) } else { (384, 0) };
    let untraced = left.to_string();
    let (out, _) = run_within("small_stack", &[(STACK_LEFT_VAR, &untraced)], Duration::from_secs(30));
    assert!(out.status.success(), "the untraced program itself fails with {left} bytes of stack left");
    let traced = (left + debug_frames).to_string();
    let path = temp_path("small-stack");
    for unwinder in ["frame-pointers", "dwarf"] {
        let env = [
            (STACK_LEFT_VAR, traced.as_str()),
            ("MEMTRACE_FILE", path.to_str().unwrap()),
            ("MEMTRACE_RATE", "1"),
            ("MEMTRACE_UNWINDER", unwinder),
        ];
        let (out, _) = run_within("small_stack", &env, Duration::from_secs(30));
        assert!(out.status.success(), "{unwinder}: {}", String::from_utf8_lossy(&out.stderr));
        let messages = memtrace_messages(&out);
        assert_eq!(messages.len(), 1, "{unwinder}: a free lost? {messages:?}");
        assert!(
            messages[0].contains("1 with too little stack left, or a stack of unknown size, to capture theirs"),
            "{unwinder}: {messages:?}"
        );
        let trace = Trace::read(&path);
        assert!(trace.warnings.is_empty(), "{:?}", trace.warnings);
        assert!(!trace.allocs.is_empty());
    }
    let _ = std::fs::remove_file(&path);
}

/// A context too long for the trace's first packet: one message, and no file, neither a new
/// one nor an existing one truncated.
#[test]
fn a_rejected_context_leaves_no_file() {
    let path = temp_path("long-context");
    let context = "x".repeat(100_000);
    let env = [("MEMTRACE_FILE", path.to_str().unwrap()), ("MEMTRACE_CONTEXT", context.as_str())];
    let (out, _) = run_within("untraced", &env, Duration::from_secs(30));
    assert!(out.status.success());
    assert_one_message(&out, "not tracing");
    assert!(!path.exists(), "a failed start left {} behind", path.display());
    std::fs::write(&path, b"an older trace").unwrap();
    let (out, _) = run_within("untraced", &env, Duration::from_secs(30));
    assert!(out.status.success());
    assert_eq!(std::fs::read(&path).unwrap(), b"an older trace");
    let _ = std::fs::remove_file(&path);
}

/// The stack the tracer takes, measured per walker, is within what its stack checks require:
/// `STACK_NEEDED` in `src/runtime/unwind/capture.rs` (8 KiB for frame pointers, 16 KiB for
/// DWARF and libgcc) and `FREE_STACK_NEEDED` in `src/runtime/record.rs` (4 KiB); and a session
/// starts (calibration included) in 20 KiB (unoptimised: 17.8 KiB with the file series'
/// and the measured scopes' state, 16.2 KiB before them).
#[test]
fn stack_use_of_the_tracer() {
    let path = temp_path("stack-use");
    let second = temp_path("stack-use-start");
    for (unwinder, needed) in [("frame-pointers", 8 << 10), ("dwarf", 16 << 10)] {
        let env = [
            ("MEMTRACE_FILE", path.to_str().unwrap()),
            ("MEMTRACE_RATE", "1"),
            ("MEMTRACE_UNWINDER", unwinder),
            (super::SECOND_FILE_VAR, second.to_str().unwrap()),
        ];
        let out = child("stack_use", &env).stdout(Stdio::piped()).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout.lines().find(|l| l.starts_with("stack ")).unwrap();
        eprintln!("{unwinder}: {line}");
        let used = |what: &str| -> usize {
            let field = line.split(' ').find_map(|f| f.strip_prefix(what)?.strip_prefix('='));
            field.unwrap_or_else(|| panic!("no {what} in {line}")).parse().unwrap()
        };
        assert!(used("first-sample").max(used("sample")).max(used("libgcc-first")) <= needed, "{unwinder}: {line}");
        assert!(used("free") <= 4 << 10, "{line}");
        assert!(used("start") <= 20 << 10, "{line}");
    }
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&second);
}
