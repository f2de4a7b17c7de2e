//! What every part of the runtime shares: whether the allocator takes the tracing path (a
//! session's mode, and whether some thread measures a scope), the allocator entry point a
//! sample came through, the frame limits, the clock, and how it says something on stderr.
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

/// The session's mode (`OFF`, `ON`, `CALIBRATING` or `FORKED`), and how many threads measure a scope
/// (`testing::measure`): the one word the allocator's hot path reads.
pub(crate) static STATE: State = State(AtomicU32::new(OFF as u32));

/// The bits of [`STATE`] that hold the mode; the count of measuring threads is above them.
const MODE_MASK: u32 = 0b11;
/// One measuring thread in [`STATE`].
const MEASURER: u32 = MODE_MASK + 1;

/// The mode and the count of measuring threads in one word, so that the hot path's one relaxed
/// load says whether to take the tracing path (either is nonzero). Its `load` and `store` read
/// and write the mode alone, as the `AtomicU8` it was, so that the session code is unchanged.
pub(crate) struct State(AtomicU32);

impl State {
    /// The mode.
    #[inline(always)]
    pub(crate) fn load(&self, order: Ordering) -> u8 {
        (self.0.load(order) & MODE_MASK) as u8
    }

    /// Set the mode, keeping the count of measuring threads (always sequentially consistent:
    /// a compare-and-swap loop, rare).
    pub(crate) fn store(&self, mode: u8, _order: Ordering) {
        let _ = self.0.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |word| Some(word & !MODE_MASK | mode as u32));
    }

    /// Set the mode to `new` if it is `current` (keeping the count of measuring threads): the
    /// mode it was, `Err` if not `current`. Sequentially consistent, as [`State::store`].
    pub(crate) fn compare_exchange(
        &self,
        current: u8,
        new: u8,
        _success: Ordering,
        _failure: Ordering,
    ) -> Result<u8, u8> {
        let mode = |word: u32| (word & MODE_MASK) as u8;
        self.0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |word| {
                (mode(word) == current).then_some(word & !MODE_MASK | new as u32)
            })
            .map(mode)
            .map_err(mode)
    }

    /// Count one more thread that measures a scope: the allocator then takes the tracing path
    /// even with no session, on every thread (see `sampler::sample_points` for what that costs
    /// the others: one out-of-line call per 4 MiB).
    pub(crate) fn add_measurer(&self) {
        self.0.fetch_add(MEASURER, Ordering::SeqCst);
    }

    /// Count one thread less that measures a scope.
    pub(crate) fn remove_measurer(&self) {
        self.0.fetch_sub(MEASURER, Ordering::SeqCst);
    }
}

/// Default number of stack frames recorded per sample.
pub(crate) const DEFAULT_FRAME_CAP: usize = 64;
/// Most stack frames a sample can record (and the size of every frame buffer).
pub(crate) const MAX_FRAMES: usize = 128;

/// True while allocations go through the sampling path: a session runs, or a thread measures.
#[inline(always)]
pub(crate) fn enabled() -> bool {
    STATE.0.load(Ordering::Relaxed) != 0
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
