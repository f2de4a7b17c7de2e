//! Starting and stopping traces: configuration and environment variables, the trace file,
//! the start-up calibration of the stack capture, the hand-off of samples to the writer
//! thread, the writer thread itself, and the process hooks (`atexit`, `pthread_atfork`).
//!
//! # Threads and ordering
//! Application threads never wait for the writer: a sampled allocation captures its stack
//! into a frame buffer taken from a lock-free pool of recycled buffers (a new one is allocated
//! when the pool is empty) and sends a small message owning that buffer over an unbounded
//! crossbeam channel. The channel's occasional block allocations and any new buffer are made
//! "inside the tracer", so they are not sampled; the writer returns each buffer to the pool
//! once the sample is encoded (or frees it when the pool is full). Nothing on the sampled path
//! blocks or takes a lock. The writer
//! thread owns the [`Writer`], assigns object ids, keeps the address → id map, symbolizes
//! new frame addresses once, and flushes at least once a second. A queue bound and the
//! sampled-block table are the only places a sample can be dropped; drops are counted and
//! reported on stderr when tracing stops.
//!
//! Each session gets its own channel, leaked when the session ends (a few hundred bytes), so
//! a thread still finishing a send for an old session can never reach a new session's writer
//! and a forked child that starts tracing never shares a channel with its parent's threads.

use std::cell::Cell;
use std::ffi::OsStr;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

use crate::allocator::Entry;
use crate::error::ErrorKind;
use crate::hash::FastMap;
use crate::location_codec::Location;
use crate::sampled_set;
use crate::sampler::{self, WORD_BYTES};
use crate::symbolize;
use crate::trace::{AllocSource, Info, NewAlloc, ObjectId, Timestamp, Writer};

/// Default sampling rate: the probability that any one 8-byte word allocated is sampled.
pub const DEFAULT_RATE: f64 = 1e-5;
/// Default number of stack frames recorded per sample.
pub const DEFAULT_FRAME_CAP: usize = 64;
/// Largest frame cap [`TraceConfig::frame_cap`] accepts.
pub const MAX_FRAMES: usize = 128;
/// Environment variable naming the trace file.
pub const FILE_VAR: &str = "MEMTRACE_FILE";
/// Upstream's name for [`FILE_VAR`], also accepted.
pub const UPSTREAM_FILE_VAR: &str = "MEMTRACE";
/// Environment variable holding the sampling rate.
pub const RATE_VAR: &str = "MEMTRACE_RATE";
/// Environment variable holding the trace's free-form context string.
pub const CONTEXT_VAR: &str = "MEMTRACE_CONTEXT";

/// Environment variable choosing the stack unwinder: `dwarf` (default) or `frame-pointers`.
pub const UNWINDER_VAR: &str = "MEMTRACE_UNWINDER";

/// Frame buffers the pool of a session can hold (and is prefilled with).
const POOL_SIZE: usize = 512;

/// Messages queued for the writer beyond which new samples are dropped (the writer is far
/// behind). Frees are never dropped.
const QUEUE_LIMIT: usize = 1 << 17;
/// The writer flushes at least this often.
const FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// How long the writer sleeps when it finds the channel empty.
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// Messages the writer handles between two checks of the flush deadline.
const POLL_BATCH: usize = 4096;
/// Domain of every event.
const DOMAIN: u16 = 0;

const OFF: u8 = 0;
const ON: u8 = 1;
/// Start-up calibration: sampled allocations only feed the calibration.
const CALIBRATING: u8 = 2;

/// Whether the allocator takes the tracing path (`OFF`, `ON` or `CALIBRATING`).
static STATE: AtomicU8 = AtomicU8::new(OFF);
/// The current session's channel (leaked, never freed); null before the first session.
static CHANNEL: AtomicPtr<Channel> = AtomicPtr::new(std::ptr::null_mut());
/// Samples dropped since the current session started because the writer was far behind.
static DROPPED_QUEUE: AtomicU64 = AtomicU64::new(0);
/// Samples dropped since the current session started because the sampled-block table
/// bucket was full.
static DROPPED_TABLE: AtomicU64 = AtomicU64::new(0);
/// Per [`Unwinder`] and [`Entry`]: leading captured frames that belong to the tracer, the
/// unwinder and the allocator shims (measured by [`calibrate`]).
#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `SKIP`.
const NO_SKIP: [AtomicUsize; 3] = [AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0)];
static SKIP: [[AtomicUsize; 3]; 2] = [NO_SKIP, NO_SKIP];
/// Frames recorded per sample in the current session.
static FRAME_CAP: AtomicUsize = AtomicUsize::new(DEFAULT_FRAME_CAP);
/// The unwinder of the current session (or of the calibration under way), as `Unwinder as u8`.
static UNWINDER: AtomicU8 = AtomicU8::new(Unwinder::Dwarf as u8);
/// Per [`Unwinder`]: whether its [`SKIP`] has been measured in this process.
static CALIBRATED: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];
/// Whether frame-pointer unwinding was found not to work in this process (no frame chain).
static FRAME_POINTERS_BROKEN: AtomicBool = AtomicBool::new(false);
/// Whether the sampled-block table may hold entries of an earlier session.
static TABLE_USED: AtomicBool = AtomicBool::new(false);
/// The captures made by the calibration markers, per [`Entry`].
static CALIBRATION: Mutex<[(usize, [u64; MAX_FRAMES]); 3]> = parking_lot::const_mutex([(0, [0; MAX_FRAMES]); 3]);
/// The running session; held while starting and stopping (and across `fork`).
static SESSION: Mutex<Option<Session>> = parking_lot::const_mutex(None);
/// Registers the process hooks once.
static HOOKS: Once = Once::new();

/// True while allocations go through the sampling path.
#[inline(always)]
pub(crate) fn enabled() -> bool {
    STATE.load(Ordering::Relaxed) != OFF
}

/// Whether a trace is being recorded right now.
pub fn currently_tracing() -> bool {
    STATE.load(Ordering::Relaxed) == ON
}

/// A captured stack: frame addresses, innermost first.
type Frames = Box<[u64; MAX_FRAMES]>;

/// A session's hand-off queue, and its pool of frame buffers.
struct Channel {
    tx: Sender<Msg>,
    rx: Receiver<Msg>,
    /// Messages sent and not yet received.
    queued: AtomicUsize,
    /// Recycled frame buffers (a bounded, lock-free array queue).
    pool_tx: Sender<Frames>,
    pool_rx: Receiver<Frames>,
}

impl Channel {
    fn send(&self, msg: Msg) -> bool {
        self.queued.fetch_add(1, Ordering::Relaxed);
        let sent = self.tx.send(msg).is_ok();
        if !sent {
            self.queued.fetch_sub(1, Ordering::Relaxed);
        }
        sent
    }

    /// A frame buffer from the pool, or a new one when the pool is empty (callers are inside
    /// the tracer, so the allocation is not sampled).
    #[inline]
    fn take_frames(&self) -> Frames {
        self.pool_rx.try_recv().unwrap_or_else(|_| new_frames())
    }

    /// Give a frame buffer back to the pool; it is freed when the pool is full.
    fn recycle(&self, frames: Frames) {
        let _ = self.pool_tx.try_send(frames);
    }

    fn new() -> Channel {
        let (tx, rx) = crossbeam_channel::unbounded();
        let (pool_tx, pool_rx) = crossbeam_channel::bounded(POOL_SIZE);
        for _ in 0..POOL_SIZE {
            let _ = pool_tx.try_send(new_frames());
        }
        Channel { tx, rx, queued: AtomicUsize::new(0), pool_tx, pool_rx }
    }
}

#[cold]
#[inline(never)]
fn new_frames() -> Frames {
    Box::new([0; MAX_FRAMES])
}

/// What application threads tell the writer: a few words, so that the channel's blocks stay
/// small (the frames travel in a pooled buffer).
enum Msg {
    /// A sampled block was allocated at `addr`.
    Alloc {
        addr: usize,
        time: Timestamp,
        /// Size in words.
        length: u64,
        nsamples: u64,
        /// Frame addresses, innermost first; only the first `nframes` are meaningful.
        frames: Frames,
        nframes: u32,
    },
    /// The sampled block at `addr` was freed.
    Free { addr: usize, time: Timestamp },
    /// Close the trace and exit.
    Stop,
}

/// The current session's channel, if tracing.
fn channel() -> Option<&'static Channel> {
    // SAFETY: CHANNEL is null or points to a leaked `Channel` that is never freed.
    unsafe { CHANNEL.load(Ordering::Acquire).as_ref() }
}

/// Called (inside the tracer) for a sampled block of `size` bytes just allocated at `addr`.
pub(crate) fn sampled_alloc(addr: usize, size: usize, nsamples: u64, entry: Entry) {
    let calibration = sampler::take_calibration_flag();
    match STATE.load(Ordering::Relaxed) {
        ON => {}
        CALIBRATING if calibration => {
            let mut frames = [0; MAX_FRAMES];
            let n = capture(entry, true, &mut frames);
            CALIBRATION.lock()[entry as usize] = (n, frames);
            return;
        }
        _ => return,
    }
    let Some(channel) = channel() else { return };
    if channel.queued.load(Ordering::Relaxed) >= QUEUE_LIMIT {
        DROPPED_QUEUE.fetch_add(1, Ordering::Relaxed);
        return;
    }
    if !sampled_set::insert(addr) {
        DROPPED_TABLE.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let mut frames = channel.take_frames();
    let nframes = capture(entry, false, &mut frames);
    let length = (size as u64).div_ceil(WORD_BYTES);
    let nframes = nframes as u32;
    if !channel.send(Msg::Alloc { addr, time: now_us(), length, nsamples, frames, nframes }) {
        sampled_set::remove(addr);
        DROPPED_QUEUE.fetch_add(1, Ordering::Relaxed);
    }
}

/// Called (inside the tracer) when the sampled block at `addr` is about to be freed.
pub(crate) fn sampled_free(addr: usize) {
    if let Some(channel) = channel() {
        channel.send(Msg::Free { addr, time: now_us() });
    }
}

/// Record the stack of a sample taken in `entry` with the session's unwinder into `frames`,
/// innermost first, without the tracer's own frames (all frames, up to [`MAX_FRAMES`], for a
/// calibration capture). Returns the number of frames written. Allocation-free, except that
/// the first frame-pointer capture on a thread asks for the thread's stack bounds.
#[inline(always)]
fn capture(entry: Entry, calibrating: bool, frames: &mut [u64; MAX_FRAMES]) -> usize {
    let cap = if calibrating { MAX_FRAMES } else { FRAME_CAP.load(Ordering::Relaxed) };
    let skip = |unwinder: Unwinder| {
        if calibrating {
            0
        } else {
            SKIP[unwinder as usize][entry as usize].load(Ordering::Relaxed)
        }
    };
    if UNWINDER.load(Ordering::Relaxed) == Unwinder::FramePointers as u8 {
        if let Some(bounds) = frame_pointers::stack_bounds() {
            return frame_pointers::capture(skip(Unwinder::FramePointers), cap, frames, bounds);
        }
        // Stack bounds unknown on this thread: DWARF unwinding instead.
    }
    capture_dwarf(skip(Unwinder::Dwarf), cap, frames)
}

/// [`capture`] with libgcc's DWARF unwinder: up to `cap` frame addresses after skipping `skip`.
#[inline(never)]
fn capture_dwarf(skip: usize, cap: usize, frames: &mut [u64; MAX_FRAMES]) -> usize {
    let cap = cap.min(MAX_FRAMES);
    let mut seen = 0;
    let mut n = 0;
    // SAFETY: on Unix the unwinder (libgcc `_Unwind_Backtrace`) is thread-safe; the
    // synchronized `trace` only adds a process-wide lock, which must not be taken inside an
    // allocator (ALLOCATOR-PITFALLS §2). The callback only writes into `frames`.
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            let ip = frame.ip() as u64;
            if ip == 0 {
                // The end of the stack.
                return false;
            }
            if seen >= skip {
                if let Some(slot) = frames.get_mut(n) {
                    *slot = ip;
                    n += 1;
                }
            }
            seen += 1;
            n < cap
        });
    }
    n
}

/// Stack capture by walking the frame-pointer chain (ALLOCATOR-PITFALLS §10): no DWARF
/// tables, no loader lock, no unwinder lock, safe next to signal-based profilers.
///
/// Each frame that keeps a frame pointer stores the record `[caller's frame pointer, return
/// address]` at its frame pointer (x86_64 `rbp`, aarch64 `x29`). The walk follows the records
/// and stops at the first one that fails a check: every record must lie within this thread's
/// stack, above the current stack pointer (so it is mapped and readable: the walk never
/// faults), 8-byte aligned, and strictly above the previous record (so the walk ends). The
/// stack bounds come from `pthread_getattr_np` once per thread and are cached in
/// `const`-initialised thread-local cells; a thread whose bounds are unknown (or a sample
/// taken on another stack, such as a signal stack) falls back to DWARF unwinding.
///
/// The chain is only complete if every function between `main` and the allocator keeps frame
/// pointers: build the program with `-C force-frame-pointers=yes` (Rust's precompiled std
/// keeps them since 1.79). A chain broken by a function without one ends the walk early (a
/// truncated stack); it cannot go wrong in any other way.
mod frame_pointers {
    use super::*;

    /// Whether this target has a frame-pointer walker.
    pub(super) const SUPPORTED: bool = cfg!(all(
        any(target_arch = "x86_64", target_arch = "aarch64"),
        any(target_os = "linux", target_os = "android")
    ));

    /// `hi` values with a special meaning in [`STACK`].
    const UNKNOWN: usize = 0;
    const UNAVAILABLE: usize = 1;

    thread_local! {
        /// This thread's stack as `(lowest address, end)`; `end` is [`UNKNOWN`] until asked
        /// for, [`UNAVAILABLE`] when it cannot be known.
        static STACK: (Cell<usize>, Cell<usize>) = const { (Cell::new(0), Cell::new(UNKNOWN)) };
    }

    /// This thread's stack bounds, asked for on the first call (callers are inside the tracer:
    /// `pthread_getattr_np` may allocate, reading `/proc/self/maps` for the main thread).
    #[inline]
    pub(super) fn stack_bounds() -> Option<(usize, usize)> {
        STACK
            .try_with(|(lo, hi)| {
                if hi.get() == UNKNOWN {
                    let (l, h) = query_stack_bounds().unwrap_or((0, UNAVAILABLE));
                    lo.set(l);
                    hi.set(h);
                }
                (hi.get() != UNAVAILABLE).then(|| (lo.get(), hi.get()))
            })
            .ok()
            .flatten()
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn query_stack_bounds() -> Option<(usize, usize)> {
        // SAFETY: `attr` is initialised by pthread_getattr_np before use and destroyed after;
        // the out-pointers are valid for writes.
        unsafe {
            let mut attr: libc::pthread_attr_t = std::mem::zeroed();
            if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
                return None;
            }
            let mut addr: *mut libc::c_void = std::ptr::null_mut();
            let mut size: libc::size_t = 0;
            let result = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
            libc::pthread_attr_destroy(&mut attr);
            let lo = addr as usize;
            (result == 0 && lo > UNAVAILABLE && size > 0).then(|| (lo, lo.saturating_add(size)))
        }
    }

    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    fn query_stack_bounds() -> Option<(usize, usize)> {
        None
    }

    /// The current `(frame pointer, stack pointer)`.
    #[inline(always)]
    fn registers() -> (usize, usize) {
        let (fp, sp): (usize, usize);
        // SAFETY: reads two registers; no memory access.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            std::arch::asm!("mov {fp}, rbp", "mov {sp}, rsp", fp = out(reg) fp, sp = out(reg) sp,
                options(nomem, nostack, preserves_flags));
        }
        // SAFETY: reads two registers; no memory access.
        #[cfg(target_arch = "aarch64")]
        unsafe {
            std::arch::asm!("mov {fp}, x29", "mov {sp}, sp", fp = out(reg) fp, sp = out(reg) sp,
                options(nomem, nostack, preserves_flags));
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            (fp, sp) = (0, 0);
        }
        (fp, sp)
    }

    /// Up to `cap` return addresses, innermost first, after skipping `skip`; `stack` is this
    /// thread's `(lowest address, end)`. Returns the number written; 0 when the sample was
    /// not taken on the thread's stack.
    #[inline(never)]
    pub(super) fn capture(skip: usize, cap: usize, frames: &mut [u64; MAX_FRAMES], stack: (usize, usize)) -> usize {
        const WORD: usize = std::mem::size_of::<usize>();
        let cap = cap.min(MAX_FRAMES);
        let (mut fp, sp) = registers();
        let (lo, hi) = stack;
        if sp < lo || sp >= hi {
            // Another stack (a signal stack, a coroutine): nothing to walk.
            return 0;
        }
        let mut n = 0;
        let mut seen = 0;
        // Every record read is within [sp, hi): the live part of this thread's stack.
        while n < cap && fp >= sp && fp % WORD == 0 && fp <= hi - 2 * WORD {
            // SAFETY: `[fp, fp + 16)` is inside the mapped, live part of this thread's stack
            // (checked above) and aligned; volatile reads of plain words, never dereferenced.
            let (next, ret) = unsafe {
                (std::ptr::read_volatile(fp as *const usize), std::ptr::read_volatile((fp + WORD) as *const usize))
            };
            if ret == 0 {
                break;
            }
            if seen >= skip {
                frames[n] = ret as u64;
                n += 1;
            }
            seen += 1;
            if next <= fp {
                break;
            }
            fp = next;
        }
        n
    }
}

/// Microseconds since the Unix epoch (no allocation).
pub(crate) fn now_us() -> Timestamp {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000).saturating_add(ts.tv_nsec as u64 / 1000)
}

fn getpid() -> u32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() as u32 }
}

// ---------------------------------------------------------------------------------------------
// Configuration and errors

/// How to trace: see [`start_tracing`].
#[derive(Debug, Clone, PartialEq)]
pub struct TraceConfig {
    /// The trace file; created (mode 0600) or truncated.
    pub path: PathBuf,
    /// Probability that any one 8-byte word allocated is sampled, in (0, 1].
    pub rate: f64,
    /// A free-form description stored in the trace info.
    pub context: Option<String>,
    /// Stack frames recorded per sample, from 1 to [`MAX_FRAMES`].
    pub frame_cap: usize,
    /// How sampled stacks are captured.
    pub unwinder: Unwinder,
}

impl TraceConfig {
    /// A configuration writing to `path` with the default rate, frame cap and unwinder and no
    /// context.
    pub fn new(path: impl Into<PathBuf>) -> TraceConfig {
        TraceConfig {
            path: path.into(),
            rate: DEFAULT_RATE,
            context: None,
            frame_cap: DEFAULT_FRAME_CAP,
            unwinder: Unwinder::default(),
        }
    }
}

/// How a sampled allocation's stack is captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unwinder {
    /// libgcc's DWARF unwinder (`_Unwind_Backtrace`): works for any program with unwind
    /// tables (Rust's default), costs a few µs per sample. The default.
    #[default]
    Dwarf = 0,
    /// Walk the frame-pointer chain: several times cheaper, and never touches the dynamic
    /// loader or an unwinder lock. Needs the program built with `-C force-frame-pointers=yes`
    /// (e.g. `RUSTFLAGS="-C force-frame-pointers=yes"`; the precompiled std keeps frame
    /// pointers since Rust 1.79); a function without one truncates the stacks that pass
    /// through it. x86_64 and aarch64 Linux only; elsewhere, or when start-up calibration
    /// finds no usable frame chain, tracing uses [`Unwinder::Dwarf`] and says so on stderr.
    FramePointers = 1,
}

impl Unwinder {
    /// The name used by [`UNWINDER_VAR`] and in the trace's runtime parameters.
    pub fn name(self) -> &'static str {
        match self {
            Unwinder::Dwarf => "dwarf",
            Unwinder::FramePointers => "frame-pointers",
        }
    }
}

/// Why tracing did not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// A trace is already being recorded in this process.
    AlreadyTracing,
    /// The rate is not in (0, 1].
    InvalidRate(f64),
    /// An environment variable has a value that cannot be used.
    InvalidVariable {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// The frame cap is not in 1..=[`MAX_FRAMES`].
    InvalidFrameCap(usize),
    /// Allocations do not reach a [`crate::MemtraceAllocator`]: it is not the
    /// `#[global_allocator]`.
    NotGlobalAllocator,
    /// The trace file could not be opened.
    Open {
        /// The trace file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The trace file is locked by another process.
    Locked {
        /// The trace file.
        path: PathBuf,
    },
    /// Writing the start of the trace failed.
    Write {
        /// The trace file.
        path: PathBuf,
        /// Why.
        source: crate::Error,
    },
    /// The writer thread could not be started.
    Spawn(io::Error),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::AlreadyTracing => write!(f, "a trace is already being recorded"),
            StartError::InvalidRate(rate) => write!(f, "sampling rate must be in (0, 1], got {rate}"),
            StartError::InvalidVariable { var, value } if *var == UNWINDER_VAR => {
                write!(f, "{var} must be `dwarf` or `frame-pointers`, got {value:?}; not tracing")
            }
            StartError::InvalidVariable { var, value } => {
                write!(f, "{var} must be a sampling rate in (0, 1], got {value:?}; not tracing")
            }
            StartError::InvalidFrameCap(cap) => write!(f, "frame cap must be between 1 and {MAX_FRAMES}, got {cap}"),
            StartError::NotGlobalAllocator => {
                write!(f, "MemtraceAllocator is not the #[global_allocator]; not tracing")
            }
            StartError::Open { path, source } => {
                write!(f, "cannot open trace file {}: {source}; not tracing", path.display())
            }
            StartError::Locked { path } => {
                write!(f, "trace file {} is locked: is another process using it? Not tracing", path.display())
            }
            StartError::Write { path, source } => {
                write!(f, "cannot write trace file {}: {source}; not tracing", path.display())
            }
            StartError::Spawn(e) => write!(f, "cannot start the trace writer thread: {e}; not tracing"),
        }
    }
}

impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StartError::Open { source, .. } => Some(source),
            StartError::Write { source, .. } => Some(source),
            StartError::Spawn(e) => Some(e),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Starting and stopping

/// A running trace; dropping it stops tracing and flushes the trace.
#[must_use = "tracing stops when the guard is dropped"]
#[derive(Debug)]
pub struct TraceGuard {
    session: u64,
}

impl Drop for TraceGuard {
    fn drop(&mut self) {
        stop_session(Some(self.session));
    }
}

/// The state of the running session.
struct Session {
    id: u64,
    /// The process that started it (a forked child must not touch the writer).
    pid: u32,
    channel: &'static Channel,
    writer: JoinHandle<()>,
}

/// Start tracing if the environment asks for it: `MEMTRACE_FILE` (or upstream's `MEMTRACE`)
/// names the trace file, `MEMTRACE_RATE` the sampling rate (default 1e-5), and
/// `MEMTRACE_CONTEXT` an optional description.
///
/// The file variables are removed from the environment, so that child processes are not
/// traced into the same file. Problems (a malformed rate, an unwritable or locked file) are
/// reported on stderr in one line starting with `memtrace: `, and the program runs on
/// untraced. Returns `None` when not tracing; keep the guard alive for as long as the program
/// should be traced.
#[must_use = "tracing stops when the guard is dropped"]
pub fn trace_if_requested() -> Option<TraceGuard> {
    let path = [FILE_VAR, UPSTREAM_FILE_VAR].iter().find_map(|var| std::env::var_os(var).filter(|p| !p.is_empty()))?;
    std::env::remove_var(FILE_VAR);
    std::env::remove_var(UPSTREAM_FILE_VAR);
    let mut config = TraceConfig::new(path);
    match rate_from_env(std::env::var_os(RATE_VAR).as_deref()) {
        Ok(Some(rate)) => config.rate = rate,
        Ok(None) => {}
        Err(e) => {
            eprintln!("memtrace: {e}");
            return None;
        }
    }
    match unwinder_from_env(std::env::var_os(UNWINDER_VAR).as_deref()) {
        Ok(Some(unwinder)) => config.unwinder = unwinder,
        Ok(None) => {}
        Err(e) => {
            eprintln!("memtrace: {e}");
            return None;
        }
    }
    config.context = std::env::var(CONTEXT_VAR).ok().filter(|c| !c.is_empty());
    match start_tracing(config) {
        Ok(guard) => Some(guard),
        Err(e) => {
            eprintln!("memtrace: {e}");
            None
        }
    }
}

/// The rate given by the value of [`RATE_VAR`]: `None` when unset or empty.
fn rate_from_env(value: Option<&OsStr>) -> Result<Option<f64>, StartError> {
    let Some(value) = value.filter(|v| !v.is_empty()) else { return Ok(None) };
    match value.to_str().and_then(|v| v.trim().parse::<f64>().ok()) {
        Some(rate) if valid_rate(rate) => Ok(Some(rate)),
        _ => Err(StartError::InvalidVariable { var: RATE_VAR, value: value.to_string_lossy().into_owned() }),
    }
}

/// The unwinder named by the value of [`UNWINDER_VAR`]: `None` when unset or empty.
fn unwinder_from_env(value: Option<&OsStr>) -> Result<Option<Unwinder>, StartError> {
    let Some(value) = value.filter(|v| !v.is_empty()) else { return Ok(None) };
    let name = value.to_str().map(str::trim);
    [Unwinder::Dwarf, Unwinder::FramePointers]
        .into_iter()
        .find(|u| Some(u.name()) == name)
        .map(Some)
        .ok_or_else(|| StartError::InvalidVariable { var: UNWINDER_VAR, value: value.to_string_lossy().into_owned() })
}

fn valid_rate(rate: f64) -> bool {
    rate > 0.0 && rate <= 1.0
}

/// Start recording a trace as `config` says. Tracing stops when the returned guard is
/// dropped, when [`stop_tracing`] is called, or at process exit.
///
/// Only one trace can be recorded at a time. The file is created with mode 0600 (or
/// truncated), after taking an exclusive `lockf` lock on it: a file another process is
/// tracing into gives [`StartError::Locked`]. The first call in a process also calibrates the
/// stack capture, which requires [`crate::MemtraceAllocator`] to be the global allocator.
pub fn start_tracing(config: TraceConfig) -> Result<TraceGuard, StartError> {
    if !valid_rate(config.rate) {
        return Err(StartError::InvalidRate(config.rate));
    }
    if !(1..=MAX_FRAMES).contains(&config.frame_cap) {
        return Err(StartError::InvalidFrameCap(config.frame_cap));
    }
    HOOKS.call_once(register_hooks);
    let mut current = SESSION.lock();
    if let Some(session) = current.take() {
        if session.pid == getpid() && currently_tracing() {
            *current = Some(session);
            return Err(StartError::AlreadyTracing);
        }
        // A session whose writer failed, or our parent's session: end it quietly.
        finish(session);
    }
    let unwinder = calibrate(config.unwinder)?;
    let file = open_locked(&config.path)?;
    let start_time = now_us();
    let info = Info {
        sample_rate: config.rate,
        word_size: 64,
        executable_name: std::env::current_exe().map(|p| p.into_os_string().into_vec()).unwrap_or_default(),
        host_name: host_name(),
        runtime_params: runtime_params(config.frame_cap, unwinder).into_bytes(),
        pid: getpid() as u64,
        initial_domain: DOMAIN,
        start_time,
        context: config.context.map(String::into_bytes),
    };
    let write_error = |source| StartError::Write { path: config.path.clone(), source };
    let writer = Writer::new(file, &info).map_err(write_error)?.check_pid_on_flush(true);

    let channel: &'static Channel = Box::leak(Box::new(Channel::new()));
    let (ready_tx, ready_rx) = crossbeam_channel::bounded(1);
    let path = config.path.clone();
    let writer = std::thread::Builder::new()
        .name("memtrace-writer".into())
        .spawn(move || {
            sampler::enter_tracer_forever();
            let _ = ready_tx.send(());
            write_trace(channel, writer, &path, start_time);
        })
        .map_err(StartError::Spawn)?;
    let _ = ready_rx.recv();

    if TABLE_USED.swap(true, Ordering::Relaxed) {
        sampled_set::clear();
    }
    DROPPED_QUEUE.store(0, Ordering::Relaxed);
    DROPPED_TABLE.store(0, Ordering::Relaxed);
    sampler::configure(config.rate);
    FRAME_CAP.store(config.frame_cap, Ordering::Relaxed);
    UNWINDER.store(unwinder as u8, Ordering::Relaxed);
    CHANNEL.store(channel as *const Channel as *mut Channel, Ordering::Release);
    STATE.store(ON, Ordering::Release);
    let id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
    *current = Some(Session { id, pid: getpid(), channel, writer });
    Ok(TraceGuard { session: id })
}

/// Session ids, so that a guard only stops its own session.
static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// Stop the running trace, if any, and flush it. Blocks still alive are not reported as
/// collected.
pub fn stop_tracing() {
    stop_session(None);
}

/// Stop the running session if it is `only` (or any session for `None`).
fn stop_session(only: Option<u64>) {
    let mut current = SESSION.lock();
    if current.as_ref().is_some_and(|s| only.map_or(true, |id| id == s.id)) {
        if let Some(session) = current.take() {
            finish(session);
        }
    }
}

/// End `session`: stop sampling, let the writer drain and close the trace, report drops.
fn finish(session: Session) {
    if session.pid != getpid() {
        // Forked child: the writer thread does not exist here; never touch the parent's trace.
        std::mem::forget(session.writer);
        return;
    }
    STATE.store(OFF, Ordering::SeqCst);
    CHANNEL.store(std::ptr::null_mut(), Ordering::Release);
    session.channel.send(Msg::Stop);
    let _ = session.writer.join();
    // The channel is leaked; free the pooled buffers (a thread still finishing a sample of
    // this session may take one, or allocate one that is never received: a few KiB at most).
    while session.channel.pool_rx.try_recv().is_ok() {}
    let behind = DROPPED_QUEUE.swap(0, Ordering::Relaxed);
    let full = DROPPED_TABLE.swap(0, Ordering::Relaxed);
    if behind + full > 0 {
        eprintln!(
            "memtrace: {} samples were dropped ({behind} with the trace writer too far behind, {full} with the \
             sampled-block table full)",
            behind + full
        );
    }
}

/// Create or open `path` for writing (mode 0600), lock it, then truncate it.
fn open_locked(path: &Path) -> Result<File, StartError> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|source| StartError::Open { path: path.to_owned(), source })?;
    // SAFETY: `file` is an open descriptor for the duration of the call.
    if unsafe { libc::lockf(file.as_raw_fd(), libc::F_TLOCK, 0) } != 0 {
        let e = io::Error::last_os_error();
        if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) {
            return Err(StartError::Locked { path: path.to_owned() });
        }
        // Other failures (a device such as /dev/null that cannot be locked): go on unlocked.
    }
    // Errors ignored, as upstream does: devices cannot be truncated.
    let _ = file.set_len(0);
    Ok(file)
}

fn host_name() -> Vec<u8> {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for `buf.len()` bytes.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return Vec::new();
    }
    buf.split(|&b| b == 0).next().unwrap_or_default().to_vec()
}

fn runtime_params(frame_cap: usize, unwinder: Unwinder) -> String {
    let unwinder = match unwinder {
        Unwinder::FramePointers => "frame-pointers",
        Unwinder::Dwarf if cfg!(target_vendor = "apple") => "libunwind",
        Unwinder::Dwarf => "libgcc",
    };
    format!("memtrace-rs={},unwinder={unwinder},frames={frame_cap}", env!("CARGO_PKG_VERSION"))
}

// ---------------------------------------------------------------------------------------------
// Calibration

/// Measure, once per process, how many leading captured frames belong to the tracer, the
/// unwinder and the allocator shims for each entry point, so that the innermost frame kept is
/// the code that called into the global allocator.
///
/// A forced sample is taken from an `#[inline(never)]` marker function per entry point; the
/// frames below the marker are resolved once, and everything up to the last one that is ours
/// (`memtrace_rs::`, `backtrace::`, `__rust_alloc`, `__rg_`, `_Unwind_`, ...) is skipped.
/// This also warms up the unwinder before any real sample is taken. Called with [`SESSION`]
/// held and tracing off.
///
/// DWARF unwinding is always calibrated (it is also the fallback of frame-pointer unwinding);
/// frame pointers only when asked for. Returns the unwinder to use: [`Unwinder::Dwarf`], with
/// a note on stderr, when frame pointers are asked for but cannot be walked here.
fn calibrate(wanted: Unwinder) -> Result<Unwinder, StartError> {
    calibrate_unwinder(Unwinder::Dwarf)?;
    if wanted == Unwinder::Dwarf {
        return Ok(Unwinder::Dwarf);
    }
    let why = if !frame_pointers::SUPPORTED {
        Some("is not supported on this platform")
    } else if frame_pointers::stack_bounds().is_none() {
        Some("cannot find this thread's stack")
    } else if calibrate_unwinder(Unwinder::FramePointers)? {
        None
    } else {
        Some("finds no frame chain (build with -C force-frame-pointers=yes)")
    };
    match why {
        None => Ok(Unwinder::FramePointers),
        Some(why) => {
            eprintln!("memtrace: frame-pointer unwinding {why}; using DWARF unwinding");
            Ok(Unwinder::Dwarf)
        }
    }
}

/// Calibrate `unwinder` (once per process). Returns whether its captures reach the marker
/// functions: when they do not, nothing is skipped.
fn calibrate_unwinder(unwinder: Unwinder) -> Result<bool, StartError> {
    let u = unwinder as usize;
    if CALIBRATED[u].load(Ordering::Relaxed) {
        return Ok(unwinder == Unwinder::Dwarf || !FRAME_POINTERS_BROKEN.load(Ordering::Relaxed));
    }
    let markers: [(Entry, fn(), &str); 3] = [
        (Entry::Alloc, marker_alloc, "marker_alloc"),
        (Entry::AllocZeroed, marker_alloc_zeroed, "marker_alloc_zeroed"),
        (Entry::Realloc, marker_realloc, "marker_realloc"),
    ];
    *CALIBRATION.lock() = [(0, [0; MAX_FRAMES]); 3];
    UNWINDER.store(u as u8, Ordering::Relaxed);
    STATE.store(CALIBRATING, Ordering::SeqCst);
    for (_, marker, _) in &markers {
        marker();
    }
    STATE.store(OFF, Ordering::SeqCst);
    UNWINDER.store(Unwinder::Dwarf as u8, Ordering::Relaxed);
    let captures = *CALIBRATION.lock();
    if unwinder == Unwinder::Dwarf && captures.iter().any(|&(n, _)| n == 0) {
        return Err(StartError::NotGlobalAllocator);
    }
    let mut found = true;
    for (entry, _, name) in markers {
        let (n, frames) = &captures[entry as usize];
        let skip = tracer_frames(&frames[..*n], name);
        found &= skip.is_some();
        SKIP[u][entry as usize].store(skip.unwrap_or(0), Ordering::Relaxed);
    }
    if unwinder == Unwinder::FramePointers {
        FRAME_POINTERS_BROKEN.store(!found, Ordering::Relaxed);
    }
    CALIBRATED[u].store(true, Ordering::Relaxed);
    Ok(unwinder == Unwinder::Dwarf || found)
}

/// The number of leading `frames` (innermost first) that are tracer or allocator machinery,
/// given that the frame of the function named `marker` called into the global allocator.
/// `None` when the marker cannot be found (no symbols, or a broken frame chain).
fn tracer_frames(frames: &[u64], marker: &str) -> Option<usize> {
    const OURS: [&str; 9] = [
        "memtrace_rs::",
        "backtrace::",
        "__rust_alloc",
        "__rust_realloc",
        "__rust_dealloc",
        "__rust_alloc_zeroed",
        "__rg_",
        "__rustc::",
        "_Unwind_",
    ];
    let names: Vec<Vec<String>> = frames.iter().map(|&ip| symbolize::function_names(ip)).collect();
    let marker_at = names.iter().position(|n| n.iter().any(|n| n.ends_with(marker)))?;
    let skip = names[..marker_at]
        .iter()
        .rposition(|n| n.iter().any(|n| OURS.iter().any(|ours| n.contains(ours))))
        .map_or(0, |last| last + 1);
    Some(skip)
}

const MARKER_LAYOUT: std::alloc::Layout = std::alloc::Layout::new::<[u64; 4]>();

#[inline(never)]
fn marker_alloc() {
    sampler::force_sample();
    // SAFETY: the layout has a nonzero size; the block is freed with the same layout.
    unsafe {
        let p = std::hint::black_box(std::alloc::alloc(MARKER_LAYOUT));
        if !p.is_null() {
            std::alloc::dealloc(p, MARKER_LAYOUT);
        }
    }
}

#[inline(never)]
fn marker_alloc_zeroed() {
    sampler::force_sample();
    // SAFETY: the layout has a nonzero size; the block is freed with the same layout.
    unsafe {
        let p = std::hint::black_box(std::alloc::alloc_zeroed(MARKER_LAYOUT));
        if !p.is_null() {
            std::alloc::dealloc(p, MARKER_LAYOUT);
        }
    }
}

#[inline(never)]
fn marker_realloc() {
    // SAFETY: the layouts have nonzero sizes; `realloc` gets a live block with its layout
    // and a nonzero new size, and each block is freed once with its current layout.
    unsafe {
        let p = std::hint::black_box(std::alloc::alloc(MARKER_LAYOUT));
        if p.is_null() {
            return;
        }
        sampler::force_sample();
        let new_size = 2 * MARKER_LAYOUT.size();
        let q = std::hint::black_box(std::alloc::realloc(p, MARKER_LAYOUT, new_size));
        if q.is_null() {
            std::alloc::dealloc(p, MARKER_LAYOUT);
        } else {
            std::alloc::dealloc(q, std::alloc::Layout::from_size_align_unchecked(new_size, MARKER_LAYOUT.align()));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The writer thread

/// The writer thread's state.
struct TraceWriter {
    writer: Writer<File>,
    /// Object id of each live sampled block, by address.
    ids: FastMap<usize, ObjectId>,
    /// Symbolized frame addresses.
    locations: FastMap<u64, Arc<[Location]>>,
    /// Time of the last event: event times never decrease.
    last_time: Timestamp,
}

/// The writer thread's body: record messages until `Stop`, then close the trace. A write
/// error stops tracing with one message on stderr (none in a forked child).
fn write_trace(channel: &'static Channel, writer: Writer<File>, path: &Path, start_time: Timestamp) {
    let mut state =
        TraceWriter { writer, ids: FastMap::default(), locations: FastMap::default(), last_time: start_time };
    let result = state.run(channel).and_then(|()| state.writer.close().map(drop));
    if let Err(e) = result {
        STATE.store(OFF, Ordering::SeqCst);
        if !matches!(e.kind(), ErrorKind::PidChanged) {
            eprintln!("memtrace: error writing trace file {}: {e}; tracing stopped", path.display());
        }
    }
}

impl TraceWriter {
    /// Poll the channel rather than block on it: a receiver blocked in the channel would make
    /// every sampled allocation pay a futex wake-up (a system call) on its send.
    fn run(&mut self, channel: &Channel) -> crate::Result<()> {
        let mut next_flush = Instant::now() + FLUSH_INTERVAL;
        loop {
            let mut received = 0;
            while received < POLL_BATCH {
                let Ok(msg) = channel.rx.try_recv() else { break };
                received += 1;
                channel.queued.fetch_sub(1, Ordering::Relaxed);
                match msg {
                    Msg::Alloc { addr, time, length, nsamples, frames, nframes } => {
                        let result =
                            self.alloc(addr, time, length, nsamples, &frames[..(nframes as usize).min(MAX_FRAMES)]);
                        channel.recycle(frames);
                        result?
                    }
                    Msg::Free { addr, time } => self.free(addr, time)?,
                    Msg::Stop => return Ok(()),
                }
            }
            let now = Instant::now();
            if now >= next_flush {
                if self.writer.has_unflushed_events() {
                    self.writer.flush()?;
                }
                next_flush = now + FLUSH_INTERVAL;
            }
            if received < POLL_BATCH {
                std::thread::sleep(POLL_INTERVAL);
            }
        }
    }

    fn time(&mut self, time: Timestamp) -> Timestamp {
        self.last_time = self.last_time.max(time);
        self.last_time
    }

    fn alloc(&mut self, addr: usize, time: Timestamp, length: u64, nsamples: u64, frames: &[u64]) -> crate::Result<()> {
        let time = self.time(time);
        let alloc = NewAlloc { length, nsamples, source: AllocSource::External, callstack: frames, drop: 0 };
        let locations = &mut self.locations;
        let id = self.writer.put_alloc(DOMAIN, time, &alloc, |code| {
            locations.entry(code).or_insert_with(|| symbolize::symbolize(code)).clone()
        })?;
        self.ids.insert(addr, id);
        Ok(())
    }

    fn free(&mut self, addr: usize, time: Timestamp) -> crate::Result<()> {
        match self.ids.remove(&addr) {
            Some(id) => {
                let time = self.time(time);
                self.writer.put_collect(DOMAIN, time, id)
            }
            // A block of an earlier session, or a stale table entry: not in this trace.
            None => Ok(()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Process hooks

fn register_hooks() {
    // SAFETY: the handlers are `extern "C"` functions that live for the whole process.
    unsafe {
        libc::atexit(at_exit);
        libc::pthread_atfork(Some(before_fork), Some(after_fork_in_parent), Some(after_fork_in_child));
    }
}

/// Flush a trace whose guard was never dropped (`std::process::exit`, or `main` returning
/// with the guard leaked).
extern "C" fn at_exit() {
    stop_session(None);
}

/// Hold the session lock across `fork`, so that the child never inherits it locked by a
/// thread that does not exist there.
extern "C" fn before_fork() {
    std::mem::forget(SESSION.lock());
}

extern "C" fn after_fork_in_parent() {
    // SAFETY: `before_fork` locked SESSION on this thread and forgot the guard.
    unsafe { SESSION.force_unlock() };
}

/// The child never traces into its parent's file: stop sampling at once; the parent's
/// session is forgotten (without touching its writer) when the child stops or restarts.
extern "C" fn after_fork_in_child() {
    STATE.store(OFF, Ordering::SeqCst);
    CHANNEL.store(std::ptr::null_mut(), Ordering::Release);
    // SAFETY: `before_fork` locked SESSION in the parent on the thread that is the child's
    // only thread, and forgot the guard.
    unsafe { SESSION.force_unlock() };
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn rate_variable_parsing() {
        assert!(rate_from_env(None).unwrap().is_none());
        assert!(rate_from_env(Some(OsStr::new(""))).unwrap().is_none());
        assert_eq!(rate_from_env(Some(OsStr::new("1e-3"))).unwrap(), Some(1e-3));
        assert_eq!(rate_from_env(Some(OsStr::new("1"))).unwrap(), Some(1.0));
        for bad in ["0", "-0.1", "1.5", "abc", "NaN", "inf"] {
            let e = rate_from_env(Some(OsStr::new(bad))).unwrap_err();
            assert!(e.to_string().contains(RATE_VAR), "{e}");
        }
    }

    #[test]
    fn unwinder_variable_parsing() {
        assert!(unwinder_from_env(None).unwrap().is_none());
        assert!(unwinder_from_env(Some(OsStr::new(""))).unwrap().is_none());
        assert_eq!(unwinder_from_env(Some(OsStr::new("dwarf"))).unwrap(), Some(Unwinder::Dwarf));
        assert_eq!(unwinder_from_env(Some(OsStr::new("frame-pointers"))).unwrap(), Some(Unwinder::FramePointers));
        for bad in ["fp", "DWARF", "frame_pointers", "x"] {
            let e = unwinder_from_env(Some(OsStr::new(bad))).unwrap_err();
            assert!(e.to_string().contains(UNWINDER_VAR) && e.to_string().contains("frame-pointers"), "{e}");
        }
    }

    #[test]
    fn frame_pointer_walk_stays_on_the_stack() {
        if !frame_pointers::SUPPORTED {
            return;
        }
        let bounds = frame_pointers::stack_bounds().expect("stack bounds");
        let local = 0u64;
        let here = std::ptr::addr_of!(local) as usize;
        assert!(bounds.0 <= here && here < bounds.1, "{bounds:x?} {here:x}");
        let mut frames = [0; MAX_FRAMES];
        // Whatever the build flags, the walk ends without faulting and within the cap.
        let n = frame_pointers::capture(0, 5, &mut frames, bounds);
        assert!(n <= 5);
        // Bounds that exclude the current stack: nothing is walked.
        assert_eq!(frame_pointers::capture(0, 5, &mut frames, (1 << 20, 2 << 20)), 0);
    }

    #[test]
    fn invalid_configs_are_rejected_before_anything_starts() {
        let mut config = TraceConfig::new("/nonexistent/never-created.ctf");
        config.rate = 0.0;
        assert!(matches!(start_tracing(config.clone()), Err(StartError::InvalidRate(_))));
        config.rate = f64::NAN;
        assert!(matches!(start_tracing(config.clone()), Err(StartError::InvalidRate(_))));
        config.rate = 0.5;
        config.frame_cap = MAX_FRAMES + 1;
        assert!(matches!(start_tracing(config), Err(StartError::InvalidFrameCap(_))));
    }

    #[test]
    fn not_the_global_allocator() {
        // The library's unit tests run on the system allocator.
        let e = start_tracing(TraceConfig::new("/nonexistent/never-created.ctf")).unwrap_err();
        assert!(matches!(e, StartError::NotGlobalAllocator), "{e}");
        assert!(!currently_tracing());
    }

    #[test]
    fn messages_are_small() {
        assert!(std::mem::size_of::<Msg>() <= 48, "{}", std::mem::size_of::<Msg>());
    }

    #[test]
    fn runtime_params_name_the_crate() {
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(runtime_params(64, Unwinder::Dwarf), format!("memtrace-rs={version},unwinder=libgcc,frames=64"));
        assert_eq!(
            runtime_params(64, Unwinder::FramePointers),
            format!("memtrace-rs={version},unwinder=frame-pointers,frames=64")
        );
    }
}
