//! The error type of every fallible read or write of a trace.
//!
//! Following `gimli` and `object`, a decoding error never panics: it carries the byte offset
//! in the file where the problem was found and a [`ErrorKind`] saying what was wrong.

use std::fmt;
use std::io;

/// What went wrong while reading or writing a trace.
#[derive(Debug)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An I/O error from the underlying file or stream.
    Io(io::Error),
    /// A read needed `needed` more bytes than the packet (or file) holds.
    UnexpectedEnd {
        /// Bytes missing.
        needed: usize,
    },
    /// A packet did not start with the magic number `0xC1FC1FC1`.
    BadMagic(u32),
    /// The packet's format version is newer than this reader understands.
    UnsupportedVersion(u16),
    /// The packet's declared size is smaller than its header, or unreasonably large.
    BadPacketSize(u32),
    /// `timestamp_begin > timestamp_end` in a packet header.
    BadPacketTimes {
        /// The header's `timestamp_begin`.
        begin: u64,
        /// The header's `timestamp_end`.
        end: u64,
    },
    /// `alloc_id_begin > alloc_id_end` in a packet header.
    BadPacketIds {
        /// The header's `alloc_id_begin`.
        begin: u64,
        /// The header's `alloc_id_end`.
        end: u64,
    },
    /// The first packet is not a well-formed trace-info packet.
    BadTraceInfo(&'static str),
    /// An event's time lies outside its packet's time range.
    TimeOutOfPacket {
        /// The event's reconstructed time (µs).
        time: u64,
    },
    /// An event's time is earlier than the previous event of the same domain.
    TimeWentBackwards {
        /// The event's time (µs).
        time: u64,
        /// The time of the domain's previous event (µs).
        previous: u64,
    },
    /// An event header named an event id this format does not have.
    UnknownEvent(u32),
    /// An allocation's source byte was not 0 (minor), 1 (major) or 2 (external).
    BadAllocSource(u8),
    /// A promote event referred to an object id not yet allocated in its packet.
    NegativePromote(i64),
    /// A packet's allocation count disagrees with its header's `alloc_id_end`.
    AllocIdSync {
        /// The header's `alloc_id_end`.
        expected: u64,
        /// One past the id of the packet's last allocation.
        found: u64,
    },
    /// The packet's backtrace-cache verifier does not match the decoder's cache.
    CacheVerification {
        /// The bucket the verifier named.
        index: u16,
    },
    /// A location code was defined twice with different location lists.
    InconsistentLocation(u64),
    /// A backtrace used a location code that was never defined.
    UnknownLocationCode(u64),
    /// A location record referred to an empty slot of a move-to-front table.
    BadMtfIndex(u8),
    /// An event's length or sample count is out of range.
    BadAllocation(&'static str),
    /// A promote or collect refers to an object id below 0.
    ObjectIdOutOfRange(i64),
    /// A backtrace grew past the reader's limit (2^20 frames), which only corrupt input does.
    BacktraceTooLong,
    /// The trace writer was asked to do something the format cannot express.
    Unsupported(&'static str),
    /// The trace uses more distinct domains than the reader supports (128).
    TooManyDomains,
    /// The process id changed since the writer was created (we are a forked child).
    PidChanged,
    /// The tracer's writer thread panicked (a bug): the trace ends at its last flush.
    WriterPanicked,
    /// The tracer's writer thread did not finish within the stop timeout (blocked writing to
    /// a pipe nobody reads, say) and was left behind: the trace ends at its last write.
    WriterStalled(std::time::Duration),
}

/// An error reading or writing a trace, with the byte offset where it happened when known.
#[derive(Debug)]
pub struct Error {
    offset: Option<u64>,
    kind: ErrorKind,
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error found at byte `offset` of the trace.
    pub fn at(offset: u64, kind: ErrorKind) -> Error {
        Error { offset: Some(offset), kind }
    }

    /// An error with no meaningful position (e.g. a writer-side error).
    pub fn new(kind: ErrorKind) -> Error {
        Error { offset: None, kind }
    }

    /// The byte offset in the trace where the problem was detected.
    pub fn offset(&self) -> Option<u64> {
        self.offset
    }

    /// What went wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        Error::new(ErrorKind::Io(e))
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ErrorKind::*;
        match self {
            Io(e) => write!(f, "I/O error: {e}"),
            UnexpectedEnd { needed } => write!(f, "unexpected end of data ({needed} more bytes needed)"),
            BadMagic(m) => write!(f, "bad packet magic {m:#010x}"),
            UnsupportedVersion(v) => write!(f, "trace format v{v:03}, but expected v003 or older"),
            BadPacketSize(bits) => write!(f, "bad packet size ({bits} bits)"),
            BadPacketTimes { begin, end } => write!(f, "packet timestamps out of order ({begin} > {end})"),
            BadPacketIds { begin, end } => write!(f, "packet allocation ids out of order ({begin} > {end})"),
            BadTraceInfo(what) => write!(f, "bad trace-info packet: {what}"),
            TimeOutOfPacket { time } => write!(f, "event time {time} outside its packet's bounds"),
            TimeWentBackwards { time, previous } => {
                write!(f, "event time {time} earlier than the previous event ({previous})")
            }
            UnknownEvent(id) => write!(f, "unknown event code {id}"),
            BadAllocSource(s) => write!(f, "bad allocation source {s}"),
            NegativePromote(d) => write!(f, "promote of a not-yet-allocated object (delta {d})"),
            AllocIdSync { expected, found } => {
                write!(f, "alloc id sync: packet header says {expected}, events reach {found}")
            }
            CacheVerification { index } => write!(f, "backtrace cache verification failed at bucket {index}"),
            InconsistentLocation(code) => write!(f, "inconsistent location info for code {code:08x}"),
            UnknownLocationCode(code) => write!(f, "invalid location code {code:08x}"),
            BadMtfIndex(i) => write!(f, "location record refers to empty table slot {i}"),
            BadAllocation(what) => write!(f, "bad allocation event: {what}"),
            ObjectIdOutOfRange(id) => write!(f, "object id {id} out of range"),
            BacktraceTooLong => write!(f, "backtrace longer than 2^20 frames"),
            Unsupported(what) => write!(f, "unsupported: {what}"),
            TooManyDomains => write!(f, "more than 128 domains"),
            PidChanged => write!(f, "pid changed (forked child): not writing to the parent's trace"),
            WriterPanicked => write!(f, "the trace writer panicked"),
            WriterStalled(waited) => write!(f, "the trace writer did not finish within {waited:?}"),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.offset {
            Some(offset) => write!(f, "at byte {offset}: {}", self.kind),
            None => self.kind.fmt(f),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}
