//! One object file's parsed state: its DWARF (through `addr2line`, sections borrowed from a
//! read-only mapping of the file, only compressed ones inflated into the heap) and its function
//! symbols (`.symtab`, else `.dynsym`, so that a stripped program still names its exported
//! functions), demangled with `rustc-demangle`.
//!
//! DWARF is parsed a few compilation units at a time: `.debug_aranges` says which unit holds
//! an address, and addr2line is given that unit and the units it refers to (`DW_FORM_ref_addr`,
//! which ThinLTO and LTO emit for functions inlined across units), not the whole `.debug_info`,
//! so that naming a frame of a large program does not parse the header and line program of its
//! every unit (tens of milliseconds and megabytes on a 25 MB binary). Offsets must stay those of
//! the whole section, so the units are read from a private mapping of the file in which every
//! other unit is overwritten with the header of an empty unit as long (see [`UnitSet`]). An
//! address the ranges do not cover gets its symbol's name. DWARF that cannot be read this way
//! (no ranges, compressed, in a separate file), and a program that needs much of its DWARF,
//! are read by addr2line's context of the whole object, made the first time one is needed.
//!
//! A separate debug file (build-id under the debug directory, or `.gnu_debuglink`) is used only
//! with [`Options::separate_debug_files`]: distribution debug files are compressed, and
//! inflating libc's costs tens of milliseconds and megabytes.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use object::elf::{FileHeader32, FileHeader64};
use object::read::elf::{FileHeader, Sym as _, SymbolTable as ElfSymbolTable};
use object::{Endianness, Object as _, ObjectSection as _};

use super::symbolizer::Options;

type Reader = gimli::EndianSlice<'static, gimli::RunTimeEndian>;

pub(super) struct RawFrame {
    pub(super) function: Option<String>,
    pub(super) file: Option<String>,
    pub(super) line: u32,
    pub(super) column: u32,
}

#[derive(Clone, Copy)]
struct Symbol {
    address: u64,
    size: u64,
    name: &'static [u8],
}

/// Parsed state of one object. The `'static` slices in `dwarf`, `dwarf_file` and `symbols`
/// borrow from `inflated` and `_maps`, which are declared after them and so dropped after
/// them; they are never handed out.
pub(super) struct Loaded {
    /// Made from `dwarf_file` when an address is first looked up.
    dwarf: Option<Dwarf>,
    /// The object file, or its separate debug file, when it has DWARF not yet looked at.
    dwarf_file: Option<object::File<'static>>,
    /// The path of `dwarf_file` when it is the object's own file.
    dwarf_path: Option<PathBuf>,
    has_dwarf: bool,
    symbols: Vec<Symbol>,
    pub(super) units_seen: HashSet<usize>,
    pub(super) parsed_estimate: usize,
    pub(super) base_estimate: usize,
    inflated: Vec<Box<[u8]>>,
    _maps: Vec<Mmap>,
}

/// Estimated heap bytes of addr2line's parsed state per byte of a unit's `.debug_info`
/// (lines, functions and inlined functions); measured on ripgrep when the symbolizers were
/// compared for issue #10.
const PARSED_BYTES_PER_UNIT_BYTE: usize = 2;
/// Estimated heap bytes of addr2line's state per unit before any lookup (the unit's parsed
/// abbreviations and line program header): 10-14 KiB measured on ripgrep (935 units).
const BYTES_PER_UNIT: usize = 12 << 10;

impl Loaded {
    pub(super) fn open(path: &Path, loaded_build_id: Option<&[u8]>, options: &Options) -> Option<Loaded> {
        // The mapping is moved into the `Loaded` built here, which drops it after everything
        // that borrows from it (or dropped after `file` on the way out).
        let (map, file) = open_object(path, loaded_build_id)?;
        let mut maps = vec![];
        let has_dwarf = |f: &object::File<'static>| f.section_by_name(".debug_info").is_some_and(|s| s.size() > 0);
        let mut debug_file = None;
        if !has_dwarf(&file) && options.separate_debug_files {
            if let Some((dmap, dfile)) = find_debug_file(path, &file, options) {
                if has_dwarf(&dfile) {
                    debug_file = Some(dfile);
                    maps.push(dmap);
                }
            }
        }
        let mut symbols = function_symbols(SymbolTable::of(&file, false));
        if symbols.is_empty() {
            if let Some(d) = &debug_file {
                symbols = function_symbols(SymbolTable::of(d, false));
            }
        }
        if symbols.is_empty() {
            symbols = function_symbols(SymbolTable::of(&file, true));
        }
        let own_dwarf = debug_file.is_none();
        let dwarf_file = debug_file.or(Some(file)).filter(has_dwarf);
        maps.push(map);
        let base_estimate = symbols.capacity() * std::mem::size_of::<Symbol>();
        Some(Loaded {
            dwarf: None,
            dwarf_path: own_dwarf.then(|| path.to_path_buf()),
            has_dwarf: dwarf_file.is_some(),
            dwarf_file,
            symbols,
            units_seen: HashSet::new(),
            parsed_estimate: 0,
            base_estimate,
            inflated: Vec::new(),
            _maps: maps,
        })
    }

    /// Locate the DWARF sections and read the unit index, once.
    fn load_dwarf(&mut self) {
        let Some(file) = self.dwarf_file.take() else { return };
        self.dwarf = Dwarf::locate(&file, self.dwarf_path.as_deref(), &mut self.inflated);
        if let Some(dwarf) = &self.dwarf {
            self.base_estimate += self.inflated.iter().map(|b| b.len()).sum::<usize>() + dwarf.index_bytes();
        }
    }

    /// The addr2line context that covers `probe`, parsed the first time (a set of units, or
    /// the whole object's).
    fn context_for(&mut self, probe: u64) -> Option<&addr2line::Context<Reader>> {
        self.load_dwarf();
        let dwarf = self.dwarf.as_mut()?;
        match dwarf.set_for(probe) {
            Ok(Some((set, parsed))) => {
                self.parsed_estimate += parsed;
                self.units_seen.insert(dwarf.sets[set].units[0].0);
                return Some(&dwarf.sets[set].context);
            }
            Ok(None) => return None,
            Err(NeedsWhole) => {}
        }
        if dwarf.whole.is_none() {
            let (context, units) = dwarf.whole_context()?;
            self.base_estimate += units * BYTES_PER_UNIT;
            dwarf.whole = Some(context);
        }
        let whole = dwarf.whole.as_ref()?;
        if let Some(unit) = whole.find_dwarf_and_unit(probe).skip_all_loads() {
            let offset = unit.header.offset().0;
            if self.units_seen.insert(offset) {
                self.parsed_estimate += unit.header.length_including_self() * PARSED_BYTES_PER_UNIT_BYTE;
            }
        }
        Some(whole)
    }

    /// Whether names come from a symbol table alone (no DWARF): functions without files, lines
    /// or inlined functions.
    pub(super) fn symbols_only(&self) -> bool {
        !self.has_dwarf && !self.symbols.is_empty()
    }

    pub(super) fn bytes(&self) -> usize {
        self.base_estimate + self.parsed_estimate + self.units_seen.capacity() * 16
    }

    /// The demangled name of the function symbol at `probe`, from the symbol table alone:
    /// no DWARF is parsed.
    pub(super) fn symbol_name(&self, probe: u64) -> Option<String> {
        self.symbol(probe).map(|s| demangle(s.name))
    }

    fn symbol(&self, probe: u64) -> Option<&Symbol> {
        let i = self.symbols.partition_point(|s| s.address <= probe).checked_sub(1)?;
        let s = &self.symbols[i];
        (probe < s.address + s.size.max(1)).then_some(s)
    }

    /// The functions at `probe` (an address in the object's own terms), outermost first: from
    /// the DWARF (parsed the first time), the symbol table's name for the outermost one.
    pub(super) fn lookup(&mut self, probe: u64) -> Vec<RawFrame> {
        let mut frames = Vec::new();
        if let Some(context) = self.context_for(probe) {
            if let Ok(mut iter) = context.find_frames(probe).skip_all_loads() {
                while let Ok(Some(frame)) = iter.next() {
                    let function =
                        frame.function.as_ref().and_then(|f| f.raw_name().ok()).map(|n| demangle(n.as_bytes()));
                    let (file, line, column) = match frame.location {
                        Some(l) => (l.file.map(str::to_owned), l.line.unwrap_or(0), l.column.unwrap_or(0)),
                        None => (None, 0, 0),
                    };
                    frames.push(RawFrame { function, file, line, column });
                }
            }
        }
        // addr2line gives the innermost first.
        frames.reverse();
        let symbol = self.symbol(probe).map(|s| demangle(s.name));
        match (frames.first_mut(), symbol) {
            (None, Some(name)) => frames.push(RawFrame { function: Some(name), file: None, line: 0, column: 0 }),
            (Some(outer), Some(name)) => match &outer.function {
                None => outer.function = Some(name),
                // Line-tables-only DWARF names functions without their path: the symbol's
                // name is the same function with its path.
                Some(bare)
                    if name.len() > bare.len()
                        && name.ends_with(bare.as_str())
                        && name[..name.len() - bare.len()].ends_with("::") =>
                {
                    outer.function = Some(name)
                }
                _ => {}
            },
            _ => {}
        }
        frames
    }
}

/// An object's DWARF: its sections, which unit holds which addresses, and the sets of units
/// parsed so far.
struct Dwarf {
    sections: gimli::DwarfSections<&'static [u8]>,
    /// Where `.debug_info` lies in the object's file, when it is stored there uncompressed (the
    /// condition for reading sets of units, see [`UnitSet`]).
    info_in_file: Option<(PathBuf, u64)>,
    endian: gimli::RunTimeEndian,
    /// (start, end, `.debug_info` offset of the unit) from `.debug_aranges`, sorted by start.
    index: Vec<(u64, u64, usize)>,
    /// The units of `index`, by offset.
    unit_starts: Vec<usize>,
    /// Per unit offset: the units (start, end) its lookups need, `None` when the whole context
    /// is needed.
    needs: HashMap<usize, Option<Vec<(usize, usize)>>>,
    /// Disjoint sets of units, each with its context.
    sets: Vec<UnitSet>,
    /// addr2line's context of every unit, for what `sets` cannot answer.
    whole: Option<addr2line::Context<Reader>>,
}

/// Only addr2line's context of the whole object can answer (see [`Dwarf::set_for`]).
struct NeedsWhole;

/// Some units of `.debug_info`, parsed by addr2line alone with the offsets of the whole
/// section. addr2line reads a unit at offset 0 and finds each next unit from the length of the
/// one before, so the section it is given is a private (copy-on-write) mapping of the file's
/// `.debug_info` up to the last unit of the set, in which each run of other units is
/// overwritten with the header of one unit as long with no entries, which addr2line skips
/// (one page of the mapping copied per run).
struct UnitSet {
    /// (start, end) of each unit, sorted.
    units: Vec<(usize, usize)>,
    /// Borrows from `_map`, declared after it.
    context: addr2line::Context<Reader>,
    _map: Mmap,
}

/// The most [`UnitSet`]s an object keeps apart (more are merged).
const MAX_UNIT_SETS: usize = 16;

/// The bytes of an empty unit that stands for others in a [`UnitSet`]: a DWARF 4 header
/// (32-bit length, version, abbreviation offset 0, address size 8), then a null entry.
const EMPTY_UNIT_BYTES: usize = 12;

impl Dwarf {
    fn locate(file: &object::File<'static>, path: Option<&Path>, inflated: &mut Vec<Box<[u8]>>) -> Option<Dwarf> {
        let endian = if file.is_little_endian() { gimli::RunTimeEndian::Little } else { gimli::RunTimeEndian::Big };
        let sections = gimli::DwarfSections::load(|id| -> Result<&'static [u8], ()> {
            Ok(section_data(file, id.name(), inflated).unwrap_or(&[]))
        })
        .ok()?;
        let info_in_file = path.zip(file.section_by_name(".debug_info")).and_then(|(path, section)| {
            let compressed = section.compressed_file_range().ok()?;
            (compressed.format == object::CompressionFormat::None).then(|| (path.to_path_buf(), compressed.offset))
        });
        let borrowed = sections.borrow(|data| gimli::EndianSlice::new(data, endian));
        let mut index = Vec::new();
        let mut headers = borrowed.debug_aranges.headers();
        while let Ok(Some(header)) = headers.next() {
            let unit = header.debug_info_offset().0;
            let mut entries = header.entries();
            while let Ok(Some(entry)) = entries.next() {
                let range = entry.range();
                if range.begin < range.end {
                    index.push((range.begin, range.end, unit));
                }
            }
        }
        index.sort_unstable();
        index.shrink_to_fit();
        let mut unit_starts: Vec<usize> = index.iter().map(|&(_, _, unit)| unit).collect();
        unit_starts.sort_unstable();
        unit_starts.dedup();
        unit_starts.shrink_to_fit();
        Some(Dwarf {
            sections,
            info_in_file,
            endian,
            index,
            unit_starts,
            needs: HashMap::new(),
            sets: Vec::new(),
            whole: None,
        })
    }

    fn reader(&self, data: &'static [u8]) -> Reader {
        gimli::EndianSlice::new(data, self.endian)
    }

    /// The heap bytes of the index.
    fn index_bytes(&self) -> usize {
        self.index.capacity() * std::mem::size_of::<(u64, u64, usize)>()
            + self.unit_starts.capacity() * std::mem::size_of::<usize>()
    }

    /// The index in `sets` of a set that holds `probe`'s unit and the units it refers to,
    /// parsed the first time, and the estimated heap bytes newly parsed for it; `Ok(None)`
    /// when `.debug_aranges` covers no unit at `probe` (code without DWARF, such as the C
    /// library's start files: a symbol names it); `Err(NeedsWhole)` when only the whole
    /// context can answer.
    fn set_for(&mut self, probe: u64) -> Result<Option<(usize, usize)>, NeedsWhole> {
        if self.info_in_file.is_none() || self.index.is_empty() || self.whole.is_some() {
            return Err(NeedsWhole);
        }
        let Some(i) = self.index.partition_point(|r| r.0 <= probe).checked_sub(1) else { return Ok(None) };
        let (_, end, unit) = self.index[i];
        if probe >= end {
            return Ok(None);
        }
        if !self.needs.contains_key(&unit) {
            let needed = self.units_needed(unit);
            self.needs.insert(unit, needed);
        }
        let needed = self.needs[&unit].as_deref().ok_or(NeedsWhole)?;
        let holds = |set: &UnitSet| needed.iter().all(|unit| set.units.binary_search(unit).is_ok());
        if let Some(at) = self.sets.iter().position(holds) {
            return Ok(Some((at, 0)));
        }
        // A new set, with the sets that share a unit with it (which it replaces): so a unit
        // is parsed in one set only, and the sets grow to the units that refer to each other
        // (the code units of one crate, under ThinLTO), never to the whole object.
        let shares = |set: &UnitSet| needed.iter().any(|unit| set.units.binary_search(unit).is_ok());
        let mut merged: Vec<bool> = self.sets.iter().map(shares).collect();
        if merged.iter().filter(|&&m| !m).count() >= MAX_UNIT_SETS {
            // Each set maps `.debug_info` up to its last unit: a bounded number of them keeps
            // the address space they take bounded. The smallest joins the new one.
            if let Some(smallest) =
                (0..self.sets.len()).filter(|&i| !merged[i]).min_by_key(|&i| self.sets[i].units.len())
            {
                merged[smallest] = true;
            }
        }
        let mut units = needed.to_vec();
        let replaced = self.sets.iter().zip(&merged).filter(|(_, &m)| m).map(|(set, _)| set.units.as_slice());
        units.extend(replaced.clone().flatten().copied());
        let replaced_units: usize = replaced.map(<[_]>::len).sum();
        let own = needed[0];
        let set = self.parse_set(units).ok_or(NeedsWhole)?;
        let mut merged = merged.into_iter();
        self.sets.retain(|_| !merged.next().unwrap_or(false));
        let parsed = (set.units.len() - replaced_units) * BYTES_PER_UNIT + (own.1 - own.0) * PARSED_BYTES_PER_UNIT_BYTE;
        self.sets.push(set);
        Ok(Some((self.sets.len() - 1, parsed)))
    }

    /// Unit `unit` and the units it refers to, as (start, end), sorted (`unit` first when it
    /// is the lowest); `None` when a reference leads outside the units that can be found, or
    /// to a supplementary file.
    fn units_needed(&self, unit: usize) -> Option<Vec<(usize, usize)>> {
        let dwarf = self.sections.borrow(|data| self.reader(data));
        let mut units = vec![self.unit_span(&dwarf, unit)?];
        let header = dwarf.debug_info.header_from_offset(gimli::DebugInfoOffset(unit)).ok()?;
        let abbreviations = dwarf.debug_abbrev.abbreviations(header.debug_abbrev_offset()).ok()?;
        let refers = |spec: &gimli::AttributeSpecification| {
            matches!(spec.form(), gimli::DW_FORM_ref_addr | gimli::DW_FORM_GNU_ref_alt)
                || matches!(spec.form(), gimli::DW_FORM_ref_sup4 | gimli::DW_FORM_ref_sup8)
        };
        // Compilers number abbreviations 1, 2, 3...: a unit none of whose abbreviations has a
        // reference form refers to no other unit, and its entries need not be read. (A table
        // numbered otherwise would hide codes from this check, and a reference it hid would
        // cost the name of the frame that needs it.)
        if (1..).map_while(|code| abbreviations.get(code)).all(|a| !a.attributes().iter().any(refers)) {
            return Some(units);
        }
        let mut entries = header.entries_raw(&abbreviations, None).ok()?;
        while !entries.is_empty() {
            let Some(abbreviation) = entries.read_abbreviation().ok()? else { continue };
            if !abbreviation.attributes().iter().any(refers) {
                // Most entries: skipped by their forms' sizes, nothing decoded.
                entries.skip_attributes(abbreviation.attributes()).ok()?;
                continue;
            }
            for spec in abbreviation.attributes() {
                if !refers(spec) {
                    entries.skip_attributes(std::slice::from_ref(spec)).ok()?;
                    continue;
                }
                match entries.read_attribute(*spec).ok()?.value() {
                    gimli::AttributeValue::DebugInfoRef(target) => {
                        if !units.iter().any(|&(s, e)| s <= target.0 && target.0 < e) {
                            units.push(self.unit_containing(&dwarf, target.0)?);
                        }
                    }
                    _ => return None,
                }
            }
        }
        let own = units[0];
        units.sort_unstable();
        units.dedup();
        // The looked-up unit first, for the parsed-size estimate.
        let at = units.binary_search(&own).ok()?;
        units[..=at].rotate_right(1);
        units[1..].sort_unstable();
        Some(units)
    }

    /// The span of the unit that holds `.debug_info` offset `target`: found from the nearest
    /// unit before it that the index knows, walking unit headers from there (units without
    /// code, which `.debug_aranges` leaves out, are mostly right after one with code).
    fn unit_containing(&self, dwarf: &gimli::Dwarf<Reader>, target: usize) -> Option<(usize, usize)> {
        let i = self.unit_starts.partition_point(|&u| u <= target).checked_sub(1)?;
        let mut unit = self.unit_span(dwarf, self.unit_starts[i])?;
        while unit.1 <= target {
            unit = self.unit_span(dwarf, unit.1)?;
        }
        Some(unit)
    }

    fn unit_span(&self, dwarf: &gimli::Dwarf<Reader>, unit: usize) -> Option<(usize, usize)> {
        let header = dwarf.debug_info.header_from_offset(gimli::DebugInfoOffset(unit)).ok()?;
        Some((unit, unit.checked_add(header.length_including_self())?))
    }

    /// A [`UnitSet`] of `units` (in any order, repeats allowed).
    fn parse_set(&self, mut units: Vec<(usize, usize)>) -> Option<UnitSet> {
        units.sort_unstable();
        units.dedup();
        let (path, offset) = self.info_in_file.as_ref()?;
        let end = units.last()?.1;
        let map = Mmap::open_private(path, *offset, end)?;
        // SAFETY: the mapping is kept in the `UnitSet` with the context that borrows it, and
        // dropped after it; nothing else has it.
        let bytes = unsafe { map.bytes_mut() };
        let mut next = 0;
        for &(start, end) in &units {
            if start > next {
                self.write_empty_unit(bytes.get_mut(next..start)?)?;
            }
            next = end;
        }
        let mut dwarf = self.sections.borrow(|data| self.reader(data));
        dwarf.debug_info = gimli::DebugInfo::from(self.reader(&*bytes));
        let context = addr2line::Context::from_dwarf(dwarf).ok()?;
        Some(UnitSet { units, context, _map: map })
    }

    /// Overwrite the start of `run` (whole units) with the header of one empty unit as long.
    fn write_empty_unit(&self, run: &mut [u8]) -> Option<()> {
        let length = u32::try_from(run.len().checked_sub(4)?).ok().filter(|&l| l < 0xffff_fff0)?;
        let header = run.get_mut(..EMPTY_UNIT_BYTES)?;
        let (length, version) = match self.endian {
            gimli::RunTimeEndian::Little => (length.to_le_bytes(), 4u16.to_le_bytes()),
            gimli::RunTimeEndian::Big => (length.to_be_bytes(), 4u16.to_be_bytes()),
        };
        header.fill(0);
        header[..4].copy_from_slice(&length);
        header[4..6].copy_from_slice(&version);
        header[10] = 8;
        Some(())
    }

    /// addr2line's context of the whole object, and its number of units (what its base state
    /// grows with).
    fn whole_context(&self) -> Option<(addr2line::Context<Reader>, usize)> {
        let dwarf = self.sections.borrow(|data| self.reader(data));
        let mut headers = dwarf.units();
        let mut units = 0;
        while let Ok(Some(_)) = headers.next() {
            units += 1;
        }
        Some((addr2line::Context::from_dwarf(dwarf).ok()?, units))
    }
}

/// A section's bytes: borrowed from the mapping, or inflated into `inflated` when compressed.
fn section_data(file: &object::File<'static>, name: &str, inflated: &mut Vec<Box<[u8]>>) -> Option<&'static [u8]> {
    // object also finds GNU `.zdebug_*` sections for `.debug_*` names.
    let section = file.section_by_name(name)?;
    let compressed = section.compressed_data().ok()?;
    match compressed.format {
        object::CompressionFormat::None => Some(compressed.data),
        object::CompressionFormat::Zlib => {
            let mut buf = vec![0u8; usize::try_from(compressed.uncompressed_size).ok()?].into_boxed_slice();
            inflate_zlib(compressed.data, &mut buf)?;
            // SAFETY: the heap block does not move when its box does; it is kept in `inflated`,
            // which the `Loaded` drops after everything that borrows from it.
            let slice: &'static [u8] = unsafe { std::slice::from_raw_parts(buf.as_ptr(), buf.len()) };
            inflated.push(buf);
            Some(slice)
        }
        // zstd (ld --compress-debug-sections=zstd) would need ruzstd: treated as absent.
        _ => None,
    }
}

fn inflate_zlib(input: &[u8], output: &mut [u8]) -> Option<()> {
    use miniz_oxide::inflate::core::inflate_flags::{
        TINFL_FLAG_PARSE_ZLIB_HEADER, TINFL_FLAG_USING_NON_WRAPPING_OUTPUT_BUF,
    };
    use miniz_oxide::inflate::core::{decompress, DecompressorOxide};
    use miniz_oxide::inflate::TINFLStatus;
    let (status, _, written) = decompress(
        &mut DecompressorOxide::new(),
        input,
        output,
        0,
        TINFL_FLAG_USING_NON_WRAPPING_OUTPUT_BUF | TINFL_FLAG_PARSE_ZLIB_HEADER,
    );
    (status == TINFLStatus::Done && written == output.len()).then_some(())
}

/// The object file at `path`, mapped and parsed, if it is the one loaded with
/// `loaded_build_id` (when both have a build-id). The `'static` file borrows from the
/// mapping: the caller keeps the mapping for as long as it uses the file.
fn open_object(path: &Path, loaded_build_id: Option<&[u8]>) -> Option<(Mmap, object::File<'static>)> {
    let map = Mmap::open(path)?;
    // SAFETY: the mapping is returned with the file, and the caller keeps it while the file
    // is used (or both are dropped here).
    let data = unsafe { map.bytes() };
    let file = object::File::parse(data).ok()?;
    let file_build_id = file.build_id().ok().flatten();
    if let (Some(loaded), Some(on_disk)) = (loaded_build_id, file_build_id) {
        if loaded != on_disk {
            return None;
        }
    }
    Some((map, file))
}

/// One of an object's symbol tables, read straight from its ELF structures: object's
/// format-independent symbol API costs about ten times as much per symbol, which on a
/// program's table of thousands of functions is a good part of a millisecond. Names are read
/// from the string table's bytes by hand: object's string table finds their ends with
/// `memchr`, whose first call probes the CPU's features (tens of µs in a virtual machine) on
/// the thread that starts tracing.
#[derive(Clone, Copy)]
enum SymbolTable {
    Elf32(ElfSymbolTable<'static, FileHeader32<Endianness>>, Endianness, &'static [u8]),
    Elf64(ElfSymbolTable<'static, FileHeader64<Endianness>>, Endianness, &'static [u8]),
}

impl SymbolTable {
    /// `file`'s symbol table (`.symtab`), or its dynamic one (`.dynsym`); `None` if it is not
    /// ELF.
    fn of(file: &object::File<'static>, dynamic: bool) -> Option<SymbolTable> {
        Some(match file {
            object::File::Elf32(f) => {
                let (table, strings) = elf_table(f, dynamic);
                SymbolTable::Elf32(table, f.endian(), strings)
            }
            object::File::Elf64(f) => {
                let (table, strings) = elf_table(f, dynamic);
                SymbolTable::Elf64(table, f.endian(), strings)
            }
            _ => return None,
        })
    }

    /// `f(address, size, index)` for each function symbol (defined code at a nonzero address).
    fn for_each_function(&self, f: impl FnMut(u64, u64, usize)) {
        match self {
            SymbolTable::Elf32(table, endian, _) => for_each_elf_function(table, *endian, f),
            SymbolTable::Elf64(table, endian, _) => for_each_elf_function(table, *endian, f),
        }
    }

    /// The symbol at `index`, if its name can be read.
    fn symbol(&self, (address, size, index): (u64, u64, usize)) -> Option<Symbol> {
        let index = object::SymbolIndex(index);
        let name = match self {
            SymbolTable::Elf32(table, endian, strings) => elf_name(table.symbol(index).ok()?, *endian, strings),
            SymbolTable::Elf64(table, endian, strings) => elf_name(table.symbol(index).ok()?, *endian, strings),
        };
        Some(Symbol { address, size, name: name? })
    }
}

/// `file`'s symbol table or dynamic one, and the bytes of its string table (none when they
/// cannot be read: then no name can).
fn elf_table<Elf: FileHeader<Endian = Endianness>>(
    file: &object::read::elf::ElfFile<'static, Elf>,
    dynamic: bool,
) -> (ElfSymbolTable<'static, Elf>, &'static [u8]) {
    let table = *if dynamic { file.elf_dynamic_symbol_table() } else { file.elf_symbol_table() };
    let strings = file
        .elf_section_table()
        .section(table.string_section())
        .ok()
        .and_then(|section| object::read::elf::SectionHeader::data(section, file.endian(), file.data()).ok());
    (table, strings.unwrap_or_default())
}

/// The NUL-terminated name of `symbol` in `strings`.
fn elf_name<S: object::read::elf::Sym<Endian = Endianness>>(
    symbol: &S,
    endian: Endianness,
    strings: &'static [u8],
) -> Option<&'static [u8]> {
    let rest = strings.get(usize::try_from(symbol.st_name(endian)).ok()?..)?;
    Some(&rest[..rest.iter().position(|&b| b == 0)?])
}

fn for_each_elf_function<Elf: FileHeader<Endian = Endianness>>(
    table: &ElfSymbolTable<'static, Elf>,
    endian: Endianness,
    mut f: impl FnMut(u64, u64, usize),
) {
    for (index, s) in table.symbols().iter().enumerate() {
        let address: u64 = s.st_value(endian).into();
        // What object's `kind() == Text && is_definition()` keeps: STT_GNU_IFUNC is code, but
        // not a definition.
        if s.st_type() == object::elf::STT_FUNC && address != 0 && s.is_definition(endian, table.strings()) {
            f(address, s.st_size(endian).into(), index);
        }
    }
}

/// The order of the sorted table: by address, and among symbols at one address the one
/// kept first: one with a size (then the longest name, then the first name in byte order:
/// aliases of one length, `<u64 as UpperHex>::fmt` and `<usize as UpperHex>::fmt` say, are
/// common, and the one pass must pick the one the sorted table keeps).
fn table_order(a: &Symbol, b: &Symbol) -> std::cmp::Ordering {
    a.address
        .cmp(&b.address)
        .then(b.size.cmp(&a.size))
        .then(b.name.len().cmp(&a.name.len()))
        .then_with(|| a.name.cmp(b.name))
}

fn function_symbols(table: Option<SymbolTable>) -> Vec<Symbol> {
    let Some(table) = table else { return Vec::new() };
    let mut symbols = Vec::new();
    table.for_each_function(|address, size, index| symbols.extend(table.symbol((address, size, index))));
    symbols.sort_unstable_by(table_order);
    symbols.dedup_by_key(|s| s.address);
    symbols.shrink_to_fit();
    symbols
}

/// What [`Loaded::symbol_name`] gives for each of `probes` (addresses in the object's own
/// terms) in the object file at `path`, from one pass over its symbol table rather than a
/// sorted copy of it (symbol tables only: no DWARF, no separate debug file). For start-up
/// calibration, which names a few frames: collecting and sorting a program's whole table is
/// most of what naming them would cost, and the writer's symbols thread builds that table
/// when it first needs it.
pub(super) fn symbol_names(path: &Path, loaded_build_id: Option<&[u8]>, probes: &[u64]) -> Vec<Option<String>> {
    let Some((map, file)) = open_object(path, loaded_build_id) else { return vec![None; probes.len()] };
    let names = symbols_at(SymbolTable::of(&file, false), probes)
        .or_else(|| symbols_at(SymbolTable::of(&file, true), probes))
        .unwrap_or_else(|| vec![None; probes.len()]);
    drop(file);
    drop(map);
    names
}

/// The name of the symbol of `table` that the sorted table finds for each of `probes` (the
/// last at or below it, if it contains it), in one pass; `None` when `table` has no function
/// symbol (as [`function_symbols`] would give none). Names are read only to break ties and
/// for the symbols found, so that most of the string table is never touched (a symbol whose
/// name cannot be read, which the sorted table leaves out, then names nothing).
fn symbols_at(table: Option<SymbolTable>, probes: &[u64]) -> Option<Vec<Option<String>>> {
    let table = table?;
    // The distinct probes in address order (the calibration stacks share most frames).
    let mut sorted = probes.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let highest = sorted.last().copied().unwrap_or(0);
    // For the k-th of them, the best symbol above the one before and at or below it, by
    // address and then size: (address, size, index); and the symbols that tied with it, whose
    // names break the tie once the pass is over.
    let mut nearest: Vec<Option<(u64, u64, usize)>> = vec![None; sorted.len()];
    let mut tied: Vec<(usize, (u64, u64, usize))> = Vec::new();
    let mut any = false;
    table.for_each_function(|address, size, index| {
        any = true;
        if address > highest {
            return;
        }
        let k = sorted.partition_point(|&p| p < address);
        match nearest[k] {
            Some((a, s, _)) if (a, s) == (address, size) => tied.push((k, (address, size, index))),
            Some((a, s, _)) if (a, s) > (address, size) => {}
            _ => nearest[k] = Some((address, size, index)),
        }
    });
    if !any {
        return None;
    }
    for (k, candidate) in tied {
        if let Some(best) = nearest[k].filter(|&(a, s, _)| (a, s) == (candidate.0, candidate.1)) {
            if table.symbol(candidate).zip(table.symbol(best)).is_some_and(|(c, b)| table_order(&c, &b).is_lt()) {
                nearest[k] = Some(candidate);
            }
        }
    }
    // The name at each of `sorted`, each symbol's demangled once (its probes are neighbours).
    let mut names: Vec<Option<String>> = Vec::with_capacity(sorted.len());
    let mut best: Option<(u64, u64, usize)> = None;
    let mut named: Option<(usize, Option<String>)> = None;
    for (k, &probe) in sorted.iter().enumerate() {
        // Every symbol in an earlier slot is at a lower address than one in this slot.
        best = nearest[k].or(best);
        let Some(found) = best.filter(|&(address, size, _)| probe < address + size.max(1)) else {
            names.push(None);
            continue;
        };
        if named.as_ref().is_none_or(|(index, _)| *index != found.2) {
            named = Some((found.2, table.symbol(found).map(|s| demangle(s.name))));
        }
        names.push(named.as_ref().and_then(|(_, name)| name.clone()));
    }
    Some(probes.iter().map(|p| sorted.binary_search(p).ok().and_then(|k| names[k].clone())).collect())
}

/// A Rust symbol demangled in `{:#}` form (no hash); anything else as it is.
pub(super) fn demangle(name: &[u8]) -> String {
    let name = String::from_utf8_lossy(name);
    match rustc_demangle::try_demangle(&name) {
        Ok(d) => format!("{d:#}"),
        Err(_) => name.into_owned(),
    }
}

fn find_debug_file(
    path: &Path,
    file: &object::File<'static>,
    options: &Options,
) -> Option<(Mmap, object::File<'static>)> {
    let build_id = file.build_id().ok().flatten();
    let mut candidates = Vec::new();
    if let Some(id) = build_id.filter(|id| id.len() >= 2) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        candidates.push(options.debug_dir.join(".build-id").join(&hex[..2]).join(format!("{}.debug", &hex[2..])));
    }
    if let Ok(Some((name, _crc))) = file.gnu_debuglink() {
        let name = Path::new(OsStr::from_bytes(name));
        let dir = std::fs::canonicalize(path).ok().and_then(|p| p.parent().map(Path::to_path_buf)).unwrap_or_default();
        candidates.push(dir.join(name));
        candidates.push(dir.join(".debug").join(name));
        candidates.push(options.debug_dir.join(dir.strip_prefix("/").unwrap_or(&dir)).join(name));
    }
    for candidate in candidates {
        if candidate.as_path() == path {
            continue;
        }
        let Some(map) = Mmap::open(&candidate) else { continue };
        // SAFETY: the mapping is returned with the file that borrows it, and the `Loaded` keeps
        // it after everything that borrows from it.
        let data = unsafe { map.bytes() };
        let Ok(debug) = object::File::parse(data) else { continue };
        // A debug file found by debuglink name must be for this build (the CRC is not checked:
        // that would read the whole file).
        if build_id.is_some() && debug.build_id().ok().flatten() != build_id {
            continue;
        }
        return Some((map, debug));
    }
    None
}

/// A read-only private mapping of a whole file. Hand-written on `libc` (a dozen lines) rather
/// than taking `memmap2` for it.
struct Mmap {
    ptr: *const u8,
    len: usize,
    /// Where the bytes asked for begin in the mapping (which begins on a page).
    start: usize,
}

// SAFETY: the mapping is read-only and owned by one `Loaded`; nothing else unmaps it.
unsafe impl Send for Mmap {}

impl Mmap {
    fn open(path: &Path) -> Option<Mmap> {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(path).ok()?;
        let len = usize::try_from(file.metadata().ok()?.len()).ok()?;
        if len == 0 {
            return None;
        }
        // SAFETY: a fresh read-only private mapping of an open file; the descriptor may be
        // closed afterwards.
        let ptr =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        Some(Mmap { ptr: ptr as *const u8, len, start: 0 })
    }

    /// A private, writable (copy-on-write) mapping of `len` bytes of the file at `path` from
    /// byte `offset`: what is written to it stays in this process's memory, the file untouched.
    fn open_private(path: &Path, offset: u64, len: usize) -> Option<Mmap> {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(path).ok()?;
        // SAFETY: `sysconf` only reads a configuration value.
        let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok().filter(|&p| p > 0)?;
        let skip = offset % page;
        let mapped = len.checked_add(usize::try_from(skip).ok()?)?;
        // SAFETY: a fresh private mapping of an open file at a page-aligned offset; the
        // descriptor may be closed afterwards.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                libc::off_t::try_from(offset - skip).ok()?,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        Some(Mmap { ptr: ptr as *const u8, len: mapped, start: mapped - len })
    }

    /// The mapped bytes, borrowed for as long as the caller says.
    ///
    /// # Safety
    /// The mapping must outlive every use of the slice.
    unsafe fn bytes(&self) -> &'static [u8] {
        // SAFETY: `len` bytes are mapped readable at `ptr` while `self` lives (the caller's
        // promise covers the rest).
        unsafe { std::slice::from_raw_parts(self.ptr.add(self.start), self.len - self.start) }
    }

    /// The mapped bytes of a writable mapping, borrowed for as long as the caller says.
    ///
    /// # Safety
    /// The mapping must be [`Mmap::open_private`]'s, outlive every use of the slice, and be
    /// borrowed by nothing else while this slice is written to.
    #[allow(clippy::mut_from_ref)] // The mapping is the caller's to lend, as the contract says.
    unsafe fn bytes_mut(&self) -> &'static mut [u8] {
        // SAFETY: `len` bytes are mapped readable and writable at `ptr` while `self` lives
        // (the caller's promise covers the rest).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(self.start) as *mut u8, self.len - self.start) }
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: the mapping was made by `open` and is unmapped once, here.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The frames at `probe` as strings, for comparing two ways of reading them.
    fn described(frames: &[RawFrame]) -> Vec<String> {
        frames.iter().map(|f| format!("{:?} {:?}:{}:{}", f.function, f.file, f.line, f.column)).collect()
    }

    /// Reading the ELF symbol table directly keeps the symbols that object's
    /// format-independent API calls function definitions.
    #[test]
    fn elf_function_symbols_are_objects_function_definitions() {
        use object::{ObjectSymbol as _, ObjectSymbolTable as _};
        let data = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        // Leaked, so that the file borrows it for 'static as it does a mapping.
        let data: &'static [u8] = Box::leak(data.into_boxed_slice());
        let file = object::File::parse(data).unwrap();
        for dynamic in [false, true] {
            let table = if dynamic { file.dynamic_symbol_table() } else { file.symbol_table() };
            let mut generic: Vec<(u64, u64, &[u8])> = table
                .iter()
                .flat_map(|t| t.symbols())
                .filter(|s| s.kind() == object::SymbolKind::Text && s.is_definition() && s.address() != 0)
                .map(|s| (s.address(), s.size(), s.name_bytes().unwrap()))
                .collect();
            let elf = SymbolTable::of(&file, dynamic).unwrap();
            let mut direct = Vec::new();
            elf.for_each_function(|a, s, i| direct.extend(elf.symbol((a, s, i)).map(|s| (s.address, s.size, s.name))));
            generic.sort_unstable();
            direct.sort_unstable();
            assert_eq!(direct, generic, "dynamic: {dynamic}");
            assert!(dynamic || direct.len() > 100, "{} functions", direct.len());
        }
    }

    /// One pass over the symbol table names every address as the sorted table does: inside
    /// functions, at their first and last bytes, just past them, and outside every symbol.
    #[test]
    fn one_pass_over_the_symbol_table_names_as_the_sorted_table_does() {
        let path = std::env::current_exe().unwrap();
        let loaded = Loaded::open(&path, None, &Options::default()).expect("readable");
        let mut probes: Vec<u64> = vec![0, 1, u64::MAX];
        for s in loaded.symbols.iter().step_by(7) {
            probes.extend([
                s.address,
                s.address + s.size / 2,
                (s.address + s.size).saturating_sub(1),
                s.address + s.size,
            ]);
        }
        // Unsorted, with repeats, as a capture's frames are.
        probes.reverse();
        probes.extend_from_within(..10);
        let one_pass = symbol_names(&path, None, &probes);
        let sorted: Vec<Option<String>> = probes.iter().map(|&p| loaded.symbol_name(p)).collect();
        for ((probe, a), b) in probes.iter().zip(&one_pass).zip(&sorted) {
            assert_eq!(a, b, "at {probe:#x}");
        }
        assert!(sorted.iter().filter(|n| n.is_some()).count() > probes.len() / 2, "most probes are named");
        assert!(sorted.iter().any(Option::is_none), "some probes are outside every symbol");
    }

    /// Reading sets of units names every address as addr2line's context of the whole object
    /// does, frame for frame (inlined functions across units included), while parsing a part
    /// of the units. `MEMTRACE_TEST_OBJECT` names another object to check (say, a large
    /// release build with ThinLTO's cross-unit references).
    #[test]
    fn sets_of_units_name_addresses_as_the_whole_context_does() {
        let path = std::env::var_os("MEMTRACE_TEST_OBJECT")
            .map(PathBuf::from)
            .unwrap_or_else(|| std::env::current_exe().unwrap());
        let options = Options::default();
        let mut whole = Loaded::open(&path, None, &options).expect("readable");
        whole.load_dwarf();
        whole.dwarf.as_mut().unwrap().info_in_file = None;
        // Probes spread over the program's functions: a few bytes into every 11th symbol, in
        // groups small enough to stay in sets (a fresh object for each group).
        let probes: Vec<u64> = whole.symbols.iter().step_by(11).map(|s| s.address + s.size.min(9) / 2).collect();
        let (mut by_set, mut units) = (0, 0);
        for group in probes.chunks(8) {
            let mut sets = Loaded::open(&path, None, &options).expect("readable");
            for &probe in group {
                let (a, b) = (sets.lookup(probe), whole.lookup(probe));
                assert_eq!(described(&a), described(&b), "at {probe:#x} of {}", path.display());
                by_set += matches!(sets.dwarf.as_mut().unwrap().set_for(probe), Ok(Some(_))) as usize;
            }
            units += sets.dwarf.as_ref().unwrap().sets.iter().map(|set| set.units.len()).sum::<usize>();
        }
        println!(
            "{} probes, {by_set} read from sets of units; {} units parsed per group of 8, of {} with code",
            probes.len(),
            units * 8 / probes.len(),
            whole.dwarf.as_ref().unwrap().unit_starts.len()
        );
        assert!(by_set * 2 > probes.len(), "most probes read from sets of units");
        // Many units in one object: the sets are merged down to the bound, names unchanged.
        let mut sets = Loaded::open(&path, None, &options).expect("readable");
        for &probe in probes.iter().take(200) {
            assert_eq!(described(&sets.lookup(probe)), described(&whole.lookup(probe)), "at {probe:#x}");
        }
        let dwarf = sets.dwarf.as_ref().unwrap();
        let units: usize = dwarf.sets.iter().map(|set| set.units.len()).sum();
        assert!(units > MAX_UNIT_SETS, "the bound was not reached: {units} units");
        assert!(dwarf.whole.is_none() && dwarf.sets.len() <= MAX_UNIT_SETS, "{} sets", dwarf.sets.len());
    }
}
