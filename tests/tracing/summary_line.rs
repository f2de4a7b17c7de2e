//! The line that says where a trace went: written at the trace's end when stderr is a terminal
//! (or `MEMTRACE_QUIET=0` asks for it), with the trace's path, its samples, its size and the
//! command to run next; never when stderr is not a terminal (a log, a pipe) unless asked, nor
//! with `MEMTRACE_QUIET=1`.

use std::hint::black_box;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::Stdio;

use memtrace_rs::trace_if_requested;

use super::{child, run, temp_path, Trace};

/// The child: 32 MiB allocated, in blocks every one of which is sampled at rate 1e-3.
pub(super) fn child_summary() {
    let guard = trace_if_requested();
    assert!(guard.is_some(), "not tracing");
    for _ in 0..512 {
        black_box(vec![1u8; 64 << 10]);
    }
    drop(guard);
}

/// The summary lines of a child's stderr.
fn summary_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.starts_with("memtrace: trace written to ")).collect()
}

/// With `MEMTRACE_QUIET=0` the line is written though stderr is a pipe, and says the path, the
/// trace's own count of samples, its size and the next command.
#[test]
fn the_end_of_a_trace_says_where_it_went_when_asked() {
    let path = temp_path("summary-asked");
    let p = path.to_str().unwrap();
    let out = run("summary", &[("MEMTRACE_FILE", p), ("MEMTRACE_RATE", "1e-3"), ("MEMTRACE_QUIET", "0")]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let trace = Trace::read(&path);
    let bytes = std::fs::metadata(&path).unwrap().len();
    let _ = std::fs::remove_file(&path);
    let lines = summary_lines(&stderr);
    let size = format!("{:.1} KiB", bytes as f64 / 1024.0);
    let expected = format!(
        "memtrace: trace written to {p}: {} samples, {size}; next: memtrace report {p} -o report.html",
        trace.allocs.len()
    );
    assert_eq!(lines, [expected.as_str()], "{stderr}");
}

/// Unasked, the line is written to a terminal only: not to a pipe, and not with
/// `MEMTRACE_QUIET=1` even to a terminal.
#[test]
fn the_end_of_a_trace_is_silent_unless_stderr_is_a_terminal() {
    let path = temp_path("summary-unasked");
    let p = path.to_str().unwrap();
    let piped = run("summary", &[("MEMTRACE_FILE", p)]);
    assert!(piped.status.success());
    assert_eq!(summary_lines(&String::from_utf8_lossy(&piped.stderr)), Vec::<&str>::new());
    let on_terminal = |quiet: Option<&str>| {
        let mut env = vec![("MEMTRACE_FILE", p)];
        env.extend(quiet.map(|q| ("MEMTRACE_QUIET", q)));
        stderr_on_a_terminal(&env)
    };
    assert_eq!(summary_lines(&on_terminal(None)).len(), 1, "no line on a terminal");
    assert_eq!(summary_lines(&on_terminal(Some("1"))), Vec::<&str>::new());
    let _ = std::fs::remove_file(&path);
}

/// The stderr of the child `summary` run with `env` and a pseudo-terminal as its stderr.
fn stderr_on_a_terminal(env: &[(&str, &str)]) -> String {
    let (mut leader, mut follower) = (-1, -1);
    // SAFETY: openpty fills in two new descriptors; the null arguments are optional.
    let opened =
        unsafe { libc::openpty(&mut leader, &mut follower, std::ptr::null_mut(), std::ptr::null(), std::ptr::null()) };
    assert_eq!(opened, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors are new and ours alone.
    let (leader, follower) = unsafe { (OwnedFd::from_raw_fd(leader), OwnedFd::from_raw_fd(follower)) };
    let mut proc = child("summary", env).stdin(Stdio::null()).stderr(Stdio::from(follower)).spawn().unwrap();
    let status = proc.wait().unwrap();
    assert!(status.success());
    // Everything the child wrote is in the terminal's buffer once it has ended (and dropped
    // its end): read it without blocking for more.
    // SAFETY: sets a flag of our own descriptor.
    unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&leader), libc::F_SETFL, libc::O_NONBLOCK) };
    let mut text = Vec::new();
    let _ = std::fs::File::from(leader).read_to_end(&mut text);
    String::from_utf8_lossy(&text).replace('\r', "")
}
