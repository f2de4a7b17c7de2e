//! A pprof profile (`profile.proto` of github.com/google/pprof), written by hand and gzipped:
//! the library's live profiles must not pull in a protobuf crate.
//!
//! Protobuf lets a message's fields come in any order and a repeated field's elements be
//! interleaved with other fields, so the profile is written in one pass: each function and
//! location as it is first used, each sample as it comes, the string table at the end.

use crate::format::hash::FastMap;

/// Field numbers of `Profile`.
mod field {
    pub const SAMPLE_TYPE: u32 = 1;
    pub const SAMPLE: u32 = 2;
    pub const MAPPING: u32 = 3;
    pub const LOCATION: u32 = 4;
    pub const FUNCTION: u32 = 5;
    pub const STRING_TABLE: u32 = 6;
    pub const TIME_NANOS: u32 = 9;
    pub const DURATION_NANOS: u32 = 10;
    pub const PERIOD_TYPE: u32 = 11;
    pub const PERIOD: u32 = 12;
    pub const COMMENT: u32 = 13;
    pub const DEFAULT_SAMPLE_TYPE: u32 = 14;
}

const VARINT: u32 = 0;
const LENGTH_DELIMITED: u32 = 2;

/// The one mapping every location belongs to: names are given, nothing is left to symbolize.
const MAPPING_ID: u64 = 1;

/// One line of a location: a function (name, file) and a line in it.
pub(crate) struct Line<'a> {
    pub(crate) function: &'a [u8],
    pub(crate) file: &'a [u8],
    pub(crate) line: u32,
}

/// A profile being written.
pub(crate) struct PprofWriter {
    /// The encoded fields of `Profile` but the string table.
    body: Vec<u8>,
    strings: Vec<Box<[u8]>>,
    string_ids: FastMap<Box<[u8]>, i64>,
    function_ids: FastMap<(i64, i64), u64>,
    /// Each location's lines as (function id, line), innermost first.
    location_ids: FastMap<Vec<(u64, u32)>, u64>,
    /// Scratch space for one message.
    message: Vec<u8>,
    packed: Vec<u8>,
}

impl PprofWriter {
    /// A profile whose samples have values of `sample_types` (type, unit), taken every
    /// `period` of `period_type`, shown by `default_sample_type` (one of the types), of the
    /// program `executable`.
    pub(crate) fn new(
        sample_types: &[(&str, &str)],
        default_sample_type: &str,
        period_type: (&str, &str),
        period: i64,
        executable: &[u8],
    ) -> PprofWriter {
        let mut w = PprofWriter {
            body: Vec::new(),
            strings: Vec::new(),
            string_ids: FastMap::default(),
            function_ids: FastMap::default(),
            location_ids: FastMap::default(),
            message: Vec::new(),
            packed: Vec::new(),
        };
        // String 0 is the empty string.
        w.string(b"");
        for &(kind, unit) in sample_types {
            w.value_type(field::SAMPLE_TYPE, kind, unit);
        }
        w.value_type(field::PERIOD_TYPE, period_type.0, period_type.1);
        put_int(&mut w.body, field::PERIOD, period as u64);
        let default = w.string(default_sample_type.as_bytes());
        put_int(&mut w.body, field::DEFAULT_SAMPLE_TYPE, default as u64);
        let filename = w.string(executable);
        let mut mapping = Vec::new();
        put_int(&mut mapping, 1, MAPPING_ID);
        put_int(&mut mapping, 5, filename as u64);
        // has_functions, has_filenames, has_line_numbers, has_inline_frames.
        for flag in 7..=10 {
            put_int(&mut mapping, flag, 1);
        }
        put_bytes(&mut w.body, field::MAPPING, &mapping);
        w
    }

    fn string(&mut self, s: &[u8]) -> i64 {
        if let Some(&id) = self.string_ids.get(s) {
            return id;
        }
        let id = self.strings.len() as i64;
        self.strings.push(s.into());
        self.string_ids.insert(s.into(), id);
        id
    }

    fn value_type(&mut self, field: u32, kind: &str, unit: &str) {
        let (kind, unit) = (self.string(kind.as_bytes()), self.string(unit.as_bytes()));
        let mut message = Vec::new();
        put_int(&mut message, 1, kind as u64);
        put_int(&mut message, 2, unit as u64);
        put_bytes(&mut self.body, field, &message);
    }

    fn function(&mut self, name: &[u8], file: &[u8]) -> u64 {
        let key = (self.string(name), self.string(file));
        if let Some(&id) = self.function_ids.get(&key) {
            return id;
        }
        let id = self.function_ids.len() as u64 + 1;
        self.function_ids.insert(key, id);
        self.message.clear();
        put_int(&mut self.message, 1, id);
        // No system name: pprof takes one equal to the name for an undemangled C++ name and
        // shortens it.
        put_int(&mut self.message, 2, key.0 as u64);
        put_int(&mut self.message, 4, key.1 as u64);
        put_bytes(&mut self.body, field::FUNCTION, &self.message);
        id
    }

    /// The id of the location whose `lines` (innermost first: the inlined callees before the
    /// function they were inlined into) are given, written the first time.
    pub(crate) fn location<'a>(&mut self, lines: impl IntoIterator<Item = Line<'a>>) -> u64 {
        let key: Vec<(u64, u32)> = lines.into_iter().map(|l| (self.function(l.function, l.file), l.line)).collect();
        if let Some(&id) = self.location_ids.get(&key) {
            return id;
        }
        let id = self.location_ids.len() as u64 + 1;
        self.message.clear();
        put_int(&mut self.message, 1, id);
        put_int(&mut self.message, 2, MAPPING_ID);
        for &(function, line) in &key {
            let mut line_message = Vec::with_capacity(8);
            put_int(&mut line_message, 1, function);
            put_int(&mut line_message, 2, u64::from(line));
            put_bytes(&mut self.message, 4, &line_message);
        }
        put_bytes(&mut self.body, field::LOCATION, &self.message);
        self.location_ids.insert(key, id);
        id
    }

    /// A sample of `locations` (leaf first) with `values` (one per sample type).
    pub(crate) fn sample(&mut self, locations: &[u64], values: &[i64]) {
        self.message.clear();
        self.packed.clear();
        locations.iter().for_each(|&id| put_varint(&mut self.packed, id));
        put_bytes(&mut self.message, 1, &self.packed);
        self.packed.clear();
        values.iter().for_each(|&v| put_varint(&mut self.packed, v as u64));
        put_bytes(&mut self.message, 2, &self.packed);
        put_bytes(&mut self.body, field::SAMPLE, &self.message);
    }

    /// The profile, taken at `time_nanos` (since the Unix epoch) over `duration_nanos`, with
    /// `comments`, gzipped.
    pub(crate) fn finish(mut self, time_nanos: i64, duration_nanos: i64, comments: &[&str]) -> Vec<u8> {
        put_int(&mut self.body, field::TIME_NANOS, time_nanos as u64);
        put_int(&mut self.body, field::DURATION_NANOS, duration_nanos as u64);
        for comment in comments {
            let id = self.string(comment.as_bytes());
            put_int(&mut self.body, field::COMMENT, id as u64);
        }
        let mut body = std::mem::take(&mut self.body);
        for s in &self.strings {
            put_bytes(&mut body, field::STRING_TABLE, s);
        }
        gzip(&body)
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_int(out: &mut Vec<u8>, field: u32, v: u64) {
    put_varint(out, u64::from(field << 3 | VARINT));
    put_varint(out, v);
}

fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_varint(out, u64::from(field << 3 | LENGTH_DELIMITED));
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// `data` as a gzip member (RFC 1952): what pprof's readers expect of a profile.
pub(crate) fn gzip(data: &[u8]) -> Vec<u8> {
    // Level 6: zlib's default, a fraction of the cost of the best for a few percent more.
    let deflated = miniz_oxide::deflate::compress_to_vec(data, 6);
    let mut out = Vec::with_capacity(deflated.len() + 18);
    // Magic, deflate, no flags, no time, no extra flags, unknown OS.
    out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255]);
    out.extend_from_slice(&deflated);
    out.extend_from_slice(&crc32(data).to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

/// The CRC-32 (IEEE) of `data`, as gzip checks it.
fn crc32(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    !data.iter().fold(!0u32, |c, &b| TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_of_the_check_string() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn varints_are_little_endian_groups_of_seven_bits() {
        let mut out = Vec::new();
        put_varint(&mut out, 300);
        put_varint(&mut out, (-1i64) as u64);
        assert_eq!(out[..2], [0xAC, 0x02]);
        assert_eq!(out.len(), 2 + 10);
    }
}
