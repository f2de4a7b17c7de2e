//! `memtrace pprof`: a gzipped pprof profile in the convention of Go's heap profiles.
//!
//! Sample types are `alloc_objects/count`, `alloc_space/bytes`, `inuse_objects/count` and
//! `inuse_space/bytes` ("in use" meaning live at the end of the trace); every distinct stack
//! is one sample, leaf first, with all its frames. Each location code becomes one pprof
//! location whose lines are its inlined frames, so `go tool pprof` and profiling services
//! that ingest pprof show functions, files and lines without symbolizing anything.
//!
//! Values are rounded to whole numbers and saturate at `i64::MAX`.
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

use memtrace_rs::analysis::Analysis;
use prost::Message;

use super::profile_proto::{Function, Line, Location, Mapping, Profile, Sample, ValueType};

/// The sample types, in value order.
pub const SAMPLE_TYPES: [(&str, &str); 4] =
    [("alloc_objects", "count"), ("alloc_space", "bytes"), ("inuse_objects", "count"), ("inuse_space", "bytes")];

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

/// The profile of `analysis`.
pub fn profile(analysis: &Analysis) -> Profile {
    let mut strings = Strings::new();
    let sample_type =
        SAMPLE_TYPES.iter().map(|(t, unit)| ValueType { r#type: strings.get(t), unit: strings.get(unit) }).collect();
    let mapping = Mapping {
        id: 1,
        filename: strings.get(&String::from_utf8_lossy(&analysis.info.executable_name)),
        has_functions: true,
        has_filenames: true,
        has_line_numbers: true,
        has_inline_frames: true,
        ..Mapping::default()
    };
    let mut locations: Vec<Location> = Vec::new();
    let mut location_ids: HashMap<u64, u64> = HashMap::new();
    let mut functions: Vec<Function> = Vec::new();
    let mut function_ids: HashMap<(String, String), u64> = HashMap::new();
    let mut samples = Vec::with_capacity(analysis.stacks.len());
    for stack in &analysis.stacks {
        let mut location_id = Vec::with_capacity(stack.codes.len());
        for &code in stack.codes.iter().rev() {
            let id = *location_ids.entry(code).or_insert_with(|| {
                let frames = analysis.code_frames.get(&code).map_or(&[][..], Vec::as_slice);
                let line = frames
                    .iter()
                    .rev()
                    .map(|&f| {
                        let frame = &analysis.frames[f];
                        let key = (frame.function.clone(), frame.file.clone());
                        let function_id = *function_ids.entry(key).or_insert_with(|| {
                            let id = functions.len() as u64 + 1;
                            let name = strings.get(&frame.function);
                            functions.push(Function {
                                id,
                                name,
                                system_name: name,
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
        }
        let s = &stack.stats;
        let value = [
            s.allocated.objects,
            analysis.bytes(s.allocated.samples),
            s.live_end.objects,
            analysis.bytes(s.live_end.samples),
        ]
        .iter()
        .map(|v| v.round() as i64)
        .collect();
        samples.push(Sample { location_id, value, label: Vec::new() });
    }
    let info = &analysis.info;
    let period = info.bytes_for_samples(1).round() as i64;
    let period_type = Some(ValueType { r#type: strings.get("space"), unit: strings.get("bytes") });
    let comment = vec![strings.get(&format!(
        "memtrace: estimated from sampled allocations (sample rate {:e}, {}-bit words)",
        info.sample_rate, info.word_size
    ))];
    let default_sample_type = strings.get("inuse_space");
    Profile {
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
    }
}

/// Write the gzipped profile of `analysis` to `out`.
pub fn write(analysis: &Analysis, out: impl Write) -> io::Result<()> {
    let mut gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    gz.write_all(&profile(analysis).encode_to_vec())?;
    gz.finish()?.flush()
}
