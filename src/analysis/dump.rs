//! The text dump of upstream's `dump_trace` (`memtrace dump`, FORMAT.md §13), byte for byte
//! but for the control characters, bidi marks and invalid UTF-8 of names, which it shows
//! [`inert`](super::inert()) where upstream prints them raw.

use std::io::{self, Write};

use crate::format::hash::FastMap;
use crate::format::location_codec::Location;
use crate::format::trace::{AllocSource, EventKind, Reader};
use crate::inert::inert_bytes;
use crate::Result;

/// Print one line per allocation, promote and collect event of the trace at `path`.
/// Reader warnings (e.g. a truncated last packet) go to `warn`.
pub fn dump(path: &std::path::Path, out: &mut impl Write, warn: &mut impl Write) -> Result<()> {
    let mut reader = Reader::open(path)?;
    let start = reader.info().start_time;
    let mut line = Vec::with_capacity(4096);
    // Each code's text, formatted once: a frame then costs one copy.
    let mut frame_text: FastMap<u64, Box<[u8]>> = FastMap::default();
    let mut warned = 0;
    while let Some(event) = reader.next_event()? {
        line.clear();
        // Wrapping, like upstream's Int64.sub: a corrupt time must not overflow.
        put_padded(&mut line, (event.time as i64).wrapping_sub(start as i64), 10);
        line.push(b' ');
        match event.kind {
            EventKind::Alloc(alloc) => {
                put_padded(&mut line, alloc.id as i64, 10);
                line.extend_from_slice(match alloc.source {
                    AllocSource::Minor => b" alloc ",
                    AllocSource::Major => b" alloc_major ",
                    AllocSource::External => b" alloc_ext ",
                });
                put_int(&mut line, alloc.nsamples as i64);
                line.extend_from_slice(b" len=");
                put_int(&mut line, alloc.length as i64);
                line.extend_from_slice(b" dom=");
                put_int(&mut line, event.domain as i64);
                line.push(b' ');
                put_space_padded(&mut line, alloc.common_prefix as i64, 4);
                line.push(b':');
                // Frames go straight out: a line holds the whole stack, whatever its depth.
                out.write_all(&line)?;
                line.clear();
                for &code in alloc.backtrace {
                    let text = match frame_text.get(&code) {
                        Some(text) => text,
                        None => frame_text.entry(code).or_insert(format_frame(code, event.locations.get(code)?)),
                    };
                    out.write_all(text)?;
                }
            }
            EventKind::Promote { id } => {
                put_padded(&mut line, id as i64, 10);
                line.extend_from_slice(b" promote");
            }
            EventKind::Collect { id } => {
                put_padded(&mut line, id as i64, 10);
                line.extend_from_slice(b" collect");
            }
        }
        line.push(b'\n');
        out.write_all(&line)?;
        report_warnings(&reader, &mut warned, warn)?;
    }
    report_warnings(&reader, &mut warned, warn)?;
    out.flush()?;
    Ok(())
}

/// The text of one backtrace frame: ` $code` for a code without locations, else
/// ` defname@filename:line:start-end` for each location.
fn format_frame(code: u64, locations: &[Location]) -> Box<[u8]> {
    let mut text = Vec::new();
    if locations.is_empty() {
        text.extend_from_slice(b" $");
        put_uint(&mut text, code);
    }
    for l in locations {
        text.push(b' ');
        text.extend_from_slice(inert_bytes(&l.defname).as_bytes());
        text.push(b'@');
        text.extend_from_slice(inert_bytes(&l.filename).as_bytes());
        text.push(b':');
        put_uint(&mut text, l.line.into());
        text.push(b':');
        put_uint(&mut text, l.start_char.into());
        text.push(b'-');
        put_uint(&mut text, l.end_char.into());
    }
    text.into_boxed_slice()
}

fn report_warnings<R: io::Read>(reader: &Reader<R>, reported: &mut usize, warn: &mut impl Write) -> io::Result<()> {
    for w in &reader.warnings()[*reported..] {
        writeln!(warn, "{w}")?;
    }
    *reported = reader.warnings().len();
    Ok(())
}

/// Append a decimal integer (printf `%d`).
fn put_int(out: &mut Vec<u8>, v: i64) {
    if v < 0 {
        out.push(b'-');
    }
    put_uint(out, v.unsigned_abs());
}

/// Append the decimal digits of `n`.
fn put_uint(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Append `v` as printf `%0<width>d`: zero-padded after any minus sign.
fn put_padded(out: &mut Vec<u8>, v: i64, width: usize) {
    let digits = decimal_len(v.unsigned_abs()) + usize::from(v < 0);
    if v < 0 {
        out.push(b'-');
    }
    out.extend(std::iter::repeat_n(b'0', width.saturating_sub(digits)));
    put_uint(out, v.unsigned_abs());
}

/// Append `v` as printf `% <width>d`: a space for the sign of non-negative numbers, then
/// right-aligned to `width`.
fn put_space_padded(out: &mut Vec<u8>, v: i64, width: usize) {
    let digits = decimal_len(v.unsigned_abs()) + 1;
    out.extend(std::iter::repeat_n(b' ', width.saturating_sub(digits)));
    out.push(if v < 0 { b'-' } else { b' ' });
    put_uint(out, v.unsigned_abs());
}

fn decimal_len(mut n: u64) -> usize {
    let mut len = 1;
    while n >= 10 {
        n /= 10;
        len += 1;
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fmt(f: impl Fn(&mut Vec<u8>)) -> String {
        let mut v = Vec::new();
        f(&mut v);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn printf_paddings() {
        assert_eq!(fmt(|o| put_padded(o, 461, 10)), "0000000461");
        assert_eq!(fmt(|o| put_padded(o, -5, 10)), "-000000005");
        assert_eq!(fmt(|o| put_space_padded(o, 0, 4)), "   0");
        assert_eq!(fmt(|o| put_space_padded(o, 1234, 4)), " 1234");
        assert_eq!(fmt(|o| put_space_padded(o, 12345, 4)), " 12345");
        assert_eq!(fmt(|o| put_space_padded(o, -5, 4)), "  -5");
        assert_eq!(fmt(|o| put_int(o, i64::MIN)), "-9223372036854775808");
    }
}
