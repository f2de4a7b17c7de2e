//! Control of the running session from code (and, through these functions, over HTTP): a
//! trace of a window written to any `Write` ([`trace_window`]), a new rate ([`set_rate`]),
//! starting and stopping the file trace ([`start_file_trace`], [`stop_file_trace`]), and the
//! session's state ([`session_state`]). Each asks the session's writer thread through its
//! controls (`writer_thread::Control`) and waits for its answer on the calling thread; none
//! makes the writer wait for the caller.

use std::fmt;
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use super::config::valid_rate;
use super::record::{self, Loss, Losses};
use super::session::{self, Controls};
use super::window::{self, Next};
use super::writer_thread::{Control, WriterState};

/// How long a control waits for the writer's answer at most: a writer busy naming a large
/// program's first frames answers between two of them, far sooner.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`session_state`] waits for it: a scraper of the state would rather have none.
const STATE_TIMEOUT: Duration = Duration::from_secs(5);

/// Window ids, so that a window's end reaches its own trace.
static NEXT_WINDOW: AtomicU64 = AtomicU64::new(1);

/// Why a control of the running session failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum ControlError {
    /// No session is running in this process (or tracing stopped on an error).
    NoSession,
    /// The rate is not in (0, 1].
    InvalidRate(f64),
    /// A window's rate above the session's: raise the session's first ([`set_rate`]).
    RateAboveSession {
        /// The rate asked for.
        rate: f64,
        /// The session's.
        session: f64,
    },
    /// The writer has too many controls waiting, or did not answer in time.
    Busy,
    /// No file trace can be started or stopped: why.
    File(String),
    /// The window's trace could not be written to the caller's output.
    Output(io::Error),
    /// The window ended before its time: its caller fell behind by the whole queue, or the
    /// session stopped (what was written is a readable trace up to that point).
    WindowLost(String),
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlError::NoSession => write!(f, "no memtrace session is running"),
            ControlError::InvalidRate(rate) => write!(f, "the rate must be in (0, 1], got {rate}"),
            ControlError::RateAboveSession { rate, session } => {
                write!(f, "a window's rate ({rate}) cannot be above the session's ({session}); set the session's first")
            }
            ControlError::Busy => write!(f, "the trace writer is busy; try again"),
            ControlError::File(why) => write!(f, "{why}"),
            ControlError::Output(e) => write!(f, "writing the window's trace: {e}"),
            ControlError::WindowLost(why) => write!(f, "the window's trace ended early: {why}"),
        }
    }
}

impl std::error::Error for ControlError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ControlError::Output(e) => Some(e),
            _ => None,
        }
    }
}

/// What a window's trace holds: see [`trace_window`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WindowStats {
    /// The sampled blocks live at its start, which it begins with.
    pub live_at_start: u64,
    /// Sampled allocations during the window.
    pub samples: u64,
    /// Frees of sampled blocks during the window (of blocks of either kind).
    pub frees: u64,
    /// Bytes written to the output.
    pub bytes: u64,
}

/// Write to `out` a memtrace v3 trace of the next `duration` of the running session (of any
/// kind: with a file trace or for profiles only), beginning with the sampled blocks live at its
/// start, sampled at `rate` if given (at most the session's; else the session's rate). The
/// trace has a file trace's format and names, so `memtrace` and upstream's readers open it; the
/// blocks live at its start are allocations of source `Major` at its start time, and its
/// runtime parameters say so (`live-at-start=major`, docs/FORMAT.md "Series and windows"), so
/// that "allocated during the window" leaves them out.
///
/// Blocks the calling thread for the window; never blocks the writer thread on `out`: packets
/// go through a bounded queue to this thread, which writes them. A window whose `out` falls
/// behind by that queue (16 MiB) is ended ([`ControlError::WindowLost`]); what was written
/// is a readable trace up to there.
pub fn trace_window<W: Write>(mut out: W, duration: Duration, rate: Option<f64>) -> Result<WindowStats, ControlError> {
    let Controls { controls, doorbell, rate: session_rate } = session::controls().ok_or(ControlError::NoSession)?;
    let rate = rate.unwrap_or(session_rate);
    if !valid_rate(rate) {
        return Err(ControlError::InvalidRate(rate));
    }
    if rate > session_rate {
        return Err(ControlError::RateAboveSession { rate, session: session_rate });
    }
    let (sink, packets) = window::queue();
    let (ended_tx, ended) = crossbeam_channel::bounded(1);
    let id = NEXT_WINDOW.fetch_add(1, Ordering::Relaxed);
    controls.try_send(Control::OpenWindow { id, sink, rate, ended: ended_tx }).map_err(|_| ControlError::Busy)?;
    doorbell.ring();
    let mut bytes = 0u64;
    let mut write = |packet: Vec<u8>| {
        bytes += packet.len() as u64;
        out.write_all(&packet).map_err(ControlError::Output)
    };
    let end = Instant::now() + duration;
    let mut ended_early = false;
    loop {
        match packets.next(end) {
            Next::Packet(packet) => write(packet)?,
            Next::Deadline => break,
            Next::Ended => {
                ended_early = true;
                break;
            }
        }
    }
    if !ended_early {
        // Retried while the writer's controls are full: it takes them every round.
        let asked = Instant::now();
        while controls.try_send(Control::EndWindow { id }).is_err() {
            if asked.elapsed() > ANSWER_TIMEOUT {
                return Err(ControlError::Busy);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        doorbell.ring();
        let guard = Instant::now() + ANSWER_TIMEOUT;
        loop {
            match packets.next(guard) {
                Next::Packet(packet) => write(packet)?,
                Next::Deadline => return Err(ControlError::Busy),
                Next::Ended => break,
            }
        }
    }
    out.flush().map_err(ControlError::Output)?;
    match ended.recv_timeout(ANSWER_TIMEOUT) {
        Ok(Ok(counts)) if !ended_early => {
            Ok(WindowStats { live_at_start: counts.carried, samples: counts.allocs, frees: counts.frees, bytes })
        }
        Ok(Ok(_)) => Err(ControlError::WindowLost("the session stopped".to_owned())),
        Ok(Err(why)) => Err(ControlError::WindowLost(why)),
        Err(_) => Err(ControlError::WindowLost("the session stopped".to_owned())),
    }
}

/// Change the running session's rate (in (0, 1]): from now every word allocated is sampled
/// with probability `rate`. A file trace goes on in a new file of its series at the new rate
/// (one rate per trace), which begins with the live blocks, each carried with its own rate's
/// weight; every estimate stays unbiased across the change (see docs/GUIDE.md). The queue to
/// the writer keeps the size it had for the session's first rate: a rate far above it may
/// drop samples at bursts (counted as lost, never silently).
pub fn set_rate(rate: f64) -> Result<(), ControlError> {
    if !valid_rate(rate) {
        return Err(ControlError::InvalidRate(rate));
    }
    match session::rerate(rate) {
        None => Err(ControlError::NoSession),
        Some(false) => Err(ControlError::Busy),
        Some(true) => Ok(()),
    }
}

/// Start (attach) a file trace to the running session, at its configured path
/// (`MEMTRACE_FILE`, or [`TraceConfig::new`](crate::TraceConfig::new)'s, with
/// [`file_at_start`](crate::TraceConfig::file_at_start) off for a session that starts without
/// it), as the next file of its series: it begins with the blocks live now. Never at a path
/// chosen any other way. The path written to.
pub fn start_file_trace() -> Result<PathBuf, ControlError> {
    ask(Control::StartFile, ANSWER_TIMEOUT)?.map_err(ControlError::File)
}

/// Stop the running session's file trace, closing its file; the session (its profiles, its
/// HTTP endpoint) keeps running, and [`start_file_trace`] starts the next file. The path closed.
pub fn stop_file_trace() -> Result<PathBuf, ControlError> {
    ask(Control::StopFile, ANSWER_TIMEOUT)?.map_err(ControlError::File)
}

/// The running session's state, `None` without one (or with its writer too busy to say).
pub fn session_state() -> Option<SessionState> {
    let rate = session::controls()?.rate;
    let writer = ask(Control::State, STATE_TIMEOUT).ok()?;
    Some(SessionState { rate, writer, losses: record::losses_so_far() })
}

/// Send the control that `control` makes with a reply channel, and wait `timeout` at most for
/// the answer.
fn ask<T>(control: impl FnOnce(crossbeam_channel::Sender<T>) -> Control, timeout: Duration) -> Result<T, ControlError> {
    let Controls { controls, doorbell, .. } = session::controls().ok_or(ControlError::NoSession)?;
    let (reply, answer): (_, Receiver<T>) = crossbeam_channel::bounded(1);
    controls.try_send(control(reply)).map_err(|_| ControlError::Busy)?;
    doorbell.ring();
    answer.recv_timeout(timeout).map_err(|e| match e {
        crossbeam_channel::RecvTimeoutError::Timeout => ControlError::Busy,
        crossbeam_channel::RecvTimeoutError::Disconnected => ControlError::NoSession,
    })
}

/// The running session's state: see [`session_state`].
#[derive(Debug, Clone)]
pub struct SessionState {
    rate: f64,
    writer: WriterState,
    losses: Losses,
}

impl SessionState {
    /// The sampling rate now.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// The files of the file trace's series on disk, oldest first.
    pub fn files(&self) -> &[PathBuf] {
        &self.writer.files
    }

    /// Whether a file trace is being written (into the last of [`files`](SessionState::files)).
    pub fn file_open(&self) -> bool {
        self.writer.file_open
    }

    /// Sampled allocations taken since the session started.
    pub fn samples(&self) -> u64 {
        self.writer.allocs
    }

    /// Windows being written.
    pub fn windows(&self) -> usize {
        self.writer.windows
    }

    /// Sampled blocks live now.
    pub fn live_blocks(&self) -> usize {
        self.writer.live_blocks
    }

    /// Sampled allocations lost since the session started, whatever the reason.
    pub fn samples_lost(&self) -> u64 {
        self.losses.samples.iter().map(|lost| lost.samples).sum()
    }

    /// The state as one JSON object: `{"rate":..,"files":[..],"file_open":..,"windows":..,
    /// "samples":..,"frees":..,"live_blocks":..,"losses":{"writer_behind":{"samples":..,
    /// "points":..,"bytes":..},"no_memory":..,"no_stack":..,"untracked":..,"frees":..,
    /// "frees_no_stack":..}}`. Paths are escaped so that no byte of theirs is markup or a
    /// control character where the JSON is shown.
    pub fn to_json(&self) -> String {
        let files: Vec<String> = self.writer.files.iter().map(|p| json_string(&p.to_string_lossy())).collect();
        let losses: Vec<String> = Loss::ALL
            .iter()
            .map(|&cause| {
                let lost = self.losses.of(cause);
                let name = cause.describe().replace(' ', "_");
                format!(r#""{name}":{{"samples":{},"points":{},"bytes":{}}}"#, lost.samples, lost.points, lost.bytes)
            })
            .collect();
        format!(
            r#"{{"rate":{:e},"files":[{}],"file_open":{},"windows":{},"samples":{},"frees":{},"live_blocks":{},"losses":{{{},"frees":{},"frees_no_stack":{}}}}}"#,
            self.rate,
            files.join(","),
            self.writer.file_open,
            self.writer.windows,
            self.writer.allocs,
            self.writer.frees,
            self.writer.live_blocks,
            losses.join(","),
            self.losses.frees,
            self.losses.frees_no_stack,
        )
    }
}

/// `text` as a JSON string, with every character outside printable ASCII, and `<`, `>`, `&`,
/// escaped.
fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            ' '..='~' if !matches!(c, '<' | '>' | '&') => out.push(c),
            _ => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_escape_markup_and_control_characters() {
        assert_eq!(json_string("/tmp/a b.ctf"), r#""/tmp/a b.ctf""#);
        assert_eq!(json_string("<x>&\"\\\n\u{1b}é😀"), r#""\u003cx\u003e\u0026\"\\\u000a\u001b\u00e9\ud83d\ude00""#);
    }

    #[test]
    fn the_state_is_one_json_object() {
        let mut losses = Losses::default();
        losses.samples[Loss::NoStack as usize] = record::Lost { samples: 2, points: 3, bytes: 40 };
        let writer = WriterState {
            files: vec!["/t/trace.ctf".into(), "/t/trace.1.ctf".into()],
            file_open: true,
            windows: 1,
            live_blocks: 7,
            allocs: 10,
            frees: 3,
        };
        let state = SessionState { rate: 1e-5, writer, losses };
        assert_eq!(
            state.to_json(),
            r#"{"rate":1e-5,"files":["/t/trace.ctf","/t/trace.1.ctf"],"file_open":true,"windows":1,"samples":10,"frees":3,"live_blocks":7,"losses":{"writer_behind":{"samples":0,"points":0,"bytes":0},"no_memory":{"samples":0,"points":0,"bytes":0},"no_stack":{"samples":2,"points":3,"bytes":40},"untracked":{"samples":0,"points":0,"bytes":0},"frees":0,"frees_no_stack":0}}"#
        );
    }
}
