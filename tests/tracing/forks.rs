//! Forks after the start: a child that outlives its parent (a daemon) says once that it runs
//! untraced; one that execs, or exits while its parent lives, says nothing; the parent's trace
//! stays readable.

use std::hint::black_box;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use memtrace_rs::trace_if_requested;

use super::{memtrace_messages, run_within, site_direct, site_freed, temp_path, Trace};

/// What a forked child allocates: many times the bytes between two looks at its parent.
fn allocate_in_the_child() {
    for i in 0..64 << 10 {
        black_box(vec![i as u8; 256]);
    }
}

/// In a forked child: wait (at most a minute) until the process that forked it is gone.
fn wait_for_the_parent_to_go(parent: libc::pid_t) {
    let deadline = Instant::now() + Duration::from_secs(60);
    // SAFETY: getppid has no preconditions.
    while unsafe { libc::getppid() } == parent && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Wait for child `pid`, which must exit with 0.
fn reap(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child failed: {status}");
}

/// The children: `fork:daemon` traces, then daemonizes with `daemon(3)` (keeping its stderr) and
/// allocates once its parent is gone; `fork:double` does the same by a double fork, the
/// original parent tracing on; `fork:quiet` runs a command through fork and exec, forks a
/// child that allocates and exits, and another that `_exit`s, while it traces on.
pub(super) fn child(role: &str) {
    let guard = trace_if_requested();
    assert!(guard.is_some(), "not tracing");
    site_freed();
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    match role {
        "fork:daemon" => {
            // SAFETY: the parent `_exit`s in `daemon`; the child only allocates and exits.
            assert_eq!(unsafe { libc::daemon(1, 1) }, 0);
            wait_for_the_parent_to_go(parent);
            allocate_in_the_child();
            std::process::exit(0);
        }
        "fork:double" => {
            // SAFETY: the children only fork, allocate and exit.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: as above.
                let middle = unsafe { libc::getpid() };
                if unsafe { libc::fork() } == 0 {
                    wait_for_the_parent_to_go(middle);
                    allocate_in_the_child();
                    std::process::exit(0);
                }
                // SAFETY: leaving the grandchild to be adopted.
                unsafe { libc::_exit(0) };
            }
            reap(pid);
        }
        "fork:quiet" => {
            // A `pre_exec` makes std fork and exec rather than `posix_spawn`.
            // SAFETY: the closure does nothing.
            let status = unsafe { Command::new("true").pre_exec(|| Ok(())).status() }.unwrap();
            assert!(status.success());
            for exit in [false, true] {
                // SAFETY: the child only allocates and exits.
                let pid = unsafe { libc::fork() };
                if pid == 0 {
                    allocate_in_the_child();
                    if exit {
                        std::process::exit(0);
                    }
                    // SAFETY: ending the child without its exit hooks.
                    unsafe { libc::_exit(0) };
                }
                reap(pid);
            }
        }
        other => panic!("unknown role {other}"),
    }
    site_direct();
    drop(guard);
}

/// Whether the trace at `path`, read to its end, was closed by its writer.
fn closed_by_writer(path: &std::path::Path) -> bool {
    let mut reader = memtrace_rs::trace::Reader::open(path).unwrap();
    while reader.next_event().unwrap().is_some() {}
    reader.closed_by_writer()
}

/// Run `role` tracing into a new file: its `memtrace:` lines, its trace, and whether the trace
/// reads as closed by its writer (by the parent's stop, or at the fork a daemonizing parent
/// ended at).
fn run_forking(role: &str) -> (Vec<String>, Trace, bool) {
    let path = temp_path(&role.replace(':', "-"));
    let (out, _) = run_within(role, &[("MEMTRACE_FILE", path.to_str().unwrap())], Duration::from_secs(120));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let trace = Trace::read(&path);
    let closed = closed_by_writer(&path);
    let _ = std::fs::remove_file(&path);
    assert!(trace.warnings.is_empty(), "{:?}", trace.warnings);
    assert!(trace.at_site("::site_freed").count() > 0, "the samples before the fork");
    (memtrace_messages(&out), trace, closed)
}

/// A daemon says once, on the stderr it kept, that tracing stopped in it, and how to trace it.
fn assert_one_line_from_the_daemon(messages: &[String]) {
    assert_eq!(messages.len(), 1, "{messages:?}");
    assert!(messages[0].contains("outlived it (a daemon?) untraced"), "{messages:?}");
    assert!(messages[0].contains("start tracing in it after it daemonizes"), "{messages:?}");
}

#[test]
fn a_daemon_says_once_that_it_runs_untraced_and_its_parents_trace_reads_as_closed() {
    let (messages, _, closed) = run_forking("fork:daemon");
    assert_one_line_from_the_daemon(&messages);
    // The parent `_exit`ed in `daemon(3)`, right after the fork: what it sampled before was
    // flushed at the fork, marked as a closed trace's end.
    assert!(closed, "the daemonized parent's trace reads as not closed");
}

#[test]
fn the_grandchild_of_a_double_fork_says_once_that_it_runs_untraced() {
    let (messages, trace, closed) = run_forking("fork:double");
    assert_one_line_from_the_daemon(&messages);
    assert!(closed);
    assert!(trace.at_site("::site_direct").count() > 0, "the parent traced on");
}

#[test]
fn children_that_exec_or_exit_before_their_parent_say_nothing() {
    let (messages, trace, closed) = run_forking("fork:quiet");
    assert!(messages.is_empty(), "{messages:?}");
    assert!(closed);
    assert!(trace.at_site("::site_direct").count() > 0, "the parent traced on");
}
