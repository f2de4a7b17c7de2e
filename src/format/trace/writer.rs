//! The trace writer (FORMAT.md §9, §10).
//!
//! [`Writer`] is upstream's multiplexed front end: one domain-writer state per domain, all
//! sharing one output stream and one object-id counter, with every domain except the most
//! recently used one flushed. Packets are built in a fixed 32 KiB buffer and written out
//! whole, so the flush policy — and therefore the bytes — are upstream's exactly.

use std::io::Write;
use std::sync::Arc;

use super::{
    event_id, AllocSource, Info, ObjectId, Timestamp, CLOSED_MARK, FORMAT_VERSION, MAGIC, PACKET_BUFFER_SIZE, TIME_MASK,
};
use crate::format::backtrace_codec;
use crate::format::buf::WriteBuf;
use crate::format::error::{Error, ErrorKind, Result};
use crate::format::location_codec::{self, Location};

/// Object ids a domain writer reserves at a time.
const IDS_PER_CHUNK: u64 = 10_000;
/// Flush before an event when less than this is free (event fields plus the largest
/// backtrace or location list).
const MIN_FREE_BEFORE_EVENT: usize = 100 + 4096;
/// Flush before an event when more than this many new locations are pending.
const MAX_PENDING_LOCATIONS: usize = 128;
/// Flush before an event when the packet already spans more than this (µs), so that the
/// 25-bit timestamps in event headers stay unambiguous.
const MAX_PACKET_SPAN: u64 = 30_000_000;
/// A location event is started only while more than this is free in its packet.
const MIN_FREE_FOR_LOCATION: usize = 4096;
/// Positions of the header fields patched at flush time.
const SIZE_AT: usize = 4;
const TIME_BEGIN_AT: usize = 8;
const TIME_END_AT: usize = 16;
const FLUSH_DURATION_AT: usize = 24;
const ALLOC_ID_BEGIN_AT: usize = 52;
const ALLOC_ID_END_AT: usize = 60;

/// An allocation to record.
#[derive(Debug, Clone, Copy)]
pub struct NewAlloc<'a> {
    /// Size in words (excluding any header word).
    pub length: u64,
    /// Number of samples that fell in the block (≥ 1).
    pub nsamples: u64,
    /// Where the allocation came from.
    pub source: AllocSource,
    /// Location codes of the callstack, **innermost first** (index 0 is the allocation
    /// site). This is the reverse of the order in which readers return backtraces.
    pub callstack: &'a [u64],
    /// Number of innermost entries of `callstack` to leave out of the trace.
    pub drop: usize,
}

/// The state of one domain's event stream.
struct DomainWriter {
    domain: u16,
    locations: location_codec::Encoder,
    backtraces: backtrace_codec::Writer,
    /// Codes that missed the backtrace cache since the last flush, with their locations,
    /// in miss order; written as location packets before the events packet.
    pending_locations: Vec<(u64, Arc<[Location]>)>,
    prev_callstack: Vec<u64>,
    prev_drop: usize,
    /// Whether the location of code 0 was written. Every cache bucket starts out holding
    /// code 0, so that code "hits" without ever missing (§7.1) and would otherwise never get
    /// a location event. Upstream never meets code 0; a writer fed arbitrary codes can.
    zero_code_bound: bool,
    next_id: ObjectId,
    chunk_end: ObjectId,
    packet_first_id: ObjectId,
    packet_time_start: Timestamp,
    packet_time_end: Timestamp,
    packet: WriteBuf,
}

/// Where ids and packets go: the state all domain writers share.
struct Output<W> {
    out: W,
    /// The pid written in every header.
    pid: u64,
    /// Whether to refuse to flush once the current process is not `pid` (a forked child).
    check_pid: bool,
    next_chunk: ObjectId,
    /// Scratch buffer for location packets.
    location_packet: WriteBuf,
    /// Set by [`Writer::close_marked`]: the next event packet is the trace's last.
    closing: bool,
}

/// A trace writer over any [`Write`].
///
/// Events are buffered per packet; call [`Writer::flush`] to push everything written so far
/// to the output (the trace is then readable up to that point), and [`Writer::close`] at
/// the end. Any error leaves the writer unusable for further events.
pub struct Writer<W: Write> {
    output: Output<W>,
    start_time: Timestamp,
    domains: Vec<DomainWriter>,
    /// Index in `domains` of the most recently used domain writer.
    current: usize,
    /// True when events were added since the last flush of the current domain.
    dirty: bool,
}

/// The trace-info packet that starts a trace of `info`, or the error [`Writer::new`] gives for
/// it, without making a writer (whose tables take a few hundred KiB): how a tracer checks
/// that a trace can start before it touches the file.
pub(crate) fn trace_info_packet(info: &Info) -> Result<WriteBuf> {
    if !(info.sample_rate > 0.0 && info.sample_rate <= 1.0) || info.word_size == 0 {
        return Err(Error::new(ErrorKind::BadTraceInfo("the sample rate must be in (0, 1] and the word size above 0")));
    }
    let mut packet = WriteBuf::with_capacity(PACKET_BUFFER_SIZE);
    put_header_start(&mut packet, info.pid, info.initial_domain);
    backtrace_codec::Writer::put_dummy_verifier(&mut packet);
    packet.reserve(16);
    put_event_header(&mut packet, event_id::TRACE_INFO, info.start_time);
    packet.put_f64(info.sample_rate);
    packet.put_u8(info.word_size);
    packet.put_string(&info.executable_name);
    packet.put_string(&info.host_name);
    packet.put_string(&info.runtime_params);
    packet.put_u64(info.pid);
    packet.put_string(info.context.as_deref().unwrap_or_default());
    finish_packet(&mut packet, info.start_time, info.start_time, 0, 0, 0)?;
    Ok(packet)
}

impl<W: Write> std::fmt::Debug for Writer<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("pid", &self.output.pid)
            .field("domains", &self.domains.len())
            .finish_non_exhaustive()
    }
}

impl<W: Write> Writer<W> {
    /// Start a trace: write the trace-info packet for `info` and open the first events
    /// packet of `info.initial_domain`. Fails if the sample rate is outside (0, 1] or the word
    /// size is 0 (readers reject such traces).
    pub fn new(mut out: W, info: &Info) -> Result<Writer<W>> {
        out.write_all(trace_info_packet(info)?.as_bytes())?;
        Ok(Writer::after_info_packet(out, info))
    }

    /// A writer that goes on with `out`, which has the trace-info packet of `info`
    /// ([`trace_info_packet`]) written already, as [`Writer::new`] would: how a tracer writes
    /// the packet on the thread that starts tracing and builds the writer on its own thread.
    pub(crate) fn after_info_packet(out: W, info: &Info) -> Writer<W> {
        let mut output = Output {
            out,
            pid: info.pid,
            check_pid: false,
            next_chunk: 0,
            location_packet: WriteBuf::with_capacity(PACKET_BUFFER_SIZE),
            closing: false,
        };
        let first = DomainWriter::new(&mut output, info.initial_domain, info.start_time);
        Writer { output, start_time: info.start_time, domains: vec![first], current: 0, dirty: false }
    }

    /// The output stream, as the writer left it (packets flushed so far).
    pub(crate) fn output(&self) -> &W {
        &self.output.out
    }

    /// The trace's start time (its info's): no event is earlier.
    pub(crate) fn start_time(&self) -> Timestamp {
        self.start_time
    }

    /// Make every flush first check that the current process is still the one whose pid
    /// is in the trace info, and fail with [`ErrorKind::PidChanged`] (writing nothing)
    /// otherwise. A forked child then never writes into its parent's trace.
    pub fn check_pid_on_flush(mut self, check: bool) -> Self {
        self.output.check_pid = check;
        self
    }

    /// Switch to domain `domain`, flushing the previously used one if it differs.
    fn select(&mut self, domain: u16) -> Result<()> {
        if self.domains[self.current].domain != domain {
            let previous = &mut self.domains[self.current];
            let at = previous.packet_time_end;
            previous.flush_at(&mut self.output, at)?;
            self.current = match self.domains.iter().position(|d| d.domain == domain) {
                Some(i) => i,
                None => {
                    self.domains.push(DomainWriter::new(&mut self.output, domain, self.start_time));
                    self.domains.len() - 1
                }
            };
        }
        Ok(())
    }

    /// Record an allocation at `time` on `domain` and return its object id.
    ///
    /// `locations` is asked for the location list of every code that is new to the
    /// backtrace cache; the list is written in a location packet before the events packet
    /// that uses the code.
    pub fn put_alloc(
        &mut self,
        domain: u16,
        time: Timestamp,
        alloc: &NewAlloc<'_>,
        locations: impl FnMut(u64) -> Arc<[Location]>,
    ) -> Result<ObjectId> {
        if alloc.nsamples == 0 || alloc.length > i64::MAX as u64 || alloc.nsamples > i64::MAX as u64 {
            return Err(Error::new(ErrorKind::BadAllocation("nsamples must be at least 1 and sizes below 2^63")));
        }
        self.select(domain)?;
        self.dirty = true;
        let w = &mut self.domains[self.current];
        w.put_alloc(&mut self.output, time, alloc, locations)
    }

    /// Record that object `id` was promoted (OCaml minor to major heap).
    pub fn put_promote(&mut self, domain: u16, time: Timestamp, id: ObjectId) -> Result<()> {
        self.put_id_event(domain, time, event_id::PROMOTE, id)
    }

    /// Record that object `id` was freed.
    pub fn put_collect(&mut self, domain: u16, time: Timestamp, id: ObjectId) -> Result<()> {
        self.put_id_event(domain, time, event_id::COLLECT, id)
    }

    fn put_id_event(&mut self, domain: u16, time: Timestamp, id_kind: u32, id: ObjectId) -> Result<()> {
        self.select(domain)?;
        self.dirty = true;
        let w = &mut self.domains[self.current];
        w.begin_event(&mut self.output, time, id_kind)?;
        w.packet.put_vint((w.next_id as i64).wrapping_sub(1).wrapping_sub(id as i64));
        Ok(())
    }

    /// The id the next allocation on `domain` will get (flushing that domain first if its
    /// id chunk is used up).
    pub fn next_alloc_id(&mut self, domain: u16) -> Result<ObjectId> {
        self.select(domain)?;
        let w = &mut self.domains[self.current];
        if w.next_id == w.chunk_end {
            let at = w.packet_time_end;
            w.flush_at(&mut self.output, at)?;
        }
        Ok(w.next_id)
    }

    /// True when events were recorded since the last flush.
    pub fn has_unflushed_events(&self) -> bool {
        self.dirty
    }

    /// Write out everything recorded so far (location packets, then the current events
    /// packet, even if empty) and flush the output stream.
    pub fn flush(&mut self) -> Result<()> {
        let w = &mut self.domains[self.current];
        let at = w.packet_time_end;
        w.flush_at(&mut self.output, at)?;
        self.output.out.flush()?;
        self.dirty = false;
        Ok(())
    }

    /// Flush and return the output stream.
    pub fn close(mut self) -> Result<W> {
        self.flush()?;
        Ok(self.output.out)
    }

    /// [`close`](Writer::close), and mark the last packet as the end of a finished trace (its
    /// `flush_duration`, which readers ignore, is [`CLOSED_MARK`]), so that readers can tell it
    /// from a trace still being written ([`Reader::closed_by_writer`](super::Reader::closed_by_writer)).
    pub(crate) fn close_marked(mut self) -> Result<W> {
        self.output.closing = true;
        self.close()
    }
}

impl DomainWriter {
    fn new<W>(output: &mut Output<W>, domain: u16, start_time: Timestamp) -> DomainWriter {
        let first_id = output.next_chunk;
        output.next_chunk += IDS_PER_CHUNK;
        let mut packet = WriteBuf::with_capacity(PACKET_BUFFER_SIZE);
        put_header_start(&mut packet, output.pid, domain);
        backtrace_codec::Writer::put_dummy_verifier(&mut packet);
        packet.reserve(16);
        DomainWriter {
            domain,
            locations: location_codec::Encoder::new(),
            backtraces: backtrace_codec::Writer::new(),
            pending_locations: Vec::new(),
            prev_callstack: Vec::new(),
            prev_drop: 0,
            zero_code_bound: false,
            next_id: first_id,
            chunk_end: first_id + IDS_PER_CHUNK,
            packet_first_id: first_id,
            packet_time_start: start_time,
            packet_time_end: start_time,
            packet,
        }
    }

    /// Flush if the packet cannot take another event, then write the event header.
    fn begin_event<W: Write>(&mut self, output: &mut Output<W>, now: Timestamp, id: u32) -> Result<()> {
        if now < self.packet_time_end {
            return Err(Error::new(ErrorKind::TimeWentBackwards { time: now, previous: self.packet_time_end }));
        }
        if self.packet.remaining() < MIN_FREE_BEFORE_EVENT
            || self.pending_locations.len() > MAX_PENDING_LOCATIONS
            || now - self.packet_time_start > MAX_PACKET_SPAN
            || self.next_id == self.chunk_end
        {
            self.flush_at(output, now)?;
        }
        self.packet_time_end = now;
        put_event_header(&mut self.packet, id, now);
        Ok(())
    }

    fn put_alloc<W: Write>(
        &mut self,
        output: &mut Output<W>,
        now: Timestamp,
        alloc: &NewAlloc<'_>,
        mut locations: impl FnMut(u64) -> Arc<[Location]>,
    ) -> Result<ObjectId> {
        let stack = alloc.callstack;
        let drop = alloc.drop;
        // Length of the common outer part with the previous callstack (§6.2).
        let mut i = stack.len();
        let mut j = self.prev_callstack.len();
        while i > drop && j > self.prev_drop && stack[i - 1] == self.prev_callstack[j - 1] {
            i -= 1;
            j -= 1;
        }
        let common = stack.len() - i;
        let new_len = i;
        self.prev_callstack.clear();
        self.prev_callstack.extend_from_slice(stack);
        self.prev_drop = drop;

        let short = (1..=event_id::SHORT_ALLOC_MAX_LENGTH).contains(&alloc.length)
            && alloc.source == AllocSource::Minor
            && alloc.nsamples == 1
            && new_len < 256;
        let kind = if short { event_id::SHORT_ALLOC_BASE + alloc.length as u32 } else { event_id::ALLOC };
        self.begin_event(output, now, kind)?;
        let id = self.next_id;
        self.next_id += 1;
        let nencoded_at = if short {
            self.packet.put_vint(common as i64);
            self.packet.reserve(1)
        } else {
            self.packet.put_vint(alloc.length as i64);
            self.packet.put_vint(alloc.nsamples as i64);
            self.packet.put_u8(alloc.source.to_byte());
            self.packet.put_vint(common as i64);
            self.packet.reserve(2)
        };
        let encoded = &stack[drop.min(new_len)..new_len];
        if !self.zero_code_bound && encoded.contains(&0) {
            self.zero_code_bound = true;
            self.pending_locations.push((0, locations(0)));
        }
        let pending = &mut self.pending_locations;
        let nencoded =
            self.backtraces.put_backtrace(&mut self.packet, id, stack, drop, new_len.saturating_sub(drop), |index| {
                pending.push((stack[index], locations(stack[index])))
            });
        if short {
            self.packet.patch_u8(nencoded_at, nencoded as u8);
        } else {
            self.packet.patch_u16(nencoded_at, nencoded as u16);
        }
        if self.packet.overflowed() {
            return Err(Error::new(ErrorKind::Unsupported("event does not fit in a packet")));
        }
        Ok(id)
    }

    /// Write pending location packets, then the events packet, and start a new one (§10.4).
    fn flush_at<W: Write>(&mut self, output: &mut Output<W>, now: Timestamp) -> Result<()> {
        if output.check_pid && u64::from(std::process::id()) != output.pid {
            return Err(Error::new(ErrorKind::PidChanged));
        }
        let mut pending = self.pending_locations.drain(..).peekable();
        while pending.peek().is_some() {
            let packet = &mut output.location_packet;
            packet.clear();
            put_header_start(packet, output.pid, self.domain);
            backtrace_codec::Writer::put_dummy_verifier(packet);
            packet.reserve(16);
            while let Some((code, list)) = pending.peek() {
                let needed = 4 + location_codec::encoded_size_bound(list);
                if packet.remaining() <= MIN_FREE_FOR_LOCATION || packet.remaining() < needed {
                    break;
                }
                put_event_header(packet, event_id::LOCATION, self.packet_time_start);
                packet.put_u64(*code);
                self.locations.put_location_list(packet, list);
                pending.next();
            }
            let (t, id) = (self.packet_time_start, self.packet_first_id);
            finish_packet(packet, t, t, id, id, 0)?;
            output.out.write_all(packet.as_bytes())?;
        }
        drop(pending);
        finish_packet(
            &mut self.packet,
            self.packet_time_start,
            self.packet_time_end,
            self.packet_first_id,
            self.next_id,
            if output.closing { CLOSED_MARK } else { 0 },
        )?;
        output.out.write_all(self.packet.as_bytes())?;

        self.packet_time_start = now;
        self.packet_time_end = now;
        if self.next_id == self.chunk_end {
            self.next_id = output.next_chunk;
            self.chunk_end = self.next_id + IDS_PER_CHUNK;
            output.next_chunk += IDS_PER_CHUNK;
        }
        self.packet_first_id = self.next_id;
        self.packet.clear();
        put_header_start(&mut self.packet, output.pid, self.domain);
        self.backtraces.put_cache_verifier(&mut self.packet);
        self.packet.reserve(16);
        Ok(())
    }
}

/// Write the header fields up to the verifier, leaving the patched ones as placeholders.
fn put_header_start(packet: &mut WriteBuf, pid: u64, domain: u16) {
    packet.put_u32(MAGIC);
    packet.reserve(4 + 8 + 8 + 4);
    packet.put_u16(FORMAT_VERSION);
    packet.put_u64(pid);
    packet.put_u16(domain);
}

/// Patch the size, times and ids of a finished packet.
fn finish_packet(
    packet: &mut WriteBuf,
    begin: Timestamp,
    end: Timestamp,
    first_id: ObjectId,
    end_id: ObjectId,
    flush_duration: u32,
) -> Result<()> {
    let bits = (packet.position() * 8) as u32;
    packet.patch_u32(SIZE_AT, bits);
    packet.patch_u64(TIME_BEGIN_AT, begin);
    packet.patch_u64(TIME_END_AT, end);
    packet.patch_u32(FLUSH_DURATION_AT, flush_duration);
    packet.patch_u64(ALLOC_ID_BEGIN_AT, first_id);
    packet.patch_u64(ALLOC_ID_END_AT, end_id);
    if packet.overflowed() {
        return Err(Error::new(ErrorKind::Unsupported("packet overflow")));
    }
    Ok(())
}

fn put_event_header(packet: &mut WriteBuf, id: u32, time: Timestamp) {
    packet.put_u32(id << 25 | (time & TIME_MASK) as u32);
}
