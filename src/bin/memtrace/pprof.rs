//! `memtrace pprof`: a gzipped pprof profile in the convention of Go's heap profiles.
//!
//! Sample types are `alloc_objects/count`, `alloc_space/bytes`, `inuse_objects/count` and
//! `inuse_space/bytes`, the last pprof's default view. "In use" means live at the peak of the
//! trace's live estimate unless asked otherwise ([`InuseAt`]: at the end, or at a time): at
//! the end of a finished program most of its heap is usually freed, and a default view of
//! nothing ("Total samples = 0") tells a reader nothing. The profile's comments say which
//! moment it is. Every distinct stack
//! is one sample, leaf first, without the allocator frames at its leaf and the runtime's
//! start-up frames at its root unless asked (the rule of `hotspots`). Each location code
//! becomes one pprof location whose lines are its inlined frames (those kept), so `go tool
//! pprof` and profiling services that ingest pprof show functions, files and lines without
//! symbolizing anything. Names are given as they are, with no system name: pprof takes a
//! system name equal to the name for an undemangled C++ name and shortens it.
//!
//! Values are rounded to whole numbers and saturate at `i64::MAX`.
//!
//! A sample lists its whole stack, so a profile is as large as stacks × depth: the samples
//! hold at most [`MAX_LOCATION_IDS`] locations in all, and the stacks past that (the last
//! allocated first) are left out, which only a trace of thousands of very deep stacks
//! reaches.
//!
//! # Limitation: object counts
//!
//! `alloc_objects` and `inuse_objects` are the analysis's object estimates
//! (`nsamples / (length × rate)`, see `memtrace_rs::analysis`), which under-count
//! allocations whose size is not a multiple of the word size: Rust traces record an
//! allocation of `n` bytes as `ceil(n / 8)` words while sampling only its `n` bytes. The
//! trace format cannot carry exact byte sizes, so the profile cannot either (each sample
//! holds one stack's totals, not sizes of single allocations) and the bias cannot be
//! corrected here. The `*_space` values are unaffected.

use std::collections::HashMap;
use std::io::{self, Write};

use memtrace_rs::analysis::{inert_bytes, Analysis, FrameId, StackStats, Tally, Trim};
use prost::Message;

use super::profile_proto::{Function, Line, Location, Mapping, Profile, Sample, ValueType};

/// The sample types, in value order.
pub const SAMPLE_TYPES: [(&str, &str); 4] =
    [("alloc_objects", "count"), ("alloc_space", "bytes"), ("inuse_objects", "count"), ("inuse_space", "bytes")];

/// Most location ids in the samples of a profile (128 MiB of them in memory, a profile of
/// tens of MiB).
pub const MAX_LOCATION_IDS: usize = 16 << 20;

/// When the `inuse_*` sample types count what is live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InuseAt {
    /// At the peak of the total live estimate.
    Peak,
    /// At the end of the trace.
    End,
    /// At this many µs after the start.
    Time(u64),
}

impl InuseAt {
    /// The live figure of `stats` at this moment.
    fn live(self, stats: &StackStats) -> Tally {
        match self {
            InuseAt::Peak => stats.live_peak,
            InuseAt::End => stats.live_end,
            InuseAt::Time(_) => stats.live_at,
        }
    }

    /// The moment, for the profile's comment.
    fn describe(self) -> String {
        match self {
            InuseAt::Peak => "at the peak of the live estimate".to_string(),
            InuseAt::End => "at the end of the trace".to_string(),
            InuseAt::Time(us) => format!("at {} after the start", super::format::seconds(us)),
        }
    }
}

/// `--inuse-at`: `peak`, `end` or a time (`1.5s`, `250ms`; a plain number is seconds).
pub fn parse_inuse_at(s: &str) -> Result<InuseAt, String> {
    match s {
        "peak" => Ok(InuseAt::Peak),
        "end" => Ok(InuseAt::End),
        t => memtrace_rs::analysis::filter::parse_time(t).map(InuseAt::Time),
    }
}

/// The string table being built.
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Strings {
        let mut s = Strings::default();
        s.get("");
        s
    }

    fn get(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// The profile of `analysis`, its stacks trimmed as `trim` says (the same stack may then
/// appear in several samples, which pprof adds up), and how many stacks were left out
/// (see [`MAX_LOCATION_IDS`]).
pub fn profile(analysis: &Analysis, trim: Trim, inuse_at: InuseAt) -> (Profile, usize) {
    let mut strings = Strings::new();
    let sample_type =
        SAMPLE_TYPES.iter().map(|(t, unit)| ValueType { r#type: strings.get(t), unit: strings.get(unit) }).collect();
    let mapping = Mapping {
        id: 1,
        filename: strings.get(&inert_bytes(&analysis.info.executable_name)),
        has_functions: true,
        has_filenames: true,
        has_line_numbers: true,
        has_inline_frames: true,
        ..Mapping::default()
    };
    let mut locations: Vec<Location> = Vec::new();
    // A location is the part of one code's (inlined) frames that a trimmed stack keeps.
    let mut location_ids: HashMap<(u64, usize, usize), u64> = HashMap::new();
    let mut functions: Vec<Function> = Vec::new();
    let mut function_ids: HashMap<(String, String), u64> = HashMap::new();
    let mut samples = Vec::with_capacity(analysis.stacks.len());
    let mut frames: Vec<FrameId> = Vec::new();
    // Each frame's code, index in the code's frames and which occurrence of a code in the
    // stack it belongs to (a recursion repeats a code: each call is its own location).
    let mut code_of: Vec<(u64, usize, usize)> = Vec::new();
    let (mut room, mut left_out) = (MAX_LOCATION_IDS, 0);
    for stack in &analysis.stacks {
        if room == 0 {
            left_out += 1;
            continue;
        }
        // The stack's frames innermost first, each with its code and index in that code's
        // frames (outermost first).
        frames.clear();
        code_of.clear();
        for (occurrence, code) in analysis.trie.up(stack.node).enumerate() {
            let inlined = analysis.frames_of(code);
            for (i, &f) in inlined.iter().enumerate().rev() {
                frames.push(f);
                code_of.push((code, i, occurrence));
            }
        }
        let kept = trim.kept(analysis, &frames);
        if kept.len() > room {
            left_out += 1;
            room = 0;
            continue;
        }
        room -= kept.len();
        frames = kept.iter().map(|&i| frames[i]).collect();
        code_of = kept.iter().map(|&i| code_of[i]).collect();
        let mut location_id = Vec::new();
        let mut at = 0;
        while at < frames.len() {
            let (code, _, occurrence) = code_of[at];
            let run = code_of[at..].iter().take_while(|(.., o)| *o == occurrence).count();
            // Indexes within the code, outermost first: `inner` is the innermost kept.
            let (inner, outer) = (code_of[at].1, code_of[at + run - 1].1);
            let id = *location_ids.entry((code, outer, inner)).or_insert_with(|| {
                let line = frames[at..at + run]
                    .iter()
                    .map(|&f| {
                        let frame = &analysis.frames[f];
                        let key = (frame.profile_name().into_owned(), frame.file.clone());
                        let function_id = *function_ids.entry(key.clone()).or_insert_with(|| {
                            let id = functions.len() as u64 + 1;
                            // No system name: pprof would take a name equal to it for an
                            // undemangled C++ one and shorten it (`::call_once`, `::fmt`).
                            functions.push(Function {
                                id,
                                name: strings.get(&key.0),
                                system_name: 0,
                                filename: strings.get(&frame.file),
                                start_line: 0,
                            });
                            id
                        });
                        Line { function_id, line: i64::from(frame.line), column: 0 }
                    })
                    .collect();
                let id = locations.len() as u64 + 1;
                locations.push(Location { id, mapping_id: 1, address: code, line, is_folded: false });
                id
            });
            location_id.push(id);
            at += run;
        }
        let s = &stack.stats;
        let live = inuse_at.live(s);
        let value =
            [s.allocated.objects, analysis.bytes(s.allocated.samples), live.objects, analysis.bytes(live.samples)]
                .iter()
                .map(|v| v.round() as i64)
                .collect();
        samples.push(Sample { location_id, value, label: Vec::new() });
    }
    let info = &analysis.info;
    let period = info.bytes_for_samples(1).round() as i64;
    let period_type = Some(ValueType { r#type: strings.get("space"), unit: strings.get("bytes") });
    let comment = vec![
        strings.get(&format!(
            "memtrace: estimated from sampled allocations (sample rate {:e}, {}-bit words)",
            info.sample_rate, info.word_size
        )),
        strings.get(&format!("memtrace: inuse_objects and inuse_space are what is live {}", inuse_at.describe())),
    ];
    let default_sample_type = strings.get("inuse_space");
    let profile = Profile {
        sample_type,
        sample: samples,
        mapping: vec![mapping],
        location: locations,
        function: functions,
        time_nanos: (info.start_time as i64).saturating_mul(1000),
        duration_nanos: (analysis.duration() as i64).saturating_mul(1000),
        period_type,
        period,
        comment,
        default_sample_type,
        string_table: strings.table,
        ..Profile::default()
    };
    (profile, left_out)
}

/// Write the gzipped profile of `analysis` to `out`; returns how many stacks were left out
/// (see [`MAX_LOCATION_IDS`]).
pub fn write(analysis: &Analysis, trim: Trim, inuse_at: InuseAt, out: impl Write) -> io::Result<usize> {
    let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    let (profile, left_out) = profile(analysis, trim, inuse_at);
    gz.write_all(&profile.encode_to_vec())?;
    gz.finish()?.flush()?;
    Ok(left_out)
}
