//! A trace still being written, or whose program was killed, says so in every view; one whose
//! tracer stopped says it was closed.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use memtrace_rs::trace_if_requested;

use super::{site_freed, temp_path};

/// The child: traces a site, then waits for its standard input to close before it stops.
pub(super) fn child() {
    let guard = trace_if_requested();
    assert!(guard.is_some(), "not tracing");
    site_freed();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(guard);
}

/// `memtrace info` of `path`: its standard output and error.
fn info(path: &std::path::Path) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_memtrace")).arg("info").arg(path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The `Closed by writer` line of `memtrace info`.
fn closed_line(stdout: &str) -> &str {
    stdout.lines().find(|l| l.starts_with("Closed by writer:")).expect("no Closed by writer line")
}

/// The child started on `path`, once its writer has flushed its first samples.
fn started(path: &std::path::Path) -> Child {
    let mut cmd = super::child("closing:held", &[("MEMTRACE_FILE", path.to_str().unwrap())]);
    let child = cmd.stdin(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    // The first packet alone is a few hundred bytes; the writer flushes at least once a second.
    while std::fs::metadata(path).map_or(0, |m| m.len()) < 4096 {
        assert!(Instant::now() < deadline, "no samples flushed");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

#[test]
#[cfg(feature = "cli")]
fn a_trace_being_written_or_cut_short_is_told_from_a_finished_one() {
    let path = temp_path("closing-held");
    let mut child = started(&path);
    let (stdout, stderr) = info(&path);
    assert!(closed_line(&stdout).contains("no: still being written"), "{stdout}");
    assert!(stderr.contains("the trace is still being written"), "{stderr}");
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    let (stdout, stderr) = info(&path);
    assert_eq!(closed_line(&stdout), "Closed by writer:   yes");
    assert!(!stderr.contains("still being written"), "{stderr}");

    let killed = temp_path("closing-killed");
    let mut child = started(&killed);
    child.kill().unwrap();
    child.wait().unwrap();
    let (stdout, stderr) = info(&killed);
    assert!(closed_line(&stdout).contains("no: its writer stopped without closing it"), "{stdout}");
    assert!(!stderr.contains("still being written"), "{stderr}");
    let _ = (std::fs::remove_file(&path), std::fs::remove_file(&killed));
}
