//! The tracer's own descriptors, used and closed only while their numbers still hold the files
//! they were opened on, and the identity (device, inode, file type) that tells.
//!
//! A program may close any descriptor, the tracer's among them (a daemon closing every one from
//! 3 up, or `close_range(0, ~0)`), and then open its own files, which get the lowest numbers
//! free: a tracer that went on using its old numbers would write trace bytes into the
//! program's files, read them as its binary, or close them under it. So every use checks the
//! number's identity first (a read also after, since the program may swap the file meanwhile on
//! another thread), and the descriptors are kept out of the low numbers a program's files get.
//!
//! The bottom of the runtime: it depends on nothing else in the crate.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, RawFd};

/// What an open descriptor holds: its file's device, inode number and type (`st_mode &
/// S_IFMT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) device: u64,
    pub(crate) inode: u64,
    pub(crate) kind: u32,
}

impl Identity {
    /// What `fd` holds; `None` when it is not open. Async-signal-safe, and allocates nothing.
    pub(crate) fn of(fd: RawFd) -> Option<Identity> {
        Some(Identity::from(&stat_of(fd)?))
    }
}

impl From<&libc::stat> for Identity {
    fn from(stat: &libc::stat) -> Identity {
        Identity { device: stat.st_dev, inode: stat.st_ino, kind: stat.st_mode & libc::S_IFMT }
    }
}

/// `fstat(fd)`; `None` when `fd` is not open.
pub(crate) fn stat_of(fd: RawFd) -> Option<libc::stat> {
    // SAFETY: a zeroed `stat` is valid, filled in by the call.
    unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut stat) == 0).then_some(stat)
    }
}

/// The lowest descriptor number the tracer's long-lived descriptors are moved to, unless the
/// process may open fewer than twice as many (then half the limit): a program's own files,
/// given the lowest numbers free, reach it only once it holds that many open. Within the 64 a
/// process's table of descriptors starts with: a descriptor beyond the table grows it, which in
/// a process with a second thread (the writer is started first) waits for an RCU grace period,
/// which every start would pay (milliseconds).
pub(crate) const HIGH_DESCRIPTOR: libc::rlim_t = 48;

/// `file` on a descriptor of the tracer's own, high and closed on `exec` (see
/// [`HIGH_DESCRIPTOR`]); `file` itself as it was where the process has no such number to
/// spare. A `lockf` lock goes with any descriptor's close: lock after moving.
pub(crate) fn move_high(file: File) -> File {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: a valid, writable `rlimit`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return file;
    }
    let lowest = HIGH_DESCRIPTOR.min(limit.rlim_cur / 2).max(3) as libc::c_int;
    // SAFETY: `file` is an open descriptor for the duration of the call.
    let moved = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_DUPFD_CLOEXEC, lowest) };
    if moved < 0 {
        return file;
    }
    // SAFETY: a new descriptor of our own; `file`'s is closed as `file` drops.
    unsafe { File::from_raw_fd(moved) }
}

/// A descriptor of the tracer's: read, written and closed only while its number holds the file
/// it was opened on. Not a `File`, whose drop would close whatever the number holds by then
/// (and abort a debug build of the program where it holds nothing).
#[derive(Debug)]
pub(crate) struct OwnFd {
    fd: RawFd,
    /// What it held when taken over; `None` if even that could not be told (never ours then).
    identity: Option<Identity>,
}

impl OwnFd {
    /// Take `file` over, as it is now.
    pub(crate) fn new(file: File) -> OwnFd {
        let fd = file.into_raw_fd();
        OwnFd { fd, identity: Identity::of(fd) }
    }

    /// Whether the number still holds the file it was opened on.
    pub(crate) fn is_ours(&self) -> bool {
        self.identity.is_some() && Identity::of(self.fd) == self.identity
    }

    /// The number, for a call the caller checks [`OwnFd::is_ours`] around.
    pub(crate) fn number(&self) -> RawFd {
        self.fd
    }

    /// Write from `buf` once (a partial write is the caller's to go on with); `None`, nothing
    /// written, when the number no longer holds the file.
    pub(crate) fn write(&self, buf: &[u8]) -> Option<io::Result<usize>> {
        if !self.is_ours() {
            return None;
        }
        // SAFETY: writing `buf.len()` bytes from a live slice to a descriptor checked above.
        let written = unsafe { libc::write(self.fd, buf.as_ptr().cast(), buf.len()) };
        Some(usize::try_from(written).map_err(|_| io::Error::last_os_error()))
    }

    /// Fill `buf` from `offset`; `None` when the number does not hold the file before or after
    /// the read (what was read may then be the program's, and is not to be used).
    pub(crate) fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Option<io::Result<()>> {
        if !self.is_ours() {
            return None;
        }
        // Through a `File` that is never dropped: its drop would close the number.
        // SAFETY: the descriptor is open (checked above); the `File` is forgotten, not closed.
        let file = std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(self.fd) });
        let read = std::os::unix::fs::FileExt::read_exact_at(&*file, buf, offset);
        self.is_ours().then_some(read)
    }
}

impl Drop for OwnFd {
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

    fn temp_file(name: &str, contents: &[u8]) -> (std::path::PathBuf, File) {
        let path = std::env::temp_dir().join(format!("memtrace-descriptor-{name}-{}", std::process::id()));
        std::fs::write(&path, contents).unwrap();
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        (path, file)
    }

    #[test]
    fn a_descriptor_is_moved_high_and_closed_on_exec() {
        let (path, file) = temp_file("high", b"");
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

    /// A number the program has put a file of its own on is neither read, written nor closed,
    /// and what a read gets is not used.
    #[test]
    fn a_number_the_program_reused_is_neither_read_written_nor_closed() {
        let (path, file) = temp_file("ours", b"the tracer's");
        let (other_path, other) = temp_file("theirs", b"the program's");
        let own = OwnFd::new(file);
        let mut read = [0u8; 5];
        assert!(matches!(own.read_exact_at(&mut read, 4), Some(Ok(()))));
        assert_eq!(&read, b"trace");
        // SAFETY: descriptors of ours; the program's file on the tracer's number.
        assert_eq!(unsafe { libc::dup2(other.as_raw_fd(), own.fd) }, own.fd);
        assert!(own.read_exact_at(&mut read, 4).is_none());
        assert!(own.write(b"trace bytes").is_none());
        let fd = own.fd;
        drop(own);
        // Still open: the program's.
        assert_eq!(Identity::of(fd), Identity::of(other.as_raw_fd()));
        assert_eq!(std::fs::read(&path).unwrap(), b"the tracer's");
        assert_eq!(std::fs::read(&other_path).unwrap(), b"the program's");
        // SAFETY: the duplicate made above.
        unsafe { libc::close(fd) };
        let _ = (std::fs::remove_file(path), std::fs::remove_file(other_path));
    }
}
