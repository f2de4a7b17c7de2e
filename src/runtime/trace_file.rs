//! The trace file's descriptor, the tracer's own: out of the low numbers a program's files
//! get, closed on `exec`, and checked before every write to be the file the trace was
//! opened as, so that a program that closes it (a daemon closing every descriptor from 3 up)
//! and opens its own files, one of which may get its number, never receives trace bytes:
//! the write fails instead, and the trace stops with one message.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{FromRawFd, IntoRawFd, RawFd};

/// The lowest descriptor number the trace file is moved to, unless the process may open
/// fewer than twice as many (then half the limit): a program's own files, given the lowest
/// numbers free, reach it only once it holds that many open. Within the 64 a process's table
/// of descriptors starts with: a descriptor beyond the table grows it, which in a process with
/// a second thread (the writer is started first) waits for an RCU grace period, which every
/// start would pay (milliseconds).
const HIGH_DESCRIPTOR: libc::rlim_t = 48;

/// `file` on a descriptor of the tracer's own, high and closed on `exec` (see
/// [`HIGH_DESCRIPTOR`]); `file` itself as it was where the process has no such number to
/// spare. Done before the file is locked: a `lockf` lock goes with any descriptor's close.
pub(crate) fn move_high(file: File) -> File {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: a valid, writable `rlimit`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return file;
    }
    let lowest = HIGH_DESCRIPTOR.min(limit.rlim_cur / 2).max(3) as libc::c_int;
    // SAFETY: `file` is an open descriptor for the duration of the call.
    let moved = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&file), libc::F_DUPFD_CLOEXEC, lowest) };
    if moved < 0 {
        return file;
    }
    // SAFETY: a new descriptor of our own; `file`'s is closed as `file` drops.
    unsafe { File::from_raw_fd(moved) }
}

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
/// closed only then.
pub(crate) struct TraceFile {
    fd: RawFd,
    /// The file's device and inode number, as opened.
    identity: (u64, u64),
}

impl TraceFile {
    /// Take `file` over, as it is now.
    pub(crate) fn new(file: File) -> TraceFile {
        let fd = file.into_raw_fd();
        TraceFile { fd, identity: identity_of(fd).unwrap_or((u64::MAX, u64::MAX)) }
    }

    /// Whether the descriptor still holds the file it was opened as.
    fn is_ours(&self) -> bool {
        identity_of(self.fd) == Some(self.identity)
    }
}

/// The device and inode number of the file open on `fd`; `None` when it is not open.
fn identity_of(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: a zeroed `stat` is valid, filled in by the call.
    unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut stat) == 0).then_some((stat.st_dev, stat.st_ino))
    }
}

impl Write for TraceFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if !self.is_ours() {
            return Err(io::Error::other(format!(
                "the program closed the trace's descriptor ({}) or opened another file on it",
                self.fd
            )));
        }
        // SAFETY: writing `buf.len()` bytes from a live slice to a descriptor checked above.
        let written = unsafe { libc::write(self.fd, buf.as_ptr().cast(), buf.len()) };
        usize::try_from(written).map_err(|_| io::Error::last_os_error())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for TraceFile {
    fn drop(&mut self) {
        // Not a descriptor the program has made its own since.
        if self.is_ours() {
            // SAFETY: our descriptor, closed once.
            unsafe { libc::close(self.fd) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn temp_file(name: &str) -> (std::path::PathBuf, File) {
        let path = std::env::temp_dir().join(format!("memtrace-trace-file-{name}-{}", std::process::id()));
        let file = File::create(&path).unwrap();
        (path, file)
    }

    #[test]
    fn the_trace_file_is_moved_high_and_closed_on_exec() {
        let (path, file) = temp_file("high");
        let moved = move_high(file);
        let fd = moved.as_raw_fd();
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: a valid, writable `rlimit`.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
        assert!(fd as libc::rlim_t >= HIGH_DESCRIPTOR.min(limit.rlim_cur / 2), "{fd}");
        // SAFETY: a descriptor of ours.
        assert_ne!(unsafe { libc::fcntl(fd, libc::F_GETFD) } & libc::FD_CLOEXEC, 0);
        let _ = std::fs::remove_file(path);
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
    fn a_descriptor_reused_by_the_program_is_neither_written_nor_closed() {
        let (path, file) = temp_file("ours");
        let (other_path, other) = temp_file("theirs");
        let mut trace = TraceFile::new(file);
        trace.write_all(b"trace").unwrap();
        // The program puts a file of its own on the trace's number.
        // SAFETY: descriptors of ours.
        assert_eq!(unsafe { libc::dup2(other.as_raw_fd(), trace.fd) }, trace.fd);
        let e = trace.write_all(b"more").unwrap_err();
        assert!(e.to_string().contains("closed the trace's descriptor"), "{e}");
        let fd = trace.fd;
        drop(trace);
        // Still open: the program's.
        assert!(identity_of(fd).is_some());
        assert_eq!(std::fs::read(&path).unwrap(), b"trace");
        assert_eq!(std::fs::read(&other_path).unwrap(), b"");
        // SAFETY: the duplicate made above.
        unsafe { libc::close(fd) };
        let _ = (std::fs::remove_file(path), std::fs::remove_file(other_path));
    }
}
