//! A unit's line-program header (DWARF 2 to 5): the parameters that decode the program's
//! instructions, and its tables of directories and files, of which an entry is read only when
//! a location names it.
//!
//! gimli's header reads every entry of both tables into vectors as it parses the header, and
//! gimli parses the header whenever it makes a unit. A Rust program's standard library unit
//! lists hundreds of files, and most of a new unit's parse was spent there (and in the page
//! faults of the vectors' heap), where the frames of a program's first samples name a few
//! files of each unit. The entries are read by gimli's rules (`LineProgramHeader::parse`,
//! `file`, `directory`): the tests compare the file names of every row with gimli's.

use gimli::Reader as _;

use super::dwarf::Reader;

type Result<T> = std::result::Result<T, gimli::Error>;

/// What a line program's header says.
pub(super) struct Header {
    pub(super) address_size: u8,
    pub(super) minimum_instruction_length: u8,
    pub(super) maximum_operations_per_instruction: u8,
    pub(super) line_base: i8,
    pub(super) line_range: u8,
    pub(super) opcode_base: u8,
    /// The operand counts of standard opcodes `1..opcode_base`.
    pub(super) standard_opcode_lengths: &'static [u8],
    /// The program's instructions.
    pub(super) instructions: Reader,
    version: u16,
    directories: Table,
    files: Table,
}

/// A table of directories or files: its entries, how they are laid out, and where each
/// starts (made at its first lookup).
struct Table {
    /// From the first entry to the end of the header.
    entries: Reader,
    layout: Layout,
    /// Whether the program is 32- or 64-bit DWARF (the size of its section offsets).
    format: gimli::Format,
    /// The offset of each entry in `entries`.
    starts: Option<Vec<u32>>,
}

#[derive(Clone, Copy)]
enum Layout {
    /// DWARF 2 to 4: a path, then (for a file) its directory, time and size as LEB128
    /// numbers; the table ends at an empty path.
    Fixed { file: bool },
    /// DWARF 5: `count` entries, each the fields that `fields` ((content type, form) pairs)
    /// describes.
    Described { fields: Reader, count: u64 },
}

/// An entry of a table: its path, and for a file the index of its directory.
pub(super) struct Entry {
    pub(super) path: gimli::AttributeValue<Reader>,
    pub(super) directory: u64,
}

impl Header {
    /// The header of the line program at `offset` in `debug_line`, of a unit whose addresses
    /// are `address_size` bytes (DWARF 2 to 4 headers do not say).
    pub(super) fn parse(debug_line: Reader, offset: usize, address_size: u8) -> Result<Header> {
        let mut input = debug_line;
        input.skip(offset)?;
        let (length, format) = input.read_initial_length()?;
        let mut unit = input.split(length)?;
        let version = unit.read_u16()?;
        if !(2..=5).contains(&version) {
            return Err(gimli::Error::UnknownVersion(u64::from(version)));
        }
        let address_size = if version >= 5 {
            let size = unit.read_u8()?;
            let _segment_selector_size = unit.read_u8()?;
            size
        } else {
            address_size
        };
        let header_length = unit.read_length(format)?;
        let mut header = unit.split(header_length)?;
        let minimum_instruction_length = header.read_u8()?;
        if minimum_instruction_length == 0 {
            return Err(gimli::Error::MinimumInstructionLengthZero);
        }
        let maximum_operations_per_instruction = if version >= 4 { header.read_u8()? } else { 1 };
        if maximum_operations_per_instruction == 0 {
            return Err(gimli::Error::MaximumOperationsPerInstructionZero);
        }
        let _default_is_stmt = header.read_u8()?;
        let line_base = header.read_i8()?;
        let line_range = header.read_u8()?;
        if line_range == 0 {
            return Err(gimli::Error::LineRangeZero);
        }
        let opcode_base = header.read_u8()?;
        if opcode_base == 0 {
            return Err(gimli::Error::OpcodeBaseZero);
        }
        let standard_opcode_lengths = header.split(usize::from(opcode_base) - 1)?.slice();
        // The directories are indexed on the way to the files.
        let (directories, files) = if version >= 5 {
            let mut directories = Table::described(&mut header, format)?;
            header = directories.index()?;
            (directories, Table::described(&mut header, format)?)
        } else {
            let fixed = |entries, file| Table { entries, layout: Layout::Fixed { file }, format, starts: None };
            let mut directories = fixed(header, false);
            header = directories.index()?;
            (directories, fixed(header, true))
        };
        Ok(Header {
            address_size,
            minimum_instruction_length,
            maximum_operations_per_instruction,
            line_base,
            line_range,
            opcode_base,
            standard_opcode_lengths,
            instructions: unit,
            version,
            directories,
            files,
        })
    }

    /// File `index` as a row or an inlined call names it (DWARF 5 numbers files from 0,
    /// earlier versions from 1: file 0 is none then).
    pub(super) fn file(&mut self, index: u64) -> Result<Option<Entry>> {
        let index = match (self.version >= 5, index) {
            (true, index) => index,
            (false, 0) => return Ok(None),
            (false, index) => index - 1,
        };
        self.files.entry(index)
    }

    /// The path of directory `index`, but for directory 0, the unit's own directory, which
    /// its entry names (DWARF 2 to 4 number the table's directories from 1).
    pub(super) fn directory(&mut self, index: u64) -> Result<Option<gimli::AttributeValue<Reader>>> {
        let index = match (self.version >= 5, index) {
            (_, 0) => return Ok(None),
            (true, index) => index,
            (false, index) => index - 1,
        };
        Ok(self.directories.entry(index)?.map(|entry| entry.path))
    }
}

impl Table {
    /// A DWARF 5 table at `input`: its entry format and count, then its entries (`input` is
    /// left at the entries).
    fn described(input: &mut Reader, format: gimli::Format) -> Result<Table> {
        let fields_start = *input;
        let pairs = input.read_u8()?;
        let mut paths = 0;
        for _ in 0..pairs {
            paths += usize::from(input.read_uleb128()? == u64::from(gimli::DW_LNCT_path.0));
            input.read_uleb128()?;
        }
        if paths != 1 {
            return Err(gimli::Error::MissingFileEntryFormatPath);
        }
        let mut fields = fields_start;
        fields.skip(1)?;
        let fields = fields.split(gimli::Reader::offset_from(&*input, &fields))?;
        let count = input.read_uleb128()?;
        Ok(Table { entries: *input, layout: Layout::Described { fields, count }, format, starts: None })
    }

    /// Note where each entry starts; the input after the table.
    fn index(&mut self) -> Result<Reader> {
        let mut input = self.entries;
        let mut starts = Vec::new();
        loop {
            match self.layout {
                Layout::Described { count, .. } if starts.len() as u64 == count => break,
                Layout::Described { .. } => {}
                Layout::Fixed { .. } => {
                    // An empty path ends the table.
                    let mut after = input;
                    if after.read_null_terminated_slice()?.is_empty() {
                        input = after;
                        break;
                    }
                }
            }
            let at = u32::try_from(gimli::Reader::offset_from(&input, &self.entries))
                .map_err(|_| gimli::Error::UnsupportedOffset)?;
            starts.push(at);
            self.read(&mut input)?;
        }
        self.starts = Some(starts);
        Ok(input)
    }

    /// Entry `index`, if the table has one.
    fn entry(&mut self, index: u64) -> Result<Option<Entry>> {
        if self.starts.is_none() {
            self.index()?;
        }
        let starts = self.starts.as_deref().unwrap_or_default();
        let Some(&start) = usize::try_from(index).ok().and_then(|i| starts.get(i)) else { return Ok(None) };
        let mut input = self.entries;
        input.skip(start as usize)?;
        self.read(&mut input).map(Some)
    }

    /// The entry at `input`, which is moved past it.
    fn read(&self, input: &mut Reader) -> Result<Entry> {
        match self.layout {
            Layout::Fixed { file } => {
                let path = gimli::AttributeValue::String(input.read_null_terminated_slice()?);
                let directory = if file {
                    let directory = input.read_uleb128()?;
                    input.read_uleb128()?;
                    input.read_uleb128()?;
                    directory
                } else {
                    0
                };
                Ok(Entry { path, directory })
            }
            Layout::Described { fields, .. } => {
                let (mut fields, mut path, mut directory) = (fields, None, 0);
                while !fields.is_empty() {
                    let content = fields.read_uleb128()?;
                    let form = gimli::DwForm(fields.read_uleb128_u16()?);
                    let value = value(input, form, self.format)?;
                    if content == u64::from(gimli::DW_LNCT_path.0) {
                        path = Some(value);
                    } else if content == u64::from(gimli::DW_LNCT_directory_index.0) {
                        directory = value.udata_value().unwrap_or(0);
                    }
                }
                let path = path.ok_or(gimli::Error::MissingFileEntryFormatPath)?;
                Ok(Entry { path, directory })
            }
        }
    }
}

/// A field of a DWARF 5 entry, of `form`, as gimli reads it (`parse_attribute` in its `line`
/// module): the forms DWARF 5 allows in these tables.
fn value(input: &mut Reader, form: gimli::DwForm, format: gimli::Format) -> Result<gimli::AttributeValue<Reader>> {
    use gimli::AttributeValue as Value;
    let block = |input: &mut Reader, length: u64| -> Result<Value<Reader>> {
        Ok(Value::Block(input.split(usize::try_from(length).map_err(|_| gimli::Error::UnsupportedOffset)?)?))
    };
    let index = |index: u64| -> Result<Value<Reader>> {
        let index = usize::try_from(index).map_err(|_| gimli::Error::UnsupportedOffset)?;
        Ok(Value::DebugStrOffsetsIndex(gimli::DebugStrOffsetsIndex(index)))
    };
    Ok(match form {
        gimli::DW_FORM_block1 => {
            let length = input.read_u8()?;
            block(input, u64::from(length))?
        }
        gimli::DW_FORM_block2 => {
            let length = input.read_u16()?;
            block(input, u64::from(length))?
        }
        gimli::DW_FORM_block4 => {
            let length = input.read_u32()?;
            block(input, u64::from(length))?
        }
        gimli::DW_FORM_block => {
            let length = input.read_uleb128()?;
            block(input, length)?
        }
        gimli::DW_FORM_data16 => block(input, 16)?,
        gimli::DW_FORM_data1 => Value::Data1(input.read_u8()?),
        gimli::DW_FORM_data2 => Value::Data2(input.read_u16()?),
        gimli::DW_FORM_data4 => Value::Data4(input.read_u32()?),
        gimli::DW_FORM_data8 => Value::Data8(input.read_u64()?),
        gimli::DW_FORM_udata => Value::Udata(input.read_uleb128()?),
        gimli::DW_FORM_sdata => Value::Sdata(input.read_sleb128()?),
        gimli::DW_FORM_flag => Value::Flag(input.read_u8()? != 0),
        gimli::DW_FORM_sec_offset => Value::SecOffset(input.read_offset(format)?),
        gimli::DW_FORM_string => Value::String(input.read_null_terminated_slice()?),
        gimli::DW_FORM_strp => Value::DebugStrRef(gimli::DebugStrOffset(input.read_offset(format)?)),
        gimli::DW_FORM_strp_sup | gimli::DW_FORM_GNU_strp_alt => {
            Value::DebugStrRefSup(gimli::DebugStrOffset(input.read_offset(format)?))
        }
        gimli::DW_FORM_line_strp => Value::DebugLineStrRef(gimli::DebugLineStrOffset(input.read_offset(format)?)),
        gimli::DW_FORM_strx | gimli::DW_FORM_GNU_str_index => index(input.read_uleb128()?)?,
        gimli::DW_FORM_strx1 => index(u64::from(input.read_u8()?))?,
        gimli::DW_FORM_strx2 => index(u64::from(input.read_u16()?))?,
        gimli::DW_FORM_strx3 => index(input.read_uint(3)?)?,
        gimli::DW_FORM_strx4 => index(u64::from(input.read_u32()?))?,
        _ => return Err(gimli::Error::UnknownForm(form)),
    })
}

#[cfg(test)]
mod tests {
    use gimli::Section as _;
    use object::Object as _;

    use super::*;

    /// Every file and directory of `header`'s tables, as gimli's header of the same program
    /// gives them (but directory 0, which naming takes from the unit's entry, and DWARF 4's
    /// file 0, which gimli makes of the unit's name when it is given one, and naming never
    /// was); the number of files.
    fn compare(ours: &mut Header, theirs: &gimli::LineProgramHeader<Reader>) -> usize {
        let files = theirs.file_names().len() as u64;
        let first = u64::from(theirs.version() <= 4);
        assert!(ours.file(0).unwrap().is_none() || first == 0, "DWARF 4 has no file 0");
        for index in first..files + 2 {
            let mine = ours.file(index).unwrap();
            match (mine, theirs.file(index)) {
                (None, None) => {}
                (Some(mine), Some(file)) => {
                    assert_eq!((mine.path, mine.directory), (file.path_name(), file.directory_index()), "file {index}");
                    let directory = ours.directory(mine.directory).unwrap();
                    let expected = file.directory(theirs).filter(|_| mine.directory != 0);
                    assert_eq!(directory, expected, "the directory of file {index}");
                }
                (mine, file) => {
                    panic!("file {index}: {:?} against {:?}", mine.map(|m| m.path), file.map(|f| f.path_name()))
                }
            }
        }
        files as usize
    }

    /// The files and directories of every unit of this test binary (DWARF 4, from rustc) and of
    /// the separate debug files under `/usr/lib/debug` (DWARF 5 from GCC, where there are
    /// some) are gimli's.
    #[test]
    fn the_files_of_real_objects_are_gimlis() {
        let mut versions = std::collections::BTreeMap::new();
        for path in &super::super::test_objects() {
            let Ok(data) = std::fs::read(path) else { continue };
            let data: &'static [u8] = Box::leak(data.into_boxed_slice());
            let Ok(file) = object::File::parse(data) else { continue };
            let endian = if file.is_little_endian() { gimli::RunTimeEndian::Little } else { gimli::RunTimeEndian::Big };
            let mut inflated = Vec::new();
            let dwarf = gimli::Dwarf::load(|id| -> std::result::Result<Reader, ()> {
                let data = super::super::object_file::section_data(&file, id.name(), &mut inflated).unwrap_or(&[]);
                Ok(gimli::EndianSlice::new(data, endian))
            })
            .unwrap();
            let mut headers = dwarf.units();
            while let Ok(Some(header)) = headers.next() {
                let Ok(unit) = dwarf.unit(header) else { continue };
                let Some(program) = &unit.line_program else { continue };
                let theirs = program.header();
                let at = theirs.offset().0;
                let mut ours = Header::parse(*dwarf.debug_line.reader(), at, unit.header.address_size()).unwrap();
                assert_eq!(ours.version, theirs.version(), "{} at {at}", path.display());
                let files = compare(&mut ours, theirs);
                *versions.entry(theirs.version()).or_insert(0) += files;
            }
        }
        println!("files compared, by DWARF version: {versions:?}");
        assert!(versions.get(&4).is_some_and(|&files| files > 1000), "{versions:?}");
    }

    /// A DWARF 5 header whose directories and files are encoded in forms of every kind a
    /// table may use is read as gimli reads it.
    #[test]
    fn a_dwarf_5_table_of_every_form_is_read_as_gimli_reads_it() {
        let uleb = |mut v: u64, out: &mut Vec<u8>| loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            out.push(byte | if v == 0 { 0 } else { 0x80 });
            if v == 0 {
                break;
            }
        };
        let mut header = vec![1, 1, 1, (-5i8) as u8, 14, 13, 0, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1];
        // Directories: a path by `.debug_line_str` offset; three of them.
        header.push(1);
        uleb(u64::from(gimli::DW_LNCT_path.0), &mut header);
        uleb(u64::from(gimli::DW_FORM_line_strp.0), &mut header);
        uleb(3, &mut header);
        for offset in [0u32, 7, 20] {
            header.extend_from_slice(&offset.to_le_bytes());
        }
        // Files: a path inline, a directory index, an MD5, a size, a vendor's block, and a
        // timestamp as a `.debug_str` index; one entry each of several forms of directory.
        let fields = [
            (gimli::DW_LNCT_path.0, gimli::DW_FORM_string.0),
            (gimli::DW_LNCT_directory_index.0, gimli::DW_FORM_udata.0),
            (gimli::DW_LNCT_MD5.0, gimli::DW_FORM_data16.0),
            (gimli::DW_LNCT_size.0, gimli::DW_FORM_data4.0),
            (0x2001, gimli::DW_FORM_block.0),
            (gimli::DW_LNCT_timestamp.0, gimli::DW_FORM_strx3.0),
        ];
        header.push(fields.len() as u8);
        for (content, form) in fields {
            uleb(u64::from(content), &mut header);
            uleb(u64::from(form), &mut header);
        }
        uleb(4, &mut header);
        for (name, directory) in [("a.rs", 0u64), ("b.rs", 2), ("c.rs", 1), ("d.rs", 300)] {
            header.extend_from_slice(name.as_bytes());
            header.push(0);
            uleb(directory, &mut header);
            header.extend_from_slice(&[0xAB; 16]);
            header.extend_from_slice(&1234u32.to_le_bytes());
            uleb(3, &mut header);
            header.extend_from_slice(b"xyz");
            header.extend_from_slice(&[1, 2, 3]);
        }
        let mut unit = vec![5, 0, 8, 0];
        unit.extend_from_slice(&(header.len() as u32).to_le_bytes());
        unit.extend(header);
        unit.extend_from_slice(&[0, 1, 1]);
        let mut section = (unit.len() as u32).to_le_bytes().to_vec();
        section.extend(unit);
        let section: &'static [u8] = Box::leak(section.into_boxed_slice());
        let debug_line = gimli::DebugLine::new(section, gimli::RunTimeEndian::Little);
        let theirs = debug_line.program(gimli::DebugLineOffset(0), 8, None, None).unwrap();
        let mut ours = Header::parse(*debug_line.reader(), 0, 4).unwrap();
        assert_eq!(ours.address_size, 8, "DWARF 5 says its address size");
        assert_eq!(compare(&mut ours, theirs.header()), 4);
        assert_eq!(
            ours.directory(2).unwrap(),
            Some(gimli::AttributeValue::DebugLineStrRef(gimli::DebugLineStrOffset(20)))
        );
        assert_eq!(ours.directory(3).unwrap(), None, "past the table");
        assert_eq!(ours.instructions.slice(), [0, 1, 1]);
    }

    /// A header cut short, or of a version no compiler writes, is an error, never a panic.
    #[test]
    fn damaged_headers_are_errors() {
        let section: &'static [u8] = &[20, 0, 0, 0, 4, 0, 200, 0, 0, 0, 1, 1, 1, 0xFB, 14, 13];
        let reader = gimli::EndianSlice::new(section, gimli::RunTimeEndian::Little);
        assert!(Header::parse(reader, 0, 8).is_err(), "cut short");
        let section: &'static [u8] = &[2, 0, 0, 0, 9, 0];
        assert!(matches!(
            Header::parse(gimli::EndianSlice::new(section, gimli::RunTimeEndian::Little), 0, 8),
            Err(gimli::Error::UnknownVersion(9))
        ));
        assert!(Header::parse(reader, 1000, 8).is_err(), "past the section");
    }
}
