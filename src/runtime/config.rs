//! How to trace: [`TraceConfig`], the environment variables that fill it in, and
//! [`StartError`], why a trace did not start.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::series::parse_size;
use super::state::{memtrace_var, DEFAULT_FRAME_CAP, MAX_FRAMES};
use super::unwind::Unwinder;

/// Default sampling rate: the probability that any one 8-byte word allocated is sampled.
pub(crate) const DEFAULT_RATE: f64 = 1e-5;
/// Environment variable naming the trace file.
pub(crate) const FILE_VAR: &str = "MEMTRACE_FILE";
/// Upstream's name for [`FILE_VAR`], also accepted.
pub(crate) const UPSTREAM_FILE_VAR: &str = "MEMTRACE";
/// Environment variable holding the sampling rate.
pub(crate) const RATE_VAR: &str = "MEMTRACE_RATE";
/// Environment variable holding the trace's free-form context string.
pub(crate) const CONTEXT_VAR: &str = "MEMTRACE_CONTEXT";
/// Environment variable choosing the stack unwinder: `auto` (default), `dwarf` or
/// `frame-pointers` (see [`Unwinder`]).
pub(crate) const UNWINDER_VAR: &str = "MEMTRACE_UNWINDER";
/// Environment variable holding the stop timeout in seconds (see [`TraceConfig::stop_timeout`]).
pub(crate) const STOP_TIMEOUT_VAR: &str = "MEMTRACE_STOP_TIMEOUT";
/// Environment variable naming the address of the profile endpoint (see [`TraceConfig::http`]):
/// alone, a session for profiles only.
pub(crate) const HTTP_VAR: &str = "MEMTRACE_HTTP";
/// Environment variable that, `1`, lets [`HTTP_VAR`] name an address other than a loopback one.
pub(crate) const HTTP_ANY_ADDRESS_VAR: &str = "MEMTRACE_HTTP_ANY_ADDRESS";
/// Environment variable holding the size from which the trace file goes on in a new numbered
/// file (see [`TraceConfig::file_limit`]).
pub(crate) const FILE_LIMIT_VAR: &str = "MEMTRACE_FILE_LIMIT";
/// Environment variable holding the number of numbered files kept (see
/// [`TraceConfig::keep_files`]).
pub(crate) const FILE_KEEP_VAR: &str = "MEMTRACE_FILE_KEEP";
/// Environment variable that, `1`, makes [`FILE_VAR`] the file that `start_file_trace` opens,
/// not one opened at the start (see [`TraceConfig::file_at_start`]).
pub(crate) const FILE_ON_DEMAND_VAR: &str = "MEMTRACE_FILE_ON_DEMAND";
/// Environment variable that, `1`, leaves out the line that says where a trace went, or, `0`,
/// writes it even when stderr is no terminal (see [`TraceConfig::summary`]).
pub(crate) const QUIET_VAR: &str = "MEMTRACE_QUIET";
/// How long stopping waits for the writer thread by default.
pub(crate) const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(1);
/// Environment variable that, `1`, lets clients not on this machine control the session over
/// HTTP (see [`TraceConfig::http_control_from_any_address`]).
pub(crate) const HTTP_CONTROL_VAR: &str = "MEMTRACE_HTTP_CONTROL";

/// How to trace: see [`start_tracing`](crate::start_tracing).
///
/// ```no_run
/// use memtrace_rs::{start_tracing, TraceConfig, Unwinder};
///
/// let config = TraceConfig::new("trace.ctf").rate(1e-4).unwinder(Unwinder::Dwarf).context("load test");
/// let _guard = start_tracing(config)?;
/// # Ok::<(), memtrace_rs::StartError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TraceConfig {
    /// The trace file, created (mode 0600), or an earlier trace replaced; `None` for profiles
    /// only.
    pub(crate) path: Option<PathBuf>,
    /// Probability that any one 8-byte word allocated is sampled, in (0, 1].
    pub(crate) rate: f64,
    /// A free-form description stored in the trace info.
    pub(crate) context: Option<String>,
    /// Stack frames of code recorded per sample, from 1 to [`MAX_FRAMES`] (pseudo-frames come
    /// on top).
    pub(crate) frame_cap: usize,
    /// How sampled stacks are captured.
    pub(crate) unwinder: Unwinder,
    /// Whether each sample records its thread as the outermost frame.
    pub(crate) thread_frames: bool,
    /// How long stopping waits for the writer thread to write what is queued.
    pub(crate) stop_timeout: Duration,
    /// Where the profile endpoint listens, if anywhere.
    pub(crate) http: Option<SocketAddr>,
    /// Whether clients not on this machine may control the session over HTTP.
    pub(crate) http_control_from_any_address: bool,
    /// Whether the endpoint may listen on an address other than a loopback one.
    pub(crate) http_on_any_address: bool,
    /// The size from which the trace goes on in a new numbered file, if it does.
    pub(crate) file_limit: Option<u64>,
    /// Numbered files kept at most.
    pub(crate) file_keep: Option<usize>,
    /// Whether the file is opened at the start (else by `start_file_trace`).
    pub(crate) file_at_start: bool,
    /// Whether a trace's end says where it went: `None` for when stderr is a terminal.
    pub(crate) summary: Option<bool>,
}

impl TraceConfig {
    /// A configuration writing to `path` with the default rate, frame cap and unwinder and no
    /// context.
    pub fn new(path: impl Into<PathBuf>) -> TraceConfig {
        TraceConfig {
            path: Some(path.into()),
            rate: DEFAULT_RATE,
            context: None,
            frame_cap: DEFAULT_FRAME_CAP,
            unwinder: Unwinder::default(),
            thread_frames: true,
            stop_timeout: DEFAULT_STOP_TIMEOUT,
            http: None,
            http_control_from_any_address: false,
            http_on_any_address: false,
            file_limit: None,
            file_keep: None,
            file_at_start: true,
            summary: None,
        }
    }

    /// A configuration for profiles only (see [`crate::profile`]): the same sampling, no
    /// trace file.
    pub fn profile_only() -> TraceConfig {
        TraceConfig { path: None, ..TraceConfig::new("") }
    }

    /// Serve heap profiles over HTTP at `addr` while the session runs, on a thread of the
    /// tracer's: `GET /debug/pprof/heap`, `/debug/pprof/allocs`, `/debug/pprof/peak`, with
    /// `?seconds=N` for a delta and `?format=folded` for folded stacks (see
    /// [`crate::http_response`]), and `/debug/memtrace/…`: a trace of the next seconds, the
    /// session's state, and its control ([`TraceConfig::http_control_from_any_address`]; see
    /// docs/GUIDE.md); port 0 picks a free port, said on stderr. Only a loopback
    /// address is served unless [`TraceConfig::http_on_any_address`] allows others; an endpoint
    /// that cannot start is reported on stderr in one line, and the session runs without it.
    pub fn http(mut self, addr: SocketAddr) -> TraceConfig {
        self.http = Some(addr);
        self
    }

    /// Whether [`TraceConfig::http`] may name an address other than a loopback one (off by
    /// default: anyone who can reach the address can read the program's profiles, which name
    /// its code).
    pub fn http_on_any_address(mut self, allowed: bool) -> TraceConfig {
        self.http_on_any_address = allowed;
        self
    }

    /// Whether clients not on this machine (not at a loopback address) may control the
    /// session over the endpoint: `POST` to `/debug/memtrace/start`, `/stop` and `/rate` (off by
    /// default: they start and stop a file trace and change what tracing costs). Clients on
    /// this machine may, except a browser's requests (with an `Origin` header), which no
    /// client is allowed: a page of any site can make them.
    pub fn http_control_from_any_address(mut self, allowed: bool) -> TraceConfig {
        self.http_control_from_any_address = allowed;
        self
    }

    /// The sampling rate: the probability that any one 8-byte word allocated is sampled,
    /// in (0, 1].
    pub fn rate(mut self, rate: f64) -> TraceConfig {
        self.rate = rate;
        self
    }

    /// A free-form description stored in the trace.
    pub fn context(mut self, context: impl Into<String>) -> TraceConfig {
        self.context = Some(context.into());
        self
    }

    /// The number of stack frames of code recorded per sample, from 1 to 128 (the innermost
    /// ones; default 64). Pseudo-frames come on top of these: the thread's (see
    /// [`thread_frames`](TraceConfig::thread_frames)) and, under `MemtraceLayer`, up to 16
    /// spans', so a sample holds up to `frame_cap` + 17 frames; never more than 128, the
    /// outermost frames of code giving way to the pseudo-frames.
    pub fn frame_cap(mut self, frame_cap: usize) -> TraceConfig {
        self.frame_cap = frame_cap;
        self
    }

    /// How sampled stacks are captured.
    pub fn unwinder(mut self, unwinder: Unwinder) -> TraceConfig {
        self.unwinder = unwinder;
        self
    }

    /// Whether each sample records its thread (on by default): as its outermost frame, a
    /// location named after the thread (or `thread-<id>` when it has no name) with the file
    /// name `<thread>`.
    pub fn thread_frames(mut self, on: bool) -> TraceConfig {
        self.thread_frames = on;
        self
    }

    /// Bound the disk the trace takes: once the file reaches `bytes`, the trace goes on in a
    /// new numbered file (`trace.ctf`, `trace.1.ctf`, `trace.2.ctf`, ...), each of which begins
    /// with the blocks live at its start and opens alone; only the last
    /// [`keep_files`](TraceConfig::keep_files) are kept. A file whose live blocks alone take
    /// more than half the limit is cut at those plus half the limit. See docs/GUIDE.md.
    pub fn file_limit(mut self, bytes: u64) -> TraceConfig {
        self.file_limit = Some(bytes);
        self
    }

    /// How many numbered files of the trace are kept at most (at least 1; default 8 with a
    /// [`file_limit`](TraceConfig::file_limit), all without one): the oldest are removed as
    /// new ones start.
    pub fn keep_files(mut self, files: usize) -> TraceConfig {
        self.file_keep = Some(files);
        self
    }

    /// Whether the trace file is opened at the start (the default). Off, the session starts
    /// for profiles only, and [`start_file_trace`](crate::start_file_trace) opens the file
    /// later, at this configuration's path.
    pub fn file_at_start(mut self, on: bool) -> TraceConfig {
        self.file_at_start = on;
        self
    }

    /// Whether the end of a trace says on stderr, in one line, where it went: its file, its
    /// samples, its size and the command to run next. By default it does when stderr is a
    /// terminal, and not otherwise (a service's log, a test's captured output); `MEMTRACE_QUIET`
    /// `1` or `0` sets it from the environment.
    pub fn summary(mut self, on: bool) -> TraceConfig {
        self.summary = Some(on);
        self
    }

    /// How long stopping (the guard's drop, [`stop_tracing`], the exit hook) waits for a writer
    /// thread that makes no progress (default 1 s). Stopping waits while the writer writes what
    /// is queued, names frames and closes the trace; a writer that has taken no message and
    /// named no frame for this long is looked at: one that is stuck (blocked writing to a pipe
    /// nobody reads, say) is left behind, with one message on stderr that says what it was seen
    /// doing, and the program goes on: the trace ends at the writer's last write. One that is
    /// getting on slowly (starved of CPU by the program's threads) is waited for up to 60 times
    /// this long (at least 5 s) without progress, except by the exit hook.
    ///
    /// [`stop_tracing`]: crate::stop_tracing
    pub fn stop_timeout(mut self, timeout: Duration) -> TraceConfig {
        self.stop_timeout = timeout;
        self
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
    /// The frame cap is not in 1..=128.
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
    /// The trace file is a FIFO that no process has open for reading (opening it would block
    /// until one does).
    NoReader {
        /// The trace file.
        path: PathBuf,
    },
    /// The trace file's name is empty or only whitespace: no file is made of it.
    BlankPath {
        /// The name.
        path: PathBuf,
    },
    /// The trace file exists and is neither empty nor a memtrace trace (it does not start with
    /// the trace magic): it is left as it is. FIFOs and character devices are not looked at.
    NotATrace {
        /// The trace file.
        path: PathBuf,
    },
    /// The trace file is a symbolic link in a world-writable sticky directory (such as `/tmp`)
    /// owned neither by this process's effective user nor by the directory's owner: one that
    /// another user may have planted to have this process overwrite a file of their choosing.
    /// The rule of Linux's `fs.protected_symlinks`, applied where the kernel does not.
    PlantedSymlink {
        /// The trace file.
        path: PathBuf,
    },
    /// The trace file is a terminal.
    Terminal {
        /// The trace file.
        path: PathBuf,
    },
    /// The trace file is the program's own standard output or error (the file of descriptor 1
    /// or 2, `/dev/null` aside), where the trace would be mixed with what the program writes.
    ProgramOutput {
        /// The trace file.
        path: PathBuf,
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
    /// The memory a trace needs to start (its sample queue, the writer thread's stack, a few
    /// MiB), or the address space it takes once running (its threads' stacks and malloc arenas,
    /// the symbolizer's mappings of object files), could not be had.
    NoMemory,
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
            StartError::NoReader { path } => {
                write!(f, "trace file {} is a FIFO that no process is reading; not tracing", path.display())
            }
            StartError::BlankPath { path } => {
                write!(f, "trace file name {path:?} is empty or only whitespace; not tracing")
            }
            StartError::NotATrace { path } => {
                write!(
                    f,
                    "trace file {} exists and is not a memtrace trace; left as it is, not tracing",
                    path.display()
                )
            }
            StartError::PlantedSymlink { path } => write!(
                f,
                "trace file {} is a symbolic link in a world-writable sticky directory, owned by neither this user \
                 nor the directory's owner; not following it, not tracing",
                path.display()
            ),
            StartError::Terminal { path } => write!(f, "trace file {} is a terminal; not tracing", path.display()),
            StartError::ProgramOutput { path } => {
                write!(f, "trace file {} is the program's own standard output or error; not tracing", path.display())
            }
            StartError::Locked { path } => {
                write!(f, "trace file {} is locked: is another process using it? Not tracing", path.display())
            }
            StartError::Write { path, source } => {
                write!(f, "cannot write trace file {}: {source}; not tracing", path.display())
            }
            StartError::Spawn(e) => write!(f, "cannot start the trace writer thread: {e}; not tracing"),
            StartError::NoMemory => write!(f, "not enough memory to start tracing; not tracing"),
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

/// The configuration the environment asks for, writing to `path` (`None`: profiles only);
/// every variable read through [`memtrace_var`], which ignores them all in secure-execution
/// mode.
pub(crate) fn config_from_env(path: Option<OsString>) -> Result<TraceConfig, StartError> {
    let mut config = path.map_or_else(TraceConfig::profile_only, TraceConfig::new);
    if let Some(rate) = rate_from_env(memtrace_var(RATE_VAR).as_deref())? {
        config.rate = rate;
    }
    if let Some(unwinder) = unwinder_from_env(memtrace_var(UNWINDER_VAR).as_deref())? {
        config.unwinder = unwinder;
    }
    if let Some(timeout) = stop_timeout_from_env(memtrace_var(STOP_TIMEOUT_VAR).as_deref())? {
        config.stop_timeout = timeout;
    }
    config.context = memtrace_var(CONTEXT_VAR).and_then(|c| c.into_string().ok()).filter(|c| !c.is_empty());
    config.http = http_from_env(http_requested().as_deref())?;
    config.http_control_from_any_address = memtrace_var(HTTP_CONTROL_VAR).is_some_and(|v| v == "1");
    config.http_on_any_address = memtrace_var(HTTP_ANY_ADDRESS_VAR).is_some_and(|v| v == "1");
    config.file_limit = number_from_env(FILE_LIMIT_VAR, parse_size, "a size such as 64MiB (at least 1KiB)")?;
    config.file_keep =
        number_from_env(FILE_KEEP_VAR, |v| v.parse().ok().filter(|&n| n >= 1), "a number of files, 1 or more")?;
    config.file_at_start = memtrace_var(FILE_ON_DEMAND_VAR).is_none_or(|v| v != "1");
    config.summary = match memtrace_var(QUIET_VAR).as_deref().and_then(|v| v.to_str()) {
        Some("1") => Some(false),
        Some("0") => Some(true),
        Some(other) if !other.is_empty() => {
            return Err(StartError::InvalidVariable { var: QUIET_VAR, value: other.to_owned(), expected: "0 or 1" })
        }
        _ => None,
    };
    Ok(config)
}

/// The value of `var` as `parse` reads it: `None` when unset or empty.
fn number_from_env<T>(
    var: &'static str,
    parse: impl Fn(&str) -> Option<T>,
    expected: &'static str,
) -> Result<Option<T>, StartError> {
    let Some(value) = memtrace_var(var).filter(|v| !v.is_empty()) else { return Ok(None) };
    match value.to_str().and_then(|v| parse(v.trim())) {
        Some(n) => Ok(Some(n)),
        None => Err(StartError::InvalidVariable { var, value: value.to_string_lossy().into_owned(), expected }),
    }
}

/// The value of [`HTTP_VAR`], unless unset or empty.
pub(crate) fn http_requested() -> Option<OsString> {
    memtrace_var(HTTP_VAR).filter(|v| !v.is_empty())
}

/// The endpoint address given by the value of [`HTTP_VAR`] (`IP:PORT`, or `localhost:PORT`):
/// `None` when unset or empty.
fn http_from_env(value: Option<&OsStr>) -> Result<Option<SocketAddr>, StartError> {
    let Some(value) = value.filter(|v| !v.is_empty()) else { return Ok(None) };
    let text = value.to_str().map(str::trim).unwrap_or_default();
    let localhost = text.strip_prefix("localhost:").map(|port| format!("127.0.0.1:{port}"));
    match localhost.as_deref().unwrap_or(text).parse::<SocketAddr>() {
        Ok(addr) => Ok(Some(addr)),
        Err(_) => Err(StartError::InvalidVariable {
            var: HTTP_VAR,
            value: value.to_string_lossy().into_owned(),
            expected: "an address and port such as 127.0.0.1:6060",
        }),
    }
}

/// The stop timeout given by the value of [`STOP_TIMEOUT_VAR`] (seconds): `None` when unset or
/// empty.
fn stop_timeout_from_env(value: Option<&OsStr>) -> Result<Option<Duration>, StartError> {
    let Some(value) = value.filter(|v| !v.is_empty()) else { return Ok(None) };
    match value.to_str().and_then(|v| Duration::try_from_secs_f64(v.trim().parse::<f64>().ok()?).ok()) {
        Some(timeout) => Ok(Some(timeout)),
        None => Err(StartError::InvalidVariable {
            var: STOP_TIMEOUT_VAR,
            value: value.to_string_lossy().into_owned(),
            expected: "a number of seconds",
        }),
    }
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

pub(crate) fn valid_rate(rate: f64) -> bool {
    rate > 0.0 && rate <= 1.0
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
    fn stop_timeout_variable_parsing() {
        assert!(stop_timeout_from_env(None).unwrap().is_none());
        assert!(stop_timeout_from_env(Some(OsStr::new(""))).unwrap().is_none());
        assert_eq!(stop_timeout_from_env(Some(OsStr::new("2.5"))).unwrap(), Some(Duration::from_millis(2500)));
        assert_eq!(stop_timeout_from_env(Some(OsStr::new(" 0 "))).unwrap(), Some(Duration::ZERO));
        for bad in ["-1", "abc", "NaN", "inf", "1s"] {
            let e = stop_timeout_from_env(Some(OsStr::new(bad))).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("{STOP_TIMEOUT_VAR} must be a number of seconds, got {bad:?}; not tracing")
            );
        }
    }

    #[test]
    fn http_variable_parsing() {
        assert!(http_from_env(None).unwrap().is_none());
        assert!(http_from_env(Some(OsStr::new(""))).unwrap().is_none());
        let parsed = |v: &str| http_from_env(Some(OsStr::new(v))).unwrap().unwrap().to_string();
        assert_eq!(parsed("127.0.0.1:6060"), "127.0.0.1:6060");
        assert_eq!(parsed("localhost:0"), "127.0.0.1:0");
        assert_eq!(parsed("[::1]:80"), "[::1]:80");
        for bad in ["6060", "localhost", "example.com:80", "127.0.0.1:99999"] {
            let e = http_from_env(Some(OsStr::new(bad))).unwrap_err();
            assert!(matches!(&e, StartError::InvalidVariable { var: HTTP_VAR, value, .. } if value == bad), "{e:?}");
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
}
