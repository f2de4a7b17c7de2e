//! What every part of the runtime shares: whether the allocator takes the tracing path, the
//! allocator entry point a sample came through, the frame limits, the clock, and how it says
//! something on stderr.
//!
//! Above `descriptor` alone, the bottom of the runtime.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

use super::descriptor::Identity;
use crate::format::trace::Timestamp;

/// Tracing is off: the allocator samples nothing.
pub(crate) const OFF: u8 = 0;
/// A session is recording.
pub(crate) const ON: u8 = 1;
/// Start-up calibration: sampled allocations only feed the calibration.
pub(crate) const CALIBRATING: u8 = 2;
/// A forked child of a traced process: nothing is sampled, but sample points look whether the
/// parent is gone (`forked`).
pub(crate) const FORKED: u8 = 3;

/// Whether the allocator takes the tracing path (`OFF`, `ON`, `CALIBRATING` or `FORKED`).
pub(crate) static STATE: AtomicU8 = AtomicU8::new(OFF);

/// Default number of stack frames recorded per sample.
pub(crate) const DEFAULT_FRAME_CAP: usize = 64;
/// Most stack frames a sample can record (and the size of every frame buffer).
pub(crate) const MAX_FRAMES: usize = 128;

/// True while allocations go through the sampling path.
#[inline(always)]
pub(crate) fn enabled() -> bool {
    STATE.load(Ordering::Relaxed) != OFF
}

/// Whether a trace is being recorded right now.
pub fn currently_tracing() -> bool {
    STATE.load(Ordering::Relaxed) == ON
}

/// Which allocator entry point made a sample: the stack frames the tracer must drop to reach
/// the caller's code differ between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// `GlobalAlloc::alloc`.
    Alloc = 0,
    /// `GlobalAlloc::alloc_zeroed`.
    AllocZeroed = 1,
    /// `GlobalAlloc::realloc`.
    Realloc = 2,
}

/// Microseconds since the Unix epoch (no allocation).
pub(crate) fn now_us() -> Timestamp {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000).saturating_add(ts.tv_nsec as u64 / 1000)
}

/// This process's id.
pub(crate) fn getpid() -> u32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u32 }
}

/// Write `line` and a newline on stderr in one `write`: every message of the runtime, on any
/// thread. Not through Rust's `stderr`, whose lock the program may hold on another thread (one
/// that writes its messages through it keeps it): the writer would wait for the program while
/// the program's start or stop waits for the writer, and a start, a stop or an exit would wait
/// for the program's thread; and a fork while a tracer thread held it would leave it held in
/// the child. Nothing is retried but an interrupted or partial write.
pub(crate) fn say(line: &str) {
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    write_stderr(&bytes);
}

/// [`say`] a line formatted into a buffer on the stack, cut at [`SAID_WITHOUT_ALLOCATING`]
/// bytes: what may not allocate (the exit hook) says it so.
pub(crate) fn say_without_allocating(args: std::fmt::Arguments<'_>) {
    struct Line {
        bytes: [u8; SAID_WITHOUT_ALLOCATING],
        len: usize,
    }
    impl std::fmt::Write for Line {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            // One byte kept for the newline.
            let n = s.len().min(SAID_WITHOUT_ALLOCATING - 1 - self.len);
            self.bytes[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
            self.len += n;
            Ok(())
        }
    }
    let mut line = Line { bytes: [0; SAID_WITHOUT_ALLOCATING], len: 0 };
    let _ = std::fmt::write(&mut line, args);
    line.bytes[line.len] = b'\n';
    write_stderr(&line.bytes[..=line.len]);
}

/// The longest line [`say_without_allocating`] says, with its newline.
const SAID_WITHOUT_ALLOCATING: usize = 1024;

/// What descriptor 2 held when the last session started ([`STDERR_DEVICE`] and the next two):
/// [`STDERR_UNNOTED`] before the first start, when it is still the one the program started
/// with. Atomics, not a lock: the exit hook says things from wherever `exit` was called, a
/// signal handler's interruption of this code included.
static STDERR_NOTED: AtomicU8 = AtomicU8::new(STDERR_UNNOTED);
const STDERR_UNNOTED: u8 = 0;
const STDERR_CLOSED: u8 = 1;
const STDERR_OPEN: u8 = 2;
static STDERR_DEVICE: AtomicU64 = AtomicU64::new(0);
static STDERR_INODE: AtomicU64 = AtomicU64::new(0);
static STDERR_KIND: AtomicU32 = AtomicU32::new(0);

/// Note what descriptor 2 holds now as the program's stderr, where the runtime's messages go
/// from now on: called as a session starts.
pub(crate) fn note_stderr() {
    let noted = match Identity::of(libc::STDERR_FILENO) {
        None => STDERR_CLOSED,
        Some(Identity { device, inode, kind }) => {
            STDERR_DEVICE.store(device, Ordering::Relaxed);
            STDERR_INODE.store(inode, Ordering::Relaxed);
            STDERR_KIND.store(kind, Ordering::Relaxed);
            STDERR_OPEN
        }
    };
    STDERR_NOTED.store(noted, Ordering::Release);
}

/// Whether descriptor 2 holds what [`note_stderr`] noted (or nothing was noted yet).
fn stderr_is_the_programs() -> bool {
    match STDERR_NOTED.load(Ordering::Acquire) {
        STDERR_UNNOTED => true,
        STDERR_CLOSED => false,
        _ => {
            let noted = Identity {
                device: STDERR_DEVICE.load(Ordering::Relaxed),
                inode: STDERR_INODE.load(Ordering::Relaxed),
                kind: STDERR_KIND.load(Ordering::Relaxed),
            };
            Identity::of(libc::STDERR_FILENO) == Some(noted)
        }
    }
}

/// Write `bytes` on stderr in one `write` if it takes them (see [`say`]), and only if
/// descriptor 2 still holds the file it held when the last session started: a program that
/// closed it (a daemon's `close_range(0, ~0)`) and opened a file of its own as 2 must not find
/// the tracer's messages in it. What the message says is in the trace too, where there is
/// one. Not a duplicate of descriptor 2 kept aside either: a program that closes its stderr
/// (a pipe) tells its reader it is done, and the reader must see the end.
pub(crate) fn write_stderr(bytes: &[u8]) {
    if !stderr_is_the_programs() {
        return;
    }
    let mut rest = bytes;
    while !rest.is_empty() {
        // SAFETY: writing `rest.len()` bytes from a live slice to a file descriptor.
        let written = unsafe { libc::write(libc::STDERR_FILENO, rest.as_ptr().cast(), rest.len()) };
        match usize::try_from(written) {
            Ok(0) => return,
            Ok(n) => rest = &rest[n..],
            Err(_) if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// Whether the process runs in secure-execution mode (`AT_SECURE`: setuid or setgid, or with
/// file capabilities), where its environment is its caller's, not to be trusted with the
/// privileges it was given.
pub(crate) fn secure_execution() -> bool {
    // SAFETY: getauxval has no preconditions; an absent entry gives 0.
    #[cfg(target_os = "linux")]
    return unsafe { libc::getauxval(libc::AT_SECURE) } != 0;
    #[cfg(not(target_os = "linux"))]
    return false;
}

/// The value of the tracer's environment variable `name` (`MEMTRACE_*`, or upstream's
/// `MEMTRACE`): every read of one goes through here. `None` in secure-execution mode, as glibc
/// ignores `MALLOC_TRACE` and jemalloc `MALLOC_CONF` there: a setuid program's user must not
/// choose the files it writes, nor anything else about its tracing.
pub(crate) fn memtrace_var(name: &str) -> Option<std::ffi::OsString> {
    if secure_execution() {
        return None;
    }
    std::env::var_os(name)
}

/// Whether the calling thread runs under a seccomp filter (a sandbox installed by the program,
/// which may kill the process at a system call it forbids, such as opening a file): the
/// tracer then opens no file on it (see `symbolize`). False where the system does not say.
pub(crate) fn under_seccomp_filter() -> bool {
    // SAFETY: PR_GET_SECCOMP only reports the calling thread's mode (2: a filter).
    #[cfg(target_os = "linux")]
    return unsafe { libc::prctl(libc::PR_GET_SECCOMP) } == 2;
    #[cfg(not(target_os = "linux"))]
    return false;
}
