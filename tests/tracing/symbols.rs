//! Names in traces: long inline chains, libraries loaded and unloaded while tracing, stripped
//! libraries, forks while the writer symbolizes, start-up with little memory, and a release
//! build's frames against binutils' `addr2line`.

use crate::skip::skip;
use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::hint::black_box;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use memtrace_rs::trace::Location;
use memtrace_rs::{start_tracing, trace_if_requested, TraceConfig};

use super::{
    build_release_sites, memtrace_messages, release_sites_fixture, run, run_within, temp_path, Trace, SECOND_FILE_VAR,
};

/// The child roles of this module (`child_role` hands them over).
pub(super) fn child(role: &str) {
    match role {
        "symbols:inline" => {
            let guard = trace_if_requested();
            assert!(guard.is_some());
            black_box(inline_chain_root());
        }
        "symbols:dlopen" => {
            let _guard = trace_if_requested();
            let libraries = std::env::var(SECOND_FILE_VAR).unwrap();
            let (alpha, beta) = libraries.split_once(':').unwrap();
            // The writer names samples some time after they are taken, and samples still queued
            // at an unload are named after what is loaded when it gets to them: give it time to
            // name the program's frames first (unoptimised, on a busy machine), then alpha's.
            black_box(allocate_blocks());
            std::thread::sleep(Duration::from_secs(1));
            let (handle, alpha_at) = call_library(alpha, "alpha_calls", allocate_from_alpha);
            std::thread::sleep(Duration::from_secs(1));
            // SAFETY: nothing of the library is used after this.
            assert_eq!(unsafe { libc::dlclose(handle) }, 0);
            let (handle, beta_at) = call_library(beta, "beta_calls", allocate_from_beta);
            std::fs::write(format!("{alpha}.same"), if alpha_at == beta_at { "1" } else { "0" }).unwrap();
            std::thread::sleep(Duration::from_secs(1));
            // SAFETY: nothing of the library is used after this.
            unsafe { libc::dlclose(handle) };
        }
        "symbols:dlopen-churn" => {
            let libraries = std::env::var(SECOND_FILE_VAR).unwrap();
            let (alpha, beta) = libraries.split_once(':').unwrap();
            // Alpha, loaded before the start, stays; beta, a plugin, is loaded, called back and
            // closed at once, again and again.
            let (kept, _) = call_library(alpha, "alpha_calls", allocate_from_alpha);
            let _guard = trace_if_requested();
            for _ in 0..200 {
                call_library(alpha, "alpha_calls", allocate_from_alpha);
                let (handle, _) = call_library(beta, "beta_calls", allocate_from_beta);
                // SAFETY: nothing of the library is used after this.
                assert_eq!(unsafe { libc::dlclose(handle) }, 0);
            }
            // SAFETY: nothing of the library is used after this (the trace is written at exit,
            // from the program's frames and the libraries' names already taken).
            black_box(kept);
        }
        "symbols:fork" => fork_while_symbolizing(),
        #[cfg(debug_assertions)]
        "symbols:fork-in-loader" => fork_while_in_the_loader(),
        "symbols:stuck" => {
            // The library loaded, its file is replaced by a FIFO that nobody writes to: naming
            // its frames opens the FIFO, which blocks, as reading from a file system that does
            // not answer would.
            let library = std::env::var(SECOND_FILE_VAR).unwrap();
            let c_library = CString::new(library.as_str()).unwrap();
            // SAFETY: a NUL-terminated path; the library (built by `build_library`) has no
            // constructors.
            let handle = unsafe { libc::dlopen(c_library.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            assert!(!handle.is_null());
            std::fs::remove_file(&library).unwrap();
            // SAFETY: a NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c_library.as_ptr(), 0o600) }, 0);
            let path = std::env::var("MEMTRACE_FILE").unwrap();
            let config = TraceConfig::new(path).rate(0.01).stop_timeout(Duration::from_millis(200));
            let guard = start_tracing(config).unwrap();
            // SAFETY: `handle` is the loaded library; its function has the type it is called with.
            unsafe {
                let at = libc::dlsym(handle, c"stuck_calls".as_ptr());
                assert!(!at.is_null());
                let calls: extern "C" fn(extern "C" fn() -> i32) -> i32 = std::mem::transmute(at);
                black_box(calls(allocate_from_alpha));
            }
            let error = guard.finish().unwrap_err();
            assert!(matches!(error.kind(), memtrace_rs::ErrorKind::WriterStalled(_)), "{error}");
        }
        "symbols:rlimit" => {
            // Little address space left (`MEMTRACE_TEST_HEADROOM_MIB`): with 4 MiB, the queue
            // for rate 1 (7 MiB) cannot be had. (The
            // parent runs this child with one malloc arena, and blocks of 128 KiB and more are
            // mapped afresh: a thread arena's 64 MiB reservation, counted before the limit was
            // set, would otherwise serve the queue whatever the limit.)
            let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            // SAFETY: reading and lowering this process's own soft limit; mallopt only sets a
            // parameter of the C allocator.
            unsafe {
                assert_eq!(libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10), 1);
                assert_eq!(libc::getrlimit(libc::RLIMIT_AS, &mut limit), 0);
                let used = std::fs::read_to_string("/proc/self/statm").unwrap();
                let pages: u64 = used.split_whitespace().next().unwrap().parse().unwrap();
                let headroom: u64 = std::env::var("MEMTRACE_TEST_HEADROOM_MIB").unwrap().parse().unwrap();
                let tight = libc::rlimit { rlim_cur: pages * 4096 + (headroom << 20), rlim_max: limit.rlim_max };
                assert_eq!(libc::setrlimit(libc::RLIMIT_AS, &tight), 0);
            }
            let guard = trace_if_requested();
            // SAFETY: restoring the soft limit (not above the hard one).
            assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) }, 0);
            let v: Vec<Vec<u8>> = (0..1000).map(|i| vec![1u8; i]).collect();
            black_box(v);
            drop(guard);
        }
        other => panic!("unknown role {other}"),
    }
}

// ---------------------------------------------------------------------------------------------
// A site reached through a long inline chain of long generic names.

/// A type whose name makes every generic instance's name long.
struct AnExceedinglyLongTypeNameThatMakesGenericFunctionNamesLongerThanAnyoneWouldLike<T>(T);

macro_rules! inline_chain {
    ($name:ident, $next:ident $(, $rest:ident)*) => {
        #[inline(always)]
        fn $name<T: Copy>(
            x: AnExceedinglyLongTypeNameThatMakesGenericFunctionNamesLongerThanAnyoneWouldLike<T>,
        ) -> usize {
            $next(x) + 1
        }
        inline_chain!($next $(, $rest)*);
    };
    ($last:ident) => {
        #[inline(always)]
        fn $last<T: Copy>(
            x: AnExceedinglyLongTypeNameThatMakesGenericFunctionNamesLongerThanAnyoneWouldLike<T>,
        ) -> usize {
            let mut n = 0;
            for _ in 0..2000 {
                let v: Vec<T> = Vec::with_capacity(1000);
                n += black_box(v).capacity();
                black_box(x.0);
            }
            n
        }
    };
}

inline_chain!(
    inline_level_00_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_01_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_02_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_03_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_04_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_05_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_06_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_07_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_08_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_09_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_10_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_11_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_12_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_13_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_14_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_15_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_16_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_17_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_18_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_19_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_20_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_21_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_22_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_23_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_24_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_25_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_26_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_27_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_28_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_29_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_30_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_31_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_32_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_33_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_34_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_35_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_36_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_37_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_38_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record,
    inline_level_39_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record
);

#[inline(never)]
fn inline_chain_root() -> usize {
    inline_level_00_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record(
        AnExceedinglyLongTypeNameThatMakesGenericFunctionNamesLongerThanAnyoneWouldLike([0u64; 4]),
    )
}

/// A frame whose inline chain (41 functions with names of some 200 bytes) is too long for a
/// location record keeps its outermost function and its innermost call site, by name, instead
/// of becoming the unknown location.
#[test]
fn a_long_inline_chain_keeps_its_function_names() {
    let path = temp_path("inline-chain");
    let out = run("symbols:inline", &[("MEMTRACE_FILE", path.to_str().unwrap()), ("MEMTRACE_RATE", "0.01")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let trace = Trace::read(&path);
    let mut chains = 0;
    for a in trace.allocs.values() {
        for frame in trace.frames(a) {
            assert!(!frame.contains(&Location::unknown()), "a frame became the unknown location");
            let names: Vec<_> = frame.iter().map(|l| l.defname_str().into_owned()).collect();
            if names.iter().any(|n| n.contains("inline_level_")) {
                chains += 1;
                assert!(names[0].ends_with("inline_chain_root"), "outermost kept: {names:?}");
                assert!(
                    names.iter().any(|n| n.contains(
                        "inline_level_39_with_a_name_long_enough_that_forty_one_of_them_cannot_fit_in_one_record"
                    )),
                    "innermost: {names:?}"
                );
                let shortened = names.len() < 41 || names.iter().any(|n| n.contains("<…>"));
                assert!(shortened, "the chain fitted a record: the test proves nothing: {names:?}");
            }
        }
    }
    // 2000 blocks of 32 KB at 1 %: thousands of samples.
    assert!(chains > 100, "{chains} samples through the chain");
    let _ = std::fs::remove_file(&path);
}

// ---------------------------------------------------------------------------------------------
// Libraries loaded while tracing, and unloaded.

/// The C library `lib<name>.so` in `dir`, exporting `<name>_calls(f)` that calls `f` (kept out
/// of line, with a frame pointer); stripped of its symbol table (the dynamic one stays) when
/// `strip`. `None` without a C compiler.
fn build_library(dir: &Path, name: &str, strip: bool) -> Option<PathBuf> {
    let source = dir.join(format!("{name}.c"));
    let code =
        format!("__attribute__((noinline)) int {name}_calls(int (*f)(void)) {{\n  int r = f();\n  return r + 1;\n}}\n");
    std::fs::write(&source, code).unwrap();
    let out = dir.join(format!("lib{name}.so"));
    let mut cc = Command::new("cc");
    cc.args(["-shared", "-fPIC", "-g", "-O1", "-fno-omit-frame-pointer", "-o"]).arg(&out).arg(&source);
    if strip {
        cc.arg("-s");
    }
    cc.status().ok()?.success().then_some(out)
}

/// Load `path` and call its `symbol` with `f`; the handle and the symbol's address.
fn call_library(path: &str, symbol: &str, f: extern "C" fn() -> i32) -> (*mut libc::c_void, usize) {
    let (path, symbol) = (CString::new(path).unwrap(), CString::new(symbol).unwrap());
    // SAFETY: NUL-terminated strings; the library (built by `build_library`) has no
    // constructors, and its function has the type it is called with.
    unsafe {
        let handle = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!handle.is_null());
        let at = libc::dlsym(handle, symbol.as_ptr());
        assert!(!at.is_null());
        let calls: extern "C" fn(extern "C" fn() -> i32) -> i32 = std::mem::transmute(at);
        black_box(calls(f));
        (handle, at as usize)
    }
}

#[inline(never)]
fn allocate_blocks() -> i32 {
    let blocks: Vec<Vec<u8>> = (0..200).map(|_| black_box(vec![1u8; 10_000])).collect();
    blocks.len() as i32
}

// Of different code (their results differ), so that an optimised build does not fold them
// into one function of one name.
extern "C" fn allocate_from_alpha() -> i32 {
    black_box(allocate_blocks()) + 1
}

extern "C" fn allocate_from_beta() -> i32 {
    black_box(allocate_blocks()) + 2
}

/// What [`trace_loading_libraries`] leaves: the trace, the library `alpha`, and the trace's
/// path and the libraries' directory, for the test to remove.
struct LibrariesRun {
    trace: Trace,
    alpha: PathBuf,
    path: PathBuf,
    dir: PathBuf,
}

/// The trace, at `rate`, of the child `symbols:CASE`, given the libraries `alpha` and `beta`
/// (stripped if `strip_beta`) built in a directory of its own; `None` without a C compiler
/// (never under CI).
fn trace_loading_libraries(case: &str, rate: &str, strip_beta: bool) -> Option<LibrariesRun> {
    let dir = temp_path(case).with_extension("d");
    std::fs::create_dir_all(&dir).unwrap();
    let (Some(alpha), Some(beta)) = (build_library(&dir, "alpha", false), build_library(&dir, "beta", strip_beta))
    else {
        skip("no C compiler (apt-get install gcc)");
        return None;
    };
    let path = temp_path(case);
    let libraries = format!("{}:{}", alpha.display(), beta.display());
    let out = run(
        &format!("symbols:{case}"),
        &[("MEMTRACE_FILE", path.to_str().unwrap()), ("MEMTRACE_RATE", rate), (SECOND_FILE_VAR, &libraries)],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Some(LibrariesRun { trace: Trace::read(&path), alpha, path, dir })
}

/// A library loaded after tracing started is named (with its file and line, from its DWARF);
/// one loaded after it was unloaded, at its address (the loader reuses the range of a library
/// of the same layout), gets its own names, from its dynamic symbol table (it is stripped),
/// never the unloaded one's.
#[test]
fn libraries_loaded_while_tracing_are_named_and_unloads_forgotten() {
    let Some(LibrariesRun { trace, alpha, path, dir }) = trace_loading_libraries("dlopen", "0.01", true) else {
        return;
    };
    let (mut from_alpha, mut from_beta) = (0, 0);
    for a in trace.allocs.values() {
        let names: Vec<Location> = trace.frames(a).flatten().cloned().collect();
        let has = |name: &str| names.iter().any(|l| l.defname_str() == name);
        if names.iter().any(|l| l.defname_str().ends_with("allocate_from_alpha")) {
            from_alpha += 1;
            let alpha_frame = names
                .iter()
                .find(|l| l.defname_str() == "alpha_calls")
                .unwrap_or_else(|| panic!("alpha_calls not named: {}", super::describe(&names)));
            assert!(alpha_frame.filename_str().ends_with("alpha.c") && alpha_frame.line == 2, "{alpha_frame:?}");
        }
        if names.iter().any(|l| l.defname_str().ends_with("allocate_from_beta")) {
            from_beta += 1;
            assert!(has("beta_calls") && !has("alpha_calls"), "{}", super::describe(&names));
        }
    }
    assert!(from_alpha > 50 && from_beta > 50, "{from_alpha} samples from alpha, {from_beta} from beta");
    // Else the case the test is for, names of an unloaded library's range, was not exercised.
    let same = std::fs::read_to_string(format!("{}.same", alpha.display())).unwrap();
    assert_eq!(same, "1", "beta was loaded elsewhere than at alpha's address");
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A plugin host: a library loaded before the start, and another loaded after it, called back
/// at rate 1 and closed at once, 200 times over: the frames of both are named, the second's
/// although the writer names most of them after its unload.
#[test]
fn a_library_unloaded_at_once_keeps_its_names() {
    let Some(LibrariesRun { trace, path, dir, .. }) = trace_loading_libraries("dlopen-churn", "1", false) else {
        return;
    };
    let (mut samples, mut unnamed) = ([0u64; 2], [0u64; 2]);
    for a in trace.allocs.values() {
        let names: Vec<Location> = trace.frames(a).flatten().cloned().collect();
        for (k, (caller, library)) in
            [("allocate_from_alpha", "alpha_calls"), ("allocate_from_beta", "beta_calls")].iter().enumerate()
        {
            if names.iter().any(|l| l.defname_str().ends_with(caller)) {
                samples[k] += a.nsamples;
                if !names.iter().any(|l| l.defname_str() == *library) {
                    unnamed[k] += a.nsamples;
                }
            }
        }
    }
    eprintln!("samples from alpha, beta: {samples:?}; of which unnamed: {unnamed:?}");
    assert!(samples.iter().all(|&n| n > 1000), "{samples:?}");
    assert_eq!(unnamed, [0, 0], "frames left unnamed of {samples:?}");
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A symbolizer stuck reading an object's file (a FIFO in the library's place, as a file
/// system that does not answer) is not taken for one at work: stopping gives up on the writer
/// after its timeout, with one message, and the program ends, where it waited for ever before.
#[test]
fn a_symbolizer_stuck_reading_a_file_is_given_up_at_stop() {
    let dir = temp_path("stuck").with_extension("d");
    std::fs::create_dir_all(&dir).unwrap();
    let Some(library) = build_library(&dir, "stuck", false) else {
        skip("no C compiler (apt-get install gcc)");
        return;
    };
    let path = temp_path("stuck");
    let env = [("MEMTRACE_FILE", path.to_str().unwrap()), (SECOND_FILE_VAR, library.to_str().unwrap())];
    let (out, _) = run_within("symbols:stuck", &env, Duration::from_secs(60));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let messages = memtrace_messages(&out);
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert!(messages[0].contains("gave up waiting"), "{messages:?}");
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------
// Forks while the writer symbolizes.

macro_rules! sites {
    ($($name:ident),*) => {
        $(
            #[inline(never)]
            fn $name() -> usize {
                let v: Vec<u8> = Vec::with_capacity(100_000);
                black_box(v).capacity()
            }
        )*
        const SITES: &[fn() -> usize] = &[$($name),*];
    };
}

sites!(
    site_00, site_01, site_02, site_03, site_04, site_05, site_06, site_07, site_08, site_09, site_10, site_11,
    site_12, site_13, site_14, site_15
);

fn symbols_budget_var() -> &'static str {
    "MEMTRACE_SYMBOLS_BUDGET_MIB"
}

/// The parent side of `symbols:fork`: a writer kept busy symbolizing (a budget of 0 makes it
/// parse this program's debug info again and again) while the program forks children that
/// each start a trace of their own, allocate and stop. Each child must be done within 20 s.
fn fork_while_symbolizing() {
    let _guard = trace_if_requested();
    let second = PathBuf::from(std::env::var_os(SECOND_FILE_VAR).unwrap());
    for (i, site) in SITES.iter().enumerate() {
        black_box(site());
        if i % 2 == 1 {
            continue;
        }
        // SAFETY: the child starts a trace of its own (a new writer thread) and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // The child's own writer symbolizes at the default budget, in a test of reasonable
            // length. SAFETY (of `remove_var`): the forked child has one thread.
            std::env::remove_var(symbols_budget_var());
            let path = second.with_extension(format!("{i}.ctf"));
            trace_in_forked_child(&path, || drop(std::fs::remove_file(&path)));
        }
        wait_for_forked_child(pid, &format!("fork child {i}"));
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// In a forked child: start a trace of its own into `path`, allocate at every site, stop, then
/// `after()`, and exit: 0, or 3 after a panic.
fn trace_in_forked_child(path: &Path, after: impl FnOnce()) -> ! {
    let traced = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let guard = start_tracing(TraceConfig::new(path).rate(0.01)).unwrap();
        for site in SITES {
            black_box(site());
        }
        drop(guard);
        after();
    }));
    // SAFETY: leaving the child without running the parent's exit handlers twice.
    unsafe { libc::_exit(if traced.is_ok() { 0 } else { 3 }) }
}

/// Wait for the forked child `pid` (`what`), killing it and failing past 20 s, and check that
/// it exited with 0.
fn wait_for_forked_child(pid: libc::pid_t, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut status = 0;
    // SAFETY: waiting for our own child, without blocking.
    while unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == 0 {
        if Instant::now() > deadline {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("{what} hung");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "{what} failed: {status}");
}

#[cfg(debug_assertions)]
/// Fork while a tracer thread is inside the loader's list of objects (`dl_iterate_phdr`, whose
/// lock glibc's `fork` leaves held in the child), held there by a test hook: the child starts
/// a trace of its own, which reads that list, and loads a library, which takes that lock.
fn fork_while_in_the_loader() {
    let guard = trace_if_requested();
    let second = PathBuf::from(std::env::var_os(SECOND_FILE_VAR).unwrap());
    memtrace_rs::__internals::hold_in_the_loader(300);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !memtrace_rs::__internals::held_in_the_loader() {
        assert!(Instant::now() < deadline, "the writer never read the loader's list");
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: the child starts a trace of its own, loads a library and exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        memtrace_rs::__internals::hold_in_the_loader(0);
        trace_in_forked_child(&second, || {
            // SAFETY: a library of the system, without side effects on loading.
            let handle = unsafe { libc::dlopen(c"libBrokenLocale.so.1".as_ptr(), libc::RTLD_NOW) };
            assert!(!handle.is_null());
        });
    }
    memtrace_rs::__internals::hold_in_the_loader(0);
    wait_for_forked_child(pid, "the child forked while the writer was in the loader");
    // And the parent traces on.
    for site in SITES {
        black_box(site());
    }
    drop(guard);
}

/// A child forked while the writer thread is inside symbolization starts and stops a trace of
/// its own within a bound: the symbolizer takes no lock that a fork can leave held.
#[test]
fn forks_while_the_writer_symbolizes_do_not_hang_their_children() {
    let path = temp_path("fork-symbolizing");
    let out = run(
        "symbols:fork",
        &[
            ("MEMTRACE_FILE", path.to_str().unwrap()),
            ("MEMTRACE_RATE", "0.01"),
            (symbols_budget_var(), "0"),
            (SECOND_FILE_VAR, temp_path("fork-symbolizing-child").to_str().unwrap()),
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!Trace::read(&path).allocs.is_empty());
    let _ = std::fs::remove_file(&path);
}

#[cfg(debug_assertions)]
/// A child forked while a tracer thread is inside the loader's list of objects starts a trace
/// of its own, and loads a library, within a bound: the fork waits for the tracer to leave it.
#[test]
fn a_fork_while_the_tracer_reads_the_loaders_list_does_not_hang_the_child() {
    let path = temp_path("fork-in-loader");
    let second = temp_path("fork-in-loader-child");
    let env = [
        ("MEMTRACE_FILE", path.to_str().unwrap()),
        ("MEMTRACE_RATE", "0.01"),
        (SECOND_FILE_VAR, second.to_str().unwrap()),
    ];
    let (out, _) = run_within("symbols:fork-in-loader", &env, Duration::from_secs(60));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(memtrace_messages(&out).is_empty(), "{:?}", memtrace_messages(&out));
    let child = Trace::read(&second);
    assert!(child.warnings.is_empty() && !child.allocs.is_empty(), "{:?}", child.warnings);
    assert!(!Trace::read(&path).allocs.is_empty());
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&second);
}

// ---------------------------------------------------------------------------------------------
// Little memory at start.

/// With 4 MiB of address space left, tracing at rate 1 cannot start (its queue alone takes 7
/// MiB; the start checks that it can have what it needs at once): one message, and the program
/// runs on untraced (it used to abort in `handle_alloc_error`). With 16 or 32 MiB left (where
/// it used to abort too), it either starts and writes a whole trace, or says the same.
#[test]
fn starting_with_little_memory_fails_cleanly() {
    for headroom in ["4", "16", "32"] {
        let path = temp_path(&format!("rlimit-{headroom}"));
        let env = [
            ("MEMTRACE_FILE", path.to_str().unwrap()),
            ("MEMTRACE_RATE", "1"),
            ("MALLOC_ARENA_MAX", "1"),
            ("MEMTRACE_TEST_HEADROOM_MIB", headroom),
        ];
        let out = run("symbols:rlimit", &env);
        assert!(out.status.success(), "{headroom} MiB: {}", String::from_utf8_lossy(&out.stderr));
        let messages = memtrace_messages(&out);
        let errors: Vec<_> = messages.iter().filter(|m| !m.starts_with("memtrace: note:")).collect();
        if headroom == "4" || !errors.is_empty() {
            assert!(
                errors.len() == 1 && errors[0].ends_with("not enough memory to start tracing; not tracing"),
                "{headroom} MiB: {messages:?}"
            );
            assert!(!path.exists(), "{headroom} MiB: a failed start left its file");
        } else {
            let trace = Trace::read(&path);
            assert!(trace.warnings.is_empty() && trace.allocs.len() > 100, "{headroom} MiB: {:?}", trace.warnings);
            let _ = std::fs::remove_file(&path);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A release build against binutils.

/// Every frame of a release build (line-tables-only debug info, no frame pointers) that
/// binutils' `addr2line -i` names is named in the trace, with the functions it names. Run
/// without address-space randomisation, so that the program's frames are at its link-time
/// addresses plus the usual base of a position-independent executable.
#[test]
fn frames_that_addr2line_names_are_named() {
    const PIE_BASE: u64 = 0x5555_5555_4000;
    const ALLOCATOR_ENTRIES: [&str; 4] = ["__rust_alloc", "__rust_alloc_zeroed", "__rust_realloc", "__rust_dealloc"];
    if Command::new("addr2line").arg("--version").output().is_err() {
        skip("no addr2line (apt-get install binutils)");
        return;
    }
    let Some(fixture) = release_sites_fixture() else { return };
    let program = build_release_sites(&fixture, &[("LTO", "off"), ("OPT_LEVEL", "3")]);
    let path = temp_path("release-sites-addr2line");
    let mut command = Command::new(&program);
    command.env("MEMTRACE_FILE", &path).env("MEMTRACE_RATE", "0.01");
    // SAFETY: `personality` is async-signal-safe; it only sets a flag for the exec.
    unsafe {
        command.pre_exec(|| {
            libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong);
            Ok(())
        })
    };
    let out = command.output().expect("run the program");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let trace = Trace::read(&path);
    let size = std::fs::metadata(&program).unwrap().len();
    let codes: Vec<u64> = trace
        .allocs
        .values()
        .flat_map(|a| a.codes.iter().copied())
        .collect::<HashSet<_>>()
        .into_iter()
        .filter(|&c| c > PIE_BASE && c - PIE_BASE < size)
        .collect();
    assert!(codes.len() > 5, "{} frames of the program sampled (is randomisation off?)", codes.len());
    let mut addr2line = Command::new("addr2line");
    addr2line.args(["-i", "-f", "-C", "-a", "-e"]).arg(&program);
    addr2line.args(codes.iter().map(|c| format!("{:#x}", c - 1 - PIE_BASE)));
    let answer = String::from_utf8(addr2line.output().unwrap().stdout).unwrap();
    // `-a` starts each address's answer with a line of the address, then two lines (name,
    // place) per function, innermost first.
    let mut blocks: Vec<Vec<&str>> = Vec::new();
    for line in answer.lines() {
        match blocks.last_mut() {
            Some(block) if !line.starts_with("0x") => block.push(line),
            _ => blocks.push(Vec::new()),
        }
    }
    assert_eq!(blocks.len(), codes.len(), "{answer}");
    let mut named_by_binutils = 0;
    for (code, block) in codes.iter().zip(&blocks) {
        let functions: Vec<&str> = block.iter().step_by(2).copied().collect();
        if functions.iter().all(|f| *f == "??") {
            continue;
        }
        named_by_binutils += 1;
        let ours = &trace.locations[code];
        let ours_named: Vec<String> = ours.iter().map(|l| l.defname_str().into_owned()).collect();
        assert!(
            ours_named.iter().all(|name| name != "??" && !name.starts_with("0x")),
            "{code:#x}: addr2line names {functions:?}, the trace {ours_named:?}"
        );
        // The same functions, outermost first, as far as the allocator's entry (`__rust_alloc`
        // and what is inlined into it are the tracer's frames, which the trace leaves out). Of a
        // frame that does not allocate, all but the innermost: binutils names that one with
        // the containing function's symbol, not the function inlined there.
        let mut theirs: Vec<&str> = functions.iter().rev().copied().collect();
        let machinery = |f: &&str| f.starts_with("__rg_") || ALLOCATOR_ENTRIES.contains(f);
        let compared = match theirs.iter().position(machinery) {
            Some(entry) => {
                theirs.truncate(entry);
                entry
            }
            None => theirs.len() - 1,
        };
        let same = |(ours, theirs): (&String, &&str)| ours == theirs || ours.ends_with(&format!("::{theirs}"));
        // The function whose code it is has its path, which line-tables-only debug info leaves
        // out (the symbol gives it): but for C functions, the C runtime's (`_start`) and the
        // `main` that rustc writes.
        let c_function = ours_named[0] == "main" || ours_named[0].starts_with('_');
        assert!(
            c_function || ours_named[0].contains("::"),
            "{code:#x}: the trace names {ours_named:?}, the outermost without its path"
        );
        assert!(
            ours_named.len() == theirs.len() && ours_named.iter().zip(&theirs).take(compared).all(same),
            "{code:#x}: addr2line names {theirs:?} (outermost first), the trace {ours_named:?}"
        );
    }
    assert!(named_by_binutils > 5, "{named_by_binutils} frames named by addr2line");
    let _ = std::fs::remove_file(&path);
}

/// Whole stacks of the release builds of a small program, through the `memtrace` command line:
/// a build with line tables only (the recommended profile) and one with `debug = 1`, each run
/// twice.
/// - `hotspots --stacks` holds no start-up frame (the C library's, named by object and offset,
///   or the standard library's) and no raw address: each stack's outermost code frame is the
///   program's `main`;
/// - two runs of one build, and the two builds, diff to nothing beyond the sampling noise (all
///   stacks matched, each within twice its margin): a function is one frame across runs (load
///   addresses) and debug levels (bare or full names: the builds spell the inlined
///   `inlined_buffer` the two ways, which would come out as one stack gone and one new);
/// - `go tool pprof -top` of the line-tables build (with no flags: in-use space at the peak)
///   is not empty, and every function in it has a path: no bare inlined name (`{closure#0}`,
///   `call_once`) for pprof to merge across files.
#[test]
fn release_stacks_read_right_across_runs_and_debug_levels() {
    let Some(memtrace) = option_env!("CARGO_BIN_EXE_memtrace") else {
        skip("the memtrace command line is not built (cargo test --all-features builds it)");
        return;
    };
    let Some(fixture) = release_sites_fixture() else { return };
    let line_tables = build_release_sites(&fixture, &[("LTO", "off"), ("OPT_LEVEL", "3")]);
    let debug_1 = build_release_sites(&fixture, &[("LTO", "off"), ("OPT_LEVEL", "3"), ("DEBUG", "1")]);
    let traced = |program: &Path, name: &str| {
        let path = temp_path(name);
        let out =
            Command::new(program).env("MEMTRACE_FILE", &path).env("MEMTRACE_RATE", "0.01").output().expect("run it");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        path
    };
    let cli = |args: &[&str]| {
        let out = Command::new(memtrace).args(args).output().expect("run memtrace");
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let p = |path: &Path| path.to_str().unwrap().to_string();
    let runs = [
        traced(&line_tables, "release-stacks-a"),
        traced(&line_tables, "release-stacks-b"),
        traced(&debug_1, "release-stacks-debug-1"),
    ];
    // The inlined function, bare in line tables, with its path with `debug = 1`.
    let inlined = |run: &Path| {
        let stacks = cli(&["hotspots", "--stacks", "--top", "1000", "--frames", "1000", &p(run)]);
        let frame = |l: &str| l.split("  ").last().unwrap().trim().to_string();
        stacks.lines().map(frame).find(|f| f.contains("inlined_buffer (")).unwrap_or_else(|| panic!("{stacks}"))
    };
    assert!(inlined(&runs[0]).starts_with("inlined_buffer ("), "{}", inlined(&runs[0]));
    assert!(inlined(&runs[2]).starts_with("memtrace_release_sites::inlined_buffer ("), "{}", inlined(&runs[2]));
    for run in &runs {
        let stacks = cli(&["hotspots", "--stacks", "--top", "1000", "--frames", "1000", &p(run)]);
        let frames: Vec<&str> = stacks.lines().skip(2).map(|l| l.split("  ").last().unwrap().trim()).collect();
        for frame in &frames {
            let start_up = ["lang_start", "__rust_begin_short_backtrace", "_start", "libc.so", "0x7f", "main (<"];
            assert!(!start_up.iter().any(|s| frame.contains(s)), "{frame}:\n{stacks}");
        }
        // The last line of each stack (before the next's figures) is its outermost frame.
        let sites = stacks.lines().skip(2).filter(|l| !l.starts_with("      ")).count();
        let mains = frames.iter().filter(|f| f.starts_with("memtrace_release_sites::main ")).count();
        assert_eq!(mains, sites, "every stack's outermost frame is main:\n{stacks}");
    }
    // Every stack of one run matches one of the other, and differs by no more than sampling
    // noise: within twice its 95% margin (a false alarm once in some ten thousand stacks,
    // where the 95% margin alone would give one in twenty).
    let bytes = |number: &str, unit: &str| -> f64 {
        let scale = ["B", "KiB", "MiB", "GiB"].iter().position(|u| *u == unit).unwrap();
        number.trim_start_matches(['+', '-', '±']).parse::<f64>().unwrap() * 1024f64.powi(scale as i32)
    };
    for (base, new) in [(&runs[0], &runs[1]), (&runs[0], &runs[2])] {
        let diff = cli(&["diff", "--stacks", "--top", "1000", &p(base), &p(new)]);
        for row in diff.lines().skip(2) {
            // Base, new, change and margin, each a number and a unit, then the stack.
            let words: Vec<&str> = row.split_whitespace().take(8).collect();
            let [before, after, change, margin] = [0, 2, 4, 6].map(|i| bytes(words[i], words[i + 1]));
            assert!(before > 0.0 && after > 0.0, "unmatched:\n{row}\n{diff}");
            assert!(change <= 2.0 * margin, "beyond the noise:\n{row}\n{diff}");
        }
    }
    let (profile, whole) = (temp_path("release-stacks.pb.gz"), temp_path("release-stacks-whole.pb.gz"));
    cli(&["pprof", &p(&runs[0]), "-o", &p(&profile)]);
    // With every frame kept: the standard library's, inlined into the program's, bring the bare
    // names of line tables (`call_once`, `with_capacity_in` of `Vec` and of `RawVec`).
    cli(&["pprof", &p(&runs[0]), "-o", &p(&whole), "--keep-root-frames", "--keep-allocator-frames"]);
    // `go tool pprof -top` with `args`: the output and its rows past the five figures.
    let top = |profile: &Path, args: &[&str]| -> Option<(String, Vec<String>)> {
        let out = Command::new("go").args(["tool", "pprof", "-top"]).args(args).arg(profile).output().ok()?;
        let top = String::from_utf8(out.stdout).unwrap();
        let rows = top.lines().skip_while(|l| !l.trim_start().starts_with("flat")).skip(1);
        let names = rows.map(|row| row.split_whitespace().skip(5).collect::<Vec<_>>().join(" ")).collect();
        Some((top, names))
    };
    let Some((shown, rows)) = top(&profile, &[]) else {
        skip("go is not installed (apt-get install golang-go)");
        return;
    };
    assert!(rows.len() >= 2, "an empty profile:\n{shown}");
    // pprof merges functions by name: no name may stand for functions of two files.
    let (shown, rows) = top(&whole, &["-filefunctions", "-sample_index=alloc_space"]).unwrap();
    let mut files_of: HashMap<&str, HashSet<&str>> = HashMap::new();
    for row in &rows {
        let row = row.strip_suffix(" (inline)").unwrap_or(row);
        let (name, file) = match row.rfind(" /") {
            Some(at) => (&row[..at], &row[at + 1..]),
            None => row.rsplit_once(' ').unwrap(),
        };
        files_of.entry(name).or_default().insert(file);
    }
    assert!(files_of.len() > 10, "{shown}");
    for (name, files) in files_of {
        assert_eq!(files.len(), 1, "{name} names functions of {files:?}:\n{shown}");
    }
    for path in runs.iter().chain([&profile, &whole]) {
        let _ = std::fs::remove_file(path);
    }
}
