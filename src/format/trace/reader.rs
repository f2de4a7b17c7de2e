//! The streaming trace reader (FORMAT.md §2.5–§11).
//!
//! [`Reader`] holds one packet at a time, so memory stays bounded whatever the file size:
//! it grows only with the number of distinct location codes and domains. Events are
//! returned one by one by [`Reader::next_event`]; an allocation's backtrace borrows the
//! decoder's buffer until the next call, so the read loop allocates nothing per event.
//!
//! Every malformed input ends in an [`Error`] naming the byte offset, never a panic. A file
//! cut inside its last packet (or inside a packet header) is not an error: the events of
//! every complete packet are delivered, the cut packet is skipped, and a
//! [`Warning::TruncatedPacket`] is recorded — upstream's behaviour, except that upstream
//! treats a cut inside a header as fatal.

use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;
use std::sync::Arc;

use super::{
    event_id, AllocSource, Info, ObjectId, PacketHeader, Timestamp, CLOSED_MARK, FORMAT_VERSION, HEADER_SIZE_V1, MAGIC,
    TIME_MASK,
};
use crate::format::backtrace_codec::{self, CacheVerifier};
use crate::format::buf::ReadCursor;
use crate::format::error::{Error, ErrorKind, Result};
use crate::format::hash::FastMap;
use crate::format::location_codec::{self, Location};

/// Largest packet the reader accepts. Writers produce at most 32 KiB; this leaves room for
/// other writers while bounding the memory a corrupt size field can claim.
const MAX_PACKET_SIZE: usize = 1 << 20;
/// Most distinct domains a trace may use (OCaml 5's default limit). Each costs a 160 KiB
/// backtrace cache, so a corrupt file must not be able to create them without bound.
const MAX_DOMAINS: usize = 128;

/// One traced event, with the absolute time it happened and the domain that recorded it.
#[derive(Debug, Clone, Copy)]
pub struct Event<'a> {
    /// When the event happened (µs since the Unix epoch).
    pub time: Timestamp,
    /// The domain (upstream: OCaml 5 domain) whose packet held the event.
    pub domain: u16,
    /// What happened.
    pub kind: EventKind<'a>,
    /// The locations of every code defined so far, to look up the backtrace's frames.
    pub locations: &'a LocationTable,
}

/// Location lists by location code, shared by all domains (§5.5).
#[derive(Debug, Default)]
pub struct LocationTable {
    map: FastMap<u64, Arc<[Location]>>,
}

impl LocationTable {
    /// The locations bound to `code`, or an [`ErrorKind::UnknownLocationCode`] error.
    pub fn get(&self, code: u64) -> Result<&[Location]> {
        self.map.get(&code).map(|l| &l[..]).ok_or_else(|| Error::new(ErrorKind::UnknownLocationCode(code)))
    }

    /// The shared location list of `code`, for re-encoding without copying.
    pub fn get_shared(&self, code: u64) -> Option<Arc<[Location]>> {
        self.map.get(&code).cloned()
    }

    /// Every code defined so far with its locations, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &[Location])> {
        self.map.iter().map(|(&code, l)| (code, &l[..]))
    }

    /// Number of codes defined.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no code is defined.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// The kinds of events a caller sees (location events are absorbed by the reader).
#[derive(Debug, Clone, Copy)]
pub enum EventKind<'a> {
    /// A sampled allocation.
    Alloc(Alloc<'a>),
    /// An object moved from the OCaml minor heap to the major heap.
    Promote {
        /// The object's id.
        id: ObjectId,
    },
    /// A sampled object was freed.
    Collect {
        /// The object's id.
        id: ObjectId,
    },
}

/// A sampled allocation.
#[derive(Debug, Clone, Copy)]
pub struct Alloc<'a> {
    /// Object id (consecutive within a packet).
    pub id: ObjectId,
    /// Size in words.
    pub length: u64,
    /// Number of samples in the block; the block stands for `nsamples / rate` words.
    pub nsamples: u64,
    /// Where the memory came from.
    pub source: AllocSource,
    /// Frames shared with the previous allocation's backtrace, as stored in the file.
    pub common_prefix: u64,
    /// Location codes, outermost caller first, allocation site last; empty when backtrace
    /// decoding is off. Look codes up with [`Reader::lookup_location_code`].
    pub backtrace: &'a [u64],
}

/// Something unusual the reader skipped over without failing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// The file ends inside a packet (e.g. the traced program was killed mid-write); the
    /// packet starting at `offset` was skipped and the read ended there.
    TruncatedPacket {
        /// File offset of the cut packet.
        offset: u64,
    },
    /// A packet written by another process (a forked child) was skipped.
    WrongPid {
        /// File offset of the skipped packet.
        offset: u64,
        /// The pid in the packet.
        pid: u64,
        /// The pid of the trace.
        expected: u64,
    },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::TruncatedPacket { .. } => write!(f, "skipping truncated packet"),
            Warning::WrongPid { pid, expected, .. } => {
                write!(f, "skipping bad packet (wrong pid: {pid}, but tracing {expected})")
            }
        }
    }
}

/// Decoder state kept per domain (§11).
struct DomainState {
    domain: u16,
    locations: location_codec::Decoder,
    backtraces: backtrace_codec::Reader,
    last_time: Timestamp,
}

/// The packet being read.
struct Packet {
    header: PacketHeader,
    /// File offset of the first content byte.
    content_offset: u64,
    content: Vec<u8>,
    pos: usize,
    /// Running allocation id (§9).
    next_id: ObjectId,
    /// Index of the packet's domain in `Reader::domains`.
    domain_index: usize,
}

/// A streaming reader of memtrace traces, versions 1 to 3.
pub struct Reader<R: Read = BufReader<File>> {
    input: R,
    /// File offset of the next unread byte of `input`.
    offset: u64,
    info: Info,
    packet: Packet,
    in_packet: bool,
    finished: bool,
    domains: Vec<DomainState>,
    locations: LocationTable,
    scratch_locations: Vec<Location>,
    decode_backtraces: bool,
    warnings: Vec<Warning>,
    /// Whether the last packet read carries the writer's closing mark.
    closed: bool,
}

impl<R: Read> fmt::Debug for Reader<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reader").field("info", &self.info).field("offset", &self.offset).finish_non_exhaustive()
    }
}

/// Whether another process holds the write lock of the trace file at `path`: a tracer of this
/// crate (like upstream's) locks the file while it writes the trace, so the trace is still
/// being written. False when the file cannot be opened or its lock tested.
pub fn writer_holds_lock(path: impl AsRef<Path>) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(file) = File::open(path) else { return false };
    // SAFETY: `flock` is plain data, for which all zeros is a value.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: `file` is open for the call, and `lock` a valid, writable `flock`.
    let tested = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &mut lock) };
    tested == 0 && lock.l_type != libc::F_UNLCK as libc::c_short && lock.l_pid != std::process::id() as libc::pid_t
}

impl Reader<BufReader<File>> {
    /// Open a trace file and read its trace-info packet.
    pub fn open(path: impl AsRef<Path>) -> Result<Reader<BufReader<File>>> {
        let file = File::open(path)?;
        Reader::new(BufReader::with_capacity(1 << 16, file))
    }
}

impl<R: Read> Reader<R> {
    /// Read a trace from `input`, starting with its trace-info packet.
    pub fn new(mut input: R) -> Result<Reader<R>> {
        let mut offset = 0;
        let (header, content) = match read_packet(&mut input, &mut offset)? {
            PacketRead::Complete { header, content } => (header, content),
            PacketRead::End => return Err(Error::at(0, ErrorKind::UnexpectedEnd { needed: HEADER_SIZE_V1 })),
            PacketRead::Truncated { needed, .. } => return Err(Error::at(offset, ErrorKind::UnexpectedEnd { needed })),
        };
        let content_offset = offset - content.len() as u64;
        let info = parse_info(&header, &content, content_offset)?;
        let first_domain = DomainState::new(info.initial_domain, info.start_time);
        Ok(Reader {
            input,
            offset,
            packet: Packet { header, content_offset, content, pos: 0, next_id: 0, domain_index: 0 },
            in_packet: false,
            finished: false,
            domains: vec![first_domain],
            locations: LocationTable::default(),
            scratch_locations: Vec::new(),
            decode_backtraces: true,
            warnings: Vec::new(),
            closed: false,
            info,
        })
    }

    /// The trace's metadata.
    pub fn info(&self) -> &Info {
        &self.info
    }

    /// Choose whether allocation backtraces are decoded (the default) or skipped, which is
    /// faster. Must be called before the first event is read.
    pub fn set_decode_backtraces(&mut self, decode: bool) {
        self.decode_backtraces = decode;
    }

    /// Things skipped so far without failing (a truncated last packet, foreign packets).
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }

    /// Whether the trace, read to its end, was closed by its writer: its last packet carries
    /// the mark this crate's tracer writes when it finishes a trace. False for a trace whose
    /// writer is still running or stopped without closing it (the program was killed), and for
    /// traces of writers that do not mark them (upstream's, [`Writer::close`](super::Writer::close)).
    pub fn closed_by_writer(&self) -> bool {
        self.finished && self.closed
    }

    /// Remove and return the warnings recorded so far.
    pub fn take_warnings(&mut self) -> Vec<Warning> {
        std::mem::take(&mut self.warnings)
    }

    /// True when the file ended inside a packet.
    pub fn is_truncated(&self) -> bool {
        self.warnings.iter().any(|w| matches!(w, Warning::TruncatedPacket { .. }))
    }

    /// Bytes of the file consumed so far (for progress reporting).
    pub fn bytes_read(&self) -> u64 {
        self.offset
    }

    /// The locations bound to `code` by the location events read so far.
    pub fn lookup_location_code(&self, code: u64) -> Result<&[Location]> {
        self.locations.get(code)
    }

    /// Every location code defined so far.
    pub fn locations(&self) -> &LocationTable {
        &self.locations
    }

    /// The next allocation, promote or collect event, or `None` at the end of the trace.
    pub fn next_event(&mut self) -> Result<Option<Event<'_>>> {
        loop {
            if self.finished {
                return Ok(None);
            }
            if !self.in_packet {
                self.next_packet()?;
                continue;
            }
            if self.packet.pos == self.packet.content.len() {
                let header = &self.packet.header;
                if self.packet.next_id != header.alloc_id_end {
                    return Err(Error::at(
                        self.packet.content_offset + self.packet.pos as u64,
                        ErrorKind::AllocIdSync { expected: header.alloc_id_end, found: self.packet.next_id },
                    ));
                }
                self.in_packet = false;
                continue;
            }
            if let Some((time, domain, kind)) = self.parse_event()? {
                let kind = match kind {
                    ParsedKind::Alloc { id, length, nsamples, source, common_prefix } => {
                        let backtrace = if self.decode_backtraces {
                            self.domains[self.packet.domain_index].backtraces.last_backtrace()
                        } else {
                            &[]
                        };
                        EventKind::Alloc(Alloc { id, length, nsamples, source, common_prefix, backtrace })
                    }
                    ParsedKind::Promote(id) => EventKind::Promote { id },
                    ParsedKind::Collect(id) => EventKind::Collect { id },
                };
                return Ok(Some(Event { time, domain, kind, locations: &self.locations }));
            }
        }
    }

    /// Read the next packet header and content, skipping foreign and cut packets.
    fn next_packet(&mut self) -> Result<()> {
        let start = self.offset;
        let header = match read_packet_into(&mut self.input, &mut self.offset, &mut self.packet.content)? {
            PacketRead::End => {
                self.finished = true;
                return Ok(());
            }
            PacketRead::Truncated { .. } => {
                self.warnings.push(Warning::TruncatedPacket { offset: start });
                self.finished = true;
                return Ok(());
            }
            PacketRead::Complete { header, .. } => header,
        };
        self.closed = header.flush_duration == CLOSED_MARK;
        if header.pid != self.info.pid {
            self.warnings.push(Warning::WrongPid { offset: start, pid: header.pid, expected: self.info.pid });
            return Ok(());
        }
        let domain_index = match self.domains.iter().position(|d| d.domain == header.domain) {
            Some(i) => i,
            None if self.domains.len() < MAX_DOMAINS => {
                self.domains.push(DomainState::new(header.domain, self.info.start_time));
                self.domains.len() - 1
            }
            None => return Err(Error::at(start + 38, ErrorKind::TooManyDomains)),
        };
        if self.decode_backtraces && !self.domains[domain_index].backtraces.check_cache_verifier(&header.verifier) {
            return Err(Error::at(start + 40, ErrorKind::CacheVerification { index: header.verifier.index }));
        }
        self.packet.header = header;
        self.packet.content_offset = self.offset - self.packet.content.len() as u64;
        self.packet.pos = 0;
        self.packet.next_id = header.alloc_id_begin;
        self.packet.domain_index = domain_index;
        self.in_packet = true;
        Ok(())
    }

    /// Parse one event of the current packet; `None` for location events.
    fn parse_event(&mut self) -> Result<Option<(Timestamp, u16, ParsedKind)>> {
        let Reader { packet, domains, locations, scratch_locations, decode_backtraces, .. } = self;
        let header = packet.header;
        let mut r = ReadCursor::new(&packet.content[packet.pos..], packet.content_offset + packet.pos as u64);
        let event_offset = r.offset();
        let word = r.get_u32()?;
        let mut low = word as u64 & TIME_MASK;
        if low < header.time_begin & TIME_MASK {
            low += TIME_MASK + 1;
        }
        // Wrapping: a corrupt `time_begin` near 2^64 must fail the bounds check below, not overflow.
        let time = (header.time_begin & !TIME_MASK).wrapping_add(low);
        if time < header.time_begin || time > header.time_end {
            return Err(Error::at(event_offset, ErrorKind::TimeOutOfPacket { time }));
        }
        let state = &mut domains[packet.domain_index];
        if time < state.last_time {
            return Err(Error::at(event_offset, ErrorKind::TimeWentBackwards { time, previous: state.last_time }));
        }
        state.last_time = time;
        let mut alloc = |r: &mut ReadCursor<'_>, length, nsamples, source, common_prefix, nencoded| -> Result<_> {
            if *decode_backtraces {
                state.backtraces.get_backtrace(r, nencoded, common_prefix as usize)?;
            } else {
                backtrace_codec::skip_backtrace(r, nencoded)?;
            }
            let id = packet.next_id;
            packet.next_id += 1;
            Ok(Some(ParsedKind::Alloc { id, length, nsamples, source, common_prefix }))
        };
        let parsed = match word >> 25 {
            event_id::LOCATION => {
                let code = r.get_u64()?;
                state.locations.get_location_list(&mut r, scratch_locations)?;
                match locations.map.get(&code) {
                    Some(known) if known[..] != scratch_locations[..] => {
                        return Err(Error::at(event_offset, ErrorKind::InconsistentLocation(code)));
                    }
                    Some(_) => {}
                    None => {
                        locations.map.insert(code, Arc::from(&scratch_locations[..]));
                    }
                }
                None
            }
            event_id::ALLOC => {
                let length = get_count(&mut r, "negative length")?;
                let nsamples = get_count(&mut r, "negative sample count")?;
                let source_byte = r.get_u8()?;
                let source = AllocSource::from_byte(source_byte)
                    .ok_or_else(|| r.error(ErrorKind::BadAllocSource(source_byte)))?;
                let common_prefix = get_count(&mut r, "negative common prefix")?;
                let nencoded = r.get_u16()? as usize;
                alloc(&mut r, length, nsamples, source, common_prefix, nencoded)?
            }
            id if (event_id::SHORT_ALLOC_BASE + 1..=event_id::SHORT_ALLOC_BASE + 16).contains(&id) => {
                let length = (id - event_id::SHORT_ALLOC_BASE) as u64;
                let common_prefix = get_count(&mut r, "negative common prefix")?;
                let nencoded = r.get_u8()? as usize;
                alloc(&mut r, length, 1, AllocSource::Minor, common_prefix, nencoded)?
            }
            event_id::PROMOTE => {
                let delta = r.get_vint()?;
                if delta < 0 {
                    return Err(Error::at(event_offset, ErrorKind::NegativePromote(delta)));
                }
                Some(ParsedKind::Promote(object_id(packet.next_id, delta, event_offset)?))
            }
            event_id::COLLECT => {
                let delta = r.get_vint()?;
                Some(ParsedKind::Collect(object_id(packet.next_id, delta, event_offset)?))
            }
            other => return Err(Error::at(event_offset, ErrorKind::UnknownEvent(other))),
        };
        packet.pos = (r.offset() - packet.content_offset) as usize;
        Ok(parsed.map(|kind| (time, header.domain, kind)))
    }
}

/// The id a promote or collect with `delta` refers to, given the packet's running id (§8).
fn object_id(next_id: ObjectId, delta: i64, offset: u64) -> Result<ObjectId> {
    let id = (next_id as i64).wrapping_sub(1).wrapping_sub(delta);
    match (next_id as i64).checked_sub(1).and_then(|last| last.checked_sub(delta)) {
        Some(id) if id >= 0 => Ok(id as ObjectId),
        _ => Err(Error::at(offset, ErrorKind::ObjectIdOutOfRange(id))),
    }
}

enum ParsedKind {
    Alloc { id: ObjectId, length: u64, nsamples: u64, source: AllocSource, common_prefix: u64 },
    Promote(ObjectId),
    Collect(ObjectId),
}

#[inline]
fn get_count(r: &mut ReadCursor<'_>, what: &'static str) -> Result<u64> {
    let offset = r.offset();
    let v = r.get_vint()?;
    u64::try_from(v).map_err(|_| Error::at(offset, ErrorKind::BadAllocation(what)))
}

impl DomainState {
    fn new(domain: u16, start_time: Timestamp) -> DomainState {
        DomainState {
            domain,
            locations: location_codec::Decoder::new(),
            backtraces: backtrace_codec::Reader::new(),
            last_time: start_time,
        }
    }
}

/// The outcome of reading one packet.
enum PacketRead<C> {
    /// Header and content, both whole.
    Complete { header: PacketHeader, content: C },
    /// No bytes at all were left.
    End,
    /// The file ended `needed` bytes short of the end of the packet.
    Truncated { needed: usize },
}

/// Read a whole packet into a fresh buffer (used for the first packet).
fn read_packet(input: &mut impl Read, offset: &mut u64) -> Result<PacketRead<Vec<u8>>> {
    let mut content = Vec::new();
    Ok(match read_packet_into(input, offset, &mut content)? {
        PacketRead::Complete { header, .. } => PacketRead::Complete { header, content },
        PacketRead::End => PacketRead::End,
        PacketRead::Truncated { needed } => PacketRead::Truncated { needed },
    })
}

/// Read and validate a packet header, then its content into `content`.
fn read_packet_into(input: &mut impl Read, offset: &mut u64, content: &mut Vec<u8>) -> Result<PacketRead<()>> {
    let start = *offset;
    let mut raw = [0u8; super::HEADER_SIZE_V3];
    // Everything up to and including `version` is common to all versions.
    let common = 30;
    let got = read_full(input, &mut raw[..common], offset)?;
    if got == 0 {
        return Ok(PacketRead::End);
    }
    if got < common {
        return Ok(PacketRead::Truncated { needed: common - got });
    }
    let version = u16::from_le_bytes([raw[28], raw[29]]);
    let header_size = PacketHeader::header_size(version);
    let got = read_full(input, &mut raw[common..header_size], offset)?;
    if got < header_size - common {
        return Ok(PacketRead::Truncated { needed: header_size - common - got });
    }
    let header = parse_header(&raw[..header_size], start)?;
    let content_size = (header.size_bits / 8) as usize - header_size;
    content.clear();
    content.resize(content_size, 0);
    let got = read_full(input, content, offset)?;
    if got < content_size {
        return Ok(PacketRead::Truncated { needed: content_size - got });
    }
    Ok(PacketRead::Complete { header, content: () })
}

/// Read until `buf` is full or the input ends; returns the bytes read.
fn read_full(input: &mut impl Read, buf: &mut [u8], offset: &mut u64) -> Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::at(*offset + filled as u64, ErrorKind::Io(e))),
        }
    }
    *offset += filled as u64;
    Ok(filled)
}

fn parse_header(raw: &[u8], start: u64) -> Result<PacketHeader> {
    let mut r = ReadCursor::new(raw, start);
    let magic = r.get_u32()?;
    if magic != MAGIC {
        return Err(Error::at(start, ErrorKind::BadMagic(magic)));
    }
    let size_bits = r.get_u32()?;
    let time_begin = r.get_u64()?;
    let time_end = r.get_u64()?;
    let flush_duration = r.get_u32()?;
    let version = r.get_u16()?;
    if version > FORMAT_VERSION {
        return Err(Error::at(start + 28, ErrorKind::UnsupportedVersion(version)));
    }
    let pid = r.get_u64()?;
    let domain = if version >= 3 { r.get_u16()? } else { 0 };
    let verifier: CacheVerifier = backtrace_codec::get_cache_verifier(&mut r)?;
    let alloc_id_begin = r.get_u64()?;
    let alloc_id_end = r.get_u64()?;
    let size = (size_bits / 8) as usize;
    if (size_bits as i32) < 0 || size < raw.len() || size > MAX_PACKET_SIZE {
        return Err(Error::at(start + 4, ErrorKind::BadPacketSize(size_bits)));
    }
    if (time_begin as i64) > (time_end as i64) {
        return Err(Error::at(start + 8, ErrorKind::BadPacketTimes { begin: time_begin, end: time_end }));
    }
    // Ids are compared as i64, as upstream does; a negative first id is corrupt (and would
    // let the running id overflow).
    if (alloc_id_begin as i64) < 0 || (alloc_id_begin as i64) > (alloc_id_end as i64) {
        return Err(Error::at(start + 52, ErrorKind::BadPacketIds { begin: alloc_id_begin, end: alloc_id_end }));
    }
    Ok(PacketHeader {
        size_bits,
        time_begin,
        time_end,
        flush_duration,
        version,
        pid,
        domain,
        verifier,
        alloc_id_begin,
        alloc_id_end,
    })
}

fn parse_info(header: &PacketHeader, content: &[u8], content_offset: u64) -> Result<Info> {
    let mut r = ReadCursor::new(content, content_offset);
    let word = r.get_u32()?;
    if word >> 25 != event_id::TRACE_INFO {
        return Err(Error::at(content_offset, ErrorKind::BadTraceInfo("first event is not trace_info")));
    }
    let start_time = (header.time_begin & !TIME_MASK) | (word as u64 & TIME_MASK);
    if start_time != header.time_begin {
        return Err(Error::at(content_offset, ErrorKind::BadTraceInfo("start time differs from the packet's")));
    }
    let rate_offset = r.offset();
    let sample_rate = r.get_f64()?;
    // Every estimate divides by the rate: anything outside (0, 1] would make them infinite
    // or meaningless, and no writer produces it.
    if !(sample_rate > 0.0 && sample_rate <= 1.0) {
        return Err(Error::at(rate_offset, ErrorKind::BadTraceInfo("sample rate outside (0, 1]")));
    }
    let word_size = r.get_u8()?;
    if word_size == 0 {
        return Err(Error::at(rate_offset + 8, ErrorKind::BadTraceInfo("word size 0")));
    }
    let executable_name = r.get_string()?.to_vec();
    let host_name = r.get_string()?.to_vec();
    let runtime_params = r.get_string()?.to_vec();
    let pid = r.get_u64()?;
    let context = if header.version >= 2 { Some(r.get_string()?.to_vec()) } else { None };
    if !r.is_empty() {
        return Err(r.error(ErrorKind::BadTraceInfo("trailing bytes after the trace info")));
    }
    Ok(Info {
        sample_rate,
        word_size,
        executable_name,
        host_name,
        runtime_params,
        pid,
        initial_domain: header.domain,
        start_time,
        context: context.filter(|c| !c.is_empty()),
    })
}
