//! Programs that do what a traced program may do untraced and that a tracer could get in the
//! way of (issue #39), each in a child process that must end as it does untraced, with its
//! trace readable: a setuid program run by another user, a program that waits for signals on
//! a thread, closes every descriptor, writes to a vanishing reader or past its file size
//! limit, allocates on small foreign stacks, exits from a signal handler, loads a library with
//! corrupt unwind tables, or forbids opening files.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use memtrace_rs::trace_if_requested;

use super::{assert_one_message, child_at, output_within, site_freed, Trace};

/// The roles of this module's children.
pub(crate) fn child_role(role: &str) {
    match role {
        "hostile:secure" => {
            let guard = trace_if_requested();
            site_freed();
            drop(guard);
        }
        other => panic!("unknown role {other}"),
    }
}

/// The user the setuid test runs its program as.
const NOBODY: u32 = 65534;

/// A directory under `/tmp` that every user may enter (mode 0755, root's), removed when
/// dropped: where a program another user runs is put.
struct OpenDir(PathBuf);

impl OpenDir {
    fn new(name: &str) -> OpenDir {
        let dir = PathBuf::from(format!("/tmp/memtrace-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        OpenDir(dir)
    }
}

impl Drop for OpenDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Run a copy of this test binary, `program`, as `nobody` in role `hostile:secure` with `env`:
/// its output.
fn run_as_nobody(program: &Path, env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = child_at(program, "hostile:secure", env);
    cmd.uid(NOBODY).gid(NOBODY).current_dir("/");
    output_within(cmd, "hostile:secure", Duration::from_secs(60)).0
}

/// A setuid-root program run by `nobody` ignores `MEMTRACE_FILE` and `MEMTRACE`: it neither
/// creates a new file in root's directory nor touches root's existing file; the same program
/// without the setuid bit traces for its user.
#[test]
fn a_setuid_program_ignores_the_tracing_variables() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: cannot make a setuid-root program, nothing tested");
        return;
    }
    let dir = OpenDir::new("setuid");
    let program = dir.0.join("traced");
    std::fs::copy(std::env::current_exe().unwrap(), &program).unwrap();
    std::os::unix::fs::chown(&program, Some(0), Some(0)).unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o4755)).unwrap();
    // Root's: nobody may write neither the directory nor the file.
    let roots = dir.0.join("root");
    std::fs::create_dir(&roots).unwrap();
    let (new, existing) = (roots.join("new.ctf"), roots.join("existing"));
    let contents = b"root's own data\n";
    std::fs::write(&existing, contents).unwrap();
    std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o644)).unwrap();
    let modified = std::fs::metadata(&existing).unwrap().mtime_nsec();
    for var in ["MEMTRACE_FILE", "MEMTRACE"] {
        for target in [&new, &existing] {
            let out = run_as_nobody(&program, &[(var, target.to_str().unwrap()), ("MEMTRACE_RATE", "1")]);
            assert!(out.status.success(), "{var}: {}", String::from_utf8_lossy(&out.stderr));
            assert!(!new.exists(), "{var} created root's file");
            let metadata = std::fs::metadata(&existing).unwrap();
            assert_eq!(std::fs::read(&existing).unwrap(), contents, "{var} wrote root's file");
            assert_eq!((metadata.uid(), metadata.mode() & 0o7777, metadata.mtime_nsec()), (0, 0o644, modified));
            assert_one_message(&out, &format!("{var} is ignored"));
        }
    }
    // Without the setuid bit, the same program traces into a file of nobody's.
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let theirs = dir.0.join("nobody");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(NOBODY), Some(NOBODY)).unwrap();
    let trace = theirs.join("trace.ctf");
    let out = run_as_nobody(&program, &[("MEMTRACE_FILE", trace.to_str().unwrap())]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::metadata(&trace).unwrap().uid(), NOBODY);
    assert!(!Trace::read(&trace).allocs.is_empty());
}
