//! The trace file's descriptor, the tracer's own (a `descriptor::OwnFd`): out of the low
//! numbers a program's files get, closed on `exec`, and checked before every write to be the
//! file the trace was opened as, so that a program that closes it (a daemon closing every descriptor from 3 up)
//! and opens its own files, one of which may get its number, never receives trace bytes:
//! the write fails instead, and the trace stops with one message.

use std::fs::File;
use std::io::{self, Write};

use super::descriptor::OwnFd;

/// Write all of `bytes` to `file` from a thread of the program's (the trace's first packet, as
/// tracing starts), as the tracer's threads write: a reader gone (a FIFO's) or the file size
/// limit reached fails the write with `EPIPE` or `EFBIG` instead of raising SIGPIPE or SIGXFSZ,
/// whose default actions end the process. The two are blocked on this thread for the write; an
/// instance the write raised is then taken, one that was pending before is left to the program.
pub(crate) fn write_all_without_signals(file: &mut File, bytes: &[u8]) -> io::Result<()> {
    const HELD: [libc::c_int; 2] = [libc::SIGPIPE, libc::SIGXFSZ];
    // SAFETY: sigset_t values filled in by `signal_set` and sigpending before use, and a mask
    // change of the calling thread alone, restored before returning.
    unsafe {
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &signal_set(&HELD), &mut mask);
        let mut pending_before: libc::sigset_t = std::mem::zeroed();
        libc::sigpending(&mut pending_before);
        let written = file.write_all(bytes);
        if written.is_err() {
            for signal in HELD {
                if libc::sigismember(&pending_before, signal) == 0 {
                    let now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
                    libc::sigtimedwait(&signal_set(&[signal]), std::ptr::null_mut(), &now);
                }
            }
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
        written
    }
}

/// The set of `signals`.
fn signal_set(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: a zeroed sigset_t, initialised by sigemptyset before the additions.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &signal in signals {
            libc::sigaddset(&mut set, signal);
        }
        set
    }
}

/// The trace file: written only while its descriptor is still the file it was opened as, and
/// closed only then (see [`OwnFd`]).
pub(crate) struct TraceFile(OwnFd);

impl TraceFile {
    /// Take `file` over, as it is now.
    pub(crate) fn new(file: File) -> TraceFile {
        TraceFile(OwnFd::new(file))
    }
}

impl Write for TraceFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf).unwrap_or_else(|| {
            Err(io::Error::other(format!(
                "the program closed the trace's descriptor ({}) or opened another file on it",
                self.0.number()
            )))
        })
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd};

    fn temp_file(name: &str) -> (std::path::PathBuf, File) {
        let path = std::env::temp_dir().join(format!("memtrace-trace-file-{name}-{}", std::process::id()));
        let file = File::create(&path).unwrap();
        (path, file)
    }

    /// In a child forked for it, with SIGPIPE's and SIGXFSZ's default actions (which end the
    /// process): a write to a pipe with no reader, and one past a file size limit of 0, fail
    /// with `EPIPE` and `EFBIG`, and the child lives on, with neither signal left pending.
    #[test]
    fn a_write_at_start_fails_rather_than_raise_sigpipe_or_sigxfsz() {
        let (path, mut file) = temp_file("fsize");
        // SAFETY: the child makes only async-signal-safe calls (the writes' errors are codes,
        // no allocation) and ends with `_exit`.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: as above; `pipe[1]`'s `File` is the child's only owner of it.
            unsafe {
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                libc::signal(libc::SIGXFSZ, libc::SIG_DFL);
                // Made here, not before the fork: the read end would be in other tests'
                // children too, forked meanwhile.
                let mut pipe = [0; 2];
                if libc::pipe(pipe.as_mut_ptr()) != 0 {
                    libc::_exit(2);
                }
                libc::close(pipe[0]);
                let limit = libc::rlimit { rlim_cur: 0, rlim_max: libc::RLIM_INFINITY };
                libc::setrlimit(libc::RLIMIT_FSIZE, &limit);
                let mut reader_gone = File::from_raw_fd(pipe[1]);
                let epipe = write_all_without_signals(&mut reader_gone, b"trace").err().and_then(|e| e.raw_os_error());
                let efbig = write_all_without_signals(&mut file, b"trace").err().and_then(|e| e.raw_os_error());
                let mut pending: libc::sigset_t = std::mem::zeroed();
                libc::sigpending(&mut pending);
                let none_pending =
                    libc::sigismember(&pending, libc::SIGPIPE) == 0 && libc::sigismember(&pending, libc::SIGXFSZ) == 0;
                let ok = epipe == Some(libc::EPIPE) && efbig == Some(libc::EFBIG) && none_pending;
                libc::_exit(if ok { 0 } else { 1 });
            }
        }
        // SAFETY: the child just forked.
        let status = unsafe {
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
            status
        };
        let _ = std::fs::remove_file(path);
        assert!(libc::WIFEXITED(status), "the child was ended by signal {}", libc::WTERMSIG(status));
        assert_eq!(libc::WEXITSTATUS(status), 0, "a write did not fail as it should, or left a signal pending");
    }

    #[test]
    fn a_descriptor_reused_by_the_program_is_not_written() {
        let (path, file) = temp_file("ours");
        let (other_path, other) = temp_file("theirs");
        let mut trace = TraceFile::new(file);
        trace.write_all(b"trace").unwrap();
        // The program puts a file of its own on the trace's number.
        // SAFETY: descriptors of ours.
        assert_eq!(unsafe { libc::dup2(other.as_raw_fd(), trace.0.number()) }, trace.0.number());
        let e = trace.write_all(b"more").unwrap_err();
        assert!(e.to_string().contains("closed the trace's descriptor"), "{e}");
        let fd = trace.0.number();
        drop(trace);
        assert_eq!(std::fs::read(&path).unwrap(), b"trace");
        assert_eq!(std::fs::read(&other_path).unwrap(), b"");
        // SAFETY: the duplicate made above, left open by the trace's drop.
        assert_eq!(unsafe { libc::close(fd) }, 0);
        let _ = (std::fs::remove_file(path), std::fs::remove_file(other_path));
    }
}
