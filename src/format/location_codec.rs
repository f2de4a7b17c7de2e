//! Source locations and their move-to-front encoding (FORMAT.md §5).
//!
//! A location event binds a location code to a list of [`Location`]s. Each record is a
//! 48-bit packed value (line, columns, and two 5-bit move-to-front codes) followed by the
//! file and function names that the tables did not already hold. [`Encoder`] and
//! [`Decoder`] own the per-writer and per-reader-domain tables.

use std::borrow::Cow;
use std::sync::Arc;

use crate::format::buf::{ReadCursor, WriteBuf};
use crate::format::error::{ErrorKind, Result};

/// One source location: a position in a file and the name of the enclosing definition.
///
/// Names are raw bytes, as the format stores them; use [`Location::filename_str`] and
/// [`Location::defname_str`] for display. They are shared (`Arc`), so that the many
/// locations naming one file or function cost one copy of the name: a reader's memory then
/// stays proportional to its input even when records keep referring to long names.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Location {
    /// The source file.
    pub filename: Arc<[u8]>,
    /// Line number (20 bits are stored; larger values are written as `0xFFFFF`).
    pub line: u32,
    /// First column (8 bits stored; larger values are written as 255).
    pub start_char: u32,
    /// Last column (10 bits stored; larger values are written as 1023).
    pub end_char: u32,
    /// The enclosing function or definition.
    pub defname: Arc<[u8]>,
}

impl Location {
    /// The location written in place of a list too large to encode (§5.3).
    pub fn unknown() -> Location {
        Location { filename: b"<unknown>"[..].into(), line: 1, start_char: 1, end_char: 1, defname: b"??"[..].into() }
    }

    /// The file name, converted lossily to UTF-8.
    pub fn filename_str(&self) -> Cow<'_, str> {
        lossy_utf8(&self.filename)
    }

    /// The definition name, converted lossily to UTF-8.
    pub fn defname_str(&self) -> Cow<'_, str> {
        lossy_utf8(&self.defname)
    }

    /// The location as the encoder stores it: each field clamped to its width (§5.2), and
    /// names cut at their first NUL byte (§1.4).
    pub fn as_encoded(&self) -> Location {
        let cut = |s: &Arc<[u8]>| {
            let kept = cut_at_nul(s);
            if kept.len() == s.len() {
                s.clone()
            } else {
                Arc::from(kept)
            }
        };
        Location {
            filename: cut(&self.filename),
            line: clamp(self.line, MAX_LINE),
            start_char: clamp(self.start_char, MAX_START_CHAR),
            end_char: clamp(self.end_char, MAX_END_CHAR),
            defname: cut(&self.defname),
        }
    }
}

const MAX_LINE: u32 = 0xF_FFFF;
const MAX_START_CHAR: u32 = 0xFF;
const MAX_END_CHAR: u32 = 0x3FF;
/// Number of slots in each move-to-front table; code 31 means "new name follows".
const MTF_SLOTS: usize = 31;
const NEW_NAME: u8 = 31;
/// Largest location list, in entries and in worst-case bytes, that is encoded as is.
const MAX_LOCATIONS: usize = 255;
const MAX_LIST_BYTES: usize = 4096;

fn clamp(v: u32, max: u32) -> u32 {
    v.min(max)
}

/// A move-to-front table of at most 31 entries, slot 0 first.
#[derive(Debug, Clone)]
struct MtfTable<T> {
    slots: Vec<T>,
}

impl<T> Default for MtfTable<T> {
    fn default() -> Self {
        MtfTable { slots: Vec::new() }
    }
}

impl<T> MtfTable<T> {
    /// Move slot `i` to the front.
    fn promote(&mut self, i: usize) {
        self.slots[..=i].rotate_right(1);
    }

    /// Put `entry` at the front, returning the entry evicted from slot 30, if any.
    fn push(&mut self, entry: T) -> Option<T> {
        let evicted = if self.slots.len() == MTF_SLOTS { self.slots.pop() } else { None };
        self.slots.insert(0, entry);
        evicted
    }

    fn front_mut(&mut self) -> &mut T {
        &mut self.slots[0]
    }
}

impl<T> MtfTable<T> {
    fn find(&self, matches: impl Fn(&T) -> bool) -> Option<usize> {
        self.slots.iter().position(matches)
    }
}

#[derive(Debug, Clone)]
struct FileEntry {
    filename: Arc<[u8]>,
    defnames: MtfTable<Arc<[u8]>>,
}

/// The writer side of the location codec: one per writer domain.
#[derive(Debug, Default, Clone)]
pub struct Encoder {
    files: MtfTable<FileEntry>,
}

impl Encoder {
    /// A fresh encoder with empty tables.
    pub fn new() -> Encoder {
        Encoder::default()
    }

    /// Write `nlocs` (u8) and the records of a location list. A list longer than 255 entries
    /// or whose worst-case size exceeds 4096 bytes is replaced by [`Location::unknown`].
    pub fn put_location_list(&mut self, buf: &mut WriteBuf, locations: &[Location]) {
        if must_truncate(locations) {
            buf.put_u8(1);
            self.put_location(buf, &Location::unknown());
        } else {
            buf.put_u8(locations.len() as u8);
            for location in locations {
                self.put_location(buf, location);
            }
        }
    }

    /// Write one location record, updating the move-to-front tables.
    pub fn put_location(&mut self, buf: &mut WriteBuf, location: &Location) {
        let filename = cut_at_nul(&location.filename);
        let defname = cut_at_nul(&location.defname);
        let file_code = match self.files.find(|e| &*e.filename == filename) {
            Some(i) => {
                self.files.promote(i);
                i as u8
            }
            None => {
                self.files.push(FileEntry { filename: Arc::from(filename), defnames: MtfTable::default() });
                NEW_NAME
            }
        };
        let defnames = &mut self.files.front_mut().defnames;
        let def_code = match defnames.find(|d| &**d == defname) {
            Some(i) => {
                defnames.promote(i);
                i as u8
            }
            None => {
                defnames.push(Arc::from(defname));
                NEW_NAME
            }
        };
        let packed = clamp(location.line, MAX_LINE) as u64
            | (clamp(location.start_char, MAX_START_CHAR) as u64) << 20
            | (clamp(location.end_char, MAX_END_CHAR) as u64) << 28
            | (file_code as u64) << 38
            | (def_code as u64) << 43;
        buf.put_u32(packed as u32);
        buf.put_u16((packed >> 32) as u16);
        if file_code == NEW_NAME {
            buf.put_string(filename);
        }
        if def_code == NEW_NAME {
            buf.put_string(defname);
        }
    }
}

/// The bytes of `s` up to its first NUL, as strings are written (FORMAT.md §1.4).
fn cut_at_nul(s: &[u8]) -> &[u8] {
    s.split(|&b| b == 0).next().unwrap_or_default()
}

/// Upper bound on the bytes of a location event's payload (code, count and records)
/// for this list, before truncation (§5.3).
fn worst_case_size(locations: &[Location]) -> usize {
    9 + locations.iter().map(|l| 6 + (l.filename.len() + 1) + (l.defname.len() + 1)).sum::<usize>()
}

/// Whether a list is replaced by the unknown location on encoding (§5.3).
pub fn must_truncate(locations: &[Location]) -> bool {
    locations.len() > MAX_LOCATIONS || worst_case_size(locations) > MAX_LIST_BYTES
}

/// `locations` (outermost first) made to fit a location record (§5.3) without losing the
/// names that matter, for writers that would rather shorten a list than have it replaced by
/// [`Location::unknown`]. Lists that fit are returned as they are. Otherwise, in order, until
/// the list fits: generic arguments are elided from function names (`f<…>`); inline frames
/// are dropped from the outer middle of the list (keeping the outermost function and the
/// innermost call sites); names are cut. A list that had a name keeps a name.
pub fn shorten_to_fit(locations: &[Location]) -> Cow<'_, [Location]> {
    if !must_truncate(locations) {
        return Cow::Borrowed(locations);
    }
    let mut list: Vec<Location> = locations
        .iter()
        .map(|l| Location { defname: elide_generic_arguments(&l.defname).into(), ..l.clone() })
        .collect();
    while must_truncate(&list) && list.len() > 2 {
        list.remove(1);
    }
    if must_truncate(&list) {
        // At most two records: give each name an equal share of what is left.
        let share = (MAX_LIST_BYTES - worst_case_size(&[]) - list.len() * 8) / (2 * list.len());
        for l in &mut list {
            l.filename = cut_to(&l.filename, share);
            l.defname = cut_to(&l.defname, share);
        }
    }
    Cow::Owned(list)
}

/// `name` with the contents of every outermost `<…>` group replaced by `…` (the `>` of a
/// `->` closes nothing).
fn elide_generic_arguments(name: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(name.len());
    let mut depth = 0usize;
    for (i, &b) in name.iter().enumerate() {
        let arrow = b == b'>' && i > 0 && name[i - 1] == b'-';
        match b {
            _ if arrow && depth > 0 => {}
            b'<' => {
                if depth == 0 {
                    out.extend_from_slice("<…".as_bytes());
                }
                depth += 1;
            }
            b'>' if depth > 0 && !arrow => {
                depth -= 1;
                if depth == 0 {
                    out.push(b'>');
                }
            }
            _ if depth == 0 => out.push(b),
            _ => {}
        }
    }
    out
}

/// The first `max` bytes of `s`, ending at a UTF-8 character boundary.
fn cut_to(s: &Arc<[u8]>, max: usize) -> Arc<[u8]> {
    if s.len() <= max {
        return s.clone();
    }
    let mut end = max;
    while end > 0 && (s[end] & 0xC0) == 0x80 {
        end -= 1;
    }
    Arc::from(&s[..end])
}

/// Upper bound on the bytes a location event's payload (code, count and records) takes
/// for this list, as actually encoded (after any truncation).
pub fn encoded_size_bound(locations: &[Location]) -> usize {
    if must_truncate(locations) {
        worst_case_size(&[Location::unknown()])
    } else {
        worst_case_size(locations)
    }
}

/// The reader side of the location codec: one per reader domain.
#[derive(Debug, Default, Clone)]
pub struct Decoder {
    files: MtfTable<FileEntry>,
}

impl Decoder {
    /// A fresh decoder with empty tables.
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Read `nlocs` and that many records into `out` (cleared first).
    pub fn get_location_list(&mut self, r: &mut ReadCursor<'_>, out: &mut Vec<Location>) -> Result<()> {
        out.clear();
        let n = r.get_u8()?;
        for _ in 0..n {
            out.push(self.get_location(r)?);
        }
        Ok(())
    }

    /// Read one location record, updating the tables.
    ///
    /// A new file name takes over the defname table of the entry it evicts from slot 30,
    /// stale contents included: version-1 writers relied on that, and later writers never
    /// refer to slots they did not fill, so emulating it is safe for every version (§5.4).
    pub fn get_location(&mut self, r: &mut ReadCursor<'_>) -> Result<Location> {
        let low = r.get_u32()? as u64;
        let high = r.get_u16()? as u64;
        let packed = low | high << 32;
        let file_code = ((packed >> 38) & 0x1F) as u8;
        let def_code = ((packed >> 43) & 0x1F) as u8;
        if file_code == NEW_NAME {
            let filename = Arc::from(r.get_string()?);
            let recycled = if self.files.slots.len() == MTF_SLOTS { self.files.slots.pop() } else { None };
            let defnames = recycled.map(|e| e.defnames).unwrap_or_default();
            self.files.push(FileEntry { filename, defnames });
        } else if (file_code as usize) < self.files.slots.len() {
            self.files.promote(file_code as usize);
        } else {
            return Err(r.error(ErrorKind::BadMtfIndex(file_code)));
        }
        let defnames = &mut self.files.front_mut().defnames;
        if def_code == NEW_NAME {
            defnames.push(Arc::from(r.get_string()?));
        } else if (def_code as usize) < defnames.slots.len() {
            defnames.promote(def_code as usize);
        } else {
            return Err(r.error(ErrorKind::BadMtfIndex(def_code)));
        }
        let file = &self.files.slots[0];
        Ok(Location {
            filename: file.filename.clone(),
            line: (packed & 0xF_FFFF) as u32,
            start_char: ((packed >> 20) & 0xFF) as u32,
            end_char: ((packed >> 28) & 0x3FF) as u32,
            defname: file.defnames.slots[0].clone(),
        })
    }
}

/// `bytes` as text, invalid UTF-8 replaced: `str::from_utf8`'s check first, which is much
/// faster than `String::from_utf8_lossy`'s on the valid names and paths that traces and debug
/// info hold.
pub(crate) fn lossy_utf8(bytes: &[u8]) -> Cow<'_, str> {
    std::str::from_utf8(bytes).map_or_else(|_| String::from_utf8_lossy(bytes), Cow::Borrowed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(file: &str, line: u32, def: &str) -> Location {
        Location { filename: file.as_bytes().into(), line, start_char: 3, end_char: 9, defname: def.as_bytes().into() }
    }

    fn round_trip(lists: &[Vec<Location>]) -> Vec<Vec<Location>> {
        let mut enc = Encoder::new();
        let mut dec = Decoder::new();
        lists
            .iter()
            .map(|list| {
                let mut buf = WriteBuf::with_capacity(1 << 16);
                enc.put_location_list(&mut buf, list);
                let mut r = ReadCursor::new(buf.as_bytes(), 0);
                let mut out = Vec::new();
                dec.get_location_list(&mut r, &mut out).unwrap();
                assert!(r.is_empty());
                out
            })
            .collect()
    }

    #[test]
    fn worked_example_from_the_spec() {
        // FORMAT.md §13: record bytes 2E 00 10 B1 C4 FF, then two strings.
        let mut bytes = vec![0x2E, 0x00, 0x10, 0xB1, 0xC4, 0xFF];
        bytes.extend_from_slice(b"trace_ocamlopt/main.ml\0Main.Options\0");
        let got = Decoder::new().get_location(&mut ReadCursor::new(&bytes, 0)).unwrap();
        let want = Location {
            filename: b"trace_ocamlopt/main.ml"[..].into(),
            line: 46,
            start_char: 17,
            end_char: 75,
            defname: b"Main.Options"[..].into(),
        };
        assert_eq!(got, want);
        let mut buf = WriteBuf::with_capacity(100);
        Encoder::new().put_location(&mut buf, &want);
        assert_eq!(buf.as_bytes(), &bytes[..]);
    }

    #[test]
    fn tables_survive_more_than_31_names() {
        let lists: Vec<Vec<Location>> = (0..200)
            .map(|i| vec![loc(&format!("f{}", i % 40), i, &format!("d{}", i % 37)), loc("main.rs", 1, "main")])
            .collect();
        assert_eq!(round_trip(&lists), lists);
    }

    #[test]
    fn oversized_lists_become_unknown() {
        let long = vec![loc("a", 1, "b"); 256];
        let big = vec![loc(&"x".repeat(5000), 1, "b")];
        let out = round_trip(&[long, big, vec![]]);
        assert_eq!(out[0], vec![Location::unknown()]);
        assert_eq!(out[1], vec![Location::unknown()]);
        assert!(out[2].is_empty());
    }

    #[test]
    fn long_inline_chains_are_shortened_keeping_their_names() {
        let generic = format!("crate::level<{}>", "Vec<HashMap<String, Box<dyn Fn(u8) -> u8>>>, ".repeat(4));
        let chain: Vec<Location> =
            (0..60).map(|i| loc(&format!("src/deep/file_{i}.rs"), i, &format!("{generic}::f{i}"))).collect();
        assert!(must_truncate(&chain));
        let short = shorten_to_fit(&chain);
        assert!(!must_truncate(&short), "{short:?}");
        let names: Vec<_> = short.iter().map(|l| l.defname_str().into_owned()).collect();
        assert_eq!(names.first().unwrap(), "crate::level<…>::f0", "the outermost function is kept");
        assert_eq!(names.last().unwrap(), "crate::level<…>::f59", "the innermost call site is kept");
        assert_eq!(short.last().unwrap().line, 59);
        assert!(short.len() > 2, "only as many frames dropped as needed");
        assert_eq!(round_trip(&[short.to_vec()])[0], short.to_vec(), "encoded as they are");
        // Eliding generic arguments alone may be enough: nothing dropped then.
        let few: Vec<Location> = (0..16).map(|i| loc("f.rs", i, &format!("{generic}{generic}"))).collect();
        assert!(must_truncate(&few));
        assert_eq!(shorten_to_fit(&few).len(), 16);
        assert_eq!(shorten_to_fit(&few)[0].defname_str(), "crate::level<…>crate::level<…>");
        // Lists that fit are untouched.
        assert!(matches!(shorten_to_fit(&few[..1]), Cow::Borrowed(_)));
    }

    #[test]
    fn over_long_names_are_cut_not_replaced() {
        let huge =
            vec![loc(&"d/".repeat(3000), 1, &"x".repeat(5000)), loc("f.rs", 2, &format!("é{}", "y".repeat(5000)))];
        let short = shorten_to_fit(&huge);
        assert!(!must_truncate(&short));
        assert_eq!(short.len(), 2);
        assert!(short[0].defname.starts_with(b"xxx") && short[1].defname.starts_with("éy".as_bytes()));
        assert!(std::str::from_utf8(&short[1].defname).is_ok(), "cut at a character boundary");
        let many = vec![loc("a", 1, "b"); 300];
        assert_eq!(shorten_to_fit(&many).len(), 255);
    }

    #[test]
    fn fields_are_clamped() {
        let l = Location {
            filename: b"f"[..].into(),
            line: 1 << 21,
            start_char: 300,
            end_char: 5000,
            defname: b"d"[..].into(),
        };
        assert_eq!(round_trip(&[vec![l.clone()]])[0], vec![l.as_encoded()]);
        assert_eq!(l.as_encoded().start_char, 255);
    }

    #[test]
    fn empty_slot_reference_is_an_error() {
        let bytes = [0, 0, 0, 0, 0x40, 0]; // file code 1 with an empty table
        let err = Decoder::new().get_location(&mut ReadCursor::new(&bytes, 0)).unwrap_err();
        assert!(matches!(err.kind(), ErrorKind::BadMtfIndex(1)));
    }
}
