//! Starting and stopping traces: the running session, its trace file, the start of the
//! writer thread, and the process hooks (`atexit`, `pthread_atfork`) that keep a session
//! consistent across `exit` and `fork`.
//!
//! # Threads and ordering
//! Application threads never wait for the writer (see `record` and `handoff`). Starting a
//! session starts the writer thread first, which gets ready meanwhile; the starting thread
//! then calibrates the stack capture (`unwind::calibrate`), checks that the trace's first
//! packet can be written, opens (never waiting for a FIFO's reader) and locks the file,
//! writes that packet, hands the file to the writer and only then turns sampling on. A start
//! that fails removes the file if it created it, and ends the writer thread. Stopping turns
//! sampling off, sends the writer a stop message after everything queued, and waits for it
//! while it gets on ([`stall`]): a writer that makes no progress for the session's stop timeout
//! and is stuck (blocked on a pipe nobody reads) is left behind with its channel, and the
//! program goes on; one starved of CPU is waited for up to 60 timeouts without progress.

use std::os::unix::ffi::OsStringExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use super::config::{valid_rate, StartError, TraceConfig};
use super::fork_safe_lock::ForkSafeLock;
use super::forked;
use super::handoff::{self, Channel};
use super::late_frees;
use super::live_profile::{self, LiveProfile, Mailbox};
use super::loader;
use super::record::{self, Loss, Losses};
use super::sampler;
use super::series::Series;
use super::serve::server::Endpoint;
use super::span_table;
use super::spans;
use super::state::{
    currently_tracing, getpid, now_us, say_without_allocating, under_seccomp_filter, MAX_FRAMES, OFF, ON, STATE,
};
use super::symbolize::{self, Desk, Worker};
use super::trace_file::{self, TraceFile};
use super::trace_open;
use super::tracer_thread::{self, Doorbell, TracerThread};
use super::unwind::{self, cfi, Walker};
use super::writer_thread::{self, write_trace, Control, Files, Sink, Traces, WriterOutcome, DOMAIN};
use crate::format::error::{Error, ErrorKind};
use crate::format::trace::{trace_info_packet, Info, Writer};
use stall::{Stall, Stuck};

mod stall;

/// The running session; held while starting and stopping (and across `fork`).
static SESSION: ForkSafeLock<Slot> = ForkSafeLock::new(Slot { running: None, finished: None });
/// Registers the process hooks once.
static HOOKS: Once = Once::new();

/// A running trace; dropping it stops tracing and flushes the trace, and so does
/// [`finish`](TraceGuard::finish), which also says how it went.
#[must_use = "tracing stops when the guard is dropped"]
#[derive(Debug)]
pub struct TraceGuard {
    session: u64,
}

impl TraceGuard {
    /// Stop tracing, flush the trace and close it: what was written and what was lost, or
    /// the error that stopped the writer ([`ErrorKind::WriterStalled`] when it was still
    /// writing at the [stop timeout](TraceConfig::stop_timeout)). A session already stopped by
    /// [`stop_tracing`] or at a write error gives its outcome too.
    pub fn finish(self) -> Result<TraceStats, Error> {
        let id = self.session;
        std::mem::forget(self);
        stop_session(Some(id)).unwrap_or_else(|| {
            let mut slot = SESSION.lock();
            match slot.finished.take() {
                Some((finished, outcome)) if finished == id => outcome,
                other => {
                    slot.finished = other;
                    // Ended with a fork, or by a later session's start: nothing to report.
                    Ok(TraceStats::default())
                }
            }
        })
    }
}

impl Drop for TraceGuard {
    fn drop(&mut self) {
        stop_session(Some(self.session));
    }
}

/// What a finished trace holds and what it lost: see [`TraceGuard::finish`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TraceStats {
    /// Sampled allocations written to the trace (counted in the profile, in a session for
    /// profiles only).
    pub samples_written: u64,
    /// Frees of sampled blocks written to the trace (counted in the profile, in a session for
    /// profiles only).
    pub frees_written: u64,
    /// Sampled allocations dropped because the writer was too far behind.
    pub dropped_writer_behind: u64,
    /// Sampled allocations dropped because there was no room to track their blocks (the
    /// sampled-block set could not grow): the cause the trace calls "untracked".
    pub dropped_untracked: u64,
    /// Sampled allocations dropped because no memory was left for their stacks, or for their
    /// blocks at the alignment of sampled blocks.
    pub dropped_no_memory: u64,
    /// Sampled allocations dropped because their thread had too little stack left to capture
    /// their stacks, or ran on a stack whose size the tracer cannot know (a coroutine's,
    /// switched to with `swapcontext`).
    pub dropped_no_stack: u64,
    /// The sample points of all the dropped allocations: `sample_points_dropped × 8 / rate`
    /// estimates the bytes they stand for. The trace records them too, as allocations at a
    /// pseudo-location of their cause (see `docs/FORMAT.md`, "Lost samples").
    pub sample_points_dropped: u64,
    /// The bytes of the dropped allocations' blocks.
    pub bytes_dropped: u64,
    /// Frees of sampled blocks lost because the writer was too far behind: the trace shows
    /// those blocks as never freed.
    pub frees_lost: u64,
    /// Frees of sampled blocks lost because their thread had too little stack left to send
    /// them (or ran on a stack of unknown size) and the slots that keep such frees for the
    /// writer were full near their address: the trace shows those blocks as never freed.
    pub frees_lost_no_stack: u64,
}

impl TraceStats {
    /// All sampled allocations dropped, whatever the reason.
    pub fn samples_dropped(&self) -> u64 {
        self.dropped_writer_behind + self.dropped_untracked + self.dropped_no_memory + self.dropped_no_stack
    }
}

/// The running session and the outcome of the last one that ended without its guard.
struct Slot {
    running: Option<Session>,
    /// The id and outcome of the last session stopped by [`stop_tracing`] or a later start.
    finished: Option<(u64, Result<TraceStats, Error>)>,
}

/// The state of the running session.
struct Session {
    id: u64,
    /// The process that started it (a forked child must not touch the writer).
    pid: u32,
    channel: &'static Channel,
    writer: TracerThread<()>,
    /// Rung to wake the writer between its polls, when stopping.
    doorbell: Arc<Doorbell>,
    /// Where the writer lends frames to name to the thread that stops the session.
    desk: Arc<Desk>,
    /// Where the writer thread sends its outcome when it ends.
    outcome: Receiver<WriterOutcome>,
    /// Set when stopping gives up waiting for the writer (it then reports nothing).
    abandoned: Arc<AtomicBool>,
    stop_timeout: Duration,
    /// The trace file, or what stands for it in messages (a session for profiles only).
    path: std::path::PathBuf,
    /// Where its writer takes requests for profiles.
    profiles: Mailbox,
    /// Its profile endpoint, if it serves one.
    http: Option<Endpoint>,
    /// Where its writer takes controls (see `runtime::control`), and its rate now.
    controls: Sender<Control>,
    rate: f64,
    /// Whether its end says where the trace went (see [`TraceConfig::summary`]).
    summary: bool,
}

/// Start a session as `config` says (see [`crate::start_tracing`]), with the endpoint that
/// `serve` starts, given the session's profile mailbox, if any: started under the session's
/// lock before sampling starts, so that no request sees the session half started.
pub(crate) fn start(
    config: TraceConfig,
    serve: impl FnOnce(&TraceConfig, Mailbox) -> Option<Endpoint>,
) -> Result<TraceGuard, StartError> {
    if !valid_rate(config.rate) {
        return Err(StartError::InvalidRate(config.rate));
    }
    if !(1..=MAX_FRAMES).contains(&config.frame_cap) {
        return Err(StartError::InvalidFrameCap(config.frame_cap));
    }
    // Starting takes some memory all at once (the queue, and a few MiB for the writer thread's
    // stack, the calibration and the trace writer's buffers), in allocations that cannot all
    // be made fallible; with less address space left than that, say so instead of failing
    // part-way, or aborting in one of them. The one check for all of it: the queue is not
    // checked again when it is made. And the address space the session takes once running
    // must be there now: under a tight `RLIMIT_AS` the start fails, not the program later.
    let needed = handoff::bytes_for(handoff::capacity_for(config.rate)).saturating_add(START_MEMORY);
    if !handoff::memory_for(needed) || !handoff::address_space_for(needed.saturating_add(address_space_once_running()))
    {
        return Err(StartError::NoMemory);
    }
    HOOKS.call_once(register_hooks);
    let mut slot = SESSION.lock();
    if let Some(session) = slot.running.take() {
        if session.pid == getpid() && currently_tracing() {
            slot.running = Some(session);
            return Err(StartError::AlreadyTracing);
        }
        // A session whose writer failed, or our parent's session: end it quietly.
        let id = session.id;
        slot.finished = finish(session).map(|outcome| (id, outcome));
    }
    // Where this session's messages go: descriptor 2 as it is now, and only while it is.
    super::state::note_stderr();
    // Rules cached by an earlier session may be for code unloaded since.
    cfi::invalidate_if_unloaded();
    // Read now: a sandbox the program installs later may forbid opening files.
    span_table::read_process_name();
    let name_start_up_frames = config.rate >= NAME_START_UP_FRAMES_FROM_RATE;
    // Gets ready on its own while the calibration runs on this thread.
    // Read once for the writer and the naming of start-up frames, which say once what is wrong.
    let symbolizer_options = symbolize::options_from_env();
    let writer = spawn_writer(&config, symbolizer_options.clone(), !name_start_up_frames)?;
    let walker =
        unwind::calibrate(config.unwinder).map_err(|unwind::NotGlobalAllocator| StartError::NotGlobalAllocator)?;
    if name_start_up_frames {
        // At the highest rates the writer's backlog fills in less time than the writer takes
        // to parse the debug info of the first frames: name the start-up frames now.
        unwind::name_start_up_frames(symbolizer_options);
    }
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
        context: config.context.clone().map(String::into_bytes),
    };
    let files = config.path.clone().map(|path| Files {
        series: Series::new(path, config.file_limit, config.file_keep),
        open: Box::new(open_part),
    });
    let mut session = match files {
        Some(mut files) if config.file_at_start => {
            let (_, path) = files.series.next_part();
            // Noted before it is opened: a start that fails ends the series with it.
            files.series.opened(path.clone());
            let path = &path;
            let write_error = |source| StartError::Write { path: path.clone(), source };
            // A first packet that cannot be written (a context too long for a packet) must not
            // cost the file: check it before opening.
            let first_packet = trace_info_packet(&info).map_err(write_error)?;
            let mut opened = trace_open::open_locked(path)?;
            if let Err(e) = trace_file::write_all_without_signals(&mut opened.file, first_packet.as_bytes()) {
                opened.remove_if_created();
                return Err(write_error(e.into()));
            }
            writer.start(Some(TraceFile::new(opened.file)), info, opened.replaced.map(TraceFile::new), Some(files))
        }
        // Profiles only: the same session without a file (until one is started).
        files => writer.start(None, info, None, files),
    };
    session.http = serve(&config, session.profiles.clone());

    record::take_losses();
    // Late frees a stopped session's writer never took.
    late_frees::drain(None, |_| true);
    sampler::configure(config.rate);
    unwind::configure(walker, config.frame_cap);
    spans::configure(config.thread_frames);
    handoff::publish(handoff::session_tag(session.id));
    STATE.store(ON, Ordering::Release);
    let id = session.id;
    slot.running = Some(session);
    Ok(TraceGuard { session: id })
}

/// The memory a start needs besides the queue: the writer thread's stack, the calibration's
/// thread and symbolizer, the trace writer's buffers.
const START_MEMORY: usize = 8 << 20;

/// The tracer's threads while a session runs: the writer, and its symbolizer's (the
/// calibration's, when there is one, has ended, and left its stack and arena to that one).
const TRACER_THREADS: usize = 2;

/// The address space of the shared libraries whose debug info the symbolizer maps, besides the
/// executable's (libc's is 2 MiB).
const LIBRARIES_MAPPED: usize = 16 << 20;

/// The address space a running session takes beyond [`START_MEMORY`] and the queue, at most:
/// its threads' stacks and malloc arenas (reserved by glibc as a thread first allocates, and
/// never given back), and the symbolizer's mappings of the executable and libraries.
fn address_space_once_running() -> usize {
    let executable = std::env::current_exe().and_then(std::fs::metadata).map_or(0, |m| m.len() as usize);
    (tracer_thread::STACK_SIZE + tracer_thread::ARENA_ADDRESS_SPACE) * TRACER_THREADS
        + executable.saturating_add(LIBRARIES_MAPPED)
}

/// The rate from which starting names the start-up frames before sampling starts: some
/// 60 000 samples a second at 2 GB/s of allocation, more than the writer absorbs while it
/// parses a large program's first units.
const NAME_START_UP_FRAMES_FROM_RATE: f64 = 2.5e-4;

/// Session ids, so that a guard only stops its own session.
static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// What a pending writer is sent to start: the trace file (holding its first packet; none for
/// profiles only), the trace's description, the file it replaced, to close, and the file
/// series, if a file is configured.
type Setup = (Option<TraceFile>, Info, Option<TraceFile>, Option<Files>);

/// Open a later part of a file series as the first one is (on the writer thread, which closes
/// the file it replaced at once).
fn open_part(path: &Path) -> Result<TraceFile, StartError> {
    trace_open::open_locked(path).map(|opened| TraceFile::new(opened.file))
}

/// The writer thread of a session being started, spawned before the calibration: it puts the
/// first frame buffers in the pool and takes the spare symbolizer and gets it ready for a
/// first sample (see [`Symbolizer::prepare`](crate::runtime::symbolize::Symbolizer::prepare))
/// while the calibration runs, then waits for the trace file, which by then holds its first
/// packet, and the trace's description ([`PendingWriter::start`]). Dropped instead (the start
/// failed), it ends, and is waited for: a failed start leaves no thread behind.
///
/// The thread is off the thread that starts tracing, which does not wait for it (a new
/// thread's first turn took milliseconds on a loaded machine, and it is started off the
/// starter's CPU for that, [`TracerThread::spawn_beside`]; it is a [`TracerThread`], marked
/// the tracer's before any of its code runs, so nothing it allocates is sampled). Except where
/// the queue is at its largest (from rate 1.25e-4 on) and holds less than its backlog time of
/// samples: there sixteen threads sampling at once filled it while the new writer waited for
/// its first turns, and the start waits until the writer is ready.
struct PendingWriter {
    /// Where the thread is sent the file and the trace's description.
    setup: Option<Sender<Setup>>,
    /// Where the thread says it is ready, if the start waits for that.
    ready: Option<Receiver<()>>,
    /// The session, until it starts.
    session: Option<Session>,
}

/// Start the writer thread of a new session (see [`PendingWriter`]), whose symbolizer has
/// `options`; `prepare`: whether it takes the spare symbolizer at once, rather than once it is
/// sent the file (the start may name the start-up frames with it meanwhile).
fn spawn_writer(config: &TraceConfig, options: symbolize::Options, prepare: bool) -> Result<PendingWriter, StartError> {
    let id = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
    let tag = handoff::session_tag(id);
    let channel = handoff::open(getpid(), config.rate);
    let (outcome_tx, outcome) = crossbeam_channel::bounded(1);
    let (ready_tx, ready) = crossbeam_channel::bounded(1);
    let (setup, setup_rx) = crossbeam_channel::bounded::<Setup>(1);
    let abandoned = Arc::new(AtomicBool::new(false));
    let path = config.path.clone().unwrap_or_else(|| "(no file: profiles only)".into());
    let given_up = Arc::clone(&abandoned);
    let doorbell = Arc::new(Doorbell::default());
    let rung = Arc::clone(&doorbell);
    let (profiles, requests) = live_profile::mailbox(Arc::clone(&doorbell));
    let (controls, controls_rx) = writer_thread::controls();
    let (rate, written) = (config.rate, path.clone());
    let desk = Arc::new(Desk::default());
    let lending = Arc::clone(&desk);
    let writer = TracerThread::spawn_beside(c"memtrace-writer", move || {
        channel.note_writer_thread();
        channel.fill_pool(handoff::STARTING_POOL);
        // Now rather than at the first naming: glibc reads `/proc/sys/vm/overcommit_memory`
        // the first time an arena other than the main one shrinks (here, as the blocks are
        // freed), and a sandbox the program installs later may kill the process at the open.
        tracer_thread::grow_arena();
        // (Calibration naming frames meanwhile, if it finds the slot empty, makes one of its
        // own, which this one replaces in the slot when the writer is done.)
        let prepared = prepare
            .then(|| {
                let mut symbolizer = symbolize::take_spare(options.clone());
                // Nothing here may panic past this: the session's sampling would start with
                // nobody draining the queue.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| symbolizer.prepare()))
                    .ok()
                    .map(|()| symbolizer)
            })
            .flatten();
        let Ok((file, info, replaced, files)) = setup_rx.recv() else {
            if let Some(symbolizer) = prepared {
                symbolize::put_spare(symbolizer);
            }
            return;
        };
        let symbolizer = prepared.unwrap_or_else(|| symbolize::take_spare(options));
        let header = trace_info_packet(&info).map_or(0, |packet| packet.as_bytes().len() as u64);
        let file = file
            .map(|file| Writer::after_info_packet(Sink::file_holding(file, header), &info).check_pid_on_flush(true));
        let _ = ready_tx.send(());
        // Freeing the replaced file's blocks, here, after a start that waits has stopped waiting.
        drop(replaced);
        let worker = Worker::new(symbolizer).lending_at(lending);
        let live = (LiveProfile::new(rate), requests);
        let traces = Traces { file, files, info, controls: controls_rx };
        let outcome = write_trace(channel, tag, traces, live, worker, &written, &given_up, rung);
        let _ = outcome_tx.send(outcome);
    })
    .map_err(StartError::Spawn)?;
    let session = Session {
        id,
        pid: getpid(),
        channel,
        writer,
        doorbell,
        desk,
        outcome,
        abandoned,
        stop_timeout: config.stop_timeout,
        path,
        profiles,
        http: None,
        controls,
        rate: config.rate,
        // SAFETY: isatty has no preconditions.
        summary: config.summary.unwrap_or_else(|| unsafe { libc::isatty(libc::STDERR_FILENO) } == 1),
    };
    let ready = (handoff::capacity_for(config.rate) == handoff::MAX_CAPACITY).then_some(ready);
    Ok(PendingWriter { setup: Some(setup), ready, session: Some(session) })
}

impl PendingWriter {
    /// Have the writer write the trace `info` describes to `file`: the session, running.
    fn start(
        mut self,
        file: Option<TraceFile>,
        info: Info,
        replaced: Option<TraceFile>,
        files: Option<Files>,
    ) -> Session {
        // Sent into room kept for it: the thread takes it, or has ended (a panic).
        if let Some(setup) = self.setup.take() {
            let _ = setup.send((file, info, replaced, files));
        }
        if let Some(ready) = self.ready.take() {
            let _ = ready.recv();
        }
        self.session.take().expect("a pending writer starts once")
    }
}

impl Drop for PendingWriter {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            // No setup coming: the thread ends once it is ready.
            drop(self.setup.take());
            let _ = session.writer.join();
        }
    }
}

/// Stop the running trace, if any, and flush it. Blocks still alive are not reported as
/// collected. Waits for the writer at most the session's
/// [stop timeout](TraceConfig::stop_timeout), as the guard's drop and the exit hook do.
pub fn stop_tracing() {
    stop_session(None);
}

/// Stop the running session if it is `only` (or any session for `None`): its outcome, `None`
/// when there was no such session or it belongs to the parent of this forked process.
fn stop_session(only: Option<u64>) -> Option<Result<TraceStats, Error>> {
    let mut slot = SESSION.lock();
    if slot.running.as_ref().is_some_and(|s| only.unwrap_or(s.id) == s.id) {
        let session = slot.running.take()?;
        let (id, outcome) = (session.id, finish(session));
        if only.is_none() {
            slot.finished = outcome.map(|outcome| (id, outcome));
            return None;
        }
        return outcome;
    }
    None
}

/// End `session`: stop sampling, let the writer drain and close the trace (naming meanwhile
/// frames it lends), report losses on stderr. `None` in a forked child, which never touches
/// its parent's writer.
fn finish(mut session: Session) -> Option<Result<TraceStats, Error>> {
    if session.pid != getpid() {
        forked::forget();
        if let Some(endpoint) = session.http.take() {
            endpoint.forget();
        }
        session.writer.forget();
        return None;
    }
    if let Some(endpoint) = session.http.take() {
        endpoint.stop();
    }
    let mut stall = send_stop(&session, true);
    // While it waits, this thread names frames the writer lends it (`symbolize::Desk`), if it
    // has the stack for it and the writer another CPU to run on. It sleeps until a loan comes:
    // spinning for the first one cost more CPU than it saved wall (README.md at cfd4150, "Benchmarks").
    let desk = &session.desk;
    let helping = tracer_thread::may_run_elsewhere()
        && unwind::capture::stack_remaining().is_some_and(|left| left >= symbolize::HELPING_STACK)
        // Naming may open object files, which a sandbox on this thread may punish.
        && !under_seccomp_filter();
    // Loans no one takes the writer takes back.
    let loans = if helping { desk.loans().clone() } else { crossbeam_channel::never() };
    let written = loop {
        crossbeam_channel::select! {
            recv(session.outcome) -> written => match written {
                Ok(written) => break written,
                // Panicked past the code that catches panics.
                Err(_) => break WriterOutcome::panicked(),
            },
            recv(loans) -> lent => if let Ok(lent) = lent {
                desk.help(lent);
            },
            default(STALL_CHECK_INTERVAL) => if let Some(stuck) = stall.stalled() {
                break give_up(&session, stuck);
            },
        }
    };
    say_where_it_went(&session, &written);
    Some(outcome(written))
}

/// The line that ends a trace written to a file, where asked for (see
/// [`TraceConfig::summary`]): where it went, what it holds, and what to run next. Allocates
/// nothing (the exit hook says it too).
fn say_where_it_went(session: &Session, written: &WriterOutcome) {
    let Some(bytes) = written.file_bytes.filter(|_| session.summary && written.error.is_none()) else { return };
    let path = session.path.display();
    say_without_allocating(format_args!(
        "memtrace: trace written to {path}: {} samples, {}; next: memtrace report {path} -o report.html",
        written.allocs,
        Size(bytes),
    ));
}

/// A size as people read it (`920 bytes`, `63.4 KiB`, `1.2 GiB`), formatted without allocating.
struct Size(u64);

impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
        if self.0 < 1024 {
            return write!(f, "{} bytes", self.0);
        }
        let (mut value, mut unit) = (self.0 as f64 / 1024.0, 0);
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        write!(f, "{value:.1} {}", UNITS[unit])
    }
}

/// Stop sampling and queue the writer's stop: how the stop then watches it for a stall (waiting
/// for a writer that gets on beyond the timeout if `patient`).
fn send_stop(session: &Session, patient: bool) -> Stall {
    STATE.store(OFF, Ordering::SeqCst);
    handoff::unpublish();
    let mut stall = Stall::watch(session.channel, session.stop_timeout, patient);
    // A writer that stopped on a write error no longer drains the queue: then Stop may not
    // fit, and is not needed. While it does not fit, the writer is woken to make room, rather
    // than left to its next poll.
    let alive = || {
        session.doorbell.ring();
        !session.writer.is_finished() && stall.stalled().is_none()
    };
    session.channel.send_stop(handoff::session_tag(session.id), alive);
    session.doorbell.ring();
    stall
}

/// The outcome of a session whose writer did what `written` says, its losses reported on
/// stderr. Allocates nothing.
fn outcome(written: WriterOutcome) -> Result<TraceStats, Error> {
    let losses = record::take_losses();
    report_losses(&losses);
    let stats = TraceStats {
        samples_written: written.allocs,
        frees_written: written.frees,
        dropped_writer_behind: losses.of(Loss::WriterBehind).samples,
        dropped_untracked: losses.of(Loss::Untracked).samples,
        dropped_no_memory: losses.of(Loss::NoMemory).samples,
        dropped_no_stack: losses.of(Loss::NoStack).samples,
        sample_points_dropped: losses.samples.iter().map(|lost| lost.points).sum(),
        bytes_dropped: losses.samples.iter().map(|lost| lost.bytes).sum(),
        frees_lost: losses.frees,
        frees_lost_no_stack: losses.frees_no_stack,
    };
    match written.error {
        None => Ok(stats),
        Some(e) => Err(e),
    }
}

/// How long the exit hook waits for a start or stop under way on another thread to let go of
/// the session: a thread that holds it past this (the one calling `exit` itself, interrupted
/// by the signal whose handler calls it) is not waited for, and the trace is not flushed.
const EXIT_LOCK_WAIT: Duration = Duration::from_secs(2);

/// How often the exit hook looks whether the writer is done.
const EXIT_POLL_INTERVAL: Duration = Duration::from_millis(1);

/// End the running session at exit, as [`finish`] does but without allocating or freeing
/// anything, and in bounded time: `exit` may be called by a signal handler that interrupted
/// `malloc` on this thread, whose arena's lock is then held for good. So the writer is waited
/// for by polling, without naming frames beside it, at most until it makes no progress for
/// the stop timeout (it may need that lock itself); the session and its outcome are leaked,
/// which at exit costs nothing.
fn finish_at_exit() {
    let started = Instant::now();
    let mut slot = loop {
        match SESSION.try_lock() {
            Some(slot) => break slot,
            None if started.elapsed() < EXIT_LOCK_WAIT => std::thread::sleep(EXIT_POLL_INTERVAL),
            None => return,
        }
    };
    let Some(session) = slot.running.take() else { return };
    if session.pid == getpid() {
        let mut stall = send_stop(&session, false);
        let written = loop {
            match session.outcome.try_recv() {
                Ok(written) => break written,
                Err(crossbeam_channel::TryRecvError::Disconnected) => break WriterOutcome::panicked(),
                Err(crossbeam_channel::TryRecvError::Empty) => match stall.stalled() {
                    Some(stuck) => break give_up(&session, stuck),
                    None => std::thread::sleep(EXIT_POLL_INTERVAL),
                },
            }
        };
        say_where_it_went(&session, &written);
        std::mem::forget(outcome(written));
    }
    std::mem::forget(session);
}

/// Where the running session's writer takes requests for profiles: `None` without a session
/// (or in a forked child, where its writer does not run).
pub(crate) fn profile_mailbox() -> Option<Mailbox> {
    let slot = SESSION.lock();
    slot.running.as_ref().filter(|s| s.pid == getpid()).map(|s| s.profiles.clone())
}

/// What `runtime::control` needs of the running session: where its writer takes controls,
/// the doorbell that wakes it, and its rate.
pub(crate) struct Controls {
    pub(crate) controls: Sender<Control>,
    pub(crate) doorbell: Arc<Doorbell>,
    pub(crate) rate: f64,
}

/// The running session's [`Controls`]: `None` without a session (or in a forked child).
pub(crate) fn controls() -> Option<Controls> {
    let slot = SESSION.lock();
    let session = slot.running.as_ref().filter(|s| s.pid == getpid() && currently_tracing())?;
    let (controls, doorbell) = (session.controls.clone(), Arc::clone(&session.doorbell));
    Some(Controls { controls, doorbell, rate: session.rate })
}

/// Sample the running session at `rate` from now (a valid rate), its file going on in a new
/// part at it: whether there was a session to change, and room for the writer's control.
pub(crate) fn rerate(rate: f64) -> Option<bool> {
    let mut slot = SESSION.lock();
    let session = slot.running.as_mut().filter(|s| s.pid == getpid() && currently_tracing())?;
    // The writer first: samples still counted at the old rate reach it labelled with their
    // epoch's, and are rescaled to the new part's.
    if session.controls.try_send(Control::Rate(rate)).is_err() {
        return Some(false);
    }
    session.doorbell.ring();
    sampler::rerate(rate);
    session.rate = rate;
    Some(true)
}

/// How often stopping looks at the writer's progress.
const STALL_CHECK_INTERVAL: Duration = Duration::from_millis(20);

/// Leave behind the writer of `session`, stuck (blocked writing to a pipe nobody reads, say, for
/// its stop timeout), or still not done at the longest wait ([`stall`]): it
/// cannot be cancelled, so it keeps its thread and its channel, and reports nothing more; the
/// next session makes a new channel. One line on stderr.
fn give_up(session: &Session, Stuck { cause, waited, longest_wait }: Stuck) -> WriterOutcome {
    session.abandoned.store(true, Ordering::Release);
    handoff::abandon();
    let what = if longest_wait {
        "has made no progress for the longest wait for a writer that gets on"
    } else {
        "has made no progress for"
    };
    say_without_allocating(format_args!(
        "memtrace: the trace writer of {} {what} ({waited:?}): it is {cause}; gave up waiting: {} queued samples and \
         frees, and what it had not flushed, are not in the trace",
        session.path.display(),
        session.channel.queued(),
    ));
    WriterOutcome { allocs: 0, frees: 0, file_bytes: None, error: Some(Error::new(ErrorKind::WriterStalled(waited))) }
}

/// One line on stderr for lost samples, one for lost frees (allocating nothing).
fn report_losses(losses: &Losses) {
    let samples = |cause| losses.of(cause).samples;
    let dropped: u64 = losses.samples.iter().map(|lost| lost.samples).sum();
    if dropped > 0 {
        let points: u64 = losses.samples.iter().map(|lost| lost.points).sum();
        say_without_allocating(format_args!(
            "memtrace: {dropped} samples ({points} sample points) were dropped ({} with the trace writer too far \
             behind, {} with no room to track their blocks, {} with no memory left, {} with too little stack left, \
             or a stack of unknown size, to capture theirs); the trace records them as lost",
            samples(Loss::WriterBehind),
            samples(Loss::Untracked),
            samples(Loss::NoMemory),
            samples(Loss::NoStack),
        ));
    }
    let (frees_behind, frees_no_stack) = (losses.frees, losses.frees_no_stack);
    let frees = frees_behind + frees_no_stack;
    if frees > 0 {
        say_without_allocating(format_args!(
            "memtrace: {frees} frees of sampled blocks were lost ({frees_behind} with the trace writer too far \
             behind, {frees_no_stack} with too little stack left, or a stack of unknown size, to send them); the trace shows those blocks as \
             never freed"
        ));
    }
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
// Process hooks

fn register_hooks() {
    // SAFETY: the handlers are `extern "C"` functions that live for the whole process.
    unsafe {
        libc::atexit(at_exit);
        libc::pthread_atfork(Some(before_fork), Some(after_fork_in_parent), Some(after_fork_in_child));
    }
}

/// Flush a trace whose guard was never dropped (`std::process::exit`, or `main` returning
/// with the guard leaked), in bounded time and without allocating ([`finish_at_exit`]).
extern "C" fn at_exit() {
    // A daemon that never allocated enough to look says it as it ends.
    forked::look_at_parent();
    finish_at_exit();
}

/// Hold the session lock across `fork`, so that the child never inherits it locked by a
/// thread that does not exist there, and keep the tracer's threads out of the loader's object
/// list (see [`loader`]).
extern "C" fn before_fork() {
    std::mem::forget(SESSION.lock());
    forked::before_fork();
    loader::before_fork();
}

extern "C" fn after_fork_in_parent() {
    loader::after_fork();
    // `before_fork` locked SESSION on this thread and forgot the guard.
    SESSION.force_unlock();
    mark_at_fork();
}

/// How long a fork waits, in the parent, for a writer that makes no progress to flush what was
/// sampled before it.
const FORK_MARK_WAIT: Duration = Duration::from_millis(100);
/// How long it waits for one that makes progress (naming the first frames of a large program
/// takes a writer a while).
const FORK_MARK_LONGEST: Duration = Duration::from_secs(2);

/// How often the parent looks whether the writer has flushed.
const FORK_MARK_POLL: Duration = Duration::from_micros(100);

/// Have the writer flush everything sampled before the fork, its packet marked as a closed
/// trace's last one (`Msg::Mark`), so that a parent that `_exit`s right after the fork (as
/// `daemon(3)` does) leaves a trace that reads as closed; a later flush unmarks it. Waited for
/// while the writer makes progress, at most [`FORK_MARK_LONGEST`], and at most
/// [`FORK_MARK_WAIT`] without progress: a writer blocked, or a full queue, leave the trace as
/// it was (it then reads as "not closed" if the parent ends so).
fn mark_at_fork() {
    if !currently_tracing() {
        return;
    }
    let slot = SESSION.lock();
    let Some(session) = slot.running.as_ref().filter(|s| s.pid == getpid()) else { return };
    let Some(seq) = session.channel.send_mark(handoff::session_tag(session.id)) else { return };
    session.doorbell.ring();
    let started = Instant::now();
    let mut stall = Stall::watch(session.channel, FORK_MARK_WAIT, false);
    while !session.channel.marked(seq)
        && !session.writer.is_finished()
        && started.elapsed() < FORK_MARK_LONGEST
        && stall.stalled().is_none()
    {
        std::thread::sleep(FORK_MARK_POLL);
    }
}

/// The child never traces into its parent's file: stop sampling at once, watching the parent
/// instead (see [`forked`]); the parent's session is forgotten (without touching its writer)
/// when the child stops or restarts. Nor does it keep its parent's profile endpoint's port.
extern "C" fn after_fork_in_child() {
    forked::after_fork_in_child();
    loader::after_fork();
    handoff::unpublish();
    // `before_fork` locked SESSION in the parent on the thread that is the child's only
    // thread, and forgot the guard.
    SESSION.force_unlock();
    if let Some(endpoint) = SESSION.lock().running.as_ref().and_then(|s| s.http.as_ref()) {
        endpoint.close_in_forked_child();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A start without an endpoint.
    fn start_tracing(config: TraceConfig) -> Result<TraceGuard, StartError> {
        start(config, |_, _| None)
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
