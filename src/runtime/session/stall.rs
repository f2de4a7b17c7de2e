//! How a stop tells a writer that is getting on from one that is stuck, and what it saw of a
//! stuck one: the writer's progress counter first, then, once that has not moved for the stop
//! timeout, the writer thread as the kernel sees it (`/proc/self/task/<tid>/stat`, `syscall`
//! and `schedstat`).
//!
//! A writer that has not moved because it does not get the CPU (runnable, the program's threads
//! keeping every CPU busy), because it waits for a lock those busy threads take in turn (a
//! malloc arena's), or because it is working without taking messages (on the CPU) is getting
//! on: it is waited for up to [`LONGEST_WAIT_FACTOR`] times the stop timeout (at least 5 s) without progress
//! (and however long it takes while it makes progress, as before). One that sleeps
//! in a system call (a write to a pipe nobody reads; a lock in a process otherwise idle, held
//! by a thread interrupted by a signal handler that exits) or is stopped is stuck: given up
//! on at the timeout. So is every writer without progress at exit (see [`Stall::watch`]).
//! Everything here allocates nothing (the
//! exit hook watches the writer too) and reads the kernel's files through descriptors of its
//! own, opened and closed on the calling thread; under a seccomp filter, which may punish an
//! `open`, the thread is not looked at and a writer without progress is given up on at the
//! timeout, as one whose state cannot be read.

use std::io::Write;
use std::time::{Duration, Instant};

use super::super::handoff::Channel;
use super::super::state::under_seccomp_filter;
use super::super::symbolize;

/// How many stop timeouts a writer that is getting on, without visible progress, is waited
/// for at most (and at least [`LONGEST_WAIT_FLOOR`]). One that makes progress is waited for
/// however long it takes.
const LONGEST_WAIT_FACTOR: u32 = 60;
/// The least that wait lasts, whatever the timeout: a machine that other processes keep busy
/// left a writer off the CPU for tens of milliseconds, far more than a timeout of 1 ms times
/// the factor.
const LONGEST_WAIT_FLOOR: Duration = Duration::from_secs(5);

/// How often the writer thread is looked at, once it has made no progress for the timeout.
const LOOK_INTERVAL: Duration = Duration::from_millis(20);

/// What the stop saw of a writer it gave up on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// Asleep in a system call that reads or writes a file.
    Io,
    /// Asleep on a futex, the rest of the process idle: a lock no running thread will let go
    /// of, or a condition no one signals.
    Lock,
    /// Asleep on a futex while the program's threads run: a lock they hold, taken in turn.
    Contended,
    /// Asleep in another system call (its number).
    Syscall(libc::c_long),
    /// Stopped (a signal, a debugger).
    Stopped,
    /// Runnable all along, on the CPU for `ran` of the time waited: the program's threads kept
    /// the CPUs.
    Starved { ran: Duration },
    /// On the CPU, taking no message.
    Busy,
    /// What the writer thread did could not be read.
    Unknown,
}

impl Cause {
    /// Whether a writer seen so is getting on, and waited for beyond the timeout.
    fn getting_on(self) -> bool {
        matches!(self, Cause::Starved { .. } | Cause::Busy | Cause::Contended)
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Cause::Io => f.write_str("blocked in a read or write of a file (a pipe or FIFO nobody reads, or a file system that does not answer?)"),
            Cause::Lock => f.write_str("waiting on a futex, the rest of the process idle (for a lock no thread lets go of, such as one interrupted in the allocator by a signal handler that exits, or for its symbolizer, stuck reading a file?)"),
            Cause::Contended => f.write_str("waiting for a lock that the program's busy threads hold in turn"),
            Cause::Syscall(nr) => write!(f, "asleep in system call {nr}"),
            Cause::Stopped => f.write_str("stopped (by a signal or a debugger)"),
            Cause::Starved { ran } => write!(
                f,
                "starved of CPU: runnable, but on a CPU for only {ran:?} (the program's threads kept every CPU busy)"
            ),
            Cause::Busy => f.write_str("running without taking a message"),
            Cause::Unknown => f.write_str("in a state that could not be read (a pipe or FIFO nobody reads, a file system that does not answer, or an exit from a signal handler that interrupted the allocator?)"),
        }
    }
}

/// A writer given up on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stuck {
    /// What it was seen doing.
    pub(crate) cause: Cause,
    /// How long it made no progress.
    pub(crate) waited: Duration,
    /// Whether it was getting on, and the stop waited for it as long as it waits.
    pub(crate) longest_wait: bool,
}

/// Watches a stopping session's writer (see the module doc). Its progress is the channel's
/// count (messages taken, frames named) beside its symbolizer's work
/// ([`symbolize::work_done`]): the writer waits for its symbolizer's answers, or names
/// addresses itself, without taking messages.
pub(crate) struct Stall {
    channel: &'static Channel,
    timeout: Duration,
    /// Whether a writer that gets on is waited for beyond the timeout: not at exit, which may
    /// run in a signal handler that interrupted the allocator, and where a writer that seems to
    /// get on may wait, on the CPU, for what that handler's thread holds.
    patient: bool,
    /// The last progress seen (the channel's and the symbolizer's), and when it was seen.
    last_progress: ((u64, u64), Instant),
    /// The writer's time on a CPU when its progress was last seen, if it could be read, and
    /// the whole process's.
    cpu_at_progress: (Option<Duration>, Duration),
    /// The last look at the writer thread, and what it saw.
    last_look: Option<(Instant, Cause)>,
}

impl Stall {
    /// Watch `channel`'s writer, which makes no progress for `timeout` at most, and which is
    /// waited for longer while it gets on if `patient`.
    pub(crate) fn watch(channel: &'static Channel, timeout: Duration, patient: bool) -> Stall {
        let now = Instant::now();
        Stall {
            channel,
            timeout,
            patient,
            last_progress: ((channel.progress(), symbolize::work_done()), now),
            cpu_at_progress: (writer_cpu_time(channel), process_cpu_time()),
            last_look: None,
        }
    }

    /// Whether to give up on the writer: no progress for the timeout and not getting on, or
    /// (if patient) getting on but without progress for [`LONGEST_WAIT_FACTOR`] timeouts.
    pub(crate) fn stalled(&mut self) -> Option<Stuck> {
        let now = Instant::now();
        let progress = (self.channel.progress(), symbolize::work_done());
        if progress != self.last_progress.0 {
            self.last_progress = (progress, now);
            self.cpu_at_progress = (writer_cpu_time(self.channel), process_cpu_time());
            self.last_look = None;
            return None;
        }
        let without_progress = now.duration_since(self.last_progress.1);
        if without_progress < self.timeout {
            return None;
        }
        let cause = match self.last_look {
            Some((at, cause)) if now.duration_since(at) < LOOK_INTERVAL => cause,
            _ => {
                let cause = self.look(without_progress);
                self.last_look = Some((now, cause));
                cause
            }
        };
        if !cause.getting_on() || !self.patient {
            return Some(Stuck { cause, waited: without_progress, longest_wait: false });
        }
        let longest = self.timeout.saturating_mul(LONGEST_WAIT_FACTOR).max(LONGEST_WAIT_FLOOR);
        (without_progress >= longest).then_some(Stuck { cause, waited: without_progress, longest_wait: true })
    }

    /// What the writer thread is doing, as the kernel says, `without_progress` after its last
    /// progress.
    fn look(&self, without_progress: Duration) -> Cause {
        let Some(tid) = self.channel.writer_tid() else { return Cause::Unknown };
        let mut buf = [0u8; 512];
        let Some(stat) = read_task_file(tid, "stat", &mut buf) else { return Cause::Unknown };
        // The state follows the command name in parentheses, which may hold anything.
        let state = stat.iter().rposition(|&b| b == b')').and_then(|end| stat.get(end + 2)).copied();
        match state {
            Some(b'R') => {
                let ran = writer_cpu_time(self.channel)
                    .zip(self.cpu_at_progress.0)
                    .map(|(now, then)| now.saturating_sub(then));
                match ran {
                    // On a CPU for most of the time without progress: working, not starved.
                    Some(ran) if ran >= self.timeout / 2 => Cause::Busy,
                    Some(ran) => Cause::Starved { ran },
                    None => Cause::Starved { ran: Duration::ZERO },
                }
            }
            Some(b'T' | b't') => Cause::Stopped,
            Some(b'S' | b'D') => {
                let mut buf = [0u8; 512];
                match read_task_file(tid, "syscall", &mut buf)
                    .and_then(first_number)
                    .map(|nr| syscall_cause(nr as libc::c_long))
                {
                    // The program's threads on a CPU for a tenth of the time at least (on a
                    // machine that other processes keep busy, they may get little more),
                    // where a thread stuck in `exit` leaves the process idle but for its polls.
                    Some(Cause::Lock)
                        if process_cpu_time().saturating_sub(self.cpu_at_progress.1) >= without_progress / 10 =>
                    {
                        Cause::Contended
                    }
                    Some(cause) => cause,
                    None => Cause::Unknown,
                }
            }
            _ => Cause::Unknown,
        }
    }
}

/// What a writer asleep in system call `nr` waits for.
fn syscall_cause(nr: libc::c_long) -> Cause {
    const IO: [libc::c_long; 11] = [
        libc::SYS_read,
        libc::SYS_write,
        libc::SYS_writev,
        libc::SYS_pread64,
        libc::SYS_pwrite64,
        libc::SYS_pwritev,
        libc::SYS_fsync,
        libc::SYS_fdatasync,
        libc::SYS_openat,
        libc::SYS_close,
        libc::SYS_ftruncate,
    ];
    if IO.contains(&nr) {
        Cause::Io
    } else if nr == libc::SYS_futex {
        Cause::Lock
    } else {
        Cause::Syscall(nr)
    }
}

/// The writer thread's time on a CPU (`schedstat`'s first field), if it can be read.
fn writer_cpu_time(channel: &Channel) -> Option<Duration> {
    let mut buf = [0u8; 128];
    let ns = read_task_file(channel.writer_tid()?, "schedstat", &mut buf).and_then(first_number)?;
    Some(Duration::from_nanos(u64::try_from(ns).ok()?))
}

/// The time the whole process has been on a CPU.
fn process_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// The number a file's text starts with.
fn first_number(text: &[u8]) -> Option<i64> {
    let digits = text.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&text[..digits]).ok()?.parse().ok()
}

/// Read `/proc/self/task/<tid>/<name>` into `buf`, allocating nothing: what it holds. `None`
/// under a seccomp filter (see the module doc), or if it cannot be read.
fn read_task_file<'a>(tid: i32, name: &str, buf: &'a mut [u8]) -> Option<&'a [u8]> {
    if under_seccomp_filter() {
        return None;
    }
    let mut path = [0u8; 64];
    let mut cursor = &mut path[..];
    // One byte left for the NUL: the path is far shorter.
    write!(cursor, "/proc/self/task/{tid}/{name}\0").ok()?;
    // SAFETY: `path` is NUL-terminated; the descriptor is ours, read into `buf` within its
    // length, and closed once.
    unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let read = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        Some(&buf[..usize::try_from(read).ok()?])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_calls_name_their_causes() {
        assert_eq!(syscall_cause(libc::SYS_write), Cause::Io);
        assert_eq!(syscall_cause(libc::SYS_futex), Cause::Lock);
        assert_eq!(syscall_cause(libc::SYS_nanosleep), Cause::Syscall(libc::SYS_nanosleep));
        assert!(Cause::Starved { ran: Duration::ZERO }.getting_on() && Cause::Busy.getting_on());
        assert!(!Cause::Io.getting_on() && !Cause::Lock.getting_on() && !Cause::Unknown.getting_on());
    }

    #[test]
    fn numbers_are_read_where_files_start_with_them() {
        assert_eq!(first_number(b"1 0x3 0x4\n"), Some(1));
        assert_eq!(first_number(b"52731310 2108724391 20\n"), Some(52_731_310));
        assert_eq!(first_number(b"running\n"), None);
    }
}
