//! Opening the trace file: which names are refused, and an open that never destroys a file
//! that is not a trace, never follows a symbolic link another user planted, never waits, and
//! locks the file.
//!
//! Refused, with the file left as it is: a name that is empty or only whitespace; a file that
//! is neither empty nor a trace (the trace magic at its start), unless it is a FIFO or a
//! character device, which are written as they are; a terminal; the program's own standard
//! output or error (a descriptor 1 or 2 on the same file), but `/dev/null`; and a symbolic link
//! in a world-writable sticky directory (`/tmp`) owned neither by this process's user nor by
//! the directory's owner, as Linux's `fs.protected_symlinks` refuses to follow it, where the
//! kernel does not. Only the name's last component is held to that rule: the directories on
//! the way are the kernel's to resolve.
//!
//! The name is looked at and opened relative to a descriptor of its directory, without
//! following a symbolic link unless it was looked at first (`O_NOFOLLOW` otherwise), and what
//! was opened is checked to be what was looked at (`fstat` against `lstat`): a name changed
//! meanwhile is looked at again, so that no check applies to one file and the open to another.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::config::StartError;
use super::descriptor::{move_high, stat_of, Identity, OwnFd};
use crate::format::trace::MAGIC;

/// How many times a name that changes between its look and its open is looked at again.
const ATTEMPTS: usize = 8;

/// A trace file opened for writing and locked, empty.
pub(crate) struct Opened {
    pub(crate) file: File,
    /// The earlier file at the name, unlinked rather than truncated (see
    /// [`unlink_if_replaceable`]): closed by the writer thread, where freeing its blocks costs
    /// the program nothing.
    pub(crate) replaced: Option<File>,
    /// The directory and the name in it, and what the name held if this start created it: a
    /// failed start removes it again ([`Opened::remove_if_created`]); not a replacement, which a
    /// failed start leaves empty, as it leaves a truncated file.
    dir: OwnFd,
    name: CString,
    created: Option<Identity>,
}

impl Opened {
    /// Remove the file if this start created it and its name still holds it.
    pub(crate) fn remove_if_created(&self) {
        if self.dir.is_ours() && self.created.is_some() && self.named(libc::AT_SYMLINK_NOFOLLOW) == self.created {
            // SAFETY: a directory descriptor checked above and a NUL-terminated name.
            unsafe { libc::unlinkat(self.dir.number(), self.name.as_ptr(), 0) };
        }
    }

    /// What the name holds (`flags`: whether a symbolic link is followed).
    fn named(&self, flags: libc::c_int) -> Option<Identity> {
        stat_at(&self.dir, &self.name, flags).ok().as_ref().map(Identity::from)
    }
}

/// Open `path` for writing, as the module doc says, lock it, and empty it: a regular file of
/// this user's and group's with no other link is replaced by a new file of its mode (see
/// [`unlink_if_replaceable`]), another trace truncated, a new file created with mode 0600.
/// Never waits: a FIFO that no process reads gives [`StartError::NoReader`] (opening it for
/// writing would block until one opens it).
pub(crate) fn open_locked(path: &Path) -> Result<Opened, StartError> {
    if path.to_str().is_some_and(|p| p.trim().is_empty()) {
        return Err(StartError::BlankPath { path: path.to_owned() });
    }
    let open_error = |source| open_error(path, source);
    let (dir, name) = split(path).ok_or_else(|| open_error(io::Error::from_raw_os_error(libc::EISDIR)))?;
    let dir = open_dir(dir).map_err(open_error)?;
    let dir_stat = stat_of(dir.number()).ok_or_else(|| open_error(io::Error::last_os_error()))?;
    for _ in 0..ATTEMPTS {
        let Some((file, created)) = open_as_looked_at(&dir, &dir_stat, &name, path)? else { continue };
        refuse_program_output(&file, path)?;
        let file = move_high(file);
        lock(&file, path)?;
        let created = created.then(|| Identity::of(file.as_raw_fd())).flatten();
        let mut opened = Opened { file, replaced: None, dir, name, created };
        // An empty file (new, a device, a FIFO) is left as it is.
        let Some(metadata) = opened.file.metadata().ok().filter(|m| m.len() > 0) else { return Ok(opened) };
        if let Some(mode) = unlink_if_replaceable(&opened, &metadata) {
            let new = open_at(&opened.dir, &opened.name, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, mode)
                .map(move_high)
                .map_err(open_error)?;
            // The mode as it was, whatever the umask.
            let _ = new.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode));
            lock(&new, path)?;
            opened.replaced = Some(std::mem::replace(&mut opened.file, new));
            return Ok(opened);
        }
        // Errors ignored, as upstream does: devices cannot be truncated.
        let _ = opened.file.set_len(0);
        return Ok(opened);
    }
    Err(open_error(io::Error::other("the file kept changing while it was opened")))
}

/// Why `path` could not be opened: a FIFO with no reader gives `ENXIO` when opened without
/// waiting.
fn open_error(path: &Path, source: io::Error) -> StartError {
    match source.raw_os_error() {
        Some(libc::ENXIO) => StartError::NoReader { path: path.to_owned() },
        _ => StartError::Open { path: path.to_owned(), source },
    }
}

/// `path`'s directory and last component; `None` for a name that ends in a directory.
fn split(path: &Path) -> Option<(&Path, CString)> {
    if path.as_os_str().as_bytes().ends_with(b"/") {
        return None;
    }
    let name = path.file_name()?;
    let dir = path.parent().filter(|dir| !dir.as_os_str().is_empty()).unwrap_or(Path::new("."));
    Some((dir, CString::new(name.as_bytes()).ok()?))
}

/// A descriptor of the directory `dir` to open names in, of the tracer's own.
fn open_dir(dir: &Path) -> io::Result<OwnFd> {
    let dir = CString::new(dir.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a NUL-terminated name; the descriptor returned is ours alone.
    let fd = unsafe { libc::open(dir.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    Ok(OwnFd::new(unsafe { File::from_raw_fd(fd) }))
}

/// `fstatat(dir, name, flags)`.
fn stat_at(dir: &OwnFd, name: &CString, flags: libc::c_int) -> io::Result<libc::stat> {
    // SAFETY: a zeroed `stat` is valid, filled in by the call; a NUL-terminated name.
    unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        if libc::fstatat(dir.number(), name.as_ptr(), &mut stat, flags) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stat)
    }
}

/// `openat(dir, name, flags | …, mode)`, never waiting for a FIFO's reader nor taking a
/// terminal as the process's controlling one.
fn open_at(dir: &OwnFd, name: &CString, flags: libc::c_int, mode: u32) -> io::Result<File> {
    let flags = flags | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: a NUL-terminated name; the descriptor returned is ours alone.
    let fd = unsafe { libc::openat(dir.number(), name.as_ptr(), flags, mode as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Open `name` in `dir` (of `dir_stat`) as it is when looked at, if it is a file a trace may be
/// written to: the file and whether this created it; `None` when the name changed between the
/// look and the open (look again).
fn open_as_looked_at(
    dir: &OwnFd,
    dir_stat: &libc::stat,
    name: &CString,
    path: &Path,
) -> Result<Option<(File, bool)>, StartError> {
    let open_error = |source| open_error(path, source);
    let changed = |e: &io::Error| matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ELOOP | libc::EEXIST));
    let named = match stat_at(dir, name, libc::AT_SYMLINK_NOFOLLOW) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
            return match open_at(dir, name, flags, 0o600) {
                Ok(file) => Ok(Some((file, true))),
                Err(e) if changed(&e) => Ok(None),
                Err(e) => Err(open_error(e)),
            };
        }
        named => named.map_err(open_error)?,
    };
    let is_link = named.st_mode & libc::S_IFMT == libc::S_IFLNK;
    if is_link && planted(dir_stat, &named) {
        return Err(StartError::PlantedSymlink { path: path.to_owned() });
    }
    // What is opened: the link's target (a dangling link is an error, as it was), or the name.
    let looked_at = if is_link { stat_at(dir, name, 0).map_err(open_error)? } else { named };
    let looked_at = Identity::from(&looked_at);
    // Read too, for its first bytes, unless it is a FIFO or a character device.
    let access = if is_stream(&looked_at) { libc::O_WRONLY } else { libc::O_RDWR };
    let flags = if is_link { access } else { access | libc::O_NOFOLLOW };
    let file = match open_at(dir, name, flags, 0) {
        Ok(file) => file,
        Err(e) if changed(&e) => return Ok(None),
        Err(e) => return Err(open_error(e)),
    };
    let still_the_link = || stat_at(dir, name, libc::AT_SYMLINK_NOFOLLOW).is_ok_and(|now| same_file(&now, &named));
    if Identity::of(file.as_raw_fd()) != Some(looked_at) || (is_link && !still_the_link()) {
        return Ok(None);
    }
    if !is_stream(&looked_at) && !empty_or_a_trace(&file) {
        return Err(StartError::NotATrace { path: path.to_owned() });
    }
    Ok(Some((file, false)))
}

/// Whether `file` is a FIFO or a character device: neither is emptied nor read.
fn is_stream(file: &Identity) -> bool {
    matches!(file.kind, libc::S_IFIFO | libc::S_IFCHR)
}

/// Whether `a` and `b` are the same file.
fn same_file(a: &libc::stat, b: &libc::stat) -> bool {
    (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
}

/// Whether the symbolic link `link`, in the directory of `dir_stat`, is one the kernel's
/// `protected_symlinks` rule refuses to follow: in a world-writable sticky directory, owned
/// neither by the follower nor by the directory's owner.
fn planted(dir_stat: &libc::stat, link: &libc::stat) -> bool {
    let sticky_and_world_writable = dir_stat.st_mode & (libc::S_ISVTX | libc::S_IWOTH) == libc::S_ISVTX | libc::S_IWOTH;
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    sticky_and_world_writable && link.st_uid != euid && link.st_uid != dir_stat.st_uid
}

/// Whether `file` is empty or starts with the trace magic (what every trace's first packet
/// starts with). A file too short for the magic, or one that cannot be read, is neither.
fn empty_or_a_trace(file: &File) -> bool {
    let mut start = [0u8; 4];
    let mut filled = 0;
    while filled < start.len() {
        match std::os::unix::fs::FileExt::read_at(file, &mut start[filled..], filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    filled == 0 || start == MAGIC.to_le_bytes()
}

/// [`StartError::Terminal`] for a terminal, [`StartError::ProgramOutput`] for the file of
/// descriptor 1 or 2 (but `/dev/null`, where the trace mixes with nothing).
fn refuse_program_output(file: &File, path: &Path) -> Result<(), StartError> {
    let fd = file.as_raw_fd();
    // SAFETY: an open descriptor for the duration of the call.
    if unsafe { libc::isatty(fd) } == 1 {
        return Err(StartError::Terminal { path: path.to_owned() });
    }
    let Some(stat) = stat_of(fd) else { return Ok(()) };
    let null = stat.st_mode & libc::S_IFMT == libc::S_IFCHR && stat.st_rdev == libc::makedev(1, 3);
    let opened = Some(Identity::from(&stat));
    let programs = [libc::STDOUT_FILENO, libc::STDERR_FILENO].into_iter().any(|out| Identity::of(out) == opened);
    if programs && !null {
        return Err(StartError::ProgramOutput { path: path.to_owned() });
    }
    Ok(())
}

/// Make writes to `file` (opened without waiting) block as usual, and take its `lockf` lock:
/// [`StartError::Locked`] if another process holds it.
fn lock(file: &File, path: &Path) -> Result<(), StartError> {
    // A reader that falls behind holds the writer thread up, never the program (stopping
    // waits for it at most the stop timeout).
    // SAFETY: `file` is an open descriptor for the duration of the calls.
    unsafe {
        let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK);
    }
    // SAFETY: `file` is an open descriptor for the duration of the call.
    if unsafe { libc::lockf(file.as_raw_fd(), libc::F_TLOCK, 0) } != 0 {
        let e = io::Error::last_os_error();
        if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) {
            return Err(StartError::Locked { path: path.to_owned() });
        }
        // Other failures (a device such as /dev/null that cannot be locked): go on unlocked.
    }
    Ok(())
}

/// Unlink the file `opened` holds, of `metadata`, so that a new one can be created in its
/// place, if nothing but its contents would be lost: a regular file of this user's and group's
/// (a new file would be too), with no other link, that the name holds itself (not through a
/// symbolic link). Returns its mode, for the new file; `None` (nothing done) otherwise, and
/// the caller truncates it. What else the old file had (extended attributes, ACLs) is not
/// carried over.
///
/// Truncating a trace left by an earlier run freed its blocks on the program's thread (on ext4,
/// in a journal transaction, after the write-back that the earlier run's close had started),
/// and on ext4 marked the file so that its close at the end of the run started a write-back of
/// the new trace, on the writer, which a short program's exit waits for. An unlinked file's
/// blocks are freed when its last descriptor closes: the writer's.
fn unlink_if_replaceable(opened: &Opened, metadata: &std::fs::Metadata) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid and getegid cannot fail.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let ours =
        metadata.file_type().is_file() && metadata.nlink() == 1 && metadata.uid() == euid && metadata.gid() == egid;
    let same = opened.named(libc::AT_SYMLINK_NOFOLLOW) == Identity::of(opened.file.as_raw_fd());
    // SAFETY: the directory's descriptor, checked first, and a NUL-terminated name.
    let unlinked =
        || opened.dir.is_ours() && unsafe { libc::unlinkat(opened.dir.number(), opened.name.as_ptr(), 0) } == 0;
    (ours && same && unlinked()).then_some(metadata.mode() & 0o7777)
}
