//! The writer thread: it owns the trace [`Writer`], takes the samples off the hand-off queue,
//! assigns object ids and keeps the address → id map of live sampled blocks, symbolizes each
//! new frame address once (and names each new pseudo-frame, see `span_table`), and flushes at
//! least once a second. Beside the trace (or instead of it, in a session for profiles only), it
//! keeps the live profile (`live_profile`) and answers the requests for it.
//!
//! It writes every sample to each of its outputs: the session's file, a part of its series
//! (`series`), and the windows asked for (`window`), each at its own rate (a sample found at
//! another is rescaled to it, `sampler::rescale`). An output that starts while the session runs
//! (a window, a new part: at the size limit, at a rate change, or when a file is started)
//! begins with the live blocks, as allocations of source `Major` at its start time
//! (docs/FORMAT.md, "Series and windows"). It takes the [`Control`]s of `runtime::control`
//! between two rounds of messages.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::StartError;
use super::handoff::{self, Channel, Msg};
use super::late_frees;
use super::live_profile::{LiveProfile, Request};
use super::record;
use super::sampled_set;
use super::sampler::{self, WORD_BYTES};
use super::series::Series;
use super::span_table::PseudoFrames;
use super::spans::Pseudo;
use super::state::{now_us, say, MAX_FRAMES, OFF, STATE};
use super::symbolize::{self, Worker};
use super::trace_file::TraceFile;
use super::tracer_thread::Doorbell;
use super::unwind::cfi;
use super::window::WindowSink;
use crate::format::error::{Error, ErrorKind};
use crate::format::hash::FastMap;
use crate::format::location_codec::Location;
use crate::format::trace::{AllocSource, Info, NewAlloc, ObjectId, Timestamp, Writer, LIVE_AT_START_PARAM};
use crossbeam_channel::{Receiver, Sender};

/// The writer flushes at least this often.
const FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// How long a writer runs before it fills the pool of frame buffers up to
/// [`handoff::INITIAL_POOL`], if the program has not taken half the starting ones before.
const POOL_FILLED_AFTER: Duration = Duration::from_millis(20);
/// Whether a writer that found `pooled` frame buffers in the pool as it began a round (before
/// it gave back those of the samples it took), `running_for` into its loop, fills it up to
/// [`handoff::INITIAL_POOL`]: once the program has taken half the starting ones, or has run
/// long enough to need more. A short program's few samples never do, and their page faults are
/// spared (README.md at cfd4150, "Benchmarks").
fn pool_wanted(pooled: usize, running_for: Duration) -> bool {
    pooled <= handoff::STARTING_POOL / 2 || running_for >= POOL_FILLED_AFTER
}
/// How long the writer sleeps when it finds the queue empty.
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// How long it sleeps instead when the queue filled up more than [`BUSY_FILL`] in its last
/// sleep (a burst of samples): neither the bounded queue nor the pool of frame buffers (which
/// the writer refills) may run out.
const BUSY_POLL_INTERVAL: Duration = Duration::from_millis(1);
/// The test hook behind `__internals::writer_waits_for_its_doorbell` (debug builds only): the
/// writer's waits last an hour, so that only its doorbell ends them.
#[cfg(debug_assertions)]
pub(crate) static WAIT_FOR_DOORBELL: AtomicBool = AtomicBool::new(false);
/// Messages received in one round beyond which the writer sleeps [`BUSY_POLL_INTERVAL`]: about
/// a quarter of the frame-buffer pool taken (allocs and frees come in pairs).
const BUSY_FILL: usize = handoff::POOL_SIZE / 2;
/// Messages the writer handles between two checks of the flush deadline.
const POLL_BATCH: usize = 4096;
/// Bits of a location code that are the frame's address (x86_64 and aarch64 user-space
/// addresses are below 2^48).
const ADDRESS_BITS: u32 = 48;
/// Domain of every event.
pub(crate) const DOMAIN: u16 = 0;

/// Where one of the writer's traces goes: a part of the session's file series (its bytes
/// counted, for the size limit), or a window's queue.
pub(crate) enum Sink {
    File { file: TraceFile, bytes: u64 },
    Window(WindowSink),
}

impl Sink {
    pub(crate) fn file(file: TraceFile) -> Sink {
        Sink::File { file, bytes: 0 }
    }

    fn bytes(&self) -> u64 {
        match self {
            Sink::File { bytes, .. } => *bytes,
            Sink::Window(_) => 0,
        }
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sink::File { file, bytes } => file.write(buf).inspect(|&n| *bytes += n as u64),
            Sink::Window(window) => window.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sink::File { file, .. } => file.flush(),
            Sink::Window(window) => window.flush(),
        }
    }
}

/// One trace the writer writes.
struct Output {
    writer: Writer<Sink>,
    /// Object id of each of its live sampled blocks, by address.
    ids: FastMap<usize, ObjectId>,
    /// Its rate: the samples written to it are in its units.
    rate: f64,
    /// The bytes of its start (the trace info and the blocks live then).
    carried_bytes: u64,
    /// The window's id and where to say how it ended, for a window.
    window: Option<(u64, Sender<WindowEnd>)>,
    /// What it holds: the blocks it began with, the allocations and frees since.
    counts: OutputCounts,
}

/// What one of the writer's traces holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct OutputCounts {
    /// Live blocks it began with.
    pub(crate) carried: u64,
    pub(crate) allocs: u64,
    pub(crate) frees: u64,
}

impl Output {
    fn new(writer: Writer<Sink>, rate: f64, window: Option<(u64, Sender<WindowEnd>)>) -> Output {
        Output { writer, ids: FastMap::default(), rate, carried_bytes: 0, window, counts: OutputCounts::default() }
    }

    /// End a window: close its trace (unless it failed) and say how it went.
    fn end_window(self, failed: Option<String>) {
        let Some((_, ended)) = &self.window else { return };
        let ended = ended.clone();
        let counts = self.counts;
        let result = match failed {
            Some(e) => Err(e),
            None => self.writer.close_marked().map(|_| counts).map_err(|e| e.to_string()),
        };
        // Room is kept for it; a caller gone does not want it.
        let _ = ended.try_send(result);
    }
}

/// How a window ended, sent to its caller (see `runtime::control`).
pub(crate) type WindowEnd = Result<OutputCounts, String>;

/// What the writer is told to do between two rounds of messages (by `runtime::control`).
pub(crate) enum Control {
    /// Write a trace of the session from now to `sink` at `rate`, until [`Control::EndWindow`]
    /// (or a write error), then send how it ended to `ended` (a channel with room for it).
    OpenWindow {
        id: u64,
        sink: WindowSink,
        rate: f64,
        ended: Sender<WindowEnd>,
    },
    EndWindow {
        id: u64,
    },
    /// The session samples at a new rate from now: a file goes on in a new part at it.
    Rate(f64),
    /// Start writing the session's file series (its next part), or stop it: the part's path.
    StartFile(Sender<Result<PathBuf, String>>),
    StopFile(Sender<Result<PathBuf, String>>),
    /// Say what the writer writes.
    State(Sender<WriterState>),
}

/// What the writer writes, for `session_state`.
#[derive(Debug, Clone, Default)]
pub(crate) struct WriterState {
    /// The parts of the file series on disk, oldest first.
    pub(crate) files: Vec<PathBuf>,
    /// Whether the last of them is being written.
    pub(crate) file_open: bool,
    pub(crate) windows: usize,
    pub(crate) live_blocks: usize,
    pub(crate) allocs: u64,
    pub(crate) frees: u64,
}

/// Opens a part of the file series (the session's way: created 0600, locked, emptied).
pub(crate) type Opener = Box<dyn FnMut(&Path) -> Result<TraceFile, StartError> + Send>;

/// The session's file series, if it has a file configured, and how its parts are opened.
pub(crate) struct Files {
    pub(crate) series: Series,
    pub(crate) open: Opener,
}

/// Controls waiting at most (more are refused at once).
const WAITING_CONTROLS: usize = 16;

/// A channel of controls for a writer.
pub(crate) fn controls() -> (Sender<Control>, Receiver<Control>) {
    crossbeam_channel::bounded(WAITING_CONTROLS)
}

/// The traces a writer starts with: the file's (holding its first packet), its series, the
/// session's trace info, and where its controls come from.
pub(crate) struct Traces {
    pub(crate) file: Option<Writer<Sink>>,
    pub(crate) files: Option<Files>,
    pub(crate) info: Info,
    pub(crate) controls: Receiver<Control>,
}

/// The writer thread's state.
struct TraceWriter {
    /// The file's trace: `None` in a session for profiles only, or with the file stopped.
    file: Option<Output>,
    /// The windows being written.
    windows: Vec<Output>,
    /// The file series, if the session has a file configured.
    files: Option<Files>,
    /// The session's trace info, the pattern of every trace's.
    info: Info,
    /// The session's rate now.
    rate: f64,
    /// The state of the draws that rescale samples (`sampler::rescale`).
    rng: u64,
    controls: Receiver<Control>,
    /// The live profile, and where it is asked for.
    live: LiveProfile,
    requests: Receiver<Request>,
    /// Rung by stopping and by the session's first sample, to end the wait between polls.
    doorbell: Arc<Doorbell>,
    /// What names location codes (apart from `writer`, which asks it while it writes).
    names: Names,
    /// The id of this writer's session: messages of other sessions are ignored.
    session: u32,
    /// The loader's count of loads and unloads when last looked at, and how many times it
    /// changed in this session: the tag of location codes (see [`TraceWriter::set_codes`]).
    loader_changes: u64,
    epoch: u64,
    /// The location codes of the sample being written.
    codes: Vec<u64>,
    /// Time of the last event: event times never decrease.
    last_time: Timestamp,
    /// Allocations and frees written.
    allocs: u64,
    frees: u64,
}

/// What the writer thread did: events written, and the error that stopped it if any.
pub(crate) struct WriterOutcome {
    pub(crate) allocs: u64,
    pub(crate) frees: u64,
    pub(crate) error: Option<Error>,
}

impl WriterOutcome {
    /// The outcome of a writer thread that panicked outside the code that catches it.
    pub(crate) fn panicked() -> WriterOutcome {
        WriterOutcome { allocs: 0, frees: 0, error: Some(Error::new(ErrorKind::WriterPanicked)) }
    }
}

/// The writer thread's body: record messages until `Stop`, naming their frames with `worker`
/// (whose symbolizer is kept as the spare one when done, unless naming panicked), then close the
/// trace. A write error stops tracing with one message on stderr (none in a forked child, nor
/// once the session has `abandoned` this writer: stopping gave up waiting for it, and
/// reported it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_trace(
    channel: &'static Channel,
    session: u32,
    traces: Traces,
    (live, requests): (LiveProfile, Receiver<Request>),
    worker: Worker,
    path: &Path,
    abandoned: &AtomicBool,
    doorbell: Arc<Doorbell>,
) -> WriterOutcome {
    let Traces { file, files, info, controls } = traces;
    let (start_time, rate) = (info.start_time, info.sample_rate);
    let mut state = TraceWriter {
        file: file.map(|writer| Output::new(writer, rate, None)),
        windows: Vec::new(),
        files,
        info,
        rate,
        rng: sampler::next_u64(&mut (start_time ^ 0x7772_6974)) | 1,
        controls,
        live,
        requests,
        doorbell,
        names: Names {
            channel,
            backlog: VecDeque::new(),
            worker,
            cache: FastMap::default(),
            pseudo: PseudoFrames::default(),
            tag: 0,
        },
        session,
        loader_changes: symbolize::loader_changes(),
        epoch: 0,
        codes: Vec::with_capacity(MAX_FRAMES),
        last_time: start_time,
        allocs: 0,
        frees: 0,
    };
    // A panic here (a bug, or in the symbolizer on odd debug info) must not leave sampling on
    // with nobody draining the queue: it stops tracing like a write error.
    let (mut allocs, mut frees) = (0, 0);
    let mut spare = None;
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let result = state.run();
        (allocs, frees) = (state.allocs, state.frees);
        // Not after a panic, which may have left it half-updated.
        spare = state.names.worker.take_symbolizer();
        for window in state.windows.drain(..) {
            window.end_window(Some("the session stopped".to_owned()));
        }
        result.and_then(|()| state.file.take().map_or(Ok(()), |file| file.writer.close_marked().map(drop)))
    }));
    // Also after a panic: the bell holds the writer's thread.
    channel.no_first_sample_bell();
    if let Some(symbolizer) = spare {
        symbolize::put_spare(symbolizer);
    }
    let error = match outcome {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(_) => Some(Error::new(ErrorKind::WriterPanicked)),
    };
    if let Some(e) = error.as_ref().filter(|_| !abandoned.load(Ordering::Acquire)) {
        STATE.store(OFF, Ordering::SeqCst);
        if !matches!(e.kind(), ErrorKind::PidChanged) {
            say(&format!("memtrace: error writing trace file {}: {e}; tracing stopped", path.display()));
        }
    }
    WriterOutcome { allocs, frees, error }
}

impl TraceWriter {
    /// Poll the queue rather than block on it: a receiver blocked in the queue would make
    /// every sampled allocation pay a futex wake-up (a system call) on its send. Only the
    /// session's first sample rings the doorbell, so that its frames are named while a short
    /// program runs on (rather than at its stop, which waits for them).
    fn run(&mut self) -> crate::Result<()> {
        let channel = self.names.channel;
        channel.ring_at_first_sample(Arc::clone(&self.doorbell), self.session);
        let started = Instant::now();
        let mut next_flush = started + FLUSH_INTERVAL;
        // The pool has its starting buffers ([`handoff::STARTING_POOL`]).
        let mut pool_filled = false;
        loop {
            // As the program left it: the round gives back the buffers of the samples it takes.
            let pooled = channel.pooled();
            self.live.take_requests(&self.requests);
            let mut received = 0;
            while received < POLL_BATCH {
                let Some(msg) = next_message(channel, &mut self.names.backlog) else { break };
                received += 1;
                if msg.session() != self.session {
                    // Sent by a thread still finishing a sample of an earlier session.
                    channel.dispose(msg);
                    continue;
                }
                match msg {
                    Msg::Alloc { addr, time, length, nsamples, epoch, mut frames, nframes, .. } => {
                        let frames_used = &mut frames[..(nframes as usize).min(MAX_FRAMES)];
                        self.names.pseudo.name_thread(frames_used);
                        let rate = sampler::rate_of_epoch(u32::from(epoch));
                        let result = self.alloc(addr, time, length, (nsamples, rate), frames_used);
                        channel.recycle(frames);
                        result?
                    }
                    Msg::Free { addr, time, .. } => self.free(addr, time)?,
                    Msg::ThreadName { tid, name, .. } => self.names.pseudo.kernel_name(tid, name),
                    Msg::Stop { .. } => {
                        self.write_late_frees(true)?;
                        return self.write_losses();
                    }
                }
            }
            self.write_late_frees(false)?;
            self.write_losses()?;
            self.live.answer(received < POLL_BATCH);
            // Once the queue is drained, so that each takes effect where the program asked for
            // it: after the samples queued before (a trace that starts begins with their blocks,
            // a new rate's part with the samples taken after it). A writer that does not drain
            // the queue is losing samples already.
            if received < POLL_BATCH {
                self.take_controls()?;
            }
            let now = Instant::now();
            if now >= next_flush {
                each_output(&mut self.file, &mut self.windows, |out| {
                    if out.writer.has_unflushed_events() {
                        out.writer.flush()?;
                    }
                    Ok(())
                })?;
                next_flush = now + FLUSH_INTERVAL;
            }
            let full =
                |file: &Output, files: &Files| files.series.full(file.writer.output().bytes(), file.carried_bytes);
            if self.file.as_ref().zip(self.files.as_ref()).is_some_and(|(file, files)| full(file, files)) {
                self.next_part()?;
            }
            self.names.worker.release_if_idle(now);
            cfi::invalidate_if_unloaded();
            // Not for a session stopping.
            if !pool_filled && pool_wanted(pooled, started.elapsed()) && STATE.load(Ordering::Relaxed) != OFF {
                pool_filled = true;
                channel.fill_pool(handoff::INITIAL_POOL);
            }
            if received < POLL_BATCH {
                // Waiting for the doorbell rather than asleep: stopping rings it, so that a
                // short program does not wait out the interval at exit, and so does the
                // session's first sample.
                let interval = if received > BUSY_FILL { BUSY_POLL_INTERVAL } else { POLL_INTERVAL };
                #[cfg(debug_assertions)]
                let interval =
                    if WAIT_FOR_DOORBELL.load(Ordering::Relaxed) { Duration::from_secs(3600) } else { interval };
                self.doorbell.wait(interval);
            }
        }
    }

    /// Fill [`TraceWriter::codes`] with the location codes of `frames` (innermost first), without
    /// an innermost frame that is the allocator shim's own: one the sampled path could not
    /// recognise, because calibration saw the shim inlined (see `unwind::SHIM`).
    ///
    /// A code is the frame's address until a library is loaded or unloaded; from then on it is
    /// tagged with the number of such changes seen (above [`ADDRESS_BITS`]), so that code loaded
    /// later at the same addresses gets codes, and names, of its own (and an address named
    /// unknown while nothing was loaded there is named again). Each change thus writes the
    /// locations of the frames sampled after it once more. Samples still queued at an unload
    /// are named after what is loaded when the writer gets to them.
    fn set_codes(&mut self, frames: &[u64]) {
        let changes = symbolize::loader_changes();
        if changes != self.loader_changes {
            self.loader_changes = changes;
            self.epoch += 1;
            self.names.cache.clear();
        }
        let tag = (self.epoch % (1 << (64 - ADDRESS_BITS))) << ADDRESS_BITS;
        self.names.tag = tag;
        self.codes.clear();
        // Pseudo-frames (span and thread names, tagged at the top) are codes of their own.
        self.codes.extend(frames.iter().map(|&frame| if frame >> ADDRESS_BITS == 0 { frame | tag } else { frame }));
        if let [innermost, rest @ ..] = &self.codes[..] {
            let locations = self.names.locations_of(*innermost, &self.codes);
            // Outermost first: the frame's own function.
            if !rest.is_empty() && locations.first().is_some_and(|l| symbolize::is_allocator_shim(&l.defname)) {
                self.codes.remove(0);
            }
        }
    }

    fn time(&mut self, time: Timestamp) -> Timestamp {
        self.last_time = self.last_time.max(time);
        self.last_time
    }

    /// A sampled block of `length` words at `addr`, with `nsamples` sample points found at
    /// `rate`, allocated by the stack of `frames`.
    fn alloc(
        &mut self,
        addr: usize,
        time: Timestamp,
        length: u64,
        (nsamples, rate): (u64, f64),
        frames: &[u64],
    ) -> crate::Result<()> {
        if self.holds(addr) && late_frees::take(addr, sampled_set::session_tag(self.session)) {
            // The block that had the address was freed while the queue was full.
            self.free(addr, time)?;
        }
        let time = self.time(time);
        self.set_codes(frames);
        self.profile_alloc(addr, length, nsamples, rate);
        self.allocs += 1;
        let (names, codes, rng) = (&mut self.names, &self.codes, &mut self.rng);
        each_output(&mut self.file, &mut self.windows, |out| {
            let nsamples = sampler::rescale(nsamples, rate, out.rate, rng);
            if nsamples == 0 {
                // Not in a trace at a lower rate.
                return Ok(());
            }
            let alloc = NewAlloc { length, nsamples, source: AllocSource::External, callstack: codes, drop: 0 };
            let id = out.writer.put_alloc(DOMAIN, time, &alloc, |code| names.locations_of(code, codes))?;
            out.ids.insert(addr, id);
            out.counts.allocs += 1;
            Ok(())
        })
    }

    /// Take the controls waiting (see [`Control`]).
    fn take_controls(&mut self) -> crate::Result<()> {
        while let Ok(control) = self.controls.try_recv() {
            match control {
                Control::OpenWindow { id, sink, rate, ended } => self.open_window(id, sink, rate, ended),
                Control::EndWindow { id } => {
                    if let Some(at) = self.windows.iter().position(|w| w.window.as_ref().is_some_and(|(w, _)| *w == id))
                    {
                        self.windows.swap_remove(at).end_window(None);
                    }
                }
                Control::Rate(rate) => {
                    self.rate = rate;
                    if self.file.is_some() {
                        self.next_part()?;
                    }
                }
                Control::StartFile(reply) => {
                    let result = match self.file {
                        Some(_) => Err("a trace file is being written already".to_owned()),
                        None => self.open_part(),
                    };
                    let _ = reply.try_send(result);
                }
                Control::StopFile(reply) => {
                    let result = match self.file.take() {
                        None => Err("no trace file is being written".to_owned()),
                        Some(file) => {
                            file.writer.close_marked()?;
                            self.files
                                .as_ref()
                                .and_then(|f| f.series.files().last().map(Path::to_owned))
                                .ok_or_else(|| "the file series is gone".to_owned())
                        }
                    };
                    let _ = reply.try_send(result);
                }
                Control::State(reply) => {
                    let state = WriterState {
                        files: self
                            .files
                            .as_ref()
                            .map(|f| f.series.files().map(Path::to_owned).collect())
                            .unwrap_or_default(),
                        file_open: self.file.is_some(),
                        windows: self.windows.len(),
                        live_blocks: self.live.live_blocks().count(),
                        allocs: self.allocs,
                        frees: self.frees,
                    };
                    let _ = reply.try_send(state);
                }
            }
        }
        Ok(())
    }

    /// The trace info of a trace that starts now at `rate`, with the live blocks, as `params`
    /// (`window`, `part=N`) say.
    fn info_now(&mut self, rate: f64, params: &str) -> Info {
        let mut info = self.info.clone();
        info.sample_rate = rate;
        info.start_time = self.time(now_us());
        info.runtime_params.extend_from_slice(format!(",{LIVE_AT_START_PARAM},{params}").as_bytes());
        info
    }

    /// Begin `out`, a trace that starts now, with the live blocks, each at its rate's weight
    /// in `out`'s (see `sampler::rescale`): allocations of source `Major` at its start.
    fn carry(&mut self, out: &mut Output) -> crate::Result<()> {
        let time = out.writer.start_time();
        for block in self.live.live_blocks() {
            let nsamples = sampler::rescale(block.nsamples, block.rate, out.rate, &mut self.rng);
            if nsamples == 0 {
                continue;
            }
            let alloc = NewAlloc {
                length: block.length,
                nsamples,
                source: AllocSource::Major,
                callstack: block.codes,
                drop: 0,
            };
            let (codes, frames) = (block.codes, block.frames);
            let locations =
                |code| codes.iter().position(|&c| c == code).map_or_else(Default::default, |i| frames[i].clone());
            let id = out.writer.put_alloc(DOMAIN, time, &alloc, locations)?;
            out.ids.insert(block.addr, id);
            out.counts.carried += 1;
        }
        out.writer.flush()?;
        out.carried_bytes = out.writer.output().bytes();
        Ok(())
    }

    /// Start a window's trace (see [`Control::OpenWindow`]); one that cannot start says so.
    fn open_window(&mut self, id: u64, sink: WindowSink, rate: f64, ended: Sender<WindowEnd>) {
        let info = self.info_now(rate, "window");
        let started =
            Writer::new(Sink::Window(sink), &info).map(|writer| Output::new(writer, rate, Some((id, ended.clone()))));
        match started.and_then(|mut out| self.carry(&mut out).map(|()| out)) {
            Ok(out) => self.windows.push(out),
            Err(e) => drop(ended.try_send(Err(e.to_string()))),
        }
    }

    /// End the part of the file series being written, and go on in the next.
    fn next_part(&mut self) -> crate::Result<()> {
        if let Some(file) = self.file.take() {
            file.writer.close_marked()?;
        }
        if let Err(e) = self.open_part() {
            say(&format!("memtrace: {e}; the session goes on without a trace file"));
        }
        Ok(())
    }

    /// Open the next part of the file series and begin it with the live blocks: its path.
    fn open_part(&mut self) -> Result<PathBuf, String> {
        let Some(files) = self.files.as_mut() else {
            return Err("the session has no trace file configured".to_owned());
        };
        let (part, path) = files.series.next_part();
        let file = (files.open)(&path).map_err(|e| e.to_string())?;
        files.series.opened(path.clone());
        let rate = self.rate;
        let info = self.info_now(rate, &format!("part={part}"));
        let fail = |e: Error| format!("error writing trace file {}: {e}", path.display());
        let writer = Writer::new(Sink::file(file), &info).map_err(fail)?.check_pid_on_flush(true);
        let mut out = Output::new(writer, rate, None);
        self.carry(&mut out).map_err(fail)?;
        self.file = Some(out);
        Ok(path)
    }

    /// Write the frees that found the queue full (see `late_frees`), at the time they are taken:
    /// those of blocks whose allocs are written (the others are still queued, and wait), or, as
    /// the session stops (`stopping`: everything queued is written), all.
    fn write_late_frees(&mut self, stopping: bool) -> crate::Result<()> {
        let mut result = Ok(());
        late_frees::drain(Some(sampled_set::session_tag(self.session)), |addr| {
            if !self.holds(addr) {
                return stopping;
            }
            if result.is_ok() {
                result = self.free(addr, now_us());
            }
            true
        });
        result
    }

    /// Whether the block at `addr` is one this writer has taken the alloc of (every such block
    /// is in the live profile until it is freed).
    fn holds(&self, addr: usize) -> bool {
        self.live.holds(addr)
    }

    /// Write the samples lost since the last call (see `record`) as one allocation for each
    /// cause, of all their sample points and words, at the cause's pseudo-location, collected at
    /// once: allocated totals stay unbiased, live ones are not inflated, and every reader (and
    /// the live profile) sees the loss as a site of its own.
    fn write_losses(&mut self) -> crate::Result<()> {
        /// The address the live profile counts a loss at: no sampled block's (they are aligned).
        const LOST: usize = 1;
        for (cause, lost) in record::take_unwritten_losses().into_iter().enumerate() {
            if lost.points == 0 {
                continue;
            }
            let time = self.time(now_us());
            self.codes.clear();
            self.codes.push(Pseudo::Lost(cause as u32).code());
            let length = lost.bytes.div_ceil(WORD_BYTES);
            // Counted in the session's rate now (a loss racing a rate change may be in the
            // last one's).
            let rate = self.rate;
            self.profile_alloc(LOST, length, lost.points, rate);
            self.live.free(LOST);
            let (names, codes, rng) = (&mut self.names, &self.codes, &mut self.rng);
            each_output(&mut self.file, &mut self.windows, |out| {
                let nsamples = sampler::rescale(lost.points, rate, out.rate, rng);
                if nsamples == 0 {
                    return Ok(());
                }
                let alloc = NewAlloc { length, nsamples, source: AllocSource::External, callstack: codes, drop: 0 };
                let id = out.writer.put_alloc(DOMAIN, time, &alloc, |code| names.locations_of(code, codes))?;
                out.writer.put_collect(DOMAIN, time, id)
            })?;
        }
        Ok(())
    }

    fn free(&mut self, addr: usize, time: Timestamp) -> crate::Result<()> {
        // A block of an earlier session, or a stale table entry, is in no trace.
        let profiled = self.live.free(addr);
        self.frees += u64::from(profiled);
        let time = self.time(time);
        each_output(&mut self.file, &mut self.windows, |out| match out.ids.remove(&addr) {
            Some(id) => {
                out.counts.frees += 1;
                out.writer.put_collect(DOMAIN, time, id)
            }
            // Not sampled at its rate.
            None => Ok(()),
        })
    }

    /// Count the sample being written (its codes set), found at `rate`, in the live profile.
    fn profile_alloc(&mut self, addr: usize, length: u64, nsamples: u64, rate: f64) {
        let (names, codes) = (&mut self.names, &self.codes);
        self.live.alloc_at(addr, length, nsamples, rate, codes, |code| names.locations_of(code, codes));
    }
}

/// Do `write` to each output: a window it fails on ends (its caller is told why), the file's
/// error is the writer's.
fn each_output(
    file: &mut Option<Output>,
    windows: &mut Vec<Output>,
    mut write: impl FnMut(&mut Output) -> crate::Result<()>,
) -> crate::Result<()> {
    let mut at = 0;
    while at < windows.len() {
        match write(&mut windows[at]) {
            Ok(()) => at += 1,
            Err(e) => windows.swap_remove(at).end_window(Some(e.to_string())),
        }
    }
    file.as_mut().map_or(Ok(()), write)
}

/// Messages the writer may take off the queue ahead of their turn, beyond those it holds.
const BACKLOG_LIMIT: usize = 1 << 15;

/// Of the samples taken ahead, those whose new frames are named with those of the sample being
/// written, in one request (see [`Names::name_new`]).
const NAMED_AHEAD: usize = 16;

/// Take what the queue holds into `backlog` (up to [`BACKLOG_LIMIT`]): done while the writer
/// waits for frames' names, which may take milliseconds of parsing debug info (tens for a
/// large unit of an unoptimised build), so that the queue does not fill up and samples get
/// dropped meanwhile; a burst of new frames, at the start of a run above all, is absorbed by
/// the writer's memory instead. Called every slice of the wait for the symbols thread, and
/// between addresses while the writer names them itself (see `symbolize::worker`).
fn take_ahead(channel: &Channel, backlog: &mut VecDeque<Msg>) {
    while backlog.len() < BACKLOG_LIMIT {
        let Some(msg) = channel.try_recv() else { break };
        backlog.push_back(msg);
    }
    // Counted as still queued if stopping gives up on the writer.
    channel.note_taken_ahead(backlog.len());
}

/// The next message to handle: the oldest taken ahead, else the queue's next.
fn next_message(channel: &Channel, backlog: &mut VecDeque<Msg>) -> Option<Msg> {
    match backlog.pop_front() {
        Some(msg) => {
            channel.note_taken_ahead(backlog.len());
            Some(msg)
        }
        None => channel.try_recv(),
    }
}

/// What names location codes.
struct Names {
    /// Told of the writer's progress as it starts naming frames (see
    /// [`Channel::note_progress`]), and where messages are taken ahead while it waits.
    channel: &'static Channel,
    /// Messages taken off the queue ahead of their turn (see [`take_ahead`]), handled before
    /// the queue's.
    backlog: VecDeque<Msg>,
    /// Names frame addresses, lazily and within its memory budget: on the writer's thread at
    /// first, then on its own.
    worker: Worker,
    /// The locations of each location code written.
    cache: FastMap<u64, Arc<[Location]>>,
    /// The names of span and thread pseudo-frames.
    pseudo: PseudoFrames,
    /// The tag of the frame addresses' location codes (see [`TraceWriter::set_codes`]).
    tag: u64,
}

impl Names {
    /// The locations of location `code` of the sample whose codes are `sample` (see
    /// [`TraceWriter::set_codes`]), worked out the first time, with those of the sample's
    /// other codes not named yet: their addresses are asked of the worker in one request,
    /// each of which costs both threads context switches. A sample whose codes are all named
    /// is not looked through: most of them, once a program's stacks have been seen.
    fn locations_of(&mut self, code: u64, sample: &[u64]) -> Arc<[Location]> {
        if let Some(locations) = self.cache.get(&code) {
            return locations.clone();
        }
        self.name_new(std::iter::once(code).chain(sample.iter().copied()));
        self.cache[&code].clone()
    }

    /// Work out the locations of those of `codes` not named yet: a pseudo-frame's name, or the
    /// code address's source locations, asked of the worker for all the addresses at once,
    /// with the new frame addresses of the first [`NAMED_AHEAD`] samples queued behind (taken
    /// ahead now): each request costs a pass over the tables of each object its addresses are
    /// in (for an object's first few), and samples that wait together (a short program's, at
    /// its stop) are named in one.
    fn name_new(&mut self, codes: impl IntoIterator<Item = u64>) {
        let mut new_codes = Vec::new();
        for code in codes {
            if self.cache.contains_key(&code) || new_codes.contains(&code) {
                continue;
            }
            match self.pseudo.locations(code) {
                Some(locations) => drop(self.cache.insert(code, locations)),
                None => new_codes.push(code),
            }
        }
        if new_codes.is_empty() {
            return;
        }
        take_ahead(self.channel, &mut self.backlog);
        let ahead = self
            .backlog
            .iter()
            .filter_map(|msg| match msg {
                Msg::Alloc { frames, nframes, .. } => Some(&frames[..usize::from(*nframes).min(MAX_FRAMES)]),
                _ => None,
            })
            .take(NAMED_AHEAD)
            .flatten()
            // Addresses only: a pseudo-frame is named as its own sample is written.
            .filter(|&&frame| frame >> ADDRESS_BITS == 0)
            .map(|&frame| frame | self.tag)
            .filter(|code| !self.cache.contains_key(code));
        new_codes.extend(ahead);
        new_codes.sort_unstable();
        new_codes.dedup();
        self.channel.note_progress();
        let addrs: Vec<u64> = new_codes.iter().map(|code| code & ((1 << ADDRESS_BITS) - 1)).collect();
        let (channel, backlog) = (self.channel, &mut self.backlog);
        // Once sampling is off (the session stopping), nothing more is coming to take off the
        // queue meanwhile. (A stop watches the symbolizer's own work count for its progress.)
        let stopping = STATE.load(Ordering::Relaxed) == OFF;
        let (locations, program_note) = self.worker.locations(&addrs, stopping, || take_ahead(channel, backlog));
        if let Some(note) = program_note {
            say(&note);
        }
        self.cache.extend(new_codes.into_iter().zip(locations));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::symbolize::Symbolizer;

    /// The pool is filled once the program has taken half the starting buffers, or has run
    /// 20 ms, whichever comes first.
    #[test]
    fn the_pool_is_filled_once_half_the_starting_buffers_are_taken_or_after_a_while() {
        let ms = Duration::from_millis;
        let half = handoff::STARTING_POOL / 2;
        assert!(!pool_wanted(handoff::STARTING_POOL, ms(0)));
        assert!(!pool_wanted(half + 1, POOL_FILLED_AFTER - ms(1)));
        assert!(pool_wanted(half, ms(0)));
        assert!(pool_wanted(0, ms(0)));
        assert!(pool_wanted(handoff::STARTING_POOL, POOL_FILLED_AFTER));
    }

    /// Messages taken ahead of their turn count as queued (for a stop that gives up on the
    /// writer) until the writer handles them, and come before the queue's.
    #[test]
    fn messages_taken_ahead_count_as_queued_until_handled() {
        let channel = Channel::new(0, 1 << 10);
        let free = |addr| Msg::Free { session: 1, addr, time: 0 };
        for addr in 1..=5 {
            assert!(channel.try_send(free(addr)));
        }
        let mut backlog = VecDeque::new();
        take_ahead(&channel, &mut backlog);
        assert_eq!((backlog.len(), channel.queued()), (5, 5));
        assert!(channel.try_send(free(6)));
        for handled in 1..=6 {
            let msg = next_message(&channel, &mut backlog);
            assert!(matches!(msg, Some(Msg::Free { addr, .. }) if addr == handled), "message {handled}");
            assert_eq!(channel.queued(), 6 - handled);
        }
        assert!(next_message(&channel, &mut backlog).is_none());
    }

    /// The new frames of the samples queued behind a sample are named with its own, in one
    /// request, and the samples stay queued, to be written in their turn.
    #[test]
    fn the_frames_of_queued_samples_are_named_with_the_sample_before_them() {
        let channel: &'static Channel = Box::leak(Box::new(Channel::new(0, 1 << 10)));
        let mut names = Names {
            channel,
            backlog: VecDeque::new(),
            worker: Worker::new(Symbolizer::new()),
            cache: FastMap::default(),
            pseudo: PseudoFrames::default(),
            tag: 0,
        };
        // Return addresses in this test binary's code.
        let first = messages_taken_ahead_count_as_queued_until_handled as *const () as u64 + 1;
        let queued = next_message as *const () as u64 + 1;
        let mut frames: handoff::Frames = Box::new([0; MAX_FRAMES]);
        frames[..2].copy_from_slice(&[queued, first]);
        let sample =
            Msg::Alloc { session: 1, nframes: 2, epoch: 0, addr: 0x1000, time: 0, length: 1, nsamples: 1, frames };
        assert!(channel.try_send(sample));
        let named = names.locations_of(first, &[first]);
        assert!(
            named.iter().any(|l| String::from_utf8_lossy(&l.defname).contains("messages_taken_ahead")),
            "{named:?}"
        );
        let ahead = names.cache.get(&queued).expect("the queued sample's frame named with the first");
        assert!(ahead.iter().any(|l| String::from_utf8_lossy(&l.defname).contains("next_message")), "{ahead:?}");
        assert_eq!(names.backlog.len(), 1, "the queued sample is still to be written");
    }
}
