//! The way a window's trace (`trace_window`) leaves the writer thread: [`WindowSink`], the
//! `Write` the writer's trace writer writes it to, hands each packet to a bounded queue and
//! never blocks; the caller's thread takes them off ([`Packets`]) and writes them to its own
//! output. A caller that falls behind by the whole queue loses its window (the writer ends
//! it, and the caller is told), never the writer its pace.

use std::io::{self, Write};
use std::time::Instant;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError};

/// Packets a window's queue holds: a packet is at most 32 KiB (`format::trace`'s buffer), so
/// 16 MiB at most, taken only while the caller is behind: room for the burst of a window's
/// start, the live blocks (some 20 bytes each), while the caller writes them out.
const QUEUED_PACKETS: usize = 512;

/// The writer thread's end of a window's queue.
pub(crate) struct WindowSink {
    packets: Sender<Vec<u8>>,
}

/// The caller's end of a window's queue.
pub(crate) struct Packets {
    packets: Receiver<Vec<u8>>,
}

/// A window's queue.
pub(crate) fn queue() -> (WindowSink, Packets) {
    let (packets, received) = crossbeam_channel::bounded(QUEUED_PACKETS);
    (WindowSink { packets }, Packets { packets: received })
}

impl Write for WindowSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.packets.try_send(buf.to_vec()) {
            Ok(()) => Ok(buf.len()),
            Err(TrySendError::Full(_)) => Err(io::Error::other("the window's reader fell behind")),
            Err(TrySendError::Disconnected(_)) => Err(io::Error::other("the window's reader is gone")),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What [`Packets::next`] found.
pub(crate) enum Next {
    Packet(Vec<u8>),
    /// Nothing by the deadline.
    Deadline,
    /// The writer ended the window (closed it, or dropped it).
    Ended,
}

impl Packets {
    /// The next packet, waiting until `deadline` at most.
    pub(crate) fn next(&self, deadline: Instant) -> Next {
        match self.packets.recv_deadline(deadline) {
            Ok(packet) => Next::Packet(packet),
            Err(RecvTimeoutError::Timeout) => Next::Deadline,
            Err(RecvTimeoutError::Disconnected) => Next::Ended,
        }
    }
}
