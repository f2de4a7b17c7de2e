//! Names an address from an object's DWARF, reading only what that address needs: the unit
//! that holds it (`.debug_aranges`: one pass over it for an object's first batch of addresses,
//! over the units' sets that may hold them for the next few, then a sorted index of it), the
//! entries of the one function there, the names on the chain of functions inlined at the
//! address, and the one line-program sequence that covers it. The function's entry and
//! sequence are found by searching the unit's bytes for the address its symbol starts at, for
//! a unit's first few lookups, else by reading the unit's entries and line program as far as
//! needed. What is kept per unit is small: its header and
//! abbreviations, the address ranges of its functions, and where each line sequence starts;
//! at most [`MAX_PARSED_UNITS`] units are kept.
//!
//! addr2line, which this replaces in the runtime, keeps every line row of a unit and, per
//! function, every inlined call with its name. For a frame of the standard library (one unit
//! of megabytes of DWARF, in every Rust program) that is megabytes of heap, and the names
//! bring most of `.debug_str` into memory. The answers are addr2line's, frame for frame (a
//! test compares them), so its rules are followed here: which attribute names a function,
//! how a file's path is put together, which row of a sequence covers an address.

use std::cell::RefCell;
use std::cmp::Ordering;

use super::line_header::Header;
use super::line_program::{Program, Sequence, Sequences};
use crate::format::hash::FastMap;
use crate::runtime::descriptor::OwnFd;

pub(super) type Reader = gimli::EndianSlice<'static, gimli::RunTimeEndian>;
pub(super) type Offset = usize;
type Result<T> = std::result::Result<T, gimli::Error>;

/// One function at an address: the outermost is the function whose code it is, the others
/// are inlined into the one before.
pub(super) struct Frame {
    /// The linkage name, else the name (of the entry or of the entries it stands for).
    pub(super) name: Option<Vec<u8>>,
    pub(super) file: Option<String>,
    /// 0 when unknown, as `column`.
    pub(super) line: u32,
    pub(super) column: u32,
}

/// The most units whose parsed state an object keeps (the least recently used is dropped):
/// enough for the 53 units a run of jaq (a 26 MB program) names frames in. The memory budget
/// bounds what they hold.
const MAX_PARSED_UNITS: usize = 64;

/// Estimated heap bytes of a parsed unit before its functions and sequences are read: its
/// abbreviations and line program header (10-14 KiB measured on ripgrep's 935 units).
const BYTES_PER_UNIT: usize = 12 << 10;

/// Estimated heap bytes of a string read ([`Dwarf::string`]) besides its own.
const STRING_READ_BYTES: usize = 48;

/// How many `DW_AT_abstract_origin`/`DW_AT_specification` links a name is followed through.
const NAME_LINKS: usize = 16;

/// `.debug_str`, which names functions and the units' directories. Read a string at a time
/// with `pread` when it lies uncompressed in the object's file, not through the mapping:
/// each first touch of a mapped page maps its neighbours too (the kernel's fault-around, 64
/// KiB, which no `madvise` turns off), and the few names a program's stacks need are spread
/// over the whole section, so reading them mapped made most of it resident. Through the
/// mapping after all once the program has closed the file's descriptor, or put a file of its
/// own on its number (see `descriptor`).
#[derive(Clone)]
pub(super) enum Strings {
    /// The file is shared with the [siblings](Dwarf::sibling) of its reader; `mapped` is the
    /// section as mapped.
    InFile {
        file: std::sync::Arc<OwnFd>,
        offset: u64,
        mapped: &'static [u8],
    },
    InMemory(&'static [u8]),
}

impl Strings {
    /// The string at `at`, without its terminating NUL.
    fn at(&self, at: u64) -> Option<Vec<u8>> {
        match self {
            Strings::InMemory(data) => string_in(data, at),
            Strings::InFile { file, offset, mapped } => {
                let len = mapped.len() as u64;
                let (mut string, mut next, mut chunk) = (Vec::new(), at, 256u64);
                while next < len {
                    let start = string.len();
                    let n = chunk.min(len - next);
                    string.resize(start + n as usize, 0);
                    match file.read_exact_at(&mut string[start..], offset + next) {
                        Some(read) => read.ok()?,
                        None => return string_in(mapped, at),
                    }
                    if let Some(end) = string[start..].iter().position(|&b| b == 0) {
                        string.truncate(start + end);
                        return Some(string);
                    }
                    (next, chunk) = (next + n, (chunk * 2).min(64 << 10));
                }
                None
            }
        }
    }
}

/// The NUL-terminated string at `at` in `data`, without its NUL.
fn string_in(data: &[u8], at: u64) -> Option<Vec<u8>> {
    let rest = data.get(usize::try_from(at).ok()?..)?;
    Some(rest[..rest.iter().position(|&b| b == 0)?].to_vec())
}

/// An object's DWARF sections and what has been read of them.
pub(super) struct Dwarf {
    /// Its `.debug_str` is empty: strings are read from `strings`.
    sections: gimli::Dwarf<Reader>,
    strings: Strings,
    /// The strings read from `strings` so far, by offset (see [`Dwarf::string`]).
    strings_read: RefCell<FastMap<u64, Vec<u8>>>,
    /// (start, end, `.debug_info` offset of the unit), sorted: made by the first
    /// lookup that a pass over `.debug_aranges` did not answer ([`Dwarf::expect`]).
    index: Option<Vec<(u64, u64, Offset)>>,
    /// The unit of each address of the last pass over `.debug_aranges`, by address.
    foreseen: Vec<(u64, Option<Offset>)>,
    /// The sets of `.debug_aranges` (a unit's ranges each) and where their ranges lie, noted by
    /// the first pass over it: later passes read only the sets a batch's addresses may be in
    /// ([`units_in_sets`]).
    sets: Option<Vec<(ArangeSet, SetSpans)>>,
    /// The offsets of the units in `index` (or that it would hold), sorted: made the first
    /// time a name leads to another unit.
    unit_starts: Option<Vec<Offset>>,
    /// Parsed units, in no order (indexes stay valid during one lookup).
    units: Vec<ParsedUnit>,
    clock: u64,
    /// Whether a unit parsed was a skeleton of split DWARF (see [`Dwarf::split`]).
    split: bool,
}

struct ParsedUnit {
    offset: Offset,
    /// One past the unit's last byte in `.debug_info`.
    end: Offset,
    /// Made without its line program (see [`unit_without_lines`]).
    unit: gimli::Unit<Reader>,
    functions: Functions,
    /// Where its line program is in `.debug_line`, if it has one.
    line_program: Option<Offset>,
    lines: Option<Lines>,
    /// Read at the first file name.
    comp_dir: Option<Option<String>>,
    /// How many lookups have searched the unit's bytes (see [`Dwarf::function_starting_at`]).
    searches: u32,
    /// Where a function's `DW_AT_low_pc` lies in its entry, per abbreviation that puts it at a
    /// fixed place: worked out at the first search.
    starts: Option<Vec<StartLayout>>,
    last_use: u64,
}

/// An abbreviation of functions whose entries hold their start address (`DW_FORM_addr`)
/// `prefix` bytes in, all of a fixed size before it, the code's own bytes included.
#[derive(Clone, Copy)]
struct StartLayout {
    code: u64,
    prefix: usize,
}

/// How many lookups in a unit may search its bytes for their function's start address and
/// line sequence (one scan of the unit's entries and of its line program each, a few times
/// faster than reading them) before the unit is read as far as lookups need instead: a unit
/// of many lookups (the standard library's, in a long run) is then read once.
const SEARCHES_PER_UNIT: u32 = 8;

/// A unit's functions with code, read only as far as lookups have needed: for a unit of a
/// few lookups (most, in a short run), part of its entries.
struct Functions {
    /// (begin, end, entry), sorted by begin once all are read (those that
    /// [`Dwarf::function_starting_at`] found may come twice).
    found: Vec<(u64, u64, Offset)>,
    /// The entry to read on from; `None` once all are read.
    next: Option<gimli::UnitOffset>,
    /// How the read steps over entries of each abbreviation code, worked out at its first
    /// entry.
    steps: Vec<Step>,
}

/// How [`read_functions`] steps over an entry of one abbreviation code.
#[derive(Clone, Copy, PartialEq)]
enum Step {
    Unknown,
    /// Not a function, and its attributes are this many bytes whatever their values (most
    /// entries: inlined calls, namespaces, declarations): stepped over without being parsed.
    Skip(usize),
    /// A function, or attributes of variable size: read through gimli.
    Read,
}

/// The most abbreviation codes whose [`Step`] is kept (codes are numbered from 1; a unit has
/// hundreds): entries of higher codes are read through gimli.
const MAX_STEPS: u64 = 1 << 12;

/// A unit's line program, its files, and where its sequences start, as far as lookups have
/// read.
struct Lines {
    program: Program,
    sequences: Sequences,
    header: Header,
}

/// What names an entry, in the order its attributes came.
#[derive(Default)]
struct NameAttributes(Vec<(gimli::DwAt, gimli::AttributeValue<Reader>)>);

/// An inlined call on the chain at an address.
struct Inlined {
    names: NameAttributes,
    call_file: Option<u64>,
    call_line: u32,
    call_column: u32,
}

impl Dwarf {
    /// The DWARF of `sections`. Without `.debug_aranges` (some compilers, such as clang, leave
    /// it out), the unit index is made now, and `None` when no unit has code.
    pub(super) fn new(sections: gimli::Dwarf<Reader>, strings: Strings) -> Option<Dwarf> {
        let mut dwarf = Dwarf {
            sections,
            strings,
            strings_read: RefCell::default(),
            index: None,
            foreseen: Vec::new(),
            sets: None,
            unit_starts: None,
            units: Vec::new(),
            clock: 0,
            split: false,
        };
        if dwarf.aranges().is_empty() {
            (!dwarf.index().is_empty()).then_some(dwarf)
        } else {
            Some(dwarf)
        }
    }

    /// A reader of the same DWARF with nothing parsed, for another thread: sharing only the
    /// sections (which borrow from the object's mapped file: the caller keeps the mapping
    /// alive for as long as the sibling) and the file its strings are read from.
    pub(super) fn sibling(&self) -> Dwarf {
        let s = &self.sections;
        let sections = gimli::Dwarf {
            debug_abbrev: s.debug_abbrev,
            debug_addr: s.debug_addr,
            debug_aranges: s.debug_aranges,
            debug_info: s.debug_info,
            debug_line: s.debug_line,
            debug_line_str: s.debug_line_str,
            debug_str: s.debug_str,
            debug_str_offsets: s.debug_str_offsets,
            debug_macinfo: s.debug_macinfo,
            debug_macro: s.debug_macro,
            debug_names: s.debug_names,
            debug_types: s.debug_types,
            locations: s.locations,
            ranges: s.ranges,
            file_type: s.file_type,
            // A cache of its own, and no supplementary file (none is loaded).
            ..Default::default()
        };
        Dwarf {
            sections,
            strings: self.strings.clone(),
            strings_read: RefCell::default(),
            index: None,
            foreseen: Vec::new(),
            // A sibling finds units through its lender (`unit_at`).
            sets: None,
            unit_starts: self.unit_starts.clone(),
            units: Vec::new(),
            clock: 0,
            split: false,
        }
    }

    fn aranges(&self) -> &'static [u8] {
        gimli::Section::reader(&self.sections.debug_aranges).slice()
    }

    fn aranges_endian(&self) -> gimli::RunTimeEndian {
        gimli::Reader::endian(gimli::Section::reader(&self.sections.debug_aranges))
    }

    /// Get ready to look up `sorted` (distinct addresses in increasing order): until the unit
    /// index is made, their units are found in one pass over `.debug_aranges` (a pass costs
    /// less than sorting a copy of it, which a short program's first batches of addresses,
    /// named at exit, would wait for), which notes where each set's ranges lie; later passes
    /// read only the sets that may hold the batch's addresses.
    pub(super) fn expect(&mut self, sorted: &[u64]) {
        if self.index.is_some() || sorted.is_empty() {
            return;
        }
        let units = match &self.sets {
            Some(sets) => units_in_sets(sorted, sets),
            None => {
                let mut sets = Vec::new();
                let units = units_at(sorted, |f| sets = noted_sets(self.aranges(), self.aranges_endian(), f));
                self.sets = Some(sets);
                units
            }
        };
        match units {
            Some(units) => self.foreseen = sorted.iter().copied().zip(units).collect(),
            // Nothing to read in `.debug_aranges` (all tombstones, say): the index is the
            // units' own ranges.
            None => drop(self.index()),
        }
    }

    /// `f` of each nonempty range of `.debug_aranges`, with its unit's offset.
    fn for_each_arange(&self, f: impl FnMut(u64, u64, Offset)) {
        for_each_arange(self.aranges(), self.aranges_endian(), f);
    }

    /// The unit index, made the first time.
    fn index(&mut self) -> &[(u64, u64, Offset)] {
        if self.index.is_none() {
            self.index = Some(self.read_index());
            self.foreseen = Vec::new();
            self.sets = None;
        }
        self.index.as_deref().unwrap_or_default()
    }

    /// Which unit holds which addresses: `.debug_aranges`, else (compilers that leave it
    /// out, such as clang) each unit's own ranges, which parses every unit's abbreviations.
    fn read_index(&self) -> Vec<(u64, u64, Offset)> {
        // Room for as many ranges of 8-byte addresses as the section could hold, so that the
        // index is not copied as it grows: each copy would be new pages, page faults while a
        // program's first sample is named. Room never written costs no memory (and is given
        // back below).
        let mut index = Vec::with_capacity(self.aranges().len() / 16);
        self.for_each_arange(|begin, end, unit| index.push((begin, end, unit)));
        if index.is_empty() {
            let mut headers = self.sections.units();
            while let Ok(Some(header)) = headers.next() {
                let Some(offset) = header.debug_info_offset() else { continue };
                let Ok(unit) = self.sections.unit(header) else { continue };
                let Ok(mut ranges) = self.sections.unit_ranges(&unit) else { continue };
                while let Ok(Some(range)) = ranges.next() {
                    if range.begin < range.end {
                        index.push((range.begin, range.end, offset.0));
                    }
                }
            }
        }
        // Whole entries: of ranges that start together (those of functions the linker removed,
        // at 0, say), a lookup takes the last, as a pass over the ranges does
        // ([`Dwarf::expect`]).
        index.sort_unstable();
        index.shrink_to_fit();
        index
    }

    #[cfg(test)]
    pub(super) fn has_index(&self) -> bool {
        self.index.is_some()
    }

    /// Estimated heap bytes of the index.
    pub(super) fn index_bytes(&self) -> usize {
        self.index.as_ref().map_or(0, |i| i.capacity() * std::mem::size_of::<(u64, u64, Offset)>())
            + self.sets.as_ref().map_or(0, |s| s.capacity() * std::mem::size_of::<(ArangeSet, SetSpans)>())
            + self.unit_starts.as_ref().map_or(0, |u| u.capacity() * std::mem::size_of::<Offset>())
    }

    /// Estimated heap bytes of the parsed units (and of the last pass's answers).
    pub(super) fn parsed_bytes(&self) -> usize {
        self.foreseen.capacity() * std::mem::size_of::<(u64, Option<Offset>)>()
            + self.strings_read.borrow().values().map(|s| STRING_READ_BYTES + s.len()).sum::<usize>()
            + self
                .units
                .iter()
                .map(|u| {
                    BYTES_PER_UNIT
                        + u.functions.found.capacity() * std::mem::size_of::<(u64, u64, Offset)>()
                        + u.lines.as_ref().map_or(0, |l| l.sequences.capacity() * std::mem::size_of::<Sequence>())
                })
                .sum::<usize>()
    }

    /// Drop every parsed unit and the strings read (the index is kept).
    pub(super) fn forget_units(&mut self) {
        self.units = Vec::new();
        self.strings_read = RefCell::default();
    }

    pub(super) fn parsed_units(&self) -> usize {
        self.units.len()
    }

    /// Whether a unit looked up so far was the skeleton of a unit in split DWARF (a build with
    /// `split-debuginfo`: its entries are in `.dwo`/`.dwp` files, which are not read). Its
    /// frames then have lines but no inlined functions, and the line is that of the innermost
    /// code, which may be inlined from elsewhere.
    pub(super) fn split(&self) -> bool {
        self.split
    }

    /// The names of all the functions whose ranges hold `probe` (for comparing with
    /// addr2line, which names aliases by any of their entries).
    #[cfg(test)]
    pub(super) fn names_of_functions_at(&mut self, probe: u64) -> Vec<Vec<u8>> {
        let Some(u) = self.unit_at(probe).and_then(|offset| self.parsed(offset).ok()) else { return Vec::new() };
        // No function holds the last address: this reads all the unit's functions.
        let _ = self.function_at(u, u64::MAX, None);
        let holding: Vec<Offset> =
            self.units[u].functions.found.iter().filter(|f| f.0 <= probe && probe < f.1).map(|f| f.2).collect();
        let mut names = Vec::new();
        for entry in holding {
            let Ok((attributes, _)) = self.inlined_chain(u, gimli::UnitOffset(entry), probe) else { continue };
            names.extend(self.name(u, &attributes).ok().flatten());
        }
        names
    }

    /// The entry of the function at `probe` and the bounds of its line sequence, as searching
    /// from `start` finds them (see [`Dwarf::function_starting_at`]), whatever the unit's
    /// earlier lookups.
    #[cfg(test)]
    pub(super) fn searched(&mut self, probe: u64, (start, size): (u64, u64)) -> (Option<Offset>, Option<(u64, u64)>) {
        let Some(u) = self.unit_at(probe).and_then(|offset| self.parsed(offset).ok()) else { return (None, None) };
        let function = self.function_starting_at(u, (start, size), probe).map(|f| f.0);
        let sequence = self.lines(u).and_then(|l| l.program.sequence_starting_at(&mut l.sequences, start, probe));
        (function, sequence.map(|s| (s.start, s.end)))
    }

    /// The entry of the function at `probe` and the bounds of its line sequence, as reading
    /// the unit finds them.
    #[cfg(test)]
    pub(super) fn read(&mut self, probe: u64) -> (Option<Offset>, Option<(u64, u64)>) {
        let Some(u) = self.unit_at(probe).and_then(|offset| self.parsed(offset).ok()) else { return (None, None) };
        let function = self.function_at(u, probe, None).ok().flatten().map(|f| f.0);
        let sequence = self.lines(u).and_then(|l| l.program.sequence_at(&mut l.sequences, probe, None).ok().flatten());
        (function, sequence.map(|s| (s.start, s.end)))
    }

    /// The `.debug_info` offset of the unit holding `probe`, for [`Dwarf::frames`].
    pub(super) fn unit_at(&mut self, probe: u64) -> Option<Offset> {
        if self.index.is_none() {
            if let Ok(k) = self.foreseen.binary_search_by_key(&probe, |&(p, _)| p) {
                return self.foreseen[k].1;
            }
        }
        unit_in(self.index(), probe)
    }

    /// The functions at `probe`, outermost first; empty when the DWARF does not say. `unit`:
    /// the unit holding `probe`, as [`Dwarf::unit_at`] gave it (a sibling is given its
    /// reader's). `function`: the start and size of the function at `probe` as the symbol
    /// table gives them, if it does (which lets the unit's bytes be searched rather than read;
    /// see [`Dwarf::function_starting_at`]).
    pub(super) fn frames(&mut self, unit: Option<Offset>, probe: u64, function: Option<(u64, u64)>) -> Vec<Frame> {
        self.clock += 1;
        while self.units.len() >= MAX_PARSED_UNITS {
            let oldest = (0..self.units.len()).min_by_key(|&i| self.units[i].last_use).unwrap_or(0);
            self.units.swap_remove(oldest);
        }
        let Some(offset) = unit else { return Vec::new() };
        self.frames_in(offset, probe, function).unwrap_or_default()
    }

    fn frames_in(&mut self, unit_offset: Offset, probe: u64, function: Option<(u64, u64)>) -> Result<Vec<Frame>> {
        let u = self.parsed(unit_offset)?;
        let search = function.filter(|_| self.units[u].searches < SEARCHES_PER_UNIT);
        let function = self.function_at(u, probe, search)?;
        let location = self.location(u, probe, search.map(|(start, _)| start))?;
        let Some(function) = function else {
            return Ok(location
                .map(|(file, line, column)| vec![Frame { name: None, file, line, column }])
                .unwrap_or_default());
        };
        let (names, chain) = self.inlined_chain(u, function, probe)?;
        let mut frames = vec![Frame { name: self.name(u, &names)?, file: None, line: 0, column: 0 }];
        for inlined in &chain {
            // Each frame's location is where it calls the function inlined into it.
            let outer = frames.last_mut().expect("the function's frame is first");
            outer.file = match inlined.call_file {
                Some(index) => self.file_name(u, index)?,
                None => None,
            };
            (outer.line, outer.column) = (inlined.call_line, inlined.call_column);
            frames.push(Frame { name: self.name(u, &inlined.names)?, file: None, line: 0, column: 0 });
        }
        if let Some((file, line, column)) = location {
            let innermost = frames.last_mut().expect("the function's frame is first");
            (innermost.file, innermost.line, innermost.column) = (file, line, column);
        }
        Ok(frames)
    }

    /// The index in `units` of the unit at `.debug_info` offset `offset`, parsed the first
    /// time.
    fn parsed(&mut self, offset: Offset) -> Result<usize> {
        let clock = self.clock;
        if let Some(i) = self.units.iter().position(|u| u.offset == offset) {
            self.units[i].last_use = clock;
            return Ok(i);
        }
        let header = self.sections.debug_info.header_from_offset(gimli::DebugInfoOffset(offset))?;
        let end = offset + header.length_including_self();
        let first_entry = gimli::UnitOffset(header.header_size());
        let (unit, line_program) = unit_without_lines(&self.sections, header)?;
        self.split |= unit.dwo_id.is_some();
        self.units.push(ParsedUnit {
            offset,
            end,
            unit,
            functions: Functions { found: Vec::new(), next: Some(first_entry), steps: Vec::new() },
            line_program,
            lines: None,
            comp_dir: None,
            searches: 0,
            starts: None,
            last_use: clock,
        });
        Ok(self.units.len() - 1)
    }

    /// The unit holding `.debug_info` offset `target`, parsed, and the offset in it.
    fn unit_holding(&mut self, target: gimli::DebugInfoOffset) -> Result<(usize, gimli::UnitOffset)> {
        let parsed = self.units.iter().position(|u| u.offset <= target.0 && target.0 < u.end);
        let u = match parsed {
            Some(u) => u,
            None => {
                // From the nearest unit before `target` that the index knows, walk the unit
                // headers (units without code, which the index leaves out, are few and mostly
                // right after one with code). Walking every header instead would bring the
                // whole section into memory, a page per unit.
                if self.unit_starts.is_none() {
                    self.unit_starts = Some(self.read_unit_starts());
                }
                let starts = self.unit_starts.as_deref().unwrap_or_default();
                let i = starts.partition_point(|&s| s <= target.0).checked_sub(1);
                let mut start = i.map(|i| starts[i]).ok_or(gimli::Error::NoEntryAtGivenOffset(target.0 as u64))?;
                loop {
                    let header = self.sections.debug_info.header_from_offset(gimli::DebugInfoOffset(start))?;
                    let end = start + header.length_including_self();
                    if target.0 < end {
                        break;
                    }
                    start = end;
                }
                self.parsed(start)?
            }
        };
        let unit = &self.units[u];
        let offset =
            target.to_unit_offset(&unit.unit.header).ok_or(gimli::Error::NoEntryAtGivenOffset(target.0 as u64))?;
        Ok((u, offset))
    }

    /// The offsets of the units in the index, sorted: from a pass over `.debug_aranges` when
    /// the index is not made (the same units: those with a range there).
    fn read_unit_starts(&mut self) -> Vec<Offset> {
        let mut starts: Vec<Offset> = Vec::new();
        if self.index.is_none() {
            self.for_each_arange(|_, _, unit| {
                if starts.last() != Some(&unit) {
                    starts.push(unit);
                }
            });
        }
        if starts.is_empty() {
            starts = self.index().iter().map(|&(_, _, unit)| unit).collect();
        }
        starts.sort_unstable();
        starts.dedup();
        starts.shrink_to_fit();
        starts
    }

    fn unit_ref(&self, u: usize) -> gimli::UnitRef<'_, Reader> {
        gimli::UnitRef::new(&self.sections, &self.units[u].unit)
    }

    /// The entry of the function whose code holds `probe`: one found before, else found by
    /// searching for `search` (the function's start and size, see
    /// [`Dwarf::function_starting_at`]), else by reading the unit's functions as far as needed.
    fn function_at(&mut self, u: usize, probe: u64, search: Option<(u64, u64)>) -> Result<Option<gimli::UnitOffset>> {
        let contains = |&&(begin, end, _): &&(u64, u64, Offset)| begin <= probe && probe < end;
        let functions = &self.units[u].functions;
        let Some(from) = functions.next else {
            // Ranges are taken not to overlap, except as the same range.
            let Ok(mut i) = functions.found.binary_search_by(|&(begin, end, _)| order(begin, end, probe)) else {
                return Ok(None);
            };
            // Of functions whose ranges hold `probe` (aliases of one function: assembly
            // routines often have several entries), the first entry, as a partial read finds.
            while i > 0 && contains(&&functions.found[i - 1]) {
                i -= 1;
            }
            return Ok(Some(gimli::UnitOffset(functions.found[i].2)));
        };
        if let Some(&(_, _, entry)) = functions.found.iter().find(contains) {
            return Ok(Some(gimli::UnitOffset(entry)));
        }
        if let Some(function) = search.and_then(|function| self.function_starting_at(u, function, probe)) {
            return Ok(Some(function));
        }
        let mut found = std::mem::take(&mut self.units[u].functions.found);
        let mut steps = std::mem::take(&mut self.units[u].functions.steps);
        let read = read_functions(self.unit_ref(u), from, &mut found, &mut steps, probe);
        let functions = &mut self.units[u].functions;
        (functions.found, functions.steps) = (found, steps);
        let (hit, next) = read?;
        functions.next = next;
        if next.is_none() {
            // Stable: functions at one address stay in the order of their entries.
            functions.found.sort_by_key(|f| f.0);
            functions.found.shrink_to_fit();
        }
        Ok(hit)
    }

    /// The entry of the function `function` (its start and size, as its symbol gives them),
    /// which holds `probe`, found by searching the unit's entries for its start address
    /// rather than reading them: a function's `DW_AT_low_pc` is written out as bytes
    /// (`DW_FORM_addr`), and entries of most functions' abbreviations have only fixed-size
    /// attributes before it (see [`StartLayout`]). At each place the bytes occur, an entry of
    /// such an abbreviation whose code is the right distance before them is read, and taken
    /// if it is a function of that start, that holds `probe`, and (when the symbol has a size)
    /// of that size. Bytes that only look like such an entry's code can pass too (an entry
    /// read from the middle of another, whose start and size it then reads): so the one
    /// taken must be the only one. `None` when there is none or more than one (aliases, a
    /// function of several ranges, a unit whose layouts are not all known): the caller reads
    /// the entries then. The entry found is noted as a function of the unit.
    fn function_starting_at(&mut self, u: usize, (start, size): (u64, u64), probe: u64) -> Option<gimli::UnitOffset> {
        self.units[u].searches += 1;
        if self.units[u].starts.is_none() {
            let abbreviations = gimli::Section::reader(&self.sections.debug_abbrev).slice();
            self.units[u].starts = Some(start_layouts(&self.units[u].unit, abbreviations));
        }
        let layouts = self.units[u].starts.as_deref().unwrap_or_default();
        let unit = self.unit_ref(u);
        let header = &unit.header;
        let first = header.header_size();
        let entries = header.range_from(gimli::UnitOffset(first)..).ok()?;
        let needle = address_bytes(
            start,
            header.address_size(),
            gimli::Endianity::is_big_endian(gimli::Reader::endian(&entries)),
        )?;
        let bytes = entries.slice();
        let mut found = None;
        for at in address_finder(&needle).find_iter(bytes) {
            for layout in layouts {
                let Some(entry) = at.checked_sub(layout.prefix) else { continue };
                let mut after_code = entry;
                if uleb128(bytes, &mut after_code) != Some(layout.code)
                    || after_code - entry != uleb128_len(layout.code)
                {
                    continue;
                }
                let offset = gimli::UnitOffset(first + entry);
                let Ok(Some(ranges)) = function_ranges(unit, offset) else { continue };
                let mut bounds = Vec::new();
                if ranges.for_each(unit, |begin, end| bounds.push((begin, end, offset.0))).is_err() {
                    continue;
                }
                let fits = ranges.low_pc == Some(start)
                    && bounds.iter().any(|&(begin, end, _)| begin <= probe && probe < end)
                    && (size == 0 || bounds == [(start, start + size, offset.0)]);
                if fits {
                    if found.is_some() {
                        return None;
                    }
                    found = Some((offset, bounds));
                }
            }
        }
        let (offset, bounds) = found?;
        self.units[u].functions.found.extend(bounds);
        Some(offset)
    }

    /// The function's naming attributes, and the chain of inlined calls at `probe` in it,
    /// outermost first: its entries are read down the calls that hold `probe`, every other
    /// call's entries skipped unread.
    fn inlined_chain(
        &self,
        u: usize,
        function: gimli::UnitOffset,
        probe: u64,
    ) -> Result<(NameAttributes, Vec<Inlined>)> {
        let unit = self.unit_ref(u);
        let mut entries = unit.entries_raw(Some(function))?;
        let mut scope = entries.next_depth();
        let abbreviation = entries.read_abbreviation()?.ok_or(gimli::Error::NoEntryAtGivenOffset(function.0 as u64))?;
        let mut names = NameAttributes::default();
        for spec in abbreviation.attributes() {
            names.note(entries.read_attribute(*spec)?);
        }
        let mut chain = Vec::new();
        while !entries.is_empty() {
            let depth = entries.next_depth();
            if depth <= scope {
                break;
            }
            let Some(abbreviation) = entries.read_abbreviation()? else { continue };
            match abbreviation.tag() {
                // A nested function's entries are its own.
                gimli::DW_TAG_subprogram => {
                    entries.skip_attributes(abbreviation.attributes())?;
                    skip_children(&mut entries, depth)?
                }
                gimli::DW_TAG_inlined_subroutine => {
                    let (inlined, ranges) = read_inlined(unit, &mut entries, abbreviation)?;
                    if ranges.contain(unit, probe)? {
                        chain.push(inlined);
                        scope = depth;
                    } else {
                        skip_children(&mut entries, depth)?;
                    }
                }
                // Lexical blocks and the like: their children are the function's.
                _ => entries.skip_attributes(abbreviation.attributes())?,
            }
        }
        Ok((names, chain))
    }

    /// The name that `names` gives, following links to other entries as addr2line does.
    fn name(&mut self, u: usize, names: &NameAttributes) -> Result<Option<Vec<u8>>> {
        let mut name = None;
        for (at, value) in &names.0 {
            match *at {
                gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name => {
                    if let Ok(linkage) = self.string(u, *value) {
                        name = Some(linkage);
                    }
                }
                gimli::DW_AT_name if name.is_none() => name = self.string(u, *value).ok(),
                gimli::DW_AT_abstract_origin | gimli::DW_AT_specification if name.is_none() => {
                    name = self.linked_name(u, *value, NAME_LINKS)?
                }
                _ => {}
            }
        }
        Ok(name)
    }

    /// The name of the entry that `link` (an attribute of an entry of unit `u`) leads to.
    fn linked_name(
        &mut self,
        u: usize,
        link: gimli::AttributeValue<Reader>,
        links_left: usize,
    ) -> Result<Option<Vec<u8>>> {
        if links_left == 0 {
            return Ok(None);
        }
        let (u, offset) = match link {
            gimli::AttributeValue::UnitRef(offset) => (u, offset),
            gimli::AttributeValue::DebugInfoRef(target) => self.unit_holding(target)?,
            _ => return Ok(None),
        };
        let unit = self.unit_ref(u);
        let mut entries = unit.entries_raw(Some(offset))?;
        let abbreviation = entries.read_abbreviation()?.ok_or(gimli::Error::NoEntryAtGivenOffset(offset.0 as u64))?;
        let (mut name, mut next) = (None, None);
        for spec in abbreviation.attributes() {
            let attribute = entries.read_attribute(*spec)?;
            match attribute.name() {
                gimli::DW_AT_linkage_name | gimli::DW_AT_MIPS_linkage_name => {
                    if let Ok(linkage) = self.string(u, attribute.value()) {
                        return Ok(Some(linkage));
                    }
                }
                gimli::DW_AT_name => {
                    if let Ok(plain) = self.string(u, attribute.value()) {
                        name = Some(plain);
                    }
                }
                gimli::DW_AT_abstract_origin | gimli::DW_AT_specification => next = Some(attribute.value()),
                _ => {}
            }
        }
        match (name, next) {
            (Some(name), _) => Ok(Some(name)),
            (None, Some(next)) => self.linked_name(u, next, links_left - 1),
            (None, None) => Ok(None),
        }
    }

    /// The string `value` (an attribute of unit `u`) gives, as gimli's `attr_string` would
    /// with `.debug_str` read from [`Strings`]. A string of `.debug_str` is read once: a read
    /// from the file is a system call, and many strings come again (the compilation directory
    /// of a crate's units, the names of functions inlined in several places).
    fn string(&self, u: usize, value: gimli::AttributeValue<Reader>) -> Result<Vec<u8>> {
        let unit = self.unit_ref(u);
        let at = match value {
            gimli::AttributeValue::DebugStrRef(at) => at.0 as u64,
            gimli::AttributeValue::DebugStrOffsetsIndex(index) => unit.string_offset(index)?.0 as u64,
            other => return Ok(unit.attr_string(other)?.slice().to_vec()),
        };
        if let Some(string) = self.strings_read.borrow().get(&at) {
            return Ok(string.clone());
        }
        let string = self.strings.at(at).ok_or(gimli::Error::UnexpectedEof(gimli::ReaderOffsetId(at)))?;
        self.strings_read.borrow_mut().insert(at, string.clone());
        Ok(string)
    }

    /// The unit's compilation directory (`DW_AT_comp_dir` of its root entry), read the first
    /// time.
    fn comp_dir(&mut self, u: usize) -> Result<Option<String>> {
        if self.units[u].comp_dir.is_none() {
            let unit = self.unit_ref(u);
            let mut entries = unit.entries_raw(None)?;
            let mut dir = None;
            if let Some(abbreviation) = entries.read_abbreviation()? {
                for spec in abbreviation.attributes() {
                    let attribute = entries.read_attribute(*spec)?;
                    if attribute.name() == gimli::DW_AT_comp_dir {
                        dir = self.string(u, attribute.value()).ok();
                    }
                }
            }
            self.units[u].comp_dir = Some(dir.map(|d| super::lossy_utf8(&d).into_owned()));
        }
        Ok(self.units[u].comp_dir.clone().flatten())
    }

    /// The unit's line program (`None` when it has none, or one [`Program`] cannot run).
    fn lines(&mut self, u: usize) -> Option<&mut Lines> {
        if self.units[u].lines.is_none() {
            let debug_line = *gimli::Section::reader(&self.sections.debug_line);
            let address_size = self.units[u].unit.header.address_size();
            let header = Header::parse(debug_line, self.units[u].line_program?, address_size).ok()?;
            let program = Program::new(&header).ok()?;
            self.units[u].lines = Some(Lines { program, sequences: Sequences::new(), header });
        }
        self.units[u].lines.as_mut()
    }

    /// The file, line and column of the row that covers `probe`: the sequence's rows are run
    /// up to it. `search`: the start of the function at `probe`, to search the program for
    /// its sequence (see [`Program::sequence_starting_at`]) before reading it.
    fn location(&mut self, u: usize, probe: u64, search: Option<u64>) -> Result<Option<(Option<String>, u32, u32)>> {
        let Some(lines) = self.lines(u) else { return Ok(None) };
        let Ok(Some(sequence)) = lines.program.sequence_at(&mut lines.sequences, probe, search) else {
            return Ok(None);
        };
        let Ok(Some(row)) = lines.program.row_at(&sequence, probe) else { return Ok(None) };
        // No column without a line.
        let line = u32::try_from(row.line).unwrap_or(0);
        let column = if line == 0 { 0 } else { row.column as u32 };
        Ok(Some((self.file_name(u, row.file)?, line, column)))
    }

    /// The path of the line program's file `index`, as addr2line renders it.
    fn file_name(&mut self, u: usize, index: u64) -> Result<Option<String>> {
        let comp_dir = self.comp_dir(u)?;
        let Some(lines) = self.lines(u) else { return Ok(None) };
        // A damaged table costs the frame its file, not its function's name.
        let Ok(Some(file)) = lines.header.file(index) else {
            // DWARF 4 numbers files from 1: addr2line gives file 0 an empty name.
            return Ok((index == 0).then(String::new));
        };
        let directory = lines.header.directory(file.directory).ok().flatten();
        let text = |value| self.string(u, value).map(|s| super::lossy_utf8(&s).into_owned());
        let mut path = comp_dir.unwrap_or_default();
        if let Some(directory) = directory {
            path_push(&mut path, &text(directory)?);
        }
        path_push(&mut path, &text(file.path)?);
        Ok(Some(path))
    }
}

impl NameAttributes {
    fn note(&mut self, attribute: gimli::Attribute<Reader>) {
        if matches!(
            attribute.name(),
            gimli::DW_AT_linkage_name
                | gimli::DW_AT_MIPS_linkage_name
                | gimli::DW_AT_name
                | gimli::DW_AT_abstract_origin
                | gimli::DW_AT_specification
        ) {
            self.0.push((attribute.name(), attribute.value()));
        }
    }
}

/// The code ranges an entry's attributes give.
#[derive(Default)]
struct Ranges {
    low_pc: Option<u64>,
    high_pc: Option<u64>,
    size: Option<u64>,
    list: Option<gimli::RangeListsOffset>,
}

impl Ranges {
    /// Note `attribute` if it is one of the range attributes.
    fn note(&mut self, unit: gimli::UnitRef<Reader>, attribute: &gimli::Attribute<Reader>) -> Result<()> {
        match (attribute.name(), attribute.value()) {
            (gimli::DW_AT_low_pc, gimli::AttributeValue::Addr(a)) => self.low_pc = Some(a),
            (gimli::DW_AT_low_pc, gimli::AttributeValue::DebugAddrIndex(i)) => self.low_pc = Some(unit.address(i)?),
            (gimli::DW_AT_high_pc, gimli::AttributeValue::Addr(a)) => self.high_pc = Some(a),
            (gimli::DW_AT_high_pc, gimli::AttributeValue::DebugAddrIndex(i)) => self.high_pc = Some(unit.address(i)?),
            (gimli::DW_AT_high_pc, gimli::AttributeValue::Udata(size)) => self.size = Some(size),
            (gimli::DW_AT_ranges, value) => self.list = unit.attr_ranges_offset(value)?,
            _ => {}
        }
        Ok(())
    }

    /// Call `f` with each non-empty range.
    fn for_each(&self, unit: gimli::UnitRef<Reader>, mut f: impl FnMut(u64, u64)) -> Result<()> {
        let mut add = |begin: u64, end: u64| {
            if begin < end {
                f(begin, end)
            }
        };
        if let Some(list) = self.list {
            let mut ranges = unit.ranges(list)?;
            while let Some(range) = ranges.next()? {
                add(range.begin, range.end);
            }
        } else if let (Some(begin), Some(end)) = (self.low_pc, self.high_pc) {
            add(begin, end);
        } else if let (Some(begin), Some(size)) = (self.low_pc, self.size) {
            add(begin, begin.wrapping_add(size));
        }
        Ok(())
    }

    fn contain(&self, unit: gimli::UnitRef<Reader>, probe: u64) -> Result<bool> {
        let mut hit = false;
        self.for_each(unit, |begin, end| hit |= begin <= probe && probe < end)?;
        Ok(hit)
    }
}

/// The unit of `probe` in `index` (sorted ranges): that of the greatest range starting at or
/// below it, if it holds it.
fn unit_in(index: &[(u64, u64, Offset)], probe: u64) -> Option<Offset> {
    let i = index.partition_point(|r| r.0 <= probe).checked_sub(1)?;
    let (_, end, unit) = index[i];
    (probe < end).then_some(unit)
}

/// What [`unit_in`] gives for each of `sorted` (distinct addresses in increasing order) in the
/// index of the ranges `for_each_range` gives, in one pass over them; `None` when there are
/// none.
fn units_at(
    sorted: &[u64],
    for_each_range: impl FnOnce(&mut dyn FnMut(u64, u64, Offset)),
) -> Option<Vec<Option<Offset>>> {
    Some(units_held(sorted, nearest_at(sorted, for_each_range)?))
}

/// The unit of each of `sorted` whose range of `nearest` holds it.
fn units_held(sorted: &[u64], nearest: Vec<Option<(u64, u64, Offset)>>) -> Vec<Option<Offset>> {
    let held = |(&probe, range): (&u64, Option<(u64, u64, Offset)>)| {
        range.filter(|&(_, end, _)| probe < end).map(|(_, _, unit)| unit)
    };
    sorted.iter().zip(nearest).map(held).collect()
}

/// For each of `sorted` (distinct addresses in increasing order), the range of those
/// `for_each_range` gives that [`unit_in`] would look at in their sorted index: the greatest
/// starting at or below it. `None` when there are none.
fn nearest_at(
    sorted: &[u64],
    for_each_range: impl FnOnce(&mut dyn FnMut(u64, u64, Offset)),
) -> Option<Vec<Option<(u64, u64, Offset)>>> {
    // For the k-th address, the greatest range above the one before and at or below it.
    let highest = sorted.last().copied().unwrap_or(0);
    let mut nearest: Vec<Option<(u64, u64, Offset)>> = vec![None; sorted.len()];
    let mut any = false;
    let mut slots = super::Slots::new(sorted);
    for_each_range(&mut |begin, end, unit| {
        any = true;
        if begin <= highest && !sorted.is_empty() {
            let k = slots.of(begin);
            nearest[k] = nearest[k].max(Some((begin, end, unit)));
        }
    });
    // Every range in an earlier slot starts below one in this slot.
    let mut best = None;
    any.then(|| {
        nearest
            .into_iter()
            .map(|nearest| {
                best = nearest.or(best);
                best
            })
            .collect()
    })
}

/// One set of `.debug_aranges`: a unit's ranges.
#[derive(Clone)]
struct ArangeSet {
    unit: Offset,
    ranges: SetRanges,
}

#[derive(Clone)]
enum SetRanges {
    /// (address, length) tuples of 4- or 8-byte addresses, read here ([`aranges_of_set`]).
    Tuples { tuples: &'static [u8], size: u8, big_endian: bool },
    /// Others, as gimli reads them.
    Entries(gimli::ArangeHeader<Reader>),
}

impl ArangeSet {
    /// `f` of each of its nonempty ranges.
    fn for_each_range(&self, mut f: impl FnMut(u64, u64)) {
        let mut read = 0usize;
        let mut each = |begin: u64, end: u64| {
            read += 1;
            if read.is_multiple_of(super::WORK_STEP) {
                super::note_work();
            }
            if begin < end {
                f(begin, end);
            }
        };
        match &self.ranges {
            &SetRanges::Tuples { tuples, size: 4, big_endian } => aranges_of_set::<4>(tuples, big_endian, each),
            &SetRanges::Tuples { tuples, big_endian, .. } => aranges_of_set::<8>(tuples, big_endian, each),
            SetRanges::Entries(header) => {
                let mut entries = header.entries();
                while let Ok(Some(entry)) = entries.next() {
                    each(entry.range().begin, entry.range().end);
                }
            }
        }
        super::note_work();
    }
}

/// Where a set's ranges lie: from `low` to `high`, those at 0 (functions a linker dropped,
/// left among the ranges of their unit) apart, below `zero_high`. A unit's code is mostly in
/// one stretch of the program's, apart from other units'.
#[derive(Clone, Copy)]
struct SetSpans {
    low: u64,
    /// The start of its last range (but for those at 0).
    high_begin: u64,
    high: u64,
    zero_high: u64,
}

impl Default for SetSpans {
    fn default() -> SetSpans {
        SetSpans { low: u64::MAX, high_begin: 0, high: 0, zero_high: 0 }
    }
}

impl SetSpans {
    fn note(&mut self, begin: u64, end: u64) {
        if begin == 0 {
            self.zero_high = self.zero_high.max(end);
        } else {
            (self.low, self.high_begin, self.high) =
                (self.low.min(begin), self.high_begin.max(begin), self.high.max(end));
        }
    }

    /// Whether a range of the set may hold `probe`.
    fn may_hold(&self, probe: u64) -> bool {
        (self.low <= probe && probe < self.high) || probe < self.zero_high
    }
}

/// The sets of the `.debug_aranges` section `section`, with where their ranges lie, and `f` of
/// each of their nonempty ranges with its unit's offset, as [`for_each_arange`] gives them.
fn noted_sets(
    section: &'static [u8],
    endian: gimli::RunTimeEndian,
    f: &mut dyn FnMut(u64, u64, Offset),
) -> Vec<(ArangeSet, SetSpans)> {
    let mut sets = Vec::new();
    for_each_set(section, endian, |set| {
        let mut spans = SetSpans::default();
        set.for_each_range(|begin, end| {
            spans.note(begin, end);
            f(begin, end, set.unit);
        });
        sets.push((set, spans));
    });
    sets
}

/// What [`units_at`] gives for `sorted` over all the ranges of `sets`, from the sets that may
/// hold one of the addresses. The others cannot hold an address, but one could hold a range
/// that starts between an address and the start of the range found to hold it (the ranges of
/// two units nested): `unit_in` would look at that one instead, and find no unit. Where a set
/// left out could, all are read.
fn units_in_sets(sorted: &[u64], sets: &[(ArangeSet, SetSpans)]) -> Option<Vec<Option<Offset>>> {
    let read: Vec<bool> = sets.iter().map(|(_, spans)| sorted.iter().any(|&probe| spans.may_hold(probe))).collect();
    // The ranges of the sets read, or of all.
    let ranges_of = |all: bool, f: &mut dyn FnMut(u64, u64, Offset)| {
        for ((set, _), _) in sets.iter().zip(&read).filter(|(_, &read)| all || read) {
            set.for_each_range(|begin, end| f(begin, end, set.unit));
        }
    };
    let nearest = nearest_at(sorted, |f| ranges_of(false, f)).unwrap_or_else(|| vec![None; sorted.len()]);
    let nested = sets.iter().zip(&read).filter(|(_, &read)| !read).any(|((_, spans), _)| {
        sorted.iter().zip(&nearest).any(|(&probe, range)| {
            range.is_some_and(|(begin, end, _)| probe < end && spans.low <= probe && spans.high_begin > begin)
        })
    });
    if nested {
        return units_at(sorted, |f| ranges_of(true, f));
    }
    Some(units_held(sorted, nearest))
}

/// `f` of each nonempty range of the `.debug_aranges` section `section`, with its unit's
/// offset: gimli's ranges ([`gimli::ArangeEntryIter`]).
fn for_each_arange(section: &'static [u8], endian: gimli::RunTimeEndian, mut f: impl FnMut(u64, u64, Offset)) {
    for_each_set(section, endian, |set| set.for_each_range(|begin, end| f(begin, end, set.unit)));
}

/// `f` of each set of the `.debug_aranges` section `section`. The headers are gimli's; the
/// ranges of 4- and 8-byte addresses are read here, by the same rules ([`aranges_of_set`]), in
/// a seventh of the time its iterator takes (a program's 10 000 of them are read when its
/// first sample is named).
fn for_each_set(section: &'static [u8], endian: gimli::RunTimeEndian, mut f: impl FnMut(ArangeSet)) {
    let big_endian = gimli::Endianity::is_big_endian(endian);
    let mut headers = gimli::DebugAranges::new(section, endian).headers();
    while let Ok(Some(header)) = headers.next() {
        let unit = header.debug_info_offset().0;
        let encoding = header.encoding();
        let (length_size, word_size) =
            (usize::from(encoding.format.initial_length_size()), usize::from(encoding.format.word_size()));
        // The tuples start at a multiple of their size from the set's start, as gimli finds
        // them; the header it gave says the set fits the section.
        let set = header.offset().0;
        let tuple = (2 * usize::from(encoding.address_size)).max(1);
        let first = set + (length_size + 2 + word_size + 2).next_multiple_of(tuple);
        let tuples = section.get(first..set + length_size + header.length());
        let ranges = match (encoding.address_size, tuples) {
            (size @ (4 | 8), Some(tuples)) => SetRanges::Tuples { tuples, size, big_endian },
            _ => SetRanges::Entries(header),
        };
        f(ArangeSet { unit, ranges });
    }
}

/// `f` of each (begin, end) of the (address, length) tuples of `tuples`, one set's of
/// `.debug_aranges`, as gimli's [`gimli::ArangeEntryIter`] gives them: (0, 0) tuples (meant to
/// end the set, but linkers leave them where they drop a function) and tombstones (the two
/// highest addresses) are passed over, and a range past the highest address ends the set.
/// `SIZE`: the address size, 4 or 8 (a constant, so that reading an address is one load).
fn aranges_of_set<const SIZE: usize>(tuples: &[u8], big_endian: bool, mut f: impl FnMut(u64, u64)) {
    let highest = u64::MAX >> (64 - 8 * SIZE);
    let read = |bytes: &[u8]| {
        let mut word = [0u8; 8];
        if big_endian {
            word[8 - SIZE..].copy_from_slice(bytes);
            u64::from_be_bytes(word)
        } else {
            word[..SIZE].copy_from_slice(bytes);
            u64::from_le_bytes(word)
        }
    };
    for tuple in tuples.chunks_exact(2 * SIZE) {
        let (begin, length) = (read(&tuple[..SIZE]), read(&tuple[SIZE..]));
        if (begin, length) == (0, 0) || begin >= highest - 1 {
            continue;
        }
        match begin.checked_add(length).filter(|&end| end <= highest) {
            Some(end) => f(begin, end),
            None => return,
        }
    }
}

/// The unit that `header` starts, as gimli's `Dwarf::unit` makes it but without its line
/// program (`Unit::line_program` is `None`), and where that program is: gimli parses the
/// program's header, every file of it, whenever it makes a unit, where naming reads the header
/// itself and only the files it names ([`Header`]). The root entry's attributes are read as
/// gimli reads them (`Unit::new_with_abbreviations`); its name and directory are left out,
/// for [`Dwarf::comp_dir`] reads the directory itself from `.debug_str`.
fn unit_without_lines(
    sections: &gimli::Dwarf<Reader>,
    header: gimli::UnitHeader<Reader>,
) -> Result<(gimli::Unit<Reader>, Option<Offset>)> {
    let abbreviations = sections.abbreviations(&header)?;
    let encoding = header.encoding();
    let mut unit = gimli::Unit {
        str_offsets_base: gimli::DebugStrOffsetsBase::default_for_encoding_and_file(encoding, sections.file_type),
        addr_base: gimli::DebugAddrBase(0),
        loclists_base: gimli::DebugLocListsBase::default_for_encoding_and_file(encoding, sections.file_type),
        rnglists_base: gimli::DebugRngListsBase::default_for_encoding_and_file(encoding, sections.file_type),
        dwo_id: match header.type_() {
            gimli::UnitType::Skeleton(id) | gimli::UnitType::SplitCompilation(id) => Some(id),
            _ => None,
        },
        abbreviations,
        name: None,
        comp_dir: None,
        low_pc: 0,
        line_program: None,
        header,
    };
    let (mut line_program, mut low_pc) = (None, None);
    let mut entries = unit.header.entries_raw(&unit.abbreviations, None)?;
    let root = entries.read_abbreviation()?.ok_or(gimli::Error::MissingUnitDie)?;
    for spec in root.attributes() {
        let attribute = entries.read_attribute(*spec)?;
        match (attribute.name(), attribute.value()) {
            (gimli::DW_AT_low_pc, value) => low_pc = Some(value),
            (gimli::DW_AT_stmt_list, gimli::AttributeValue::DebugLineRef(offset)) => line_program = Some(offset.0),
            (gimli::DW_AT_str_offsets_base, gimli::AttributeValue::DebugStrOffsetsBase(base)) => {
                unit.str_offsets_base = base
            }
            (gimli::DW_AT_addr_base | gimli::DW_AT_GNU_addr_base, gimli::AttributeValue::DebugAddrBase(base)) => {
                unit.addr_base = base
            }
            (gimli::DW_AT_loclists_base, gimli::AttributeValue::DebugLocListsBase(base)) => unit.loclists_base = base,
            (
                gimli::DW_AT_rnglists_base | gimli::DW_AT_GNU_ranges_base,
                gimli::AttributeValue::DebugRngListsBase(base),
            ) => unit.rnglists_base = base,
            (gimli::DW_AT_GNU_dwo_id, gimli::AttributeValue::DwoId(id)) if unit.dwo_id.is_none() => {
                unit.dwo_id = Some(id)
            }
            _ => {}
        }
    }
    if let Some(value) = low_pc {
        if let Some(address) = sections.attr_address(&unit, value)? {
            unit.low_pc = address;
        }
    }
    Ok((unit, line_program))
}

/// Where the range `begin..end` lies with respect to `probe`, for a binary search of sorted
/// ranges.
pub(super) fn order(begin: u64, end: u64, probe: u64) -> Ordering {
    if probe < begin {
        Ordering::Greater
    } else if probe >= end {
        Ordering::Less
    } else {
        Ordering::Equal
    }
}

/// Read `unit`'s entries from `from`, noting each function with code in `found`, up to the
/// first that holds `probe`: that function's entry, and the entry to read on from (`None`
/// when the unit's entries are all read). This is a flat pass over all of the unit's
/// entries (functions are found at any depth), and the one pass naming makes over most of a
/// unit's bytes: entries that are not functions and whose attributes have fixed sizes are
/// stepped over by their size (see [`Step`]), without gimli's per-attribute decoding.
fn read_functions(
    unit: gimli::UnitRef<Reader>,
    from: gimli::UnitOffset,
    found: &mut Vec<(u64, u64, Offset)>,
    steps: &mut Vec<Step>,
    probe: u64,
) -> Result<(Option<gimli::UnitOffset>, Option<gimli::UnitOffset>)> {
    let bytes = unit.header.range_from(from..)?.slice();
    let mut at = 0;
    for read in 1usize.. {
        if at >= bytes.len() {
            break;
        }
        if read.is_multiple_of(super::WORK_STEP) {
            super::note_work();
        }
        let entry = at;
        let code = uleb128(bytes, &mut at).ok_or(gimli::Error::UnexpectedEof(gimli::ReaderOffsetId(entry as u64)))?;
        if code == 0 {
            continue;
        }
        let step = match steps.get(code as usize) {
            Some(&step) if step != Step::Unknown => step,
            _ => step_for(unit, code, steps),
        };
        if let Step::Skip(size) = step {
            at += size;
            continue;
        }
        let offset = gimli::UnitOffset(from.0 + entry);
        let mut entries = unit.entries_raw(Some(offset))?;
        let Some(abbreviation) = entries.read_abbreviation()? else { continue };
        if abbreviation.tag() != gimli::DW_TAG_subprogram {
            entries.skip_attributes(abbreviation.attributes())?;
            at = entries.next_offset().0 - from.0;
            continue;
        }
        let ranges = read_ranges(unit, &mut entries, abbreviation)?;
        at = entries.next_offset().0 - from.0;
        let mut hit = false;
        ranges.for_each(unit, |begin, end| {
            found.push((begin, end, offset.0));
            hit |= begin <= probe && probe < end;
        })?;
        if hit {
            return Ok((Some(offset), Some(entries.next_offset())));
        }
    }
    Ok((None, None))
}

/// The [`Step`] for entries of abbreviation `code`, noted in `steps` when the code is low
/// enough to be kept.
fn step_for(unit: gimli::UnitRef<Reader>, code: u64, steps: &mut Vec<Step>) -> Step {
    let step = match unit.abbreviations.get(code) {
        Some(abbreviation) if abbreviation.tag() != gimli::DW_TAG_subprogram => abbreviation
            .attributes()
            .iter()
            .try_fold(0, |size, spec| Some(size + spec.size(&unit.header)?))
            .map_or(Step::Read, Step::Skip),
        _ => Step::Read,
    };
    if code < MAX_STEPS {
        if steps.len() <= code as usize {
            steps.resize(code as usize + 1, Step::Unknown);
        }
        steps[code as usize] = step;
    }
    step
}

/// The unsigned LEB128 number at `at` in `bytes`, `at` moved past it (bits past 64 dropped).
#[inline(always)]
pub(super) fn uleb128(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let (mut value, mut shift) = (0u64, 0);
    loop {
        let byte = *bytes.get(*at)?;
        *at += 1;
        if shift < 64 {
            value |= u64::from(byte & 0x7f) << shift;
        }
        if byte & 0x80 == 0 {
            return Some(value);
        }
        shift += 7;
    }
}

/// The [`StartLayout`]s of `unit`, whose abbreviations are in `.debug_abbrev`
/// (`abbreviations`): none when an abbreviation of functions has a start that no layout
/// finds (after an attribute of variable size, or an index into `.debug_addr`) or code in
/// several ranges (`DW_AT_ranges`: GCC's functions split into hot and cold parts), whose
/// entries a search would miss while perhaps taking a false one for them (bytes inside
/// another entry that read as an entry of that start).
fn start_layouts(unit: &gimli::Unit<Reader>, abbreviations: &[u8]) -> Vec<StartLayout> {
    let codes = abbreviation_codes(abbreviations, unit.header.debug_abbrev_offset().0).unwrap_or_default();
    let mut layouts = Vec::new();
    for code in codes {
        let Some(abbreviation) = unit.abbreviations.get(code) else { continue };
        if abbreviation.tag() != gimli::DW_TAG_subprogram {
            continue;
        }
        let attributes = abbreviation.attributes();
        if attributes.iter().any(|spec| spec.name() == gimli::DW_AT_ranges) {
            return Vec::new();
        }
        let Some(at) = attributes.iter().position(|spec| spec.name() == gimli::DW_AT_low_pc) else { continue };
        let before: Option<usize> = attributes[..at].iter().map(|spec| spec.size(&unit.header)).sum();
        match before.filter(|_| attributes[at].form() == gimli::DW_FORM_addr) {
            Some(size) => layouts.push(StartLayout { code, prefix: uleb128_len(code) + size }),
            None => return Vec::new(),
        }
    }
    layouts
}

/// The codes of the abbreviations at `at` in `.debug_abbrev` (`abbreviations`), in order.
fn abbreviation_codes(abbreviations: &[u8], mut at: usize) -> Option<Vec<u64>> {
    let mut codes = Vec::new();
    loop {
        let code = uleb128(abbreviations, &mut at)?;
        if code == 0 {
            return Some(codes);
        }
        codes.push(code);
        let _tag = uleb128(abbreviations, &mut at)?;
        at += 1; // DW_CHILDREN_yes or _no
        loop {
            let (name, form) = (uleb128(abbreviations, &mut at)?, uleb128(abbreviations, &mut at)?);
            if form == u64::from(gimli::DW_FORM_implicit_const.0) {
                // Its value, a signed LEB128 number: the same bytes as an unsigned one.
                uleb128(abbreviations, &mut at)?;
            }
            if (name, form) == (0, 0) {
                break;
            }
        }
    }
}

/// How many bytes `value` takes as an unsigned LEB128 number.
fn uleb128_len(value: u64) -> usize {
    (64 - value.max(1).leading_zeros() as usize).div_ceil(7)
}

/// `address` as an object of `size` bytes (4 or 8) stores it.
/// A search for `needle`, the bytes of an address in DWARF (in a unit's entries, or a line
/// program's), by [`DwarfBytes`].
pub(super) fn address_finder(needle: &[u8]) -> memchr::memmem::Finder<'_> {
    memchr::memmem::FinderBuilder::new().build_forward_with_ranker(DwarfBytes, needle)
}

/// How common each byte is in DWARF, for memchr's choice of the needle's bytes to look for
/// first. Zero is nearly half of a Rust program's `.debug_info` (44 % of jaq's), and small
/// numbers (attribute values, LEB128 digits) most of the rest; memchr's own ranking, made for
/// text, counts them rare, and so looked first for an address's high zero bytes or a small
/// low one (README.md at cfd4150, "Benchmarks").
struct DwarfBytes;

impl memchr::arch::all::packedpair::HeuristicFrequencyRank for DwarfBytes {
    fn rank(&self, byte: u8) -> u8 {
        match byte {
            0 => u8::MAX,
            1..=0x1f => u8::MAX - 1 - byte,
            _ => 0,
        }
    }
}

pub(super) fn address_bytes(address: u64, size: u8, big_endian: bool) -> Option<Vec<u8>> {
    let bytes = match (size, big_endian) {
        (8, false) => address.to_le_bytes().to_vec(),
        (8, true) => address.to_be_bytes().to_vec(),
        (4, false) => u32::try_from(address).ok()?.to_le_bytes().to_vec(),
        (4, true) => u32::try_from(address).ok()?.to_be_bytes().to_vec(),
        _ => return None,
    };
    Some(bytes)
}

/// The ranges of the entry at `offset` if it is a function's.
fn function_ranges(unit: gimli::UnitRef<Reader>, offset: gimli::UnitOffset) -> Result<Option<Ranges>> {
    let mut entries = unit.entries_raw(Some(offset))?;
    let Some(abbreviation) = entries.read_abbreviation()? else { return Ok(None) };
    if abbreviation.tag() != gimli::DW_TAG_subprogram {
        return Ok(None);
    }
    read_ranges(unit, &mut entries, abbreviation).map(Some)
}

/// The code ranges of the entry whose `abbreviation` was just read from `entries`, which are
/// moved past its attributes.
fn read_ranges(
    unit: gimli::UnitRef<Reader>,
    entries: &mut gimli::EntriesRaw<Reader>,
    abbreviation: &gimli::Abbreviation,
) -> Result<Ranges> {
    let mut ranges = Ranges::default();
    for spec in abbreviation.attributes() {
        if matches!(spec.name(), gimli::DW_AT_low_pc | gimli::DW_AT_high_pc | gimli::DW_AT_ranges) {
            ranges.note(unit, &entries.read_attribute(*spec)?)?;
        } else {
            // Names and the like: skipped by their forms' sizes, nothing decoded.
            entries.skip_attributes(std::slice::from_ref(spec))?;
        }
    }
    Ok(ranges)
}

/// Read an inlined call's entry: what names it, where it is called from, and its ranges.
fn read_inlined(
    unit: gimli::UnitRef<Reader>,
    entries: &mut gimli::EntriesRaw<Reader>,
    abbreviation: &gimli::Abbreviation,
) -> Result<(Inlined, Ranges)> {
    let mut inlined = Inlined { names: NameAttributes::default(), call_file: None, call_line: 0, call_column: 0 };
    let mut ranges = Ranges::default();
    for spec in abbreviation.attributes() {
        let attribute = entries.read_attribute(*spec)?;
        ranges.note(unit, &attribute)?;
        match attribute.name() {
            // DWARF 5 numbers files from 0, DWARF 4 from 1 (0 is no file).
            gimli::DW_AT_call_file => {
                if let gimli::AttributeValue::FileIndex(index) = attribute.value() {
                    if index > 0 || unit.header.version() >= 5 {
                        inlined.call_file = Some(index);
                    }
                }
            }
            gimli::DW_AT_call_line => inlined.call_line = attribute.udata_value().unwrap_or(0) as u32,
            gimli::DW_AT_call_column => inlined.call_column = attribute.udata_value().unwrap_or(0) as u32,
            _ => inlined.names.note(attribute),
        }
    }
    Ok((inlined, ranges))
}

/// Skip the children of the entry at `depth` just read.
fn skip_children(entries: &mut gimli::EntriesRaw<Reader>, depth: isize) -> Result<()> {
    while !entries.is_empty() && entries.next_depth() > depth {
        if let Some(child) = entries.read_abbreviation()? {
            entries.skip_attributes(child.attributes())?;
        }
    }
    Ok(())
}

/// Append `p` to `path` with a separator, or replace it when `p` is absolute (addr2line's
/// rule, Windows roots included).
fn path_push(path: &mut String, p: &str) {
    let forward_root = |p: &str| p.starts_with('/') || p.get(1..3) == Some(":/");
    let backward_root = |p: &str| p.starts_with('\\') || p.get(1..3) == Some(":\\");
    if forward_root(p) || backward_root(p) {
        *path = p.to_string();
    } else {
        let separator = if backward_root(path) { '\\' } else { '/' };
        if !path.is_empty() && !path.ends_with(separator) {
            path.push(separator);
        }
        path.push_str(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::{Object as _, ObjectSection as _};
    use proptest::prelude::*;

    /// gimli's ranges of `section`, with their units, in order.
    fn gimlis(section: &'static [u8], endian: gimli::RunTimeEndian) -> Vec<(u64, u64, Offset)> {
        let mut ranges = Vec::new();
        let mut headers = gimli::DebugAranges::new(section, endian).headers();
        while let Ok(Some(header)) = headers.next() {
            let mut entries = header.entries();
            while let Ok(Some(entry)) = entries.next() {
                if entry.range().begin < entry.range().end {
                    ranges.push((entry.range().begin, entry.range().end, header.debug_info_offset().0));
                }
            }
        }
        ranges
    }

    fn ours(section: &'static [u8], endian: gimli::RunTimeEndian) -> Vec<(u64, u64, Offset)> {
        let mut ranges = Vec::new();
        for_each_arange(section, endian, |begin, end, unit| ranges.push((begin, end, unit)));
        ranges
    }

    /// The ranges of this test binary's `.debug_aranges`, and of the C library's separate
    /// debug file where there is one, are gimli's.
    #[test]
    fn the_ranges_of_real_objects_are_gimlis() {
        let mut checked = 0;
        for path in &super::super::test_objects() {
            let Ok(data) = std::fs::read(path) else { continue };
            let data: &'static [u8] = Box::leak(data.into_boxed_slice());
            let Ok(file) = object::File::parse(data) else { continue };
            let Some(section) = file.section_by_name(".debug_aranges").and_then(|s| s.data().ok()) else { continue };
            let endian = if file.is_little_endian() { gimli::RunTimeEndian::Little } else { gimli::RunTimeEndian::Big };
            let expected = gimlis(section, endian);
            assert_eq!(ours(section, endian), expected, "{}", path.display());
            checked += usize::from(!expected.is_empty());
        }
        assert!(checked >= 1, "this binary has ranges");
    }

    /// A tuple of a set: one of the kinds gimli treats apart, or any.
    fn tuple(highest: u64) -> impl Strategy<Value = (u64, u64)> {
        prop_oneof![
            (0..1u64 << 20, 1..1u64 << 12),
            // Ranges of a few units nested in each other's.
            (0..64u64, 1..24u64),
            Just((0, 0)),
            (0..1u64 << 8).prop_map(|length| (0, length)),
            Just((highest - 1, 4)),
            Just((highest, 0)),
            (1..64u64).prop_map(move |past| (highest - past, 2 * past)),
            (any::<u64>(), any::<u64>()).prop_map(move |(b, l)| (b & highest, l & highest)),
        ]
    }

    /// A `.debug_aranges` section of sets of such tuples (32- or 64-bit DWARF, 4- or 8-byte
    /// addresses, either byte order), maybe cut short or followed by other bytes.
    fn section() -> impl Strategy<Value = (Vec<u8>, bool)> {
        let set =
            (any::<bool>(), prop_oneof![Just(4u8), Just(8u8)], 0..1u32 << 20).prop_flat_map(|(dwarf64, size, unit)| {
                let highest = u64::MAX >> (64 - 8 * u32::from(size));
                (Just((dwarf64, size, unit)), proptest::collection::vec(tuple(highest), 0..12), 0..3usize)
            });
        (any::<bool>(), proptest::collection::vec(set, 1..4), proptest::collection::vec(any::<u8>(), 0..40)).prop_map(
            |(big, sets, tail)| {
                let put = |out: &mut Vec<u8>, value: u64, size: usize| {
                    let bytes = if big { value.to_be_bytes() } else { value.to_le_bytes() };
                    out.extend_from_slice(if big { &bytes[8 - size..] } else { &bytes[..size] });
                };
                let mut section = Vec::new();
                for ((dwarf64, size, unit), tuples, odd) in sets {
                    let (size, word) = (usize::from(size), if dwarf64 { 8 } else { 4 });
                    let mut body = Vec::new();
                    put(&mut body, 2, 2);
                    put(&mut body, u64::from(unit), word);
                    body.extend([size as u8, 0]);
                    let header = if dwarf64 { 12 } else { 4 } + body.len();
                    body.resize(body.len() + header.next_multiple_of(2 * size) - header, 0);
                    for (begin, length) in tuples {
                        put(&mut body, begin, size);
                        put(&mut body, length, size);
                    }
                    // Bytes short of a tuple at the end.
                    body.resize(body.len() + odd, 0x55);
                    if dwarf64 {
                        put(&mut section, 0xffff_ffff, 4);
                        put(&mut section, body.len() as u64, 8);
                    } else {
                        put(&mut section, body.len() as u64, 4);
                    }
                    section.extend(body);
                }
                section.extend(tail);
                (section, big)
            },
        )
    }

    proptest! {
        /// One pass over any ranges (overlapping, starting together, at 0) gives each address
        /// the unit that a lookup in their sorted index gives.
        #[test]
        fn a_pass_over_the_ranges_finds_the_indexs_units(
            ranges in proptest::collection::vec((0..64u64, 1..16u64, 0..8usize), 0..40),
            probes in proptest::collection::vec(0..96u64, 0..24),
        ) {
            let mut index: Vec<(u64, u64, Offset)> = ranges.iter().map(|&(begin, length, unit)| (begin, begin + length, unit)).collect();
            index.sort_unstable();
            let mut sorted = probes.clone();
            sorted.sort_unstable();
            sorted.dedup();
            let units = units_at(&sorted, |f| ranges.iter().for_each(|&(begin, length, unit)| f(begin, begin + length, unit)));
            prop_assert_eq!(units.is_some(), !ranges.is_empty());
            let expected: Vec<Option<Offset>> = sorted.iter().map(|&p| unit_in(&index, p)).collect();
            prop_assert_eq!(units.unwrap_or_else(|| vec![None; sorted.len()]), expected);
        }

        /// A pass over only the sets that may hold one of the addresses gives each the unit a
        /// pass over all gives, whatever the ranges (nested in another set's, at 0, past the
        /// highest address); the pass that notes the sets gives all the ranges.
        #[test]
        fn a_pass_over_the_sets_that_may_hold_an_address_finds_the_units_of_one_over_all(
            (section, big) in section(),
            probes in proptest::collection::vec(prop_oneof![0..96u64, 0..1u64 << 20], 0..24),
        ) {
            let endian = if big { gimli::RunTimeEndian::Big } else { gimli::RunTimeEndian::Little };
            let section: &'static [u8] = Box::leak(section.into_boxed_slice());
            let mut sorted = probes;
            sorted.sort_unstable();
            sorted.dedup();
            let mut noted = Vec::new();
            let sets = noted_sets(section, endian, &mut |begin, end, unit| noted.push((begin, end, unit)));
            prop_assert_eq!(noted, ours(section, endian));
            if let Some(units) = units_at(&sorted, |f| for_each_arange(section, endian, f)) {
                prop_assert_eq!(units_in_sets(&sorted, &sets), Some(units));
            }
        }

        /// Sets of any tuples, damaged or not, give gimli's ranges.
        #[test]
        fn the_ranges_of_any_section_are_gimlis((section, big) in section()) {
            let endian = if big { gimli::RunTimeEndian::Big } else { gimli::RunTimeEndian::Little };
            let section: &'static [u8] = Box::leak(section.into_boxed_slice());
            prop_assert_eq!(ours(section, endian), gimlis(section, endian));
        }

        /// Any bytes at all: no panic, gimli's ranges.
        #[test]
        fn the_ranges_of_any_bytes_are_gimlis(bytes in proptest::collection::vec(any::<u8>(), 0..200), big: bool) {
            let endian = if big { gimli::RunTimeEndian::Big } else { gimli::RunTimeEndian::Little };
            let section: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            prop_assert_eq!(ours(section, endian), gimlis(section, endian));
        }
    }
}
