//! Traces written byte by byte (docs/FORMAT.md), for what this crate's `Writer` refuses to
//! write: a location list past the writer's 4096-byte bound (§5.3), a backtrace past its
//! 4096-byte budget (§7.5), a packet past 32 KiB (§2.4). Each packet is well formed, so
//! the trace is one a hostile (or merely different) writer could produce and our reader
//! accepts (packets up to 1 MiB).

use super::cli::START;

/// The v3 packet magic (§2.1).
const MAGIC: u32 = 0xC1FC_1FC1;
/// The bytes of a v3 packet header (§2.2).
const HEADER: usize = 68;
/// Event ids (§3).
const LOCATION: u32 = 1;
const ALLOC: u32 = 2;
/// The source byte of an OCaml major-heap allocation (§6.4).
const MAJOR: u8 = 1;
/// The pid of the trace-info packet and of every other one.
const PID: u64 = 4242;

/// A trace being written packet by packet.
pub struct Handmade {
    bytes: Vec<u8>,
    /// The events of the packet being filled.
    events: Vec<u8>,
    /// The next object id (§9).
    next_id: u64,
}

impl Handmade {
    /// A trace with its trace-info packet: sampling rate `rate`, 64-bit words.
    pub fn new(rate: f64) -> Handmade {
        let mut t = Handmade { bytes: Vec::new(), events: Vec::new(), next_id: 0 };
        t.event_header(0, 0);
        t.events.extend_from_slice(&rate.to_le_bytes());
        t.events.push(64);
        for s in ["handmade", "host", ""] {
            t.string(s.as_bytes());
        }
        t.events.extend_from_slice(&PID.to_le_bytes());
        t.string(b"");
        t.packet(0, 0);
        t
    }

    fn event_header(&mut self, id: u32, at: u64) {
        let time = (START + at) as u32 & 0x1FF_FFFF;
        self.events.extend_from_slice(&((id << 25) | time).to_le_bytes());
    }

    fn string(&mut self, s: &[u8]) {
        self.events.extend_from_slice(s);
        self.events.push(0);
    }

    fn vint(&mut self, v: u64) {
        match v {
            0..=252 => self.events.push(v as u8),
            253..=65_535 => {
                self.events.push(0xFD);
                self.events.extend_from_slice(&(v as u16).to_le_bytes());
            }
            _ => {
                self.events.push(0xFF);
                self.events.extend_from_slice(&v.to_le_bytes());
            }
        }
    }

    /// Close the packet of the events so far, whose times are at most `end` µs after the
    /// start; its allocations have ids `first_id..self.next_id`.
    fn packet(&mut self, first_id: u64, end: u64) {
        let size = HEADER + self.events.len();
        assert!(size <= 1 << 20, "our reader's largest packet");
        let b = &mut self.bytes;
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&((size * 8) as u32).to_le_bytes());
        b.extend_from_slice(&START.to_le_bytes());
        b.extend_from_slice(&(START + end).to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&3u16.to_le_bytes());
        b.extend_from_slice(&PID.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        // The dummy cache verifier (§7.8).
        b.extend_from_slice(&0xFFFFu16.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&first_id.to_le_bytes());
        b.extend_from_slice(&self.next_id.to_le_bytes());
        b.append(&mut self.events);
    }

    /// A packet of location events at `at` µs: each code with one location, its function
    /// and file (new strings each time: code 31 of both move-to-front tables, §5.4).
    pub fn locations(&mut self, at: u64, locations: &[(u64, &str, &str)]) {
        for &(code, function, file) in locations {
            self.event_header(LOCATION, at);
            self.events.extend_from_slice(&code.to_le_bytes());
            self.events.push(1);
            // Line 1, columns 0, filename code 31, defname code 31 (§5.1).
            let record: u64 = 1 | (31 << 38) | (31 << 43);
            self.events.extend_from_slice(&(record as u32).to_le_bytes());
            self.events.extend_from_slice(&((record >> 32) as u16).to_le_bytes());
            self.string(file.as_bytes());
            self.string(function.as_bytes());
        }
        self.packet(self.next_id, at);
    }

    /// A packet of one major-heap allocation of `nsamples` samples at `at` µs whose
    /// backtrace, outermost first, is the first `common_prefix` frames of the previous one
    /// and then each code of `runs` repeated its count of times. Each run is a miss and then
    /// hits of 256 frames per codeword (§7.3, §7.6), so a deep recursion takes a few bytes
    /// per 256 frames; a run's code must not be in the cache already.
    pub fn alloc(&mut self, at: u64, nsamples: u64, common_prefix: u64, runs: &[(u64, usize)]) {
        let first_id = self.next_id;
        self.event_header(ALLOC, at);
        self.vint(nsamples);
        self.vint(nsamples);
        self.events.push(MAJOR);
        self.vint(common_prefix);
        let mut codewords = Vec::new();
        let mut nencoded: u16 = 0;
        for &(code, count) in runs {
            // Upstream's first bucket for the code (§7.2).
            let bucket = ((code.wrapping_mul(0x4983723) >> 11) & 0x3FFF) as u16;
            codewords.extend_from_slice(&((bucket << 2) | 3).to_le_bytes());
            codewords.extend_from_slice(&code.to_le_bytes());
            nencoded += 1;
            // A hit on the bucket predicts the bucket itself: the code, again and again.
            let mut left = count - 1;
            while left > 0 {
                let predicted = (left - 1).min(255);
                codewords.extend_from_slice(&((bucket << 2) | 2).to_le_bytes());
                codewords.push(predicted as u8);
                nencoded += 1;
                left -= predicted + 1;
            }
        }
        self.events.extend_from_slice(&nencoded.to_le_bytes());
        self.events.append(&mut codewords);
        self.next_id += 1;
        self.packet(first_id, at);
    }

    /// The trace's bytes.
    pub fn finish(self) -> Vec<u8> {
        assert!(self.events.is_empty());
        self.bytes
    }
}

/// A trace whose every stack is one frame longer than the last (a recursion allocating on
/// the way down) in `n` allocations: each stack shares all but one frame with the one
/// before, so the file takes about 120 bytes a stack, but the stacks hold `n²/2` frames.
/// Two names take turns, so that many stacks tie.
pub fn ever_deeper(n: u64) -> Vec<u8> {
    let mut t = Handmade::new(0.01);
    let codes: Vec<u64> = (0..n).map(|i| 0x10_0000 + i).collect();
    for chunk in codes.chunks(10_000) {
        let name = |c: u64| if c.is_multiple_of(7) { "Deep.a" } else { "Deep.b" };
        let locations: Vec<(u64, &str, &str)> = chunk.iter().map(|&c| (c, name(c), "deep.ml")).collect();
        t.locations(0, &locations);
    }
    for (i, &code) in codes.iter().enumerate() {
        t.alloc(1, 1, i as u64, &[(code, 1)]);
    }
    t.finish()
}
