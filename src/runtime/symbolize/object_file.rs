//! One object file's parsed state: its DWARF (sections borrowed from a read-only mapping of
//! the file, only compressed ones inflated into the heap) and its function
//! symbols (`.symtab`, else `.dynsym`, so that a stripped program still names its exported
//! functions), demangled with `rustc-demangle`.
//!
//! DWARF is read by [`super::dwarf`], which reads only what each address needs. An address
//! the DWARF's unit index does not cover gets its symbol's name.
//!
//! A separate debug file (build-id under the debug directory, or `.gnu_debuglink`) is used only
//! with [`Options::separate_debug_files`]: distribution debug files are compressed, and
//! inflating libc's costs tens of milliseconds and megabytes.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use object::elf::{FileHeader32, FileHeader64, Sym64};
use object::read::elf::{FileHeader, SymbolTable as ElfSymbolTable};
use object::{Endianness, LittleEndian, Object as _, ObjectSection as _};

use super::dwarf::{Dwarf, Offset, Strings};
use super::symbolizer::Options;
use crate::runtime::descriptor::{move_high, OwnFd};

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

/// How many addresses whose symbols' names cannot be read a lookup passes over.
const UNREADABLE_NAMES_PASSED: usize = 4;

/// How many batches of addresses about to be looked up ([`Loaded::expect`]) an object answers
/// with one pass over its symbol table and unit index, before it sorts them. A short program
/// names one to a few batches, all of them at exit, while it waits: a pass costs less than
/// sorting (and than the page faults of the sorted copies).
const PASSES: u32 = 4;

/// A function of the sorted symbol table: its name is read from the table when it is looked
/// up, so that making the table touches only the symbols, not the string table (a program's
/// names are megabytes, which reading them all would make resident). 16 bytes: the table is
/// made when a program's first sample is named, and each page of it is a page fault then.
#[derive(Clone, Copy)]
struct Function {
    address: u64,
    /// Saturated (no function is 4 GiB).
    size: u32,
    /// In the symbol table (ELF relocations name symbols in 32 bits).
    index: u32,
}

/// Parsed state of one object. The `'static` slices in `dwarf`, `dwarf_file` and `table`
/// borrow from `inflated` and `_maps`, which are declared after them and so dropped after
/// them; they are never handed out.
pub(super) struct Loaded {
    /// Made from `dwarf_file` when an address is first looked up.
    dwarf: Option<Dwarf>,
    /// The object file, or its separate debug file, when it has DWARF not yet looked at.
    dwarf_file: Option<object::File<'static>>,
    has_dwarf: bool,
    /// Whether `table` is a full symbol table (`.symtab`), not only the dynamic one.
    static_table: bool,
    /// The function symbols of `table`, sorted by address: made by the first lookup that a pass
    /// over the table did not answer ([`Loaded::expect`]).
    functions: Option<Vec<Function>>,
    table: Option<SymbolTable>,
    /// The symbol of each address of the last pass over the table, by address.
    foreseen: Vec<(u64, Option<Symbol>)>,
    /// How many such passes there were (see [`PASSES`]).
    passes: u32,
    inflated: Vec<Box<[u8]>>,
    /// Shared with the object's [`Sibling`]s, whose slices borrow from them too.
    _maps: Vec<Arc<Mmap>>,
}

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
                    maps.push(Arc::new(dmap));
                }
            }
        }
        // The first of these tables with functions names them.
        // (whether it is a full symbol table, the table)
        let tables = [
            (true, SymbolTable::of(&file, false)),
            (true, debug_file.as_ref().and_then(|d| SymbolTable::of(d, false))),
            (false, SymbolTable::of(&file, true)),
        ];
        let (static_table, table) = tables
            .into_iter()
            .find_map(|(full, table)| Some((full, Some(table.filter(SymbolTable::has_function)?))))
            .unwrap_or((false, None));
        let separate = debug_file.is_some();
        let dwarf_file = debug_file.or(Some(file)).filter(has_dwarf);
        let mut map = map;
        if separate || dwarf_file.is_none() {
            // Only the file with the DWARF is kept open (for its strings, see `locate_dwarf`).
            map.file = None;
        }
        maps.push(Arc::new(map));
        Some(Loaded {
            dwarf: None,
            has_dwarf: dwarf_file.is_some(),
            static_table,
            dwarf_file,
            functions: None,
            table,
            foreseen: Vec::new(),
            passes: 0,
            inflated: Vec::new(),
            _maps: maps,
        })
    }

    /// Locate the DWARF sections, once.
    fn load_dwarf(&mut self) -> Option<&mut Dwarf> {
        if let Some(file) = self.dwarf_file.take() {
            self.dwarf = locate_dwarf(&file, &mut self.inflated, &mut self._maps);
        }
        self.dwarf.as_mut()
    }

    /// Get ready to look up `probes` (addresses in the object's own terms, in any order): for
    /// the object's first [`PASSES`] batches, their symbols and units are found in one pass
    /// over its symbol table and unit index (see [`Dwarf::expect`]) instead of sorted copies,
    /// with the answers the sorted copies give (an address whose symbol the pass cannot tell,
    /// for a name it cannot read, makes the sorted table when it is looked up).
    pub(super) fn expect(&mut self, probes: &[u64]) {
        if self.functions.is_some() || self.passes >= PASSES {
            return;
        }
        self.passes += 1;
        let mut sorted = probes.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let symbols = self.table.as_ref().and_then(|table| symbols_at(table, &sorted));
        let symbols = symbols.unwrap_or_else(|| vec![Some(None); sorted.len()]);
        // An address the pass could not decide is left to the sorted table.
        self.foreseen = sorted.iter().zip(symbols).filter_map(|(&probe, symbol)| Some((probe, symbol?))).collect();
        if let Some(dwarf) = self.load_dwarf() {
            dwarf.expect(&sorted);
        }
    }

    /// Heap bytes of what any lookup in the object needs: the sorted symbol table and unit
    /// index once made, inflated sections.
    pub(super) fn base_bytes(&self) -> usize {
        self.functions.as_ref().map_or(0, |f| f.capacity() * std::mem::size_of::<Function>())
            + self.inflated.iter().map(|b| b.len()).sum::<usize>()
            + self.dwarf.as_ref().map_or(0, Dwarf::index_bytes)
    }

    /// Give back what lookups made resident, for a while of no lookups: the parsed DWARF units
    /// (the unit index and symbol table are kept) and the pages of the object's mapped files
    /// (the kernel maps them again from the page cache when next read).
    pub(super) fn release(&mut self) {
        if let Some(dwarf) = &mut self.dwarf {
            dwarf.forget_units();
        }
        for map in &self._maps {
            map.release_pages();
        }
    }

    /// How many of the object's DWARF units are parsed.
    pub(super) fn parsed_units(&self) -> usize {
        self.dwarf.as_ref().map_or(0, Dwarf::parsed_units)
    }

    /// What the object's frames are named without, for want of debug info or symbols, and
    /// what gives full names; `None` when they are named in full.
    pub(super) fn missing_names(&self) -> Option<&'static str> {
        match (self.has_dwarf, self.static_table) {
            (true, _) if self.dwarf.as_ref().is_some_and(Dwarf::split) => Some(
                "keeps its debug info in split DWARF files, which are not read: its frames are named without inlined \
                 functions, at the lines of the innermost code (build with split-debuginfo = \"off\" in its Cargo \
                 profile)",
            ),
            (true, _) => None,
            (false, true) => Some(
                "has no debug info: its frames are named without files, lines or inlined functions (build with \
                 debug = \"line-tables-only\" in its Cargo profile)",
            ),
            (false, false) => Some(
                "has no symbol table or debug info (stripped?): its frames are unnamed but for its exported \
                 functions (build with strip = false and debug = \"line-tables-only\" in its Cargo profile)",
            ),
        }
    }

    pub(super) fn bytes(&self) -> usize {
        self.base_bytes()
            + self.foreseen.capacity() * std::mem::size_of::<(u64, Option<Symbol>)>()
            + self.dwarf.as_ref().map_or(0, Dwarf::parsed_bytes)
    }

    /// The demangled name of the function symbol at `probe`, from the symbol table alone:
    /// no DWARF is parsed.
    #[cfg(test)]
    pub(super) fn symbol_name(&mut self, probe: u64) -> Option<String> {
        self.symbol(probe).map(|s| demangle(s.name))
    }

    /// The demangled name of the function symbol at each of `probes`, from the symbol table
    /// alone (no DWARF is parsed): from the sorted table when it is made, else from one pass
    /// over the table (calibration, on the program's thread, would otherwise wait for the
    /// sorted table's making).
    pub(super) fn symbol_names(&mut self, probes: &[u64]) -> Vec<Option<String>> {
        match (&self.functions, &self.table) {
            (None, Some(table)) => names_at(table, probes).unwrap_or_else(|| vec![None; probes.len()]),
            _ => probes.iter().map(|&probe| self.symbol(probe).map(|s| demangle(s.name))).collect(),
        }
    }

    fn symbol(&mut self, probe: u64) -> Option<Symbol> {
        let table = self.table.as_ref()?;
        if self.functions.is_none() {
            if let Ok(k) = self.foreseen.binary_search_by_key(&probe, |&(p, _)| p) {
                return self.foreseen[k].1;
            }
            self.functions = Some(sorted_functions(table));
            self.foreseen = Vec::new();
        }
        let functions = self.functions.as_deref().unwrap_or_default();
        let mut end = functions.partition_point(|f| f.address <= probe);
        // The symbols at the highest address at or below `probe`, the first in [`table_order`]
        // of those whose names can be read; where none can, those at the address before (a
        // few addresses back at most: a string table so damaged is not searched through).
        for _ in 0..UNREADABLE_NAMES_PASSED {
            if end == 0 {
                break;
            }
            let address = functions[end - 1].address;
            let start = functions[..end].partition_point(|f| f.address < address);
            let at_address = &functions[start..end];
            end = start;
            let chosen = match at_address {
                [only] => table.symbol(*only),
                aliases => aliases.iter().filter_map(|&f| table.symbol(f)).min_by(table_order),
            };
            if let Some(symbol) = chosen {
                return (probe < symbol.address.saturating_add(symbol.size.max(1))).then_some(symbol);
            }
        }
        None
    }

    /// The functions at `probe` (an address in the object's own terms), outermost first: from
    /// the DWARF, the symbol table's name for the outermost one.
    pub(super) fn lookup(&mut self, probe: u64) -> Vec<RawFrame> {
        let found = self.find(probe);
        frames_of(self.dwarf.as_mut(), found)
    }

    /// Where the object's tables place `probe`: what [`Sibling::lookup`] needs to name it.
    pub(super) fn find(&mut self, probe: u64) -> Found {
        let symbol = self.symbol(probe);
        let unit = self.load_dwarf().and_then(|dwarf| dwarf.unit_at(probe));
        Found { probe, symbol, unit }
    }

    /// A reader of the object's DWARF for another thread ([`Dwarf::sibling`]), holding the
    /// mappings it borrows from. None for DWARF inflated from compressed sections (a separate
    /// debug file's): the inflated copies are not shared.
    pub(super) fn sibling(&mut self) -> Option<Sibling> {
        if !self.inflated.is_empty() {
            return None;
        }
        let dwarf = self.load_dwarf()?.sibling();
        Some(Sibling { dwarf, _maps: self._maps.clone() })
    }
}

/// Where an object's tables place an address ([`Loaded::find`]).
#[derive(Clone, Copy)]
pub(super) struct Found {
    probe: u64,
    symbol: Option<Symbol>,
    /// The DWARF unit holding it.
    unit: Option<Offset>,
}

/// A reader of an object's DWARF for another thread than the one that owns the object's
/// [`Loaded`] ([`Loaded::sibling`]): it names the addresses the owner found
/// ([`Loaded::find`]), parsing their units itself, and keeps the object's files mapped for as
/// long as it lives.
pub(super) struct Sibling {
    dwarf: Dwarf,
    /// Dropped after `dwarf`, whose slices (and those of the symbols found) borrow from them.
    _maps: Vec<Arc<Mmap>>,
}

impl Sibling {
    /// The frames at `found`, as [`Loaded::lookup`] gives them.
    pub(super) fn lookup(&mut self, found: Found) -> Vec<RawFrame> {
        frames_of(Some(&mut self.dwarf), found)
    }
}

/// The frames at `found.probe`, outermost first: the DWARF's, in the unit found, with the
/// outermost named by the symbol where the DWARF does not name it or names it without its path.
fn frames_of(dwarf: Option<&mut Dwarf>, Found { probe, symbol, unit }: Found) -> Vec<RawFrame> {
    let frames = dwarf.map_or_else(Vec::new, |dwarf| dwarf.frames(unit, probe, symbol.map(|s| (s.address, s.size))));
    // The DWARF names the function by the symbol's own name (its linkage name): nothing to
    // take from the symbol, whose name is then not demangled.
    let named_alike = frames.first().is_some_and(|f| f.name.as_deref() == symbol.map(|s| s.name));
    let mut frames: Vec<RawFrame> = frames
        .into_iter()
        .map(|f| RawFrame { function: f.name.as_deref().map(demangle), file: f.file, line: f.line, column: f.column })
        .collect();
    match (frames.first_mut(), symbol.filter(|_| !named_alike).map(|s| demangle(s.name))) {
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

/// The DWARF sections of `file`, borrowed from its mapping (one of `maps`; inflated into
/// `inflated` when compressed). `.debug_str` is read through
/// its file when it is stored there uncompressed (see [`Strings`]).
fn locate_dwarf(file: &object::File<'static>, inflated: &mut Vec<Box<[u8]>>, maps: &mut [Arc<Mmap>]) -> Option<Dwarf> {
    let endian = if file.is_little_endian() { gimli::RunTimeEndian::Little } else { gimli::RunTimeEndian::Big };
    let mut sections = gimli::DwarfSections::load(|id| -> Result<&'static [u8], ()> {
        Ok(section_data(file, id.name(), inflated).unwrap_or(&[]))
    })
    .ok()?;
    sections.debug_str = Default::default();
    let strings = section_data(file, ".debug_str", inflated).unwrap_or(&[]);
    let in_file = maps.iter_mut().find_map(|map| {
        let offset = (strings.as_ptr() as usize).checked_sub(map.ptr as usize)?;
        (offset + strings.len() <= map.len).then(|| (Arc::get_mut(map).and_then(|map| map.file.take()), offset as u64))
    });
    let strings = match in_file {
        Some((Some(file), offset)) => Strings::InFile { file: Arc::new(file), offset, mapped: strings },
        _ => Strings::InMemory(strings),
    };
    Dwarf::new(sections.borrow(|data| gimli::EndianSlice::new(data, endian)), strings)
}

/// A section's bytes: borrowed from the mapping, or inflated into `inflated` when compressed.
pub(super) fn section_data(
    file: &object::File<'static>,
    name: &str,
    inflated: &mut Vec<Box<[u8]>>,
) -> Option<&'static [u8]> {
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

    /// Whether it has a function symbol (found without reading the table through).
    fn has_function(&self) -> bool {
        match self {
            SymbolTable::Elf32(table, endian, _) => elf_functions(table, *endian).next().is_some(),
            SymbolTable::Elf64(table, endian, _) => elf_functions(table, *endian).next().is_some(),
        }
    }

    /// `f` of each function symbol (defined code at a nonzero address).
    fn for_each_function(&self, f: impl FnMut(Function)) {
        match self {
            SymbolTable::Elf32(table, endian, _) => elf_functions(table, *endian).for_each(f),
            SymbolTable::Elf64(table, endian, _) => {
                // The same bytes as symbols of a little-endian type (their layouts are one).
                let little = (*endian == Endianness::Little)
                    .then(|| object::pod::bytes_of_slice(table.symbols()))
                    .and_then(|bytes| object::pod::slice_from_all_bytes::<Sym64<LittleEndian>>(bytes).ok());
                match little {
                    Some(symbols) => functions_of(symbols, LittleEndian, table.strings()).for_each(f),
                    None => elf_functions(table, *endian).for_each(f),
                }
            }
        }
    }

    /// The symbol of `function`, if its name can be read.
    fn symbol(&self, Function { address, size, index }: Function) -> Option<Symbol> {
        let (size, index) = (u64::from(size), object::SymbolIndex(index as usize));
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

fn elf_functions<'a, Elf: FileHeader<Endian = Endianness>>(
    table: &'a ElfSymbolTable<'static, Elf>,
    endian: Endianness,
) -> impl Iterator<Item = Function> + 'a {
    functions_of(table.symbols(), endian, table.strings())
}

/// The function symbols of `symbols` (see [`SymbolTable::for_each_function`]). Generic over
/// the byte order, so that a table read as little-endian (the common case, given its own type
/// by `for_each_function`) reads each field with a plain load rather than a check of the
/// file's byte order (README.md at cfd4150, "Benchmarks").
fn functions_of<'a, S: object::read::elf::Sym>(
    symbols: &'a [S],
    endian: S::Endian,
    strings: object::read::StringTable<'static>,
) -> impl Iterator<Item = Function> + 'a {
    symbols
        .iter()
        .enumerate()
        .map_while(move |(index, s)| {
            let address: u64 = s.st_value(endian).into();
            // What object's `kind() == Text && is_definition()` keeps: STT_GNU_IFUNC is code, but
            // not a definition.
            let function = s.st_type() == object::elf::STT_FUNC && address != 0 && s.is_definition(endian, strings);
            let index = u32::try_from(index).ok()?;
            let size = u32::try_from(s.st_size(endian).into()).unwrap_or(u32::MAX);
            Some(function.then_some(Function { address, size, index }))
        })
        .flatten()
}

/// Which of the symbols at one address names it, the least in this order: one with a size
/// (then the longest name, then the first name in byte order: aliases of one length,
/// `<u64 as UpperHex>::fmt` and `<usize as UpperHex>::fmt` say, are common, and the one pass
/// must pick the one a lookup in the sorted table picks).
fn table_order(a: &Symbol, b: &Symbol) -> std::cmp::Ordering {
    a.address
        .cmp(&b.address)
        .then(b.size.cmp(&a.size))
        .then(b.name.len().cmp(&a.name.len()))
        .then_with(|| a.name.cmp(b.name))
}

/// `table`'s functions sorted by address. Of those at one address (aliases: a few percent
/// of a program's), the one that names it is chosen when it is looked up, by their names:
/// read now, those names would bring much of the string table into memory.
fn sorted_functions(table: &SymbolTable) -> Vec<Function> {
    // Counted first (the symbols are read twice, which costs less than growing the vector:
    // each of its copies is new pages).
    let mut count = 0;
    table.for_each_function(|_| count += 1);
    let mut all = Vec::with_capacity(count);
    table.for_each_function(|function| {
        if all.len().is_multiple_of(super::WORK_STEP) {
            super::note_work();
        }
        all.push(function)
    });
    all.sort_unstable_by_key(|f| f.address);
    all
}

/// What [`Loaded::symbol_names`] gives for `probes` (addresses in the object's own
/// terms) in the object file at `path`, from one pass over its symbol table rather than a
/// sorted copy of it (symbol tables only: no DWARF, no separate debug file). For start-up
/// calibration, which names a few frames: collecting and sorting a program's whole table is
/// most of what naming them would cost, and the writer's symbolizer builds that table when it
/// first needs it.
pub(super) fn symbol_names(path: &Path, loaded_build_id: Option<&[u8]>, probes: &[u64]) -> Vec<Option<String>> {
    let Some((map, file)) = open_object(path, loaded_build_id) else { return vec![None; probes.len()] };
    let names = [SymbolTable::of(&file, false), SymbolTable::of(&file, true)]
        .into_iter()
        .flatten()
        .find_map(|table| names_at(&table, probes))
        .unwrap_or_else(|| vec![None; probes.len()]);
    drop(file);
    drop(map);
    names
}

/// The demangled name of the symbol of `table` at each of `probes`, from one pass over it
/// ([`symbols_at`]; none where it cannot tell); `None` when `table` has no function symbol.
fn names_at(table: &SymbolTable, probes: &[u64]) -> Option<Vec<Option<String>>> {
    let mut sorted = probes.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let symbols = symbols_at(table, &sorted)?;
    // Each symbol demangled once: its probes are neighbours.
    let mut names: Vec<Option<String>> = Vec::with_capacity(sorted.len());
    let mut last: Option<(Symbol, Option<String>)> = None;
    for symbol in symbols.into_iter().map(Option::flatten) {
        let name = symbol.map(|symbol| match &last {
            Some((named, name)) if (named.address, named.name) == (symbol.address, symbol.name) => name.clone(),
            _ => {
                let name = Some(demangle(symbol.name));
                last = Some((symbol, name.clone()));
                name
            }
        });
        names.push(name.flatten());
    }
    Some(probes.iter().map(|p| sorted.binary_search(p).ok().and_then(|k| names[k].clone())).collect())
}

/// The symbol of `table` that the sorted table finds for each of `sorted` (distinct
/// addresses in increasing order: the last at or below it, if it contains it), in one pass:
/// `Some(None)` where there is none. Names are read only to break ties and for the symbols
/// found, so that most of the string table is never touched. `None` for an address where a
/// name that would decide cannot be read (a damaged string table: a lookup in the sorted
/// table passes over such symbols to those before them, which one pass cannot). `None` when
/// `table` has no function symbol.
fn symbols_at(table: &SymbolTable, sorted: &[u64]) -> Option<Vec<Option<Option<Symbol>>>> {
    let highest = sorted.last().copied().unwrap_or(0);
    // For the k-th of them, the best symbol above the one before and at or below it, by
    // address and then size; and the symbols that tied with it, whose names break the tie
    // once the pass is over (or leave it undecided, `undecided[k]`).
    let mut nearest: Vec<Option<Function>> = vec![None; sorted.len()];
    let mut undecided = vec![false; sorted.len()];
    let mut tied: Vec<(usize, Function)> = Vec::new();
    let place = |f: &Function| (f.address, f.size);
    let mut any = false;
    let mut read = 0usize;
    let mut slots = super::Slots::new(sorted);
    table.for_each_function(|function| {
        any = true;
        read += 1;
        if read.is_multiple_of(super::WORK_STEP) {
            super::note_work();
        }
        if function.address > highest {
            return;
        }
        let k = slots.of(function.address);
        match nearest[k] {
            Some(best) if place(&best) == place(&function) => tied.push((k, function)),
            Some(best) if place(&best) > place(&function) => {}
            _ => nearest[k] = Some(function),
        }
    });
    if !any {
        return None;
    }
    for (k, candidate) in tied {
        if let Some(best) = nearest[k].filter(|best| place(best) == place(&candidate)) {
            match table.symbol(candidate).zip(table.symbol(best)) {
                Some((c, b)) if table_order(&c, &b).is_lt() => nearest[k] = Some(candidate),
                Some(_) => {}
                None => undecided[k] = true,
            }
        }
    }
    let mut symbols = Vec::with_capacity(sorted.len());
    let mut best: Option<(Function, bool)> = None;
    let mut found: Option<(u32, Option<Symbol>)> = None;
    for (k, &probe) in sorted.iter().enumerate() {
        // Every symbol in an earlier slot is at a lower address than one in this slot.
        best = nearest[k].map(|f| (f, undecided[k])).or(best);
        let Some((function, undecided)) =
            best.filter(|(f, _)| probe < f.address.saturating_add(u64::from(f.size.max(1))))
        else {
            symbols.push(Some(None));
            continue;
        };
        if found.as_ref().is_none_or(|(index, _)| *index != function.index) {
            found = Some((function.index, table.symbol(function)));
        }
        let symbol = found.and_then(|(_, symbol)| symbol);
        symbols.push(symbol.filter(|_| !undecided).map(Some));
    }
    Some(symbols)
}

/// A Rust symbol demangled in `{:#}` form (no hash); anything else as it is.
pub(super) fn demangle(name: &[u8]) -> String {
    let name = super::lossy_utf8(name);
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
    /// The mapped file, kept open when it holds the object's DWARF: its strings are read from
    /// it (see [`Strings`]), the file that was mapped even if another replaces it on disk. A
    /// descriptor of the tracer's own, checked before each use: the program may close it and
    /// open a file of its own on the number.
    file: Option<OwnFd>,
}

// SAFETY: the mapping is read-only (its pages may be dropped, `release_pages`, and read
// again the same), and unmapped only when the last `Loaded` or `Sibling` that holds it drops
// it.
unsafe impl Send for Mmap {}
// SAFETY: as for `Send`: nothing writes through the pointer.
unsafe impl Sync for Mmap {}

impl Mmap {
    /// The file at `path`, mapped; `None` also when the program put a file of its own on the
    /// descriptor's number before it was mapped.
    fn open(path: &Path) -> Option<Mmap> {
        let file = std::fs::File::open(path).ok()?;
        let len = usize::try_from(file.metadata().ok()?.len()).ok()?;
        if len == 0 {
            return None;
        }
        let file = OwnFd::new(move_high(file));
        if !file.is_ours() {
            return None;
        }
        // SAFETY: a fresh read-only private mapping of an open file.
        let ptr =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_PRIVATE, file.number(), 0) };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        let map = Mmap { ptr: ptr as *const u8, len, file: Some(file) };
        // Not the program's file, mapped on a number it has just taken.
        map.file.as_ref().is_some_and(OwnFd::is_ours).then_some(map)
    }

    /// Drop the mapping's pages from this process's memory. Its bytes stay readable and the
    /// same: the mapping is private and never written, so its pages are the file's, read
    /// again on the next touch.
    fn release_pages(&self) {
        // SAFETY: `ptr` and `len` are this mapping's; MADV_DONTNEED on a private file mapping
        // that was never written only drops page table entries.
        unsafe { libc::madvise(self.ptr as *mut libc::c_void, self.len, libc::MADV_DONTNEED) };
    }

    /// The mapped bytes, borrowed for as long as the caller says.
    ///
    /// # Safety
    /// The mapping must outlive every use of the slice.
    unsafe fn bytes(&self) -> &'static [u8] {
        // SAFETY: `len` bytes are mapped readable at `ptr` while `self` lives (the caller's
        // promise covers the rest).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
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

    /// A function of the sorted table, its size as lookups take it.
    struct Bounds {
        address: u64,
        size: u64,
    }

    /// `loaded`'s sorted table of functions, made now if it was not.
    fn functions(loaded: &mut Loaded) -> &[Function] {
        loaded.symbol(0);
        loaded.functions.as_deref().expect("the sorted table")
    }

    /// The sorted table of `loaded`'s functions, their sizes as lookups take them.
    fn sorted_table(loaded: &mut Loaded) -> Vec<Bounds> {
        functions(loaded).iter().map(|f| Bounds { address: f.address, size: u64::from(f.size) }).collect()
    }

    /// Addresses in and around every `step`-th function of `loaded`'s sorted table: its first
    /// byte, its middle, its last, the byte past it; and 0, 1 and the highest address.
    fn around_functions(loaded: &mut Loaded, step: usize) -> Vec<u64> {
        let mut probes: Vec<u64> = vec![0, 1, u64::MAX];
        for s in sorted_table(loaded).into_iter().step_by(step) {
            probes.extend([
                s.address,
                s.address + s.size / 2,
                (s.address + s.size).saturating_sub(1),
                s.address + s.size,
            ]);
        }
        probes
    }

    fn described(frames: &[RawFrame]) -> Vec<String> {
        frames.iter().map(|f| format!("{:?} {:?}:{}:{}", f.function, f.file, f.line, f.column)).collect()
    }

    /// The first batches of addresses, looked up after one pass over the symbol table and
    /// unit index each ([`Loaded::expect`]), are named as the sorted tables name them, which
    /// are made only after [`PASSES`] batches.
    #[test]
    fn foreseen_batches_are_named_as_the_sorted_tables_name_them() {
        let path = std::env::current_exe().unwrap();
        let mut sorted = Loaded::open(&path, None, &Options::default()).expect("readable");
        let probes = around_functions(&mut sorted, 41);
        let named = |loaded: &mut Loaded, probe| described(&loaded.lookup(probe));
        let expected: Vec<Vec<String>> = probes.iter().map(|&p| named(&mut sorted, p)).collect();
        let with_lines = expected.iter().filter(|e| e.last().is_some_and(|f| !f.contains(" None:"))).count();
        assert!(with_lines > probes.len() / 2, "{with_lines} of {} probes have lines", probes.len());
        let mut foreseeing = Loaded::open(&path, None, &Options::default()).expect("readable");
        let batches: Vec<(usize, &[u64])> =
            probes.chunks(probes.len() / (PASSES as usize + 1) + 1).enumerate().collect();
        for &(batch, addrs) in &batches {
            // In the order a stack gives them, not sorted.
            let addrs: Vec<u64> = addrs.iter().rev().copied().collect();
            foreseeing.expect(&addrs);
            let first = batch * batches[0].1.len();
            for (k, &probe) in addrs.iter().rev().enumerate() {
                assert_eq!(named(&mut foreseeing, probe), expected[first + k], "{probe:#x} in batch {batch}");
            }
            let made = (foreseeing.functions.is_some(), foreseeing.dwarf.as_ref().is_some_and(Dwarf::has_index));
            assert_eq!(made, if batch < PASSES as usize { (false, false) } else { (true, true) }, "batch {batch}");
        }
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
            elf.for_each_function(|f| direct.extend(elf.symbol(f).map(|s| (s.address, s.size, s.name))));
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
        let mut loaded = Loaded::open(&path, None, &Options::default()).expect("readable");
        let mut probes = around_functions(&mut loaded, 7);
        // Unsorted, with repeats, as a capture's frames are.
        probes.reverse();
        probes.extend_from_within(..10);
        let one_pass = symbol_names(&path, None, &probes);
        let sorted: Vec<Option<String>> = probes.iter().map(|&p| loaded.symbol_name(p)).collect();
        for ((probe, a), b) in probes.iter().zip(&one_pass).zip(&sorted) {
            assert_eq!(a, b, "at {probe:#x}");
        }
        // An opened object not yet sorted names them in one pass too, and stays unsorted.
        let mut opened = Loaded::open(&path, None, &Options::default()).expect("readable");
        assert_eq!(opened.symbol_names(&probes), sorted);
        assert!(opened.functions.is_none(), "no sorted table made");
        assert_eq!(loaded.symbol_names(&probes), sorted, "from the sorted table");
        assert!(sorted.iter().filter(|n| n.is_some()).count() > probes.len() / 2, "most probes are named");
        assert!(sorted.iter().any(Option::is_none), "some probes are outside every symbol");
    }

    /// Frames as addr2line's context of the whole object gives them, outermost first.
    fn addr2line_frames(context: &addr2line::Context<super::super::dwarf::Reader>, probe: u64) -> Vec<String> {
        let mut frames = Vec::new();
        if let Ok(mut iter) = context.find_frames(probe).skip_all_loads() {
            while let Ok(Some(frame)) = iter.next() {
                let name = frame.function.as_ref().and_then(|f| f.raw_name().ok()).map(|n| demangle(n.as_bytes()));
                let (file, line, column) = match frame.location {
                    Some(l) => (l.file.map(str::to_owned), l.line.unwrap_or(0), l.column.unwrap_or(0)),
                    None => (None, 0, 0),
                };
                frames.push(format!("{name:?} {file:?}:{line}:{column}"));
            }
        }
        frames.reverse();
        frames
    }

    /// The DWARF reader names every address as addr2line's context of the whole object does,
    /// frame for frame (inlined functions across units included). `MEMTRACE_TEST_OBJECT` names
    /// another object to check (say, a large release build with ThinLTO's cross-unit
    /// references).
    #[test]
    fn frames_are_addr2lines() {
        let path = std::env::var_os("MEMTRACE_TEST_OBJECT")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::env::current_exe().unwrap());
        let mut loaded = Loaded::open(&path, None, &Options::default()).expect("readable");
        let file = loaded.dwarf_file.take().expect("DWARF");
        let endian = if file.is_little_endian() { gimli::RunTimeEndian::Little } else { gimli::RunTimeEndian::Big };
        let sections = gimli::DwarfSections::load(|id| -> Result<&'static [u8], ()> {
            Ok(section_data(&file, id.name(), &mut loaded.inflated).unwrap_or(&[]))
        })
        .unwrap();
        let context =
            addr2line::Context::from_dwarf(sections.borrow(|data| gimli::EndianSlice::new(data, endian))).unwrap();
        let mut dwarf = locate_dwarf(&file, &mut loaded.inflated, &mut loaded._maps).expect("a unit index");
        // Probes spread over the program's functions: a few bytes into every 7th symbol, and a
        // quarter, half and three quarters of the way in, where calls were inlined.
        let (mut named, mut inlined, mut aliases) = (0, 0, 0);
        let probes = sorted_table(&mut loaded)
            .into_iter()
            .step_by(7)
            .flat_map(|s| [s.size.min(9) / 2, s.size / 4, s.size / 2, s.size * 3 / 4].map(|into| s.address + into));
        // A reader of the same DWARF for another thread, which names each probe after `dwarf`.
        let mut sibling = dwarf.sibling();
        let show = |frames: Vec<super::super::dwarf::Frame>| -> Vec<String> {
            frames
                .into_iter()
                .map(|f| format!("{:?} {:?}:{}:{}", f.name.as_deref().map(demangle), f.file, f.line, f.column))
                .collect()
        };
        for probe in probes {
            let (unit, function) = (dwarf.unit_at(probe), loaded.symbol(probe).map(|s| (s.address, s.size)));
            let ours = show(dwarf.frames(unit, probe, function));
            assert_eq!(show(sibling.frames(unit, probe, function)), ours, "the sibling's frames at {probe:#x}");
            let theirs = addr2line_frames(&context, probe);
            let outer_name =
                |frames: &[String]| frames.first().map(|f| f.split_once(' ').map_or(f.clone(), |s| s.0.into()));
            if ours.len() == theirs.len()
                && ours.get(1..) == theirs.get(1..)
                && outer_name(&ours) != outer_name(&theirs)
            {
                // Aliases: addr2line names the function by one of its entries, we by the first.
                let names: Vec<String> =
                    dwarf.names_of_functions_at(probe).iter().map(|n| format!("{:?}", Some(demangle(n)))).collect();
                assert!(
                    outer_name(&theirs).is_some_and(|n| names.contains(&n)),
                    "at {probe:#x}: {theirs:?} not among {names:?}"
                );
                aliases += 1;
                continue;
            }
            assert_eq!(ours, theirs, "at {probe:#x} of {}", path.display());
            named += !ours.is_empty() as usize;
            inlined += (ours.len() > 1) as usize;
        }
        println!(
            "{named} probes named, {inlined} with inlined functions, {aliases} in aliased functions; {} units parsed",
            dwarf.parsed_units()
        );
        assert!(named > 100 && inlined > 10, "{named} named, {inlined} inlined");
    }

    /// Searching a unit for a function's start address finds the entry and line sequence
    /// that reading it finds, for most functions of this test binary (or of
    /// `MEMTRACE_TEST_OBJECT`), and nothing else; and nothing else in the C library's
    /// separate debug file where there is one, in whose units some entries' bytes look like
    /// those of another entry of the same start.
    #[test]
    fn searching_for_a_functions_start_finds_what_reading_finds() {
        let path = std::env::var_os("MEMTRACE_TEST_OBJECT")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::env::current_exe().unwrap());
        let (probes, functions, sequences) = search_against_reading(&path, &Options::default());
        // (A release build of this test binary has some 700 at every 5th.)
        assert!(probes > 500, "{probes} functions");
        // Rust code, with a section and so a line sequence per function (not C's).
        assert!(functions * 10 > probes * 9 && sequences * 10 > probes * 9, "{functions} and {sequences} of {probes}");
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let libc = maps.lines().find_map(|l| l.split_whitespace().nth(5).filter(|p| p.contains("/libc.so")));
        match libc {
            Some(libc) => {
                let options = Options { separate_debug_files: true, ..Options::default() };
                search_against_reading(Path::new(libc), &options);
            }
            None => println!("no C library found: only this binary checked"),
        }
    }

    /// Compare [`Dwarf::searched`] with [`Dwarf::read`] at every 5th function of the object
    /// at `path`: how many functions have DWARF, and how many of them, and of their line
    /// sequences, the search finds.
    fn search_against_reading(path: &Path, options: &Options) -> (usize, usize, usize) {
        let mut loaded = Loaded::open(path, None, options).expect("readable");
        let Some(file) = loaded.dwarf_file.take() else {
            println!("{}: no DWARF", path.display());
            return (0, 0, 0);
        };
        let mut searching = locate_dwarf(&file, &mut loaded.inflated, &mut loaded._maps).expect("a unit index");
        let mut reading = locate_dwarf(&file, &mut loaded.inflated, &mut loaded._maps).expect("a unit index");
        let (mut probes, mut functions, mut sequences) = (0, 0, 0);
        for f in sorted_table(&mut loaded).into_iter().step_by(5) {
            let probe = f.address + f.size / 2;
            let (function, sequence) = searching.searched(probe, (f.address, f.size));
            let read = reading.read(probe);
            probes += read.0.is_some() as usize;
            if function.is_some() {
                assert_eq!(function, read.0, "the function at {probe:#x} of {}", path.display());
                functions += 1;
            }
            if sequence.is_some() {
                assert_eq!(sequence, read.1, "the sequence at {probe:#x} of {}", path.display());
                sequences += 1;
            }
            // An address the function does not start at finds nothing.
            assert_eq!(searching.searched(probe, (f.address + 1, f.size)), (None, None));
        }
        println!(
            "{}: of {probes} functions, {functions} found by their start, {sequences} line sequences",
            path.display()
        );
        (probes, functions, sequences)
    }

    /// A C library's DWARF is read whether or not it has `.debug_aranges` (clang leaves it
    /// out: units' own ranges index it then) and when its sections are compressed (inflated,
    /// its strings then read from memory).
    #[test]
    fn libraries_without_aranges_or_compressed_are_named() {
        let dir = std::env::temp_dir().join(format!("object-file-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let Some(plain) = super::super::symbolizer::tests::build_so(&dir, "gamma", "gamma_fn") else { return };
        let variant = |name: &str, args: &[&str]| {
            let out = dir.join(name);
            let ok = std::process::Command::new("objcopy").args(args).arg(&plain).arg(&out).status();
            ok.is_ok_and(|s| s.success()).then_some(out)
        };
        let variants = [
            Some(plain.clone()),
            variant("no-aranges.so", &["--remove-section=.debug_aranges"]),
            variant("compressed.so", &["--compress-debug-sections=zlib"]),
        ];
        assert!(variants.iter().all(Option::is_some), "objcopy failed");
        for path in variants.iter().flatten() {
            let mut loaded = Loaded::open(path, None, &Options::default()).expect("readable");
            let table = loaded.table.expect("a symbol table");
            let gamma = functions(&mut loaded).iter().find(|&&f| table.symbol(f).unwrap().name == b"gamma_fn");
            let symbol = gamma.expect("gamma_fn").address;
            let frames = loaded.lookup(symbol + 1);
            let frame = frames.last().expect("a frame");
            assert_eq!(frame.function.as_deref(), Some("gamma_fn"), "{}", path.display());
            assert!(
                frame.file.as_deref().is_some_and(|f| f.ends_with("/gamma.c")),
                "{}: {:?}",
                path.display(),
                frame.file
            );
            assert_eq!(frame.line, 1, "{}", path.display());
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    /// The resident bytes of the mapping that holds `address`, from `/proc/self/smaps`.
    fn resident_bytes_of_mapping_at(address: usize) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_once(' ').and_then(|(r, _)| r.split_once('-'));
            if let Some((Ok(start), Ok(end))) =
                range.map(|(s, e)| (usize::from_str_radix(s, 16), usize::from_str_radix(e, 16)))
            {
                inside = start <= address && address < end;
            } else if let Some(kb) = line.strip_prefix("Rss:").filter(|_| inside) {
                return kb.trim().trim_end_matches(" kB").parse::<usize>().unwrap() << 10;
            }
        }
        panic!("no mapping at {address:#x}")
    }

    /// Released, an object gives back its parsed units and the pages of its file it made
    /// resident, and names addresses as before.
    #[test]
    fn a_released_object_gives_back_its_memory_and_names_as_before() {
        let path = std::env::current_exe().unwrap();
        let mut loaded = Loaded::open(&path, None, &Options::default()).expect("readable");
        let probes: Vec<u64> =
            sorted_table(&mut loaded).into_iter().step_by(97).map(|s| s.address + s.size / 2).collect();
        let before: Vec<Vec<String>> = probes.iter().map(|&p| described(&loaded.lookup(p))).collect();
        let map = loaded._maps[0].ptr as usize;
        let (resident, parsed) = (resident_bytes_of_mapping_at(map), loaded.bytes());
        assert!(loaded.parsed_units() > 1 && resident > 1 << 20, "{resident} bytes resident");
        loaded.release();
        let released = resident_bytes_of_mapping_at(map);
        assert!(loaded.parsed_units() == 0 && loaded.bytes() < parsed, "{} of {parsed} bytes", loaded.bytes());
        assert!(released < resident / 4, "{released} of {resident} bytes still resident");
        let after: Vec<Vec<String>> = probes.iter().map(|&p| described(&loaded.lookup(p))).collect();
        assert_eq!(before, after);
    }

    /// Damaged DWARF gives fewer names, never a panic: copies of the test binary with bytes of
    /// its debug sections overwritten, each looked up at a few hundred addresses.
    #[test]
    fn damaged_dwarf_never_panics() {
        let path = std::env::current_exe().unwrap();
        let original = std::fs::read(&path).unwrap();
        let mut loaded = Loaded::open(&path, None, &Options::default()).expect("readable");
        let probes: Vec<u64> =
            sorted_table(&mut loaded).into_iter().step_by(61).map(|s| s.address + s.size / 2).collect();
        let file = object::File::parse(&*original).unwrap();
        let sections: Vec<(usize, usize)> =
            [".debug_info", ".debug_abbrev", ".debug_line", ".debug_aranges", ".debug_str", ".symtab", ".strtab"]
                .iter()
                .filter_map(|name| file.section_by_name(name)?.file_range())
                .map(|(offset, size)| (offset as usize, size as usize))
                .collect();
        let dir = std::env::temp_dir().join(format!("damaged-dwarf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut with_lines_in_all = 0;
        for variant in 0..12 {
            let mut bytes = original.clone();
            for &(offset, size) in &sections {
                for _ in 0..(size / 4096).max(8) {
                    let at = offset + (next() as usize) % size;
                    bytes[at] = next() as u8;
                }
            }
            let damaged = dir.join(format!("variant-{variant}"));
            std::fs::write(&damaged, &bytes).unwrap();
            let mut loaded = Loaded::open(&damaged, None, &Options::default()).expect("readable");
            // Half the variants are looked up after one pass over the tables, half from
            // sorted ones.
            if variant % 2 == 0 {
                loaded.expect(&probes);
            }
            let with_lines = probes.iter().filter(|&&p| loaded.lookup(p).iter().any(|f| f.line != 0)).count();
            with_lines_in_all += with_lines;
            println!("variant {variant}: {with_lines} of {} probes with lines", probes.len());
        }
        // Most of the DWARF is intact: it is read, damage and all.
        assert!(with_lines_in_all > 0, "no DWARF read in any variant");
        std::fs::remove_dir_all(&dir).ok();
    }
}
