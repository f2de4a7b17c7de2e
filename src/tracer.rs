//! Starting and stopping traces: configuration and environment variables, the trace file,
//! the sampled path's hand-off to the writer thread, the writer thread itself, and the
//! process hooks (`atexit`, `pthread_atfork`). Stack capture and its calibration are in the
//! `unwind` module, the queue between application threads and the writer in `handoff`.
//!
//! # Threads and ordering
//! Application threads never wait for the writer: a sampled allocation captures its stack
//! into a pooled frame buffer and queues a small message owning that buffer on the process's
//! bounded, lock-free hand-off queue; in the steady state it allocates nothing (see `handoff`
//! for why that matters). Nothing on the sampled path blocks or takes a lock. The writer
//! thread owns the [`Writer`], assigns object ids, keeps the address → id map, symbolizes
//! new frame addresses once, and flushes at least once a second. The queue bound and the
//! sampled-block table are the only places a sample can be lost; losses are counted and
//! reported on stderr when tracing stops.

use std::cell::UnsafeCell;
use std::ffi::OsStr;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::allocator::Entry;
use crate::error::ErrorKind;
use crate::handoff::{self, Channel, Msg, NoFrames};
use crate::hash::FastMap;
use crate::location_codec::Location;
use crate::sampled_set;
use crate::sampler::{self, WORD_BYTES};
use crate::symbolize;
use crate::trace::{AllocSource, Info, NewAlloc, ObjectId, Timestamp, Writer};
use crate::unwind::{calibrate, capture, cfi, Walker, CALIBRATION, FRAME_CAP, WALKER};

pub use crate::unwind::Unwinder;

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

/// Environment variable choosing the stack unwinder: `auto` (default), `dwarf` or
/// `frame-pointers` (see [`Unwinder`]).
pub const UNWINDER_VAR: &str = "MEMTRACE_UNWINDER";

/// The writer flushes at least this often.
const FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// How long the writer sleeps when it finds the queue empty.
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// How long it sleeps instead when the queue filled up more than [`BUSY_FILL`] in its last
/// sleep (a burst of samples): neither the bounded queue nor the pool of frame buffers (which
/// the writer refills) may run out.
const BUSY_POLL_INTERVAL: Duration = Duration::from_millis(1);
/// Messages received in one round beyond which the writer sleeps [`BUSY_POLL_INTERVAL`]: about
/// a quarter of the frame-buffer pool taken (allocs and frees come in pairs).
const BUSY_FILL: usize = handoff::POOL_SIZE / 2;
/// Messages the writer handles between two checks of the flush deadline.
const POLL_BATCH: usize = 4096;
/// Domain of every event.
const DOMAIN: u16 = 0;

pub(crate) const OFF: u8 = 0;
const ON: u8 = 1;
/// Start-up calibration: sampled allocations only feed the calibration.
pub(crate) const CALIBRATING: u8 = 2;

/// Whether the allocator takes the tracing path (`OFF`, `ON` or `CALIBRATING`).
pub(crate) static STATE: AtomicU8 = AtomicU8::new(OFF);
/// Samples dropped since the current session started because the writer was far behind.
static DROPPED_QUEUE: AtomicU64 = AtomicU64::new(0);
/// Frees of sampled blocks lost since the current session started because the queue was
/// full (the blocks look alive in the trace).
static DROPPED_FREES: AtomicU64 = AtomicU64::new(0);
/// Samples dropped since the current session started because the sampled-block table
/// bucket was full.
static DROPPED_TABLE: AtomicU64 = AtomicU64::new(0);
/// Samples dropped since the current session started because no memory was left for their
/// frames.
static DROPPED_MEMORY: AtomicU64 = AtomicU64::new(0);
/// The running session; held while starting and stopping (and across `fork`).
static SESSION: SessionSlot = SessionSlot::new();
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

/// Called (inside the tracer) for a sampled block of `size` bytes just allocated at `addr`.
pub(crate) fn sampled_alloc(addr: usize, size: usize, nsamples: u64, entry: Entry) {
    let calibration = sampler::take_calibration_flag();
    match STATE.load(Ordering::Relaxed) {
        ON => {}
        CALIBRATING if calibration => {
            let mut frames = [0; MAX_FRAMES];
            let n = capture(entry, true, &mut frames);
            CALIBRATION.lock()[WALKER.load(Ordering::Relaxed) as usize][entry as usize] = (n, frames);
            return;
        }
        _ => return,
    }
    let Some((channel, session)) = handoff::current() else { return };
    let mut frames = match channel.frames_for_alloc() {
        Ok(frames) => frames,
        Err(NoFrames::WriterBehind) => {
            DROPPED_QUEUE.fetch_add(1, Ordering::Relaxed);
            return;
        }
        Err(NoFrames::NoMemory) => {
            DROPPED_MEMORY.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    if !sampled_set::insert(addr) {
        channel.recycle(frames);
        DROPPED_TABLE.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let nframes = capture(entry, false, &mut frames);
    let length = (size as u64).div_ceil(WORD_BYTES);
    let nframes = nframes as u16;
    if !channel.try_send(Msg::Alloc { session, nframes, addr, time: now_us(), length, nsamples, frames }) {
        sampled_set::remove(addr);
        DROPPED_QUEUE.fetch_add(1, Ordering::Relaxed);
    }
}

/// Called (inside the tracer) when the sampled block at `addr` is about to be freed.
pub(crate) fn sampled_free(addr: usize) {
    if let Some((channel, session)) = handoff::current() {
        if !channel.try_send(Msg::Free { session, addr, time: now_us() }) {
            DROPPED_FREES.fetch_add(1, Ordering::Relaxed);
        }
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
        /// What it must be instead, e.g. "a sampling rate in (0, 1]".
        expected: &'static str,
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
            StartError::InvalidVariable { var, value, expected } => {
                write!(f, "{var} must be {expected}, got {value:?}; not tracing")
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
///
/// Call it first thing in `main`, before the program starts threads: removing the variables
/// edits the process environment, which is not thread-safe (`std::env::remove_var`).
#[must_use = "tracing stops when the guard is dropped"]
pub fn trace_if_requested() -> Option<TraceGuard> {
    let path = [FILE_VAR, UPSTREAM_FILE_VAR].iter().find_map(|var| std::env::var_os(var).filter(|p| !p.is_empty()))?;
    std::env::remove_var(FILE_VAR);
    std::env::remove_var(UPSTREAM_FILE_VAR);
    match config_from_env(path).and_then(start_tracing) {
        Ok(guard) => Some(guard),
        Err(e) => {
            eprintln!("memtrace: {e}");
            None
        }
    }
}

/// The configuration the environment asks for, writing to `path`.
fn config_from_env(path: std::ffi::OsString) -> Result<TraceConfig, StartError> {
    let mut config = TraceConfig::new(path);
    if let Some(rate) = rate_from_env(std::env::var_os(RATE_VAR).as_deref())? {
        config.rate = rate;
    }
    if let Some(unwinder) = unwinder_from_env(std::env::var_os(UNWINDER_VAR).as_deref())? {
        config.unwinder = unwinder;
    }
    config.context = std::env::var(CONTEXT_VAR).ok().filter(|c| !c.is_empty());
    Ok(config)
}

/// The rate given by the value of [`RATE_VAR`]: `None` when unset or empty.
fn rate_from_env(value: Option<&OsStr>) -> Result<Option<f64>, StartError> {
    let Some(value) = value.filter(|v| !v.is_empty()) else { return Ok(None) };
    match value.to_str().and_then(|v| v.trim().parse::<f64>().ok()) {
        Some(rate) if valid_rate(rate) => Ok(Some(rate)),
        _ => Err(StartError::InvalidVariable {
            var: RATE_VAR,
            value: value.to_string_lossy().into_owned(),
            expected: "a sampling rate in (0, 1]",
        }),
    }
}

/// The unwinder named by the value of [`UNWINDER_VAR`]: `None` when unset or empty.
fn unwinder_from_env(value: Option<&OsStr>) -> Result<Option<Unwinder>, StartError> {
    let Some(value) = value.filter(|v| !v.is_empty()) else { return Ok(None) };
    let name = value.to_str().map(str::trim);
    [Unwinder::Auto, Unwinder::Dwarf, Unwinder::FramePointers]
        .into_iter()
        .find(|u| Some(u.name()) == name)
        .map(Some)
        .ok_or_else(|| StartError::InvalidVariable {
            var: UNWINDER_VAR,
            value: value.to_string_lossy().into_owned(),
            expected: "`auto`, `dwarf` or `frame-pointers`",
        })
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
    // Rules cached by an earlier session may be for code unloaded since.
    cfi::invalidate_if_unloaded();
    let walker = calibrate(config.unwinder)?;
    let file = open_locked(&config.path)?;
    let start_time = now_us();
    let info = Info {
        sample_rate: config.rate,
        word_size: 64,
        executable_name: std::env::current_exe().map(|p| p.into_os_string().into_vec()).unwrap_or_default(),
        host_name: host_name(),
        runtime_params: runtime_params(config.frame_cap, walker).into_bytes(),
        pid: getpid() as u64,
        initial_domain: DOMAIN,
        start_time,
        context: config.context.map(String::into_bytes),
    };
    let write_error = |source| StartError::Write { path: config.path.clone(), source };
    let writer = Writer::new(file, &info).map_err(write_error)?.check_pid_on_flush(true);

    let id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
    let tag = handoff::session_tag(id);
    let channel = handoff::open(getpid());
    let (ready_tx, ready_rx) = crossbeam_channel::bounded(1);
    let path = config.path.clone();
    let writer = std::thread::Builder::new()
        .name("memtrace-writer".into())
        .spawn(move || {
            sampler::enter_tracer_forever();
            let _ = ready_tx.send(());
            write_trace(channel, tag, writer, &path, start_time);
        })
        .map_err(StartError::Spawn)?;
    let _ = ready_rx.recv();

    sampled_set::clear();
    DROPPED_QUEUE.store(0, Ordering::Relaxed);
    DROPPED_TABLE.store(0, Ordering::Relaxed);
    DROPPED_FREES.store(0, Ordering::Relaxed);
    DROPPED_MEMORY.store(0, Ordering::Relaxed);
    sampler::configure(config.rate);
    FRAME_CAP.store(config.frame_cap, Ordering::Relaxed);
    WALKER.store(walker as u8, Ordering::Relaxed);
    handoff::publish(tag);
    STATE.store(ON, Ordering::Release);
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
    if current.as_ref().is_some_and(|s| only.unwrap_or(s.id) == s.id) {
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
    handoff::unpublish();
    // A writer that stopped on a write error no longer drains the queue: then Stop may not
    // fit, and is not needed.
    session.channel.send_stop(handoff::session_tag(session.id), || !session.writer.is_finished());
    let _ = session.writer.join();
    let behind = DROPPED_QUEUE.swap(0, Ordering::Relaxed);
    let full = DROPPED_TABLE.swap(0, Ordering::Relaxed);
    let no_memory = DROPPED_MEMORY.swap(0, Ordering::Relaxed);
    if behind + full + no_memory > 0 {
        eprintln!(
            "memtrace: {} samples were dropped ({behind} with the trace writer too far behind, {full} with the \
             sampled-block table full, {no_memory} with no memory left for their stacks)",
            behind + full + no_memory
        );
    }
    let frees = DROPPED_FREES.swap(0, Ordering::Relaxed);
    if frees > 0 {
        eprintln!(
            "memtrace: {frees} frees of sampled blocks were lost with the trace writer too far behind; the trace \
             shows those blocks as never freed"
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

fn runtime_params(frame_cap: usize, walker: Walker) -> String {
    format!("memtrace-rs={},unwinder={},frames={frame_cap}", env!("CARGO_PKG_VERSION"), walker.name())
}

// ---------------------------------------------------------------------------------------------
// The writer thread

/// The writer thread's state.
struct TraceWriter {
    writer: Writer<File>,
    /// The id of this writer's session: messages of other sessions are ignored.
    session: u32,
    /// Object id of each live sampled block, by address.
    ids: FastMap<usize, ObjectId>,
    /// Symbolized frame addresses.
    locations: FastMap<u64, Arc<[Location]>>,
    /// Time of the last event: event times never decrease.
    last_time: Timestamp,
}

/// The writer thread's body: record messages until `Stop`, then close the trace. A write
/// error stops tracing with one message on stderr (none in a forked child).
fn write_trace(channel: &'static Channel, session: u32, writer: Writer<File>, path: &Path, start_time: Timestamp) {
    let mut state =
        TraceWriter { writer, session, ids: FastMap::default(), locations: FastMap::default(), last_time: start_time };
    // A panic here (a bug, or in the symbolizer on odd debug info) must not leave sampling on
    // with nobody draining the queue: it stops tracing like a write error.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        state.run(channel).and_then(|()| state.writer.close().map(drop))
    }));
    let failure = match outcome {
        Ok(Ok(())) => return,
        Ok(Err(e)) if matches!(e.kind(), ErrorKind::PidChanged) => None,
        Ok(Err(e)) => Some(format!("error writing trace file {}: {e}", path.display())),
        Err(_) => Some(format!("the trace writer for {} panicked", path.display())),
    };
    STATE.store(OFF, Ordering::SeqCst);
    if let Some(failure) = failure {
        eprintln!("memtrace: {failure}; tracing stopped");
    }
}

impl TraceWriter {
    /// Poll the queue rather than block on it: a receiver blocked in the queue would make
    /// every sampled allocation pay a futex wake-up (a system call) on its send.
    fn run(&mut self, channel: &Channel) -> crate::Result<()> {
        let mut next_flush = Instant::now() + FLUSH_INTERVAL;
        loop {
            let mut received = 0;
            while received < POLL_BATCH {
                let Some(msg) = channel.try_recv() else { break };
                received += 1;
                if msg.session() != self.session {
                    // Sent by a thread still finishing a sample of an earlier session.
                    channel.dispose(msg);
                    continue;
                }
                match msg {
                    Msg::Alloc { addr, time, length, nsamples, frames, nframes, .. } => {
                        let result =
                            self.alloc(addr, time, length, nsamples, &frames[..(nframes as usize).min(MAX_FRAMES)]);
                        channel.recycle(frames);
                        result?
                    }
                    Msg::Free { addr, time, .. } => self.free(addr, time)?,
                    Msg::Stop { .. } => return Ok(()),
                }
            }
            let now = Instant::now();
            if now >= next_flush {
                if self.writer.has_unflushed_events() {
                    self.writer.flush()?;
                }
                next_flush = now + FLUSH_INTERVAL;
            }
            cfi::invalidate_if_unloaded();
            if received < POLL_BATCH {
                std::thread::sleep(if received > BUSY_FILL { BUSY_POLL_INTERVAL } else { POLL_INTERVAL });
            }
        }
    }

    /// `frames` (innermost first) without an innermost frame that is the allocator shim's own:
    /// one the sampled path could not recognise, because calibration saw the shim inlined (see
    /// `unwind::SHIM`).
    fn without_shim_frame<'a>(&mut self, frames: &'a [u64]) -> &'a [u64] {
        match frames {
            [innermost, rest @ ..] if !rest.is_empty() => {
                let locations = self.locations.entry(*innermost).or_insert_with(|| symbolize::symbolize(*innermost));
                // Outermost first: the frame's own function.
                if locations.first().is_some_and(|l| symbolize::is_allocator_shim(&l.defname_str())) {
                    rest
                } else {
                    frames
                }
            }
            _ => frames,
        }
    }

    fn time(&mut self, time: Timestamp) -> Timestamp {
        self.last_time = self.last_time.max(time);
        self.last_time
    }

    fn alloc(&mut self, addr: usize, time: Timestamp, length: u64, nsamples: u64, frames: &[u64]) -> crate::Result<()> {
        let time = self.time(time);
        let frames = self.without_shim_frame(frames);
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
    // `before_fork` locked SESSION on this thread and forgot the guard.
    SESSION.force_unlock();
}

/// The child never traces into its parent's file: stop sampling at once; the parent's
/// session is forgotten (without touching its writer) when the child stops or restarts.
extern "C" fn after_fork_in_child() {
    STATE.store(OFF, Ordering::SeqCst);
    handoff::unpublish();
    // `before_fork` locked SESSION in the parent on the thread that is the child's only
    // thread, and forgot the guard.
    SESSION.force_unlock();
}

/// The running session behind a spin lock whose whole state is one atomic flag, so that the
/// fork handlers can release it with a plain store. (parking_lot's `force_unlock` takes a slow
/// path through a process-wide table when a waiter was parked, and in a forked child that
/// table's lock may be held by a thread that no longer exists.) Sessions start and stop
/// rarely, so waiting by yielding costs nothing that matters.
struct SessionSlot {
    locked: AtomicBool,
    session: UnsafeCell<Option<Session>>,
}

// SAFETY: `session` is only reached through a `SessionGuard`, which exists only while its
// creator holds `locked` (acquire on lock, release on unlock), so accesses never overlap and
// each sees the previous one's writes; the data it guards is `Send` (asserted below).
unsafe impl Sync for SessionSlot {}

const _: fn() = || {
    fn assert_send<T: Send>() {}
    assert_send::<Session>();
};

impl SessionSlot {
    const fn new() -> SessionSlot {
        SessionSlot { locked: AtomicBool::new(false), session: UnsafeCell::new(None) }
    }

    fn lock(&self) -> SessionGuard<'_> {
        while self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::thread::yield_now();
        }
        SessionGuard { slot: self }
    }

    /// Release the lock held by a guard that was forgotten (the fork handlers).
    fn force_unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }
}

/// Access to the running session while [`SESSION`] is locked.
struct SessionGuard<'a> {
    slot: &'a SessionSlot,
}

impl std::ops::Deref for SessionGuard<'_> {
    type Target = Option<Session>;

    fn deref(&self) -> &Option<Session> {
        // SAFETY: this guard holds the lock, so no other reference to the session exists.
        unsafe { &*self.slot.session.get() }
    }
}

impl std::ops::DerefMut for SessionGuard<'_> {
    fn deref_mut(&mut self) -> &mut Option<Session> {
        // SAFETY: as for `deref`; `&mut self` makes this the only reference through the guard.
        unsafe { &mut *self.slot.session.get() }
    }
}

impl Drop for SessionGuard<'_> {
    fn drop(&mut self) {
        self.slot.force_unlock();
    }
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
            assert!(matches!(&e, StartError::InvalidVariable { var: RATE_VAR, value, .. } if value == bad), "{e:?}");
            assert_eq!(
                e.to_string(),
                format!("{RATE_VAR} must be a sampling rate in (0, 1], got {bad:?}; not tracing")
            );
        }
    }

    #[test]
    fn unwinder_variable_parsing() {
        assert!(unwinder_from_env(None).unwrap().is_none());
        assert!(unwinder_from_env(Some(OsStr::new(""))).unwrap().is_none());
        assert_eq!(unwinder_from_env(Some(OsStr::new("auto"))).unwrap(), Some(Unwinder::Auto));
        assert_eq!(unwinder_from_env(Some(OsStr::new("dwarf"))).unwrap(), Some(Unwinder::Dwarf));
        assert_eq!(unwinder_from_env(Some(OsStr::new("frame-pointers"))).unwrap(), Some(Unwinder::FramePointers));
        for bad in ["fp", "DWARF", "frame_pointers", "x"] {
            let e = unwinder_from_env(Some(OsStr::new(bad))).unwrap_err();
            assert!(
                matches!(&e, StartError::InvalidVariable { var: UNWINDER_VAR, value, .. } if value == bad),
                "{e:?}"
            );
            assert_eq!(
                e.to_string(),
                format!("{UNWINDER_VAR} must be `auto`, `dwarf` or `frame-pointers`, got {bad:?}; not tracing")
            );
        }
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
    fn runtime_params_name_the_crate() {
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(runtime_params(64, Walker::Libgcc), format!("memtrace-rs={version},unwinder=libgcc,frames=64"));
        assert_eq!(runtime_params(64, Walker::Cfi), format!("memtrace-rs={version},unwinder=dwarf,frames=64"));
        assert_eq!(
            runtime_params(64, Walker::FramePointers),
            format!("memtrace-rs={version},unwinder=frame-pointers,frames=64")
        );
    }
}
