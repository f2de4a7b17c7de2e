//! Runs a unit's DWARF line program: once, as far as lookups need, to find where its sequences
//! start (or a sequence is found by searching for the instruction that sets its start
//! address), then one sequence's rows up to the row that covers an address.
//!
//! gimli's own state machine does the same, as `sequences()` and `resume_from`, but it decodes
//! every instruction into an enum and keeps every register, and running the programs of a
//! program's standard library and main units is the larger part of naming its first frames.
//! This runs the instructions from their bytes, with a table for the special opcodes (most of
//! a program), and keeps only the registers a location needs. Its rules are gimli's
//! (`LineRow::execute`), which addr2line's answers, and so this module's tests, rest on:
//! tombstoned sequences (an address set below the one before, or at the top of the address
//! space) give no rows, an address that overflows is an error, and of the first row of each
//! sequence its address is the sequence's start.
//!
//! Two features of DWARF no compiler in use emits are refused (the unit then has no line
//! information): `DW_LNE_define_file` (DWARF 2 to 4, gone from 5), which adds files as the
//! program runs, and VLIW operation indexes (`maximum_operations_per_instruction` above 1).

use super::dwarf::{order, uleb128};
use super::line_header::Header;

/// The rows of one sequence start at byte `offset` of the program's instructions.
#[derive(Clone, Copy)]
pub(super) struct Sequence {
    pub(super) start: u64,
    /// The first address past the sequence.
    pub(super) end: u64,
    offset: usize,
}

/// The most bytes of instructions before a sequence's `DW_LNE_set_address` that
/// [`Program::sequence_starting_at`] looks back over for where the sequence starts (a few
/// instructions set its file and column).
const SEQUENCE_PROLOGUE: usize = 32;

/// The bytes of instructions below which [`Program::bisected`] stops narrowing the range: a few
/// sequences' worth, searched at once.
const BISECTED_ENOUGH: usize = 1024;

/// The registers of a row that a location needs.
#[derive(Clone, Copy)]
pub(super) struct Row {
    pub(super) address: u64,
    pub(super) file: u64,
    /// 0 when unknown.
    pub(super) line: u64,
    /// 0 when unknown (the left edge).
    pub(super) column: u64,
}

/// A program's sequences, read as far as lookups have needed (as gimli's `sequences`, which
/// reads them all): for a unit of one or two lookups, part of the program.
pub(super) struct Sequences {
    /// In program order while `next` is `Some` (but for those [`Program::sequence_starting_at`]
    /// found, which may then come twice); sorted by start once all are read.
    found: Vec<Sequence>,
    /// The offset of the instructions to read on from; `None` once all are read.
    next: Option<usize>,
}

impl Sequences {
    pub(super) fn new() -> Sequences {
        Sequences { found: Vec::new(), next: Some(0) }
    }

    /// How many sequences the list of those found has room for (for memory estimates).
    pub(super) fn capacity(&self) -> usize {
        self.found.capacity()
    }
}

/// Why a program cannot be run.
#[derive(Debug)]
pub(super) struct Unreadable;

/// A unit's line program: its instructions and how to decode them.
pub(super) struct Program {
    instructions: &'static [u8],
    opcode_base: u8,
    /// The operand counts of standard opcodes `1..opcode_base`.
    standard_lengths: &'static [u8],
    /// Of each special opcode: how far it moves the address, and the line.
    special: Box<[(u64, i64); 256]>,
    /// How far `DW_LNS_const_add_pc` moves the address.
    const_add_pc: u64,
    min_length: u64,
    address_size: u8,
    big_endian: bool,
    /// The lowest tombstone address (gimli's `min_tombstone`: all ones but the lowest bit).
    tombstone: u64,
}

impl Program {
    /// The program that `header` starts.
    pub(super) fn new(header: &Header) -> Result<Program, Unreadable> {
        let (opcode_base, line_range) = (header.opcode_base, header.line_range);
        let address_size = header.address_size;
        if header.maximum_operations_per_instruction != 1 || line_range == 0 || !matches!(address_size, 4 | 8) {
            return Err(Unreadable);
        }
        let min_length = u64::from(header.minimum_instruction_length);
        let mut special = Box::new([(0, 0); 256]);
        for opcode in opcode_base..=255 {
            let adjusted = opcode - opcode_base;
            special[usize::from(opcode)] = (
                min_length * u64::from(adjusted / line_range),
                i64::from(header.line_base) + i64::from(adjusted % line_range),
            );
        }
        let mask = u64::MAX >> (64 - 8 * u32::from(address_size));
        let instructions = header.instructions;
        Ok(Program {
            instructions: instructions.slice(),
            big_endian: gimli::Endianity::is_big_endian(gimli::Reader::endian(&instructions)),
            opcode_base,
            standard_lengths: header.standard_opcode_lengths,
            special,
            const_add_pc: min_length * u64::from((255 - opcode_base) / line_range),
            min_length,
            address_size,
            tombstone: mask & !1,
        })
    }

    /// The sequence that holds `probe`, if one does: one found before, else found by
    /// searching from `search` (the start of the function at `probe`, see
    /// [`Program::sequence_starting_at`]), else by reading the program on from where the last
    /// lookup stopped (see [`Sequences`]) up to the end of the sequence that holds it.
    pub(super) fn sequence_at(
        &self,
        sequences: &mut Sequences,
        probe: u64,
        search: Option<u64>,
    ) -> Result<Option<Sequence>, Unreadable> {
        let holds = |s: &Sequence| s.start <= probe && probe < s.end;
        let Some(from) = sequences.next else {
            let found = sequences.found.binary_search_by(|s| order(s.start, s.end, probe));
            return Ok(found.ok().map(|i| sequences.found[i]));
        };
        if let Some(&sequence) = sequences.found.iter().find(|s| holds(s)) {
            return Ok(Some(sequence));
        }
        if let Some(sequence) = search.and_then(|start| self.sequence_starting_at(sequences, start, probe)) {
            return Ok(Some(sequence));
        }
        let (found, mut hit, mut next) = (&mut sequences.found, None, None);
        let (mut offset, mut start, mut rows) = (from, None, 0usize);
        let ran = self.run(from, |row, end_sequence, after| {
            rows += 1;
            if rows.is_multiple_of(super::WORK_STEP) {
                super::note_work();
            }
            if end_sequence {
                let start = start.take().unwrap_or(0);
                if start < row.address {
                    let sequence = Sequence { start, end: row.address, offset };
                    found.push(sequence);
                    if holds(&sequence) {
                        (hit, next) = (Some(sequence), Some(after));
                        return false;
                    }
                }
                offset = after;
            } else if start.is_none() {
                start = Some(row.address);
            }
            true
        });
        // At the end (or at an error: what was read before it is kept), all are read.
        sequences.next = next.filter(|_| ran.is_ok());
        if sequences.next.is_none() {
            // Stable: sequences at one start (code the linker dropped, at 0) stay in program
            // order.
            sequences.found.sort_by_key(|s| s.start);
            sequences.found.shrink_to_fit();
        }
        ran.map(|()| hit)
    }

    /// The sequence that starts at `start` and holds `probe`, found by searching the program
    /// for the instruction that sets the address to `start` (`DW_LNE_set_address`) rather
    /// than reading the program up to it: a compiler that puts each function in a section of
    /// its own starts a sequence per function, with that instruction (after a few that set
    /// the file or column). The search looks first where [`Program::bisected`] says the
    /// instruction is, then, if it is not there, through the whole program. The sequence is
    /// taken to start after the last end of a sequence shortly before it, or at the program's
    /// start, and is kept if its first row is at `start` (so the instruction was read as one)
    /// and it holds `probe`. `None` when there is none (functions that share a sequence): the
    /// caller reads the program then. The sequence found is noted in `sequences` (where
    /// reading the program notes it again).
    pub(super) fn sequence_starting_at(&self, sequences: &mut Sequences, start: u64, probe: u64) -> Option<Sequence> {
        let mut needle = vec![0, 1 + self.address_size, gimli::DW_LNE_set_address.0];
        needle.extend(super::dwarf::address_bytes(start, self.address_size, self.big_endian)?);
        let end_sequence = [0, 1, gimli::DW_LNE_end_sequence.0];
        let starting_at = |at: usize| {
            let window = at.saturating_sub(SEQUENCE_PROLOGUE);
            let offset = match memchr::memmem::rfind(&self.instructions[window..at], &end_sequence) {
                Some(end) => window + end + end_sequence.len(),
                None if window == 0 => 0,
                None => return None,
            };
            let (mut first, mut sequence) = (None, None);
            self.run(offset, |row, end_sequence, _| {
                if !end_sequence {
                    first = first.or(Some(row.address));
                    return first == Some(start);
                }
                sequence = first.filter(|&first| first < row.address).map(|first| Sequence {
                    start: first,
                    end: row.address,
                    offset,
                });
                false
            })
            .ok()?;
            // Ended at its first row unless that row is at `start`.
            sequence.filter(|s| start <= probe && probe < s.end)
        };
        let (from, to) = self.bisected(start);
        let near = &self.instructions[from..(to + needle.len()).min(self.instructions.len())];
        let finder = super::dwarf::address_finder(&needle);
        let sequence = match finder.find_iter(near).find_map(|at| starting_at(from + at)) {
            Some(sequence) => sequence,
            // The range was the whole program: searched already.
            None if near.len() == self.instructions.len() => return None,
            None => finder.find_iter(self.instructions).find_map(starting_at)?,
        };
        sequences.found.push(sequence);
        Some(sequence)
    }

    /// Where the `DW_LNE_set_address` to `start` begins, if the program's sequences come in
    /// increasing order of address (as compilers that put each function in a section of its
    /// own write them, and linkers keep them): a range of instructions of at most
    /// [`BISECTED_ENOUGH`] bytes, found by bisection, each step reading the address of the first
    /// such instruction after the middle of the range (skipping addresses 0 and tombstones,
    /// of code the linker dropped). Bytes that only look like such an instruction, or
    /// sequences out of order, can mislead it: the caller searches the whole program when
    /// the range does not hold the instruction.
    fn bisected(&self, start: u64) -> (usize, usize) {
        let prefix = [0, 1 + self.address_size, gimli::DW_LNE_set_address.0];
        let instruction = prefix.len() + usize::from(self.address_size);
        let (mut low, mut high) = (0, self.instructions.len());
        while high - low > BISECTED_ENOUGH {
            let middle = low + (high - low) / 2;
            // The first instruction from `middle` that begins before `high` and sets a real
            // address.
            let mut from = middle;
            let next = loop {
                let end = (high + instruction).min(self.instructions.len());
                let Some(at) = memchr::memmem::find(&self.instructions[from..end], &prefix).map(|k| from + k) else {
                    break None;
                };
                if at >= high {
                    break None;
                }
                let mut operand = Bytes { data: self.instructions, at: at + prefix.len() };
                match operand.number(usize::from(self.address_size), self.big_endian) {
                    Ok(address) if address != 0 && address < self.tombstone => break Some((at, address)),
                    _ => from = at + 1,
                }
            };
            match next {
                // None begins in `middle..high`: the one sought begins before `middle`.
                None => high = middle,
                Some((at, address)) if address < start => low = at + 1,
                Some((_, address)) if address > start => high = middle,
                Some((at, _)) => return (at, at + 1),
            }
        }
        (low, high)
    }

    /// The row of `sequence` that covers `probe`: the last of those at the highest address at
    /// or below it.
    pub(super) fn row_at(&self, sequence: &Sequence, probe: u64) -> Result<Option<Row>, Unreadable> {
        let mut covering = None;
        self.run(sequence.offset, |row, end_sequence, _| {
            if end_sequence || row.address > probe {
                return false;
            }
            covering = Some(*row);
            true
        })?;
        Ok(covering)
    }

    /// Run the instructions from byte `from`, calling `f(row, end_sequence, next)` at each row
    /// (`next`: the offset of the instruction after it) until it returns false or the
    /// instructions end.
    fn run(&self, from: usize, mut f: impl FnMut(&Row, bool, usize) -> bool) -> Result<(), Unreadable> {
        let initial = Row { address: 0, file: 1, line: 1, column: 0 };
        let (mut row, mut tombstone) = (initial, false);
        let mut at = Bytes { data: self.instructions, at: from };
        while let Some(opcode) = at.byte() {
            let mut end_sequence = false;
            let emits = if opcode >= self.opcode_base {
                let (address, line) = self.special[usize::from(opcode)];
                advance_line(&mut row.line, line);
                self.advance(&mut row.address, tombstone, address)?;
                true
            } else if opcode == 0 {
                let length = usize::try_from(at.uleb()?).map_err(|_| Unreadable)?;
                let mut operands = Bytes { data: at.take(length)?, at: 0 };
                match gimli::DwLne(operands.byte().ok_or(Unreadable)?) {
                    gimli::DW_LNE_end_sequence => end_sequence = true,
                    gimli::DW_LNE_set_address => {
                        let address = operands.number(usize::from(self.address_size), self.big_endian)?;
                        tombstone = address < row.address || address >= self.tombstone;
                        if !tombstone {
                            row.address = address;
                        }
                    }
                    gimli::DW_LNE_define_file => return Err(Unreadable),
                    // The discriminator, and opcodes of vendors: nothing a location needs.
                    _ => {}
                }
                end_sequence
            } else {
                match opcode {
                    1 => true, // DW_LNS_copy
                    2 => {
                        let advance = at.uleb()?;
                        self.advance(&mut row.address, tombstone, advance.wrapping_mul(self.min_length))?;
                        false
                    }
                    3 => {
                        advance_line(&mut row.line, at.sleb()?);
                        false
                    }
                    4 => {
                        row.file = at.uleb()?;
                        false
                    }
                    5 => {
                        row.column = at.uleb()?;
                        false
                    }
                    8 => {
                        self.advance(&mut row.address, tombstone, self.const_add_pc)?;
                        false
                    }
                    9 => {
                        // DW_LNS_fixed_advance_pc: a uhalf, not scaled.
                        let advance = at.number(2, self.big_endian)?;
                        self.advance(&mut row.address, tombstone, advance)?;
                        false
                    }
                    // negate_stmt, set_basic_block, set_prologue_end, set_epilogue_begin.
                    6 | 7 | 10 | 11 => false,
                    // DW_LNS_set_isa.
                    12 => {
                        at.uleb()?;
                        false
                    }
                    // Opcodes of later versions or vendors: their operands skipped.
                    _ => {
                        let operands = self.standard_lengths.get(usize::from(opcode) - 1).copied().unwrap_or(0);
                        for _ in 0..operands {
                            at.uleb()?;
                        }
                        false
                    }
                }
            };
            if emits {
                if !tombstone && !f(&row, end_sequence, at.at) {
                    return Ok(());
                }
                if end_sequence {
                    (row, tombstone) = (initial, false);
                }
            }
        }
        Ok(())
    }

    /// Move `address` on by `by`, unless the sequence is tombstoned: an error past the top of
    /// the address space.
    #[inline(always)]
    fn advance(&self, address: &mut u64, tombstone: bool, by: u64) -> Result<(), Unreadable> {
        if !tombstone {
            let moved = address.checked_add(by).ok_or(Unreadable)?;
            if self.address_size == 4 && moved > u64::from(u32::MAX) {
                return Err(Unreadable);
            }
            *address = moved;
        }
        Ok(())
    }
}

/// The line register moved by `by`: wrapping upwards, stopping at 0 downwards (as gimli).
#[inline(always)]
fn advance_line(line: &mut u64, by: i64) {
    *line = if by < 0 { line.saturating_sub(by.unsigned_abs()) } else { line.wrapping_add(by as u64) };
}

/// A cursor over instruction bytes.
struct Bytes {
    data: &'static [u8],
    at: usize,
}

impl Bytes {
    #[inline(always)]
    fn byte(&mut self) -> Option<u8> {
        let byte = *self.data.get(self.at)?;
        self.at += 1;
        Some(byte)
    }

    fn take(&mut self, n: usize) -> Result<&'static [u8], Unreadable> {
        let taken = self.data.get(self.at..self.at.checked_add(n).ok_or(Unreadable)?).ok_or(Unreadable)?;
        self.at += n;
        Ok(taken)
    }

    /// An unsigned number of `size` bytes (at most 8).
    fn number(&mut self, size: usize, big_endian: bool) -> Result<u64, Unreadable> {
        let bytes = self.take(size)?;
        let from_most_significant = |value, &b| value << 8 | u64::from(b);
        Ok(if big_endian {
            bytes.iter().fold(0, from_most_significant)
        } else {
            bytes.iter().rev().fold(0, from_most_significant)
        })
    }

    #[inline(always)]
    fn uleb(&mut self) -> Result<u64, Unreadable> {
        uleb128(self.data, &mut self.at).ok_or(Unreadable)
    }

    #[inline(always)]
    fn sleb(&mut self) -> Result<i64, Unreadable> {
        let (mut value, mut shift) = (0i64, 0);
        loop {
            let byte = self.byte().ok_or(Unreadable)?;
            if shift < 64 {
                value |= i64::from(byte & 0x7f) << shift;
            }
            shift += 7;
            if byte & 0x80 == 0 {
                if shift < 64 && byte & 0x40 != 0 {
                    value |= -1 << shift;
                }
                return Ok(value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use gimli::Section as _;

    use super::super::dwarf::Reader;
    use super::*;

    /// The sequences and rows of every unit of this test binary, as gimli's state machine
    /// gives them: each sequence's bounds, and at each row's address the last row there.
    #[test]
    fn sequences_and_rows_are_gimlis() {
        let data: &'static [u8] =
            Box::leak(std::fs::read(std::env::current_exe().unwrap()).unwrap().into_boxed_slice());
        let file = object::File::parse(data).unwrap();
        let endian = gimli::RunTimeEndian::Little;
        let load = |id: gimli::SectionId| -> Result<Reader, ()> {
            let data = object::Object::section_by_name(&file, id.name())
                .and_then(|s| object::ObjectSection::data(&s).ok())
                .unwrap_or(&[]);
            Ok(gimli::EndianSlice::new(data, endian))
        };
        let dwarf = gimli::Dwarf::load(load).unwrap();
        let (mut units, mut rows) = (0, 0);
        let mut headers = dwarf.units();
        while let Some(header) = headers.next().unwrap() {
            let unit = dwarf.unit(header).unwrap();
            let Some(incomplete) = unit.line_program.clone() else { continue };
            let header = Header::parse(*dwarf.debug_line.reader(), incomplete.header().offset().0, 8).unwrap();
            let program = Program::new(&header).expect("runnable");
            let (complete, mut theirs) = incomplete.sequences().unwrap();
            theirs.retain(|s| s.start < s.end);
            // Each sequence found at its last address, in program order (where code the linker
            // dropped overlaps at 0, the first that holds the address), read on as far as it.
            let mut sequences = Sequences::new();
            for gimlis in theirs.iter().filter(|s| s.start > 0) {
                let last = gimlis.end - 1;
                let first = theirs.iter().find(|s| s.start <= last && last < s.end).unwrap();
                let found = program.sequence_at(&mut sequences, last, None).unwrap().expect("found");
                assert_eq!((found.start, found.end), (first.start, first.end));
            }
            // An address past every sequence reads the rest.
            assert!(program.sequence_at(&mut sequences, u64::MAX, None).unwrap().is_none());
            theirs.sort_by_key(|s| s.start);
            let ours = &sequences.found;
            let ours_bounds: Vec<(u64, u64)> = ours.iter().map(|s| (s.start, s.end)).collect();
            let theirs_bounds: Vec<(u64, u64)> = theirs.iter().map(|s| (s.start, s.end)).collect();
            assert_eq!(ours_bounds, theirs_bounds);
            units += 1;
            // Every 5th sequence's rows, so that a debug build checks them in a second.
            for (sequence, gimlis) in ours.iter().zip(&theirs).step_by(5) {
                let mut gimli_rows = complete.resume_from(gimlis);
                let mut at_address: Vec<(u64, Row)> = Vec::new();
                while let Some((_, row)) = gimli_rows.next_row().unwrap() {
                    if row.end_sequence() {
                        break;
                    }
                    let column = match row.column() {
                        gimli::ColumnType::Column(c) => c.get(),
                        gimli::ColumnType::LeftEdge => 0,
                    };
                    let line = row.line().map_or(0, |l| l.get());
                    let row = Row { address: row.address(), file: row.file_index(), line, column };
                    match at_address.last_mut() {
                        Some(last) if last.0 == row.address => last.1 = row,
                        _ => at_address.push((row.address, row)),
                    }
                }
                for (address, expected) in at_address {
                    let found = program.row_at(sequence, address).unwrap().expect("a row");
                    let described = |r: Row| (r.address, r.file, r.line, r.column);
                    assert_eq!(described(found), described(expected), "at {address:#x}");
                    rows += 1;
                }
            }
        }
        assert!(units > 10 && rows > 1000, "{units} units, {rows} rows");
    }

    /// A DWARF 4 line program of `instructions`, with one file, as a compiler lays it out: ours,
    /// and gimli's.
    fn program_of(instructions: &[u8]) -> (Program, gimli::IncompleteLineProgram<Reader>) {
        let mut header = vec![1, 1, 1, (-5i8) as u8, 14, 13, 0, 1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1];
        header.extend_from_slice(b"\0a.rs\0\0\0\0\0");
        let mut unit = vec![4, 0];
        unit.extend_from_slice(&(header.len() as u32).to_le_bytes());
        unit.extend(header);
        unit.extend_from_slice(instructions);
        let mut section = (unit.len() as u32).to_le_bytes().to_vec();
        section.extend(unit);
        let section: &'static [u8] = Box::leak(section.into_boxed_slice());
        let debug_line = gimli::DebugLine::new(section, gimli::RunTimeEndian::Little);
        let header = Header::parse(*debug_line.reader(), 0, 8).unwrap();
        (Program::new(&header).unwrap(), debug_line.program(gimli::DebugLineOffset(0), 8, None, None).unwrap())
    }

    fn set_address(address: u64) -> Vec<u8> {
        let mut op = vec![0, 9, 2];
        op.extend_from_slice(&address.to_le_bytes());
        op
    }

    const END_SEQUENCE: [u8; 3] = [0, 1, 1];

    /// A sequence whose address is set to a tombstone (a linker's mark of dropped code) has no
    /// rows; the rows of the ones around it are as written.
    #[test]
    fn tombstoned_sequences_give_no_rows() {
        let mut instructions = set_address(0x1000);
        // Special opcodes: (opcode - 13) / 14 address units on, line moved by -5 + (opcode - 13) % 14.
        instructions.extend([13 + 5 + 14 * 2, 5, 7, 13 + 6 + 14 * 3]); // 0x1002 line 1; column 7; 0x1005 line 2
        instructions.extend([2, 4]); // advance_pc 4
        instructions.extend(END_SEQUENCE); // ends at 0x1009
        instructions.extend(set_address(u64::MAX));
        instructions.extend([13 + 5 + 14, 2, 100]);
        instructions.extend(END_SEQUENCE);
        instructions.extend(set_address(0x2000));
        instructions.extend([3, 9, 1]); // advance_line 9, copy: 0x2000 line 10
        instructions.extend([2, 3]);
        instructions.extend(END_SEQUENCE); // ends at 0x2003
        let (program, incomplete) = program_of(&instructions);
        let mut read = Sequences::new();
        assert!(program.sequence_at(&mut read, 0x1009, None).unwrap().is_none(), "past the first sequence");
        let sequences = read.found;
        let bounds: Vec<(u64, u64)> = sequences.iter().map(|s| (s.start, s.end)).collect();
        assert_eq!(bounds, [(0x1002, 0x1009), (0x2000, 0x2003)]);
        let (_, gimlis) = incomplete.sequences().unwrap();
        assert_eq!(bounds, gimlis.iter().map(|s| (s.start, s.end)).collect::<Vec<_>>());
        let row = |s: &Sequence, probe| program.row_at(s, probe).unwrap().map(|r| (r.address, r.line, r.column));
        assert_eq!(row(&sequences[0], 0x1004), Some((0x1002, 1, 0)));
        assert_eq!(row(&sequences[0], 0x1008), Some((0x1005, 2, 7)));
        assert_eq!(row(&sequences[0], 0x1001), None);
        assert_eq!(row(&sequences[1], 0x2002), Some((0x2000, 10, 0)));
    }

    /// A program of `count` sequences of 0x20 bytes at `address(k)`, with a tombstoned
    /// sequence and one at address 0 (code the linker dropped) among them, and where each of
    /// the others begins.
    fn sequences_at(count: u64, address: impl Fn(u64) -> u64) -> (Vec<u8>, Vec<usize>) {
        let (mut instructions, mut offsets) = (Vec::new(), Vec::new());
        for k in 0..count {
            if k == count / 3 || k == 2 * count / 3 {
                instructions.extend(set_address(if k == count / 3 { u64::MAX } else { 0 }));
                instructions.extend([13 + 5 + 14, 2, 100]);
                instructions.extend(END_SEQUENCE);
            }
            offsets.push(instructions.len());
            instructions.extend(set_address(address(k)));
            instructions.extend([3, 9, 1]); // advance_line 9, copy
            instructions.extend([2, 0x20]); // advance_pc 0x20
            instructions.extend(END_SEQUENCE);
        }
        (instructions, offsets)
    }

    /// In a program whose sequences come in increasing order of address, bisection narrows the
    /// search for each sequence's start to a range that holds its instruction; in one whose
    /// sequences do not, the search still finds each, through the whole program.
    #[test]
    fn bisection_narrows_the_search_and_disorder_does_not_defeat_it() {
        let address = |k: u64| 0x1000 + k * 0x100;
        let (instructions, offsets) = sequences_at(300, address);
        let (program, _) = program_of(&instructions);
        for (k, &offset) in (0..).zip(&offsets) {
            let (from, to) = program.bisected(address(k));
            assert!(from <= offset && offset < to && to - from <= BISECTED_ENOUGH, "{k}: {from}..{to} for {offset}");
            let found = program.sequence_starting_at(&mut Sequences::new(), address(k), address(k) + 1);
            assert_eq!(found.map(|s| (s.start, s.end)), Some((address(k), address(k) + 0x20)), "{k}");
        }
        let shuffled = |k: u64| 0x1000 + (k * 7919 % 300) * 0x100;
        let (instructions, _) = sequences_at(300, shuffled);
        let (program, _) = program_of(&instructions);
        for k in 0..300 {
            let found = program.sequence_starting_at(&mut Sequences::new(), shuffled(k), shuffled(k) + 0x1f);
            assert_eq!(found.map(|s| (s.start, s.end)), Some((shuffled(k), shuffled(k) + 0x20)), "{k}");
        }
    }

    /// A program that defines files as it runs (DWARF 2 to 4) is refused, not misread.
    #[test]
    fn a_program_that_defines_files_is_refused() {
        let mut instructions = set_address(0x1000);
        instructions.extend([0, 9, 3, b'b', b'.', b'r', b's', 0, 0, 0, 0]);
        instructions.extend([1]);
        instructions.extend(END_SEQUENCE);
        let (program, _) = program_of(&instructions);
        assert!(program.sequence_at(&mut Sequences::new(), 0x1000, None).is_err());
    }
}
