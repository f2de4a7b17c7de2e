//! Tracing under a tight address-space limit (`RLIMIT_AS`): the start checks that the address
//! space tracing takes is there, so that it either fails with one line or traces, and the
//! program, which runs in that limit untraced, never runs out later.

use std::hint::black_box;
use std::time::Duration;

use memtrace_rs::trace_if_requested;

use super::{memtrace_messages, run_within, temp_path, Trace};

/// Environment variable: the address space the `memory:limited` child allows itself beyond
/// what it uses, in MiB.
const HEADROOM_VAR: &str = "MEMTRACE_TEST_HEADROOM_MIB";

/// A field of `/proc/self/status`, in KiB.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field}"));
    line[field.len()..].trim().trim_end_matches(" kB").trim().parse().unwrap()
}

/// The memory figures of this process, for the report of a start.
fn figures() -> String {
    ["VmSize:", "VmPeak:", "VmRSS:", "VmHWM:", "RssAnon:", "RssFile:"]
        .map(|f| format!("{f} {} KiB", status_kib(f)))
        .join(", ")
}

/// What the program does, traced or not: a churn of small blocks of many sizes, and of blocks
/// of 256 KiB (mapped one by one, beyond glibc's threshold for that), up to `live` of those
/// live at a time.
fn allocate_normally(live: usize) {
    let mut kept: std::collections::VecDeque<Vec<u8>> = std::collections::VecDeque::new();
    for i in 0..100_000usize {
        black_box(vec![i as u8; 16 + (i * 7919) % 32_000]);
        if i % 64 == 0 {
            kept.push_back(vec![i as u8; 256 << 10]);
            if kept.len() > live {
                kept.pop_front();
            }
        }
    }
}

/// Large blocks the child keeps live once it has started tracing: 8 MiB, half the smallest
/// headroom (the program runs in that untraced).
const LIVE_BLOCKS: usize = 32;

/// The child: limits its address space to what it uses plus [`HEADROOM_VAR`] MiB, starts
/// tracing, allocates normally (more than before), and stops; says the figures on stderr.
pub(super) fn child() {
    // Large blocks mapped each on its own, as glibc maps them before its threshold for that
    // grows (the test harness's blocks raised it): the live ones take address space.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: a malloc parameter of this process's own.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10)
    };
    allocate_normally(1);
    let headroom: u64 = std::env::var(HEADROOM_VAR).map_or(0, |v| v.parse().unwrap());
    eprintln!("before start: {}", figures());
    if headroom > 0 {
        let limit = (status_kib("VmSize:") << 10) + (headroom << 20);
        let limit = libc::rlimit { rlim_cur: limit, rlim_max: limit };
        // SAFETY: a valid limit for this process.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) }, 0);
    }
    let guard = trace_if_requested();
    eprintln!("after start ({}): {}", if guard.is_some() { "tracing" } else { "not tracing" }, figures());
    allocate_normally(LIVE_BLOCKS);
    std::thread::sleep(Duration::from_millis(1200));
    allocate_normally(LIVE_BLOCKS);
    eprintln!("after work: {}", figures());
    drop(guard);
    eprintln!("after stop: {}", figures());
}

/// Run the `memory:limited` child with `headroom_mib` MiB of address space beyond what it
/// uses: it must end well, either refused tracing with one line or traced, its trace readable.
/// Whether it traced.
fn run_limited(headroom_mib: u64) -> bool {
    let path = temp_path(&format!("memory-limited-{headroom_mib}"));
    let headroom = headroom_mib.to_string();
    // Untraced first: the program runs in that limit.
    let (out, _) = run_within("memory:limited", &[(HEADROOM_VAR, headroom.as_str())], Duration::from_secs(120));
    assert!(out.status.success(), "untraced, {headroom_mib} MiB of headroom: {:?}", out.status);
    let env = [("MEMTRACE_FILE", path.to_str().unwrap()), (HEADROOM_VAR, headroom.as_str())];
    let (out, _) = run_within("memory:limited", &env, Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{headroom_mib} MiB of headroom: {:?}\n{stderr}", out.status);
    let traced = stderr.contains("after start (tracing)");
    let messages = memtrace_messages(&out);
    if traced {
        assert!(messages.is_empty(), "{messages:?}");
        let trace = Trace::read(&path);
        assert!(trace.warnings.is_empty(), "{:?}", trace.warnings);
        assert!(!trace.allocs.is_empty());
    } else {
        assert_eq!(messages.len(), 1, "{messages:?}");
        assert!(messages[0].contains("memory"), "{messages:?}");
    }
    let _ = std::fs::remove_file(&path);
    traced
}

/// 16 and 32 MiB above what the program uses: far less than tracing takes (the address space
/// of its threads' arenas alone is 64 MiB each with glibc), so the start is refused; and the
/// program, which allocates on, is unharmed. With ample room it traces.
#[test]
fn a_tight_address_space_limit_refuses_the_start_or_traces_never_harms_the_program() {
    for headroom_mib in [16, 32] {
        let traced = run_limited(headroom_mib);
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        assert!(!traced, "{headroom_mib} MiB were enough to trace in");
        let _ = traced;
    }
    assert!(run_limited(1024), "1 GiB of headroom was not enough to trace in");
}
