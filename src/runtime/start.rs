//! Starting a session with its endpoint: [`start_tracing`] from code, [`trace_if_requested`]
//! from the environment. The one module that uses both the session and the routes (which take
//! profiles and windows of the running session, and control it), so that the session itself
//! knows only the server.

use super::config::{config_from_env, http_requested, StartError, TraceConfig, FILE_VAR, HTTP_VAR, UPSTREAM_FILE_VAR};
use super::serve::{routes, server};
use super::session::{self, TraceGuard};
use super::state::{memtrace_var, say, secure_execution};

/// Start tracing if the environment asks for it: `MEMTRACE_FILE` (or upstream's `MEMTRACE`)
/// names the trace file, `MEMTRACE_RATE` the sampling rate (default 1e-5), and
/// `MEMTRACE_CONTEXT` an optional description. `MEMTRACE_HTTP=127.0.0.1:PORT` serves heap
/// profiles at that address (see [`TraceConfig::http`]; another address than a loopback one
/// only with `MEMTRACE_HTTP_ANY_ADDRESS=1`); alone, without a file, it starts a session for
/// profiles only.
///
/// The file and endpoint variables are removed from the environment, so that child processes
/// are not traced into the same file, nor try the same port. Problems (a malformed rate, an unwritable or locked file, a
/// FIFO that no process reads) are reported on stderr in one line starting with `memtrace: `,
/// and the program runs on untraced. Returns `None` when not tracing; keep the guard alive for as long as the program
/// should be traced.
///
/// In secure-execution mode (a setuid or setgid program, or one with file capabilities: the
/// kernel's `AT_SECURE`) every `MEMTRACE` variable is ignored, with one line on stderr if a
/// file was asked for: its user must not choose the files it writes. [`start_tracing`] from
/// the program's own code is unaffected.
///
/// Call it first thing in `main`, before the program starts threads: removing the variables
/// edits the process environment, which is not thread-safe (`std::env::remove_var`).
#[must_use = "tracing stops when the guard is dropped"]
pub fn trace_if_requested() -> Option<TraceGuard> {
    if secure_execution() {
        // Only whether a file or an endpoint is asked for is looked at, to say why there is none.
        if let Some(var) = [FILE_VAR, UPSTREAM_FILE_VAR, HTTP_VAR]
            .iter()
            .find(|var| std::env::var_os(var).is_some_and(|p| !p.is_empty()))
        {
            say(&format!(
                "memtrace: {var} is ignored, as is every MEMTRACE variable, in a program that runs with privileges \
                 its user does not have (setuid, setgid or file capabilities); not tracing"
            ));
        }
        return None;
    }
    let path = [FILE_VAR, UPSTREAM_FILE_VAR].iter().find_map(|var| memtrace_var(var).filter(|p| !p.is_empty()));
    if path.is_none() && http_requested().is_none() {
        return None;
    }
    std::env::remove_var(FILE_VAR);
    std::env::remove_var(UPSTREAM_FILE_VAR);
    // Read before it is removed.
    let config = config_from_env(path);
    std::env::remove_var(HTTP_VAR);
    match config.and_then(start_tracing) {
        Ok(guard) => Some(guard),
        Err(e) => {
            say(&format!("memtrace: {e}"));
            None
        }
    }
}

/// Start recording a trace as `config` says. Tracing stops when the returned guard is
/// dropped, when [`stop_tracing`](crate::stop_tracing) is called, or at process exit.
///
/// Only one trace can be recorded at a time. The file is created with mode 0600, or taken with
/// an exclusive `lockf` lock (a file another process is tracing into gives
/// [`StartError::Locked`]) and emptied: a regular file of this user's and group's with no other
/// link is replaced by a new file of its mode (a process that has the old one open keeps
/// reading the old trace), another trace (another user's, a linked one) is truncated, a FIFO or
/// a character device written as it is. Refused, and left as they are: an existing file that is
/// neither empty nor a trace ([`StartError::NotATrace`]), a name that is only whitespace
/// ([`StartError::BlankPath`]), a terminal ([`StartError::Terminal`]), the program's own
/// stdout or stderr ([`StartError::ProgramOutput`]), and a symbolic link another user planted
/// in a sticky directory ([`StartError::PlantedSymlink`]). Opening never waits: a FIFO that no
/// process has open for reading gives [`StartError::NoReader`]. A start that fails leaves no
/// file it created behind, and a first packet that cannot be written (a context too long) is
/// found before the file is touched. The first call in a process also calibrates the stack
/// capture, which requires [`crate::MemtraceAllocator`] to be the global allocator.
pub fn start_tracing(config: TraceConfig) -> Result<TraceGuard, StartError> {
    session::start(config, |config, mailbox| {
        let addr = config.http?;
        server::start(addr, config.http_on_any_address, routes::handler(mailbox, config.http_control_from_any_address))
            .inspect_err(|e| say(&format!("memtrace: {e}")))
            .ok()
    })
}
