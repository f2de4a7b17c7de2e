//! Traces: packets of events, written by [`writer::Writer`] and read by [`reader::Reader`]
//! (FORMAT.md §2–§11; upstream `Trace`).
//!
//! This module holds what both sides share: the trace [`Info`], the event types, and the
//! packet header layout.

mod reader;
mod writer;

use crate::format::backtrace_codec::CacheVerifier;

pub use reader::{writer_holds_lock, Alloc, Event, EventKind, LocationTable, Reader, Warning};
pub(crate) use writer::trace_info_packet;
pub use writer::{NewAlloc, Writer};

/// A timestamp: microseconds since the Unix epoch.
pub type Timestamp = u64;

/// An object (allocation) id, unique within a trace.
pub type ObjectId = u64;

/// Format version written by this crate's writer.
pub const FORMAT_VERSION: u16 = 3;
/// Magic number at the start of every packet.
pub(crate) const MAGIC: u32 = 0xC1FC_1FC1;
/// Size of every packet the writer produces (and the most upstream's reader accepts).
pub(crate) const PACKET_BUFFER_SIZE: usize = 1 << 15;
/// Header size of version-3 packets (with the `domain` field).
pub(crate) const HEADER_SIZE_V3: usize = 68;
/// Header size of version-1 and version-2 packets.
pub(crate) const HEADER_SIZE_V1: usize = 66;
/// Mask of the timestamp bits stored in an event header.
pub(crate) const TIME_MASK: u64 = 0x1FF_FFFF;

/// Event ids (FORMAT.md §3).
pub(crate) mod event_id {
    pub const TRACE_INFO: u32 = 0;
    pub const LOCATION: u32 = 1;
    pub const ALLOC: u32 = 2;
    pub const PROMOTE: u32 = 3;
    pub const COLLECT: u32 = 4;
    /// Short allocs are `SHORT_ALLOC_BASE + length` for lengths 1..=16.
    pub const SHORT_ALLOC_BASE: u32 = 100;
    pub const SHORT_ALLOC_MAX_LENGTH: u64 = 16;
}

/// The trace-wide metadata of the first packet (FORMAT.md §4).
#[derive(Debug, Clone, PartialEq)]
pub struct Info {
    /// Sampling rate: the probability that any one word allocated is sampled.
    pub sample_rate: f64,
    /// Bits per word of the traced program (64).
    pub word_size: u8,
    /// Path of the traced executable.
    pub executable_name: Vec<u8>,
    /// Host the trace was taken on.
    pub host_name: Vec<u8>,
    /// Upstream: the OCaml runtime parameters. This crate writes its own name, version and
    /// settings here.
    pub runtime_params: Vec<u8>,
    /// Process id of the traced program.
    pub pid: u64,
    /// Domain of the trace-info packet (0 for this crate and for v1/v2 traces).
    pub initial_domain: u16,
    /// When tracing started.
    pub start_time: Timestamp,
    /// A free-form description given by the user; empty is stored as `None`.
    pub context: Option<Vec<u8>>,
}

/// The runtime parameter (one of [`Info::runtime_params`]' comma-separated ones) of a trace
/// that begins with the blocks live at its start, carried over from the session that wrote
/// it: its allocations of source [`AllocSource::Major`] are those blocks, allocated before the
/// trace began (docs/FORMAT.md, "Series and windows").
pub const LIVE_AT_START_PARAM: &str = "live-at-start=major";

impl Info {
    /// Whether the trace's allocations of source [`AllocSource::Major`] are the blocks live at
    /// its start (see [`LIVE_AT_START_PARAM`]), not allocations made while it ran.
    pub fn begins_with_live_blocks(&self) -> bool {
        self.runtime_params.split(|&b| b == b',').any(|param| param == LIVE_AT_START_PARAM.as_bytes())
    }

    /// Estimated bytes represented by `nsamples` samples at this trace's rate and word size.
    pub fn bytes_for_samples(&self, nsamples: u64) -> f64 {
        nsamples as f64 * (self.word_size as f64 / 8.0) / self.sample_rate
    }
}

/// Where an allocation came from. Rust allocations are all [`AllocSource::External`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AllocSource {
    /// OCaml minor heap.
    Minor,
    /// OCaml major heap.
    Major,
    /// Memory allocated outside the OCaml heap (for Rust, every allocation).
    External,
}

impl AllocSource {
    pub(crate) fn from_byte(b: u8) -> Option<AllocSource> {
        match b {
            0 => Some(AllocSource::Minor),
            1 => Some(AllocSource::Major),
            2 => Some(AllocSource::External),
            _ => None,
        }
    }

    pub(crate) fn to_byte(self) -> u8 {
        match self {
            AllocSource::Minor => 0,
            AllocSource::Major => 1,
            AllocSource::External => 2,
        }
    }
}

/// The `flush_duration` of the last packet of a trace that this crate's tracer closed: a field
/// every writer sets to 0 and no reader reads (`docs/FORMAT.md`, §2.2), which so tells a
/// finished trace from one whose writer has not closed it, in a way every reader accepts.
pub(crate) const CLOSED_MARK: u32 = 0x434c_4f53;

/// A parsed packet header (FORMAT.md §2.2).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PacketHeader {
    pub size_bits: u32,
    pub time_begin: Timestamp,
    pub time_end: Timestamp,
    /// [`CLOSED_MARK`] in the last packet of a trace its writer closed (see
    /// [`Writer::close_marked`]); 0 elsewhere.
    pub flush_duration: u32,
    pub version: u16,
    pub pid: u64,
    pub domain: u16,
    pub verifier: CacheVerifier,
    pub alloc_id_begin: ObjectId,
    pub alloc_id_end: ObjectId,
}

impl PacketHeader {
    pub fn header_size(version: u16) -> usize {
        if version >= 3 {
            HEADER_SIZE_V3
        } else {
            HEADER_SIZE_V1
        }
    }
}
