//! The program's descriptors and files, which tracing must leave alone (issue #44), each in a
//! child process: the tracer's messages never land in a file the program opened on descriptor
//! 2, its symbolizer never reads a file the program opened on one of its numbers, and the
//! trace file's name never destroys a file that is not a trace (a symbolic link to one, one
//! planted in a sticky directory, the program's stdout, a blank name).

use crate::skip::skip;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use memtrace_rs::{start_tracing, trace_if_requested, StartError, TraceConfig};

use super::{assert_one_message, child, describe, memtrace_messages, output_within, site_freed, Trace};

/// Environment variable: the directory a child of this module writes its data files in.
const DATA_DIR_VAR: &str = "MEMTRACE_TEST_FILES_DIR";
/// Environment variable: `1` for a `files:reuse` child that puts its data file on the tracer's
/// numbers, `0` for one that leaves them alone.
const REUSE_VAR: &str = "MEMTRACE_TEST_REUSE";

/// The roles of this module's children.
pub(crate) fn child_role(role: &str) {
    match role {
        "files:close-all" => speak_after_closing_every_descriptor(),
        "files:reuse" => name_frames_after_the_program_reuses_the_tracers_numbers(),
        "files:api" => refusals_from_code(),
        "files:http" => answer_on_the_profile_endpoints_number(),
        other => panic!("unknown role {other}"),
    }
}

/// What a child writes in its data file `i`.
fn data(i: usize) -> String {
    format!("the program's own data, file {i}\n")
}

/// The data directory a child was given.
fn data_dir() -> PathBuf {
    PathBuf::from(std::env::var_os(DATA_DIR_VAR).unwrap())
}

/// As a daemon that closes every descriptor once tracing started (`close_range(0, ~0)`), opens
/// its data files as 0, 1 and 2, and allocates on: the writer's next write finds the trace's
/// descriptor closed, which it would say on stderr. What the stop returned the program writes
/// in data file 0 itself.
fn speak_after_closing_every_descriptor() -> ! {
    let paths: Vec<std::ffi::CString> = (0..3)
        .map(|i| std::ffi::CString::new(data_dir().join(i.to_string()).into_os_string().into_vec()).unwrap())
        .collect();
    let guard = trace_if_requested().expect("tracing");
    site_freed();
    // Past the writer's periodic flush: it has nothing to write until the next sample, and
    // nothing is sampled until the data files are open (opened without allocating), so that
    // it finds its descriptor closed with the data file on descriptor 2.
    std::thread::sleep(Duration::from_millis(2500));
    // SAFETY: closes every descriptor, as a daemon does (nothing of this program's uses them
    // after), and opens files by NUL-terminated names, each owned by one `File`.
    let mut files: Vec<File> = unsafe {
        assert_eq!(libc::syscall(libc::SYS_close_range, 0, u32::MAX, 0), 0);
        let fds = [0, 1, 2].map(|i| libc::open(paths[i].as_ptr(), libc::O_WRONLY | libc::O_CREAT, 0o600));
        fds.into_iter().map(|fd| std::os::fd::FromRawFd::from_raw_fd(fd)).collect()
    };
    assert_eq!(files.iter().map(AsRawFd::as_raw_fd).collect::<Vec<_>>(), [0, 1, 2]);
    for (i, file) in files.iter_mut().enumerate() {
        file.write_all(data(i).as_bytes()).unwrap();
    }
    // Past the writer's periodic flush, which fails.
    let end = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < end {
        site_freed();
        std::thread::sleep(Duration::from_millis(50));
    }
    let stopped = guard.finish().map(|_| ()).map_err(|e| e.to_string());
    writeln!(files[0], "stopped: {stopped:?}").unwrap();
    // SAFETY: ends the process without returning to the test harness, which would print its
    // results on descriptor 1, now a data file.
    unsafe { libc::_exit(0) }
}

/// A traced program that samples at a first site, then (with [`REUSE_VAR`] `1`) closes 3..47,
/// opens its data file (as 3), puts it on every number the tracer holds the program's binary
/// on (the symbolizer's, which reads names through it), and samples at sites never sampled
/// before, whose names the symbolizer reads after that.
fn name_frames_after_the_program_reuses_the_tracers_numbers() {
    let reuse = std::env::var(REUSE_VAR).unwrap() == "1";
    let guard = trace_if_requested().expect("tracing");
    site_freed();
    // A periodic flush: the first site's frames named, the binary open for its names.
    std::thread::sleep(Duration::from_millis(1200));
    let data_file = reuse.then(|| {
        // SAFETY: closes descriptors, as a daemon does; nothing of this program's uses them after.
        assert_eq!(unsafe { libc::syscall(libc::SYS_close_range, 3, 47, 0) }, 0);
        let mut file = File::create(data_dir().join("0")).unwrap();
        assert_eq!(file.as_raw_fd(), 3);
        file.write_all(data(0).repeat(1 << 14).as_bytes()).unwrap();
        let binary = std::env::current_exe().unwrap();
        let tracers: Vec<i32> = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|entry| {
                let entry = entry.ok()?;
                (std::fs::read_link(entry.path()).ok()? == binary).then(|| entry.file_name().to_str()?.parse().ok())?
            })
            .collect();
        assert!(!tracers.is_empty(), "no descriptor of the binary: the symbolizer reads it through none");
        for number in tracers {
            // SAFETY: the program's own file, put on a number it now owns.
            assert_eq!(unsafe { libc::dup2(file.as_raw_fd(), number) }, number);
        }
        file
    });
    let kept = super::site_kept();
    super::site_grown();
    super::site_direct();
    drop(kept);
    guard.finish().expect("the trace written");
    if let Some(mut file) = data_file {
        // Still the program's, open, at its end.
        file.write_all(data(1).as_bytes()).unwrap();
    }
}

/// `start_tracing` refuses what `MEMTRACE_FILE` refuses, with the error that says why (the
/// paths in [`DATA_DIR_VAR`]: `not-a-trace`, a non-trace file; a pseudo-terminal's; this
/// process's stderr, a pipe).
fn refusals_from_code() {
    let dir = data_dir();
    let (_master, terminal) = open_terminal();
    let refused = |path: &Path| start_tracing(TraceConfig::new(path).rate(0.01)).map(drop).unwrap_err();
    let e = refused(&dir.join("not-a-trace"));
    assert!(matches!(e, StartError::NotATrace { .. }), "{e}");
    let e = refused(Path::new(" \t"));
    assert!(matches!(e, StartError::BlankPath { .. }), "{e}");
    let e = refused(&terminal);
    assert!(matches!(e, StartError::Terminal { .. }), "{e}");
    let e = refused(Path::new("/dev/stderr"));
    assert!(matches!(e, StartError::ProgramOutput { .. }), "{e}");
    eprintln!("refused: all four");
}

/// A client of `addr` that has sent a request for a profile.
fn client_asking(addr: std::net::SocketAddr) -> std::net::TcpStream {
    let mut client = std::net::TcpStream::connect(addr).unwrap();
    client.write_all(b"GET /debug/pprof/heap?format=folded HTTP/1.0\r\n\r\n").unwrap();
    client
}

/// What `client` is answered, read to its end.
fn answer(mut client: std::net::TcpStream) -> String {
    client.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut client, &mut answer).unwrap();
    answer
}

/// The inodes of the process's listening TCP sockets over IPv4 (state `0A` in
/// `/proc/self/net/tcp`).
fn listening_socket_inodes() -> Vec<String> {
    let table = std::fs::read_to_string("/proc/self/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|row| {
            let fields: Vec<&str> = row.split_whitespace().collect();
            (fields.get(3) == Some(&"0A")).then(|| fields.get(9).map(|inode| inode.to_string()))?
        })
        .collect()
}

/// A program serving profiles that puts a listening socket of its own on the number of the
/// endpoint's: a client of its socket gets the program's answer, never a profile.
fn answer_on_the_profile_endpoints_number() {
    use std::net::TcpListener;
    let program = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let guard = start_tracing(TraceConfig::profile_only().http(endpoint)).unwrap();
    let served = answer(client_asking(endpoint));
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    // The endpoint's socket: the listening one this program did not open (the connection it
    // just served may not be closed yet on a loaded machine).
    let listening = listening_socket_inodes();
    let sockets: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let link = std::fs::read_link(entry.path()).ok()?;
            let inode = link.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned();
            listening.contains(&inode).then(|| entry.file_name().to_str()?.parse().ok())?
        })
        .filter(|&fd| fd != program.as_raw_fd())
        .collect();
    let [number] = sockets[..] else { panic!("sockets {sockets:?}") };
    // SAFETY: the program's own socket, put on a number it now owns.
    assert_eq!(unsafe { libc::dup2(program.as_raw_fd(), number) }, number);
    // Longer than the endpoint's checks between its polls (100 ms).
    std::thread::sleep(Duration::from_millis(500));
    // Its client, which the program does not accept yet: nobody answers it meanwhile (the
    // endpoint, serving the socket on its number, would within its poll).
    let mut client = client_asking(program.local_addr().unwrap());
    client.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let early = std::io::Read::read(&mut client, &mut [0u8; 64]);
    assert!(early.is_err(), "the program's client was answered by another: {early:?}");
    let (mut connection, _) = program.accept().unwrap();
    let mut request = [0u8; 64];
    let _ = std::io::Read::read(&mut connection, &mut request).unwrap();
    connection.write_all(b"the program's answer").unwrap();
    drop(connection);
    assert_eq!(answer(client), "the program's answer");
    drop(guard);
    eprintln!("the program answered its own client");
}

/// A new pseudo-terminal: its master's descriptor and its terminal's path.
fn open_terminal() -> (File, PathBuf) {
    // SAFETY: posix_openpt's descriptor is owned by the returned `File`; ptsname's string is
    // copied before any other call.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(master >= 0, "{}", std::io::Error::last_os_error());
        assert_eq!(libc::grantpt(master), 0);
        assert_eq!(libc::unlockpt(master), 0);
        let name = std::ffi::CStr::from_ptr(libc::ptsname(master)).to_str().unwrap().to_owned();
        (std::os::fd::FromRawFd::from_raw_fd(master), PathBuf::from(name))
    }
}

/// `cmd` run, its stdout captured too.
fn output_of(mut cmd: std::process::Command, what: &str) -> Output {
    cmd.stdout(Stdio::piped());
    output_within(cmd, what, Duration::from_secs(60)).0
}

/// The `untraced` role run with `MEMTRACE_FILE=file` (from `dir`, if given): it must succeed,
/// with one message that mentions `mentions`, and its stdout the test harness's text alone.
fn assert_refused(file: &str, dir: Option<&Path>, mentions: &str) {
    let mut cmd = child("untraced", &[("MEMTRACE_FILE", file)]);
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    let out = output_of(cmd, file);
    assert!(out.status.success(), "{:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    assert_one_message(&out, mentions);
    let stdout = std::str::from_utf8(&out.stdout).expect("text on stdout");
    assert!(stdout.contains("test result: ok"), "{stdout}");
}

/// A program that closes every descriptor while tracing and opens its data files as 0, 1 and 2
/// finds only its own data in them, the tracer's messages in none (it had one to say: the stop
/// reports the trace's descriptor closed).
#[test]
fn the_tracers_messages_never_land_in_the_programs_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = super::temp_path("files-close-all");
    let env = [
        ("MEMTRACE_FILE", path.to_str().unwrap()),
        ("MEMTRACE_RATE", "0.01"),
        (DATA_DIR_VAR, dir.path().to_str().unwrap()),
    ];
    let (out, _) = output_within(child("files:close-all", &env), "files:close-all", Duration::from_secs(60));
    assert!(out.status.success(), "{:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let read = |i: usize| std::fs::read_to_string(dir.path().join(i.to_string())).unwrap();
    let stopped = read(0);
    let said = stopped.strip_prefix(&data(0)).unwrap_or_else(|| panic!("data file 0: {stopped:?}"));
    assert!(said.starts_with("stopped: Err(") && said.contains("closed the trace's descriptor"), "{said}");
    for i in 1..3 {
        assert_eq!(read(i), data(i), "data file {i}");
    }
    assert!(memtrace_messages(&out).is_empty());
    Trace::read(&path);
    let _ = std::fs::remove_file(&path);
}

/// The frames sampled after a program closed 3..47, opened its data file as 3 and put it on
/// every number the tracer read the program's binary through are named as in a run that did
/// none of that (no `??`, no text of the data file), and the data file holds the program's
/// data alone.
#[test]
fn frames_are_named_as_untouched_after_the_program_reuses_the_tracers_numbers() {
    let names_of_sites = |reuse: &str| {
        let dir = tempfile::tempdir().unwrap();
        let path = super::temp_path(&format!("files-reuse-{reuse}"));
        let env = [
            ("MEMTRACE_FILE", path.to_str().unwrap()),
            // Every allocation sampled: both runs sample the same stacks.
            ("MEMTRACE_RATE", "1"),
            (DATA_DIR_VAR, dir.path().to_str().unwrap()),
            (REUSE_VAR, reuse),
        ];
        let (out, _) = output_within(child("files:reuse", &env), "files:reuse", Duration::from_secs(60));
        assert!(out.status.success(), "{:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
        assert!(memtrace_messages(&out).is_empty(), "{:?}", memtrace_messages(&out));
        if reuse == "1" {
            let held = std::fs::read_to_string(dir.path().join("0")).unwrap();
            assert!(held == data(0).repeat(1 << 14) + &data(1), "the data file changed");
        }
        let trace = Trace::read(&path);
        let _ = std::fs::remove_file(&path);
        let mut names = std::collections::BTreeSet::new();
        for site in ["::site_kept", "::site_grown", "::site_direct"] {
            let sampled: Vec<_> = trace.at_site(site).collect();
            assert!(!sampled.is_empty(), "no sample at {site}");
            names.extend(sampled.iter().flat_map(|(_, a)| trace.frames(a).map(describe)));
        }
        names
    };
    let untouched = names_of_sites("0");
    let reused = names_of_sites("1");
    let text = data(0);
    let data_text = text.trim_end();
    assert!(reused.iter().all(|name| !name.contains("??") && !name.contains(data_text)), "{reused:#?}");
    assert_eq!(reused, untouched);
}

/// `MEMTRACE_FILE` naming a symbolic link to a file that is not a trace: refused in one line,
/// the file and the link as they were.
#[test]
fn a_symlink_to_a_file_that_is_not_a_trace_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (file, link) = (dir.path().join("notes.txt"), dir.path().join("trace.ctf"));
    std::fs::write(&file, b"the program's notes\n").unwrap();
    std::os::unix::fs::symlink(&file, &link).unwrap();
    assert_refused(link.to_str().unwrap(), None, "is not a memtrace trace");
    assert_eq!(std::fs::read(&file).unwrap(), b"the program's notes\n");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
}

/// A symbolic link in a world-writable sticky directory owned by another user than this
/// process's and the directory's (as one planted in `/tmp`) is not followed, whatever the
/// kernel's `protected_symlinks`: its file, an empty one which a trace could use, stays
/// empty. One the directory's owner made is followed.
#[test]
fn a_symlink_another_user_planted_in_a_sticky_directory_is_refused() {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        skip("needs root, to give the link another owner");
        return;
    }
    const ANOTHER_USER: u32 = 12345;
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("root-owned");
    let sticky = tempfile::tempdir().unwrap();
    std::fs::set_permissions(sticky.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let link = sticky.path().join("trace.ctf");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    std::os::unix::fs::lchown(&link, Some(ANOTHER_USER), Some(ANOTHER_USER)).unwrap();
    std::fs::write(&target, b"").unwrap();
    assert_refused(link.to_str().unwrap(), None, "symbolic link in a world-writable sticky directory");
    assert_eq!(std::fs::read(&target).unwrap(), b"");
    // The directory's owner's link (the directory now the other user's too) is followed.
    std::os::unix::fs::chown(sticky.path(), Some(ANOTHER_USER), None).unwrap();
    let out = super::run("known", &[("MEMTRACE_FILE", link.to_str().unwrap())]);
    assert!(out.status.success() && memtrace_messages(&out).is_empty(), "{:?}", memtrace_messages(&out));
    Trace::read(&target);
}

/// `/dev/stdout`, the program's own output: refused in one line, stdout holds the program's
/// text alone; likewise `/dev/stderr`.
#[test]
fn the_programs_own_stdout_and_stderr_are_refused() {
    assert_refused("/dev/stdout", None, "the program's own standard output or error");
    assert_refused("/dev/stderr", None, "the program's own standard output or error");
}

/// A name that is only whitespace is refused in one line, and no file is made of it.
#[test]
fn a_blank_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    assert_refused(" ", Some(dir.path()), "empty or only whitespace");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "a file was made");
}

/// An empty file is used for the trace.
#[test]
fn an_empty_file_is_used() {
    let path = super::temp_path("files-empty");
    std::fs::write(&path, b"").unwrap();
    let out = super::run("known", &[("MEMTRACE_FILE", path.to_str().unwrap())]);
    assert!(out.status.success() && memtrace_messages(&out).is_empty(), "{:?}", memtrace_messages(&out));
    Trace::read(&path);
    let _ = std::fs::remove_file(&path);
}

/// `start_tracing` refuses a file that is not a trace, a blank name, a terminal and the
/// program's stderr with the error variants that say so; the file is left as it was.
#[test]
fn start_tracing_refuses_what_the_variable_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let not_a_trace = dir.path().join("not-a-trace");
    std::fs::write(&not_a_trace, b"the program's notes\n").unwrap();
    let mut cmd = child("files:api", &[(DATA_DIR_VAR, dir.path().to_str().unwrap())]);
    // Where a blank name would be made.
    cmd.current_dir(dir.path());
    let out = output_of(cmd, "files:api");
    assert!(out.status.success(), "{:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("refused: all four"));
    assert_eq!(std::fs::read(&not_a_trace).unwrap(), b"the program's notes\n");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "a file was made");
}

/// A program that puts a listening socket of its own on the profile endpoint's number gets its
/// own connections: the endpoint stops serving with one line instead of answering them.
#[test]
fn the_profile_endpoint_never_answers_on_the_programs_socket() {
    let (out, _) = output_within(child("files:http", &[]), "files:http", Duration::from_secs(60));
    assert!(out.status.success(), "{:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the program answered its own client"));
    // The endpoint's address as it starts, then why it stopped.
    let messages = super::memtrace_messages(&out);
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert!(messages[0].starts_with("memtrace: serving heap profiles at http://127.0.0.1:"), "{messages:?}");
    assert!(messages[1].contains("no longer serving profiles"), "{messages:?}");
}
