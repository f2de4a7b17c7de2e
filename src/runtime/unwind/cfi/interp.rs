//! The rule at a code address from its FDE: a checked CIE/FDE parser and the CFI interpreter,
//! reduced to the registers the walk follows.

use super::rule::{Rule, RBP, RSP};
use crate::format::buf::ReadCursor;

/// An FDE with its CIE, parsed as far as the walk needs: the code it covers and the
/// call-frame instructions that give the rules there.
pub(super) struct Fde<'a> {
    cie: Cie<'a>,
    /// The start of the code covered: its function's.
    pub(super) start: u64,
    /// The end of the code covered (exclusive).
    end: u64,
    instructions: &'a [u8],
}

impl<'a> Fde<'a> {
    /// The FDE whose body (the bytes after its length word) is `body`, at address `address`,
    /// and whose CIE's body is `cie_body`; `None` when either is malformed (cut short, a CIE
    /// that makes no sense, a pointer encoding it does not know or the walk does not use, a
    /// range past the end of the address space).
    pub(super) fn parse(body: &'a [u8], address: u64, cie_body: &'a [u8]) -> Option<Fde<'a>> {
        let mut cursor = ReadCursor::new(body, address);
        // The CIE pointer, which the caller followed to `cie_body`.
        cursor.try_u32()?;
        let cie = Cie::parse(cie_body)?;
        let start = read_pointer(&mut cursor, cie.pointer_encoding, None)?;
        let length = read_value(&mut cursor, cie.pointer_encoding & FORMAT)?;
        let end = start.checked_add(length)?;
        if cie.has_augmentation_data {
            let length = cursor.try_uleb128()?;
            skip(&mut cursor, length)?;
        }
        Some(Fde { cie, start, end, instructions: cursor.rest() })
    }

    /// Whether the FDE covers code address `pc`.
    pub(super) fn covers(&self, pc: u64) -> bool {
        (self.start..self.end).contains(&pc)
    }

    /// The rule at `pc`: [`Rule::Rejected`] for malformed CFI (an instruction cut short or
    /// unknown, a restore of no remembered state) or an address the FDE does not cover,
    /// [`Rule::Unsupported`] for CFI the walk does not follow.
    pub(super) fn rule_at(&self, pc: u64) -> Rule {
        self.checked_rule_at(pc).unwrap_or(Rule::Rejected)
    }

    /// [`Fde::rule_at`]; `None` for malformed CFI.
    fn checked_rule_at(&self, pc: u64) -> Option<Rule> {
        if !self.covers(pc) {
            return None;
        }
        let cie = &self.cie;
        let mut machine = Machine::new(cie);
        machine.run(cfi_cursor(cie.initial_instructions), cie, u64::MAX, self.start)?;
        machine.initial = machine.row;
        machine.run(cfi_cursor(self.instructions), cie, pc, self.start)?;
        if cie.signal_frame {
            return Some(Rule::Unsupported);
        }
        Some(machine.row.rule().unwrap_or(Rule::Unsupported))
    }
}

/// The format bits of a `DW_EH_PE_*` pointer encoding (gimli's constants), and the
/// applications the unwind tables of x86_64 objects use.
const FORMAT: u8 = 0x0f;
const OMIT: u8 = gimli::DW_EH_PE_omit.0;
const ABSOLUTE: u8 = gimli::DW_EH_PE_absptr.0;
const PC_RELATIVE: u8 = gimli::DW_EH_PE_pcrel.0;
const DATA_RELATIVE: u8 = gimli::DW_EH_PE_datarel.0;

/// A pointer encoded with `DW_EH_PE_*` `encoding`, read at the cursor, whose offset is the
/// address it is read from; `data_base` is the base of data-relative pointers (`.eh_frame_hdr`'s
/// start, where the header is read; none in `.eh_frame`). `None` for an encoding that has no
/// value (`omit`), a format it does not know, an application other than absolute, pc- or
/// data-relative, an indirect pointer (never one the walk reads), or bytes cut short.
pub(super) fn read_pointer(cursor: &mut ReadCursor<'_>, encoding: u8, data_base: Option<u64>) -> Option<u64> {
    let at = cursor.offset();
    if encoding == OMIT || encoding & gimli::DW_EH_PE_indirect.0 != 0 {
        return None;
    }
    let value = read_value(cursor, encoding & FORMAT)?;
    let base = match encoding & !FORMAT {
        ABSOLUTE => 0,
        PC_RELATIVE => at,
        DATA_RELATIVE => data_base?,
        _ => return None,
    };
    Some(base.wrapping_add(value))
}

/// A value of `DW_EH_PE_*` format `format` (signed ones sign-extended); `None` for a format it
/// does not know or bytes cut short.
fn read_value(cursor: &mut ReadCursor<'_>, format: u8) -> Option<u64> {
    Some(match format {
        0x00 | 0x04 | 0x0c => cursor.get_u64().ok()?, // absptr (8 bytes on x86_64), udata8, sdata8
        0x01 => cursor.try_uleb128()?,
        0x09 => cursor.try_sleb128()? as u64,
        0x02 => cursor.try_u16()? as u64,
        0x0a => cursor.try_u16()? as i16 as u64,
        0x03 => cursor.try_u32()? as u64,
        0x0b => cursor.try_u32()? as i32 as u64,
        _ => return None,
    })
}

/// The parts of a CIE the walk needs.
struct Cie<'a> {
    code_alignment: u64,
    data_alignment: i64,
    return_address_register: u64,
    /// How the FDE encodes its address and length (`DW_EH_PE_*`).
    pointer_encoding: u8,
    has_augmentation_data: bool,
    signal_frame: bool,
    initial_instructions: &'a [u8],
}

impl<'a> Cie<'a> {
    fn parse(body: &'a [u8]) -> Option<Cie<'a>> {
        let mut cursor = cfi_cursor(body);
        if cursor.try_u32()? != 0 {
            return None; // Not a CIE.
        }
        let version = cursor.try_u8()?;
        let augmentation = cursor.get_string().ok()?;
        if augmentation.starts_with(b"eh") {
            return None; // GCC 2's format.
        }
        let code_alignment = cursor.try_uleb128()?;
        let data_alignment = cursor.try_sleb128()?;
        let return_address_register = if version == 1 { cursor.try_u8()? as u64 } else { cursor.try_uleb128()? };
        let mut cie = Cie {
            code_alignment,
            data_alignment,
            return_address_register,
            pointer_encoding: 0,
            has_augmentation_data: augmentation.first() == Some(&b'z'),
            signal_frame: false,
            initial_instructions: &[],
        };
        if cie.has_augmentation_data {
            let length = cursor.try_uleb128()?;
            let mut data = cfi_cursor(cursor.try_bytes(usize::try_from(length).ok()?)?);
            for &letter in &augmentation[1..] {
                match letter {
                    b'R' => cie.pointer_encoding = data.try_u8()?,
                    b'L' => _ = data.try_u8()?,
                    b'P' => {
                        // The personality routine (never read: its pointer is indirect).
                        let encoding = data.try_u8()?;
                        if encoding != OMIT {
                            read_value(&mut data, encoding & FORMAT)?;
                        }
                    }
                    b'S' => cie.signal_frame = true,
                    // Other letters come with no data, or after all the data the walk needs.
                    _ => break,
                }
            }
        } else if !augmentation.is_empty() {
            return None;
        }
        cie.initial_instructions = cursor.rest();
        Some(cie)
    }
}

/// How a register is recovered in a row of the CFI table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recovery {
    /// Unchanged in the caller (no rule, or `DW_CFA_same_value`).
    Same,
    Undefined,
    /// Saved at CFA + offset.
    Offset(i64),
    /// Any other rule.
    Other,
}

/// A row of the CFI table, reduced to what the walk needs.
#[derive(Debug, Clone, Copy)]
struct Row {
    cfa_register: u64,
    cfa_offset: i64,
    /// The CFA is given by an expression (`cfa_register` and `cfa_offset` then do not apply).
    cfa_is_expression: bool,
    rbp: Recovery,
    return_address: Recovery,
}

impl Row {
    /// The walk's rule for this row; `None` for one it does not follow.
    fn rule(&self) -> Option<Rule> {
        match self.return_address {
            Recovery::Undefined => return Some(Rule::End),
            Recovery::Offset(-8) => {}
            _ => return None,
        }
        let cfa_in_rbp = match self.cfa_register {
            RSP => false,
            RBP => true,
            _ => return None,
        };
        let rbp_offset = match self.rbp {
            Recovery::Same => None,
            Recovery::Offset(offset) => Some(i16::try_from(offset).ok()?),
            Recovery::Undefined | Recovery::Other => return None,
        };
        if self.cfa_is_expression {
            return None;
        }
        // The return address is stored above the CFA register's stack pointer: a CFA less
        // than 8 above it is malformed (libgcc would read the return address from wherever).
        let Some(cfa_offset) = i32::try_from(self.cfa_offset).ok().filter(|&o| o >= 8) else {
            return Some(Rule::Rejected);
        };
        Some(Rule::Step { cfa_in_rbp, cfa_offset, rbp_offset })
    }
}

/// The CFI state machine, tracking the CFA, `rbp` and the return address.
struct Machine {
    row: Row,
    /// The row after the CIE's initial instructions (for `DW_CFA_restore`).
    initial: Row,
    /// `DW_CFA_remember_state`'s stack.
    remembered: [Row; 8],
    depth: usize,
    return_address_register: u64,
}

impl Machine {
    fn new(cie: &Cie<'_>) -> Machine {
        let row = Row {
            cfa_register: RSP,
            cfa_offset: 0,
            cfa_is_expression: false,
            rbp: Recovery::Same,
            return_address: Recovery::Same,
        };
        Machine {
            row,
            initial: row,
            remembered: [row; 8],
            depth: 0,
            return_address_register: cie.return_address_register,
        }
    }

    /// Set how register `register` is recovered (only `rbp` and the return address matter).
    fn set(&mut self, register: u64, recovery: Recovery) {
        if register == RBP {
            self.row.rbp = recovery;
        } else if register == self.return_address_register {
            self.row.return_address = recovery;
        }
    }

    fn restore(&mut self, register: u64) {
        let initial = self.initial;
        if register == RBP {
            self.row.rbp = initial.rbp;
        } else if register == self.return_address_register {
            self.row.return_address = initial.return_address;
        }
    }

    /// Run `code` until the row that covers `pc` (the instructions of a function starting at
    /// `start`). `None` for malformed or unknown instructions.
    fn run(&mut self, mut code: ReadCursor<'_>, cie: &Cie<'_>, pc: u64, start: u64) -> Option<()> {
        let mut location = start;
        while !code.is_empty() {
            let op = code.try_u8()?;
            let advance = match op >> 6 {
                // DW_CFA_advance_loc
                1 => Some((op & 0x3f) as u64),
                // DW_CFA_offset
                2 => {
                    let offset = factored(code.try_uleb128()?, cie.data_alignment)?;
                    self.set((op & 0x3f) as u64, Recovery::Offset(offset));
                    None
                }
                // DW_CFA_restore
                3 => {
                    self.restore((op & 0x3f) as u64);
                    None
                }
                _ => self.extended(op, &mut code, cie)?,
            };
            if let Some(delta) = advance {
                location = location.checked_add(delta.checked_mul(cie.code_alignment)?)?;
                if location > pc {
                    break;
                }
            }
        }
        Some(())
    }

    /// One of the instructions with a full opcode byte; returns its advance, if it is one.
    fn extended(&mut self, op: u8, code: &mut ReadCursor<'_>, cie: &Cie<'_>) -> Option<Option<u64>> {
        let data_alignment = cie.data_alignment;
        match op {
            0x00 => {}                                         // DW_CFA_nop
            0x02 => return Some(Some(code.try_u8()? as u64)),  // DW_CFA_advance_loc1
            0x03 => return Some(Some(code.try_u16()? as u64)), // DW_CFA_advance_loc2
            0x04 => return Some(Some(code.try_u32()? as u64)), // DW_CFA_advance_loc4
            0x05 => {
                // DW_CFA_offset_extended
                let register = code.try_uleb128()?;
                let offset = factored(code.try_uleb128()?, data_alignment)?;
                self.set(register, Recovery::Offset(offset));
            }
            0x06 => {
                // DW_CFA_restore_extended
                let register = code.try_uleb128()?;
                self.restore(register);
            }
            0x07 => {
                // DW_CFA_undefined
                let register = code.try_uleb128()?;
                self.set(register, Recovery::Undefined);
            }
            0x08 => {
                // DW_CFA_same_value
                let register = code.try_uleb128()?;
                self.set(register, Recovery::Same);
            }
            0x09 => {
                // DW_CFA_register
                let register = code.try_uleb128()?;
                code.try_uleb128()?;
                self.set(register, Recovery::Other);
            }
            0x0a => {
                // DW_CFA_remember_state
                *self.remembered.get_mut(self.depth)? = self.row;
                self.depth += 1;
            }
            0x0b => {
                // DW_CFA_restore_state: the CFA rule too, as libgcc and LLVM's libunwind do
                // (compilers wrap a mid-function epilogue, which moves the CFA, in a pair).
                self.depth = self.depth.checked_sub(1)?;
                self.row = self.remembered[self.depth];
            }
            0x0c => {
                // DW_CFA_def_cfa
                self.row.cfa_register = code.try_uleb128()?;
                self.row.cfa_offset = i64::try_from(code.try_uleb128()?).ok()?;
                self.row.cfa_is_expression = false;
            }
            0x0d => {
                // DW_CFA_def_cfa_register
                self.row.cfa_register = code.try_uleb128()?;
                self.row.cfa_is_expression = false;
            }
            // DW_CFA_def_cfa_offset (an expression CFA stays one, as in libgcc)
            0x0e => self.row.cfa_offset = i64::try_from(code.try_uleb128()?).ok()?,
            0x0f => {
                // DW_CFA_def_cfa_expression
                let length = code.try_uleb128()?;
                skip(code, length)?;
                self.row.cfa_is_expression = true;
            }
            0x10 | 0x16 => {
                // DW_CFA_expression, DW_CFA_val_expression
                let register = code.try_uleb128()?;
                let length = code.try_uleb128()?;
                skip(code, length)?;
                self.set(register, Recovery::Other);
            }
            0x11 => {
                // DW_CFA_offset_extended_sf
                let register = code.try_uleb128()?;
                let offset = code.try_sleb128()?.checked_mul(data_alignment)?;
                self.set(register, Recovery::Offset(offset));
            }
            0x12 => {
                // DW_CFA_def_cfa_sf
                self.row.cfa_register = code.try_uleb128()?;
                self.row.cfa_offset = code.try_sleb128()?.checked_mul(data_alignment)?;
                self.row.cfa_is_expression = false;
            }
            0x13 => self.row.cfa_offset = code.try_sleb128()?.checked_mul(data_alignment)?, // DW_CFA_def_cfa_offset_sf
            0x14 | 0x15 => {
                // DW_CFA_val_offset, DW_CFA_val_offset_sf
                let register = code.try_uleb128()?;
                if op == 0x14 {
                    code.try_uleb128()?;
                } else {
                    code.try_sleb128()?;
                }
                self.set(register, Recovery::Other);
            }
            0x2e => _ = code.try_uleb128()?, // DW_CFA_GNU_args_size
            0x2f => {
                // DW_CFA_GNU_negative_offset_extended
                let register = code.try_uleb128()?;
                let offset = factored(code.try_uleb128()?, data_alignment)?.checked_neg()?;
                self.set(register, Recovery::Offset(offset));
            }
            // DW_CFA_set_loc and anything unknown.
            _ => return None,
        }
        Some(None)
    }
}

/// An unsigned operand times the data alignment factor; `None` on overflow.
fn factored(operand: u64, data_alignment: i64) -> Option<i64> {
    i64::try_from(operand).ok()?.checked_mul(data_alignment)
}

/// A cursor over CFI bytes. The CFI is in memory, not in a trace file, so error offsets count
/// from the start of `bytes`; they are never reported (a malformed FDE is just "unsupported").
fn cfi_cursor(bytes: &[u8]) -> ReadCursor<'_> {
    ReadCursor::new(bytes, 0)
}

/// Skip `n` bytes, a length read from the CFI.
fn skip(cursor: &mut ReadCursor<'_>, n: u64) -> Option<()> {
    cursor.try_skip(usize::try_from(n).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CIE as GCC and LLVM write it for x86_64 (`zR`, pcrel|sdata4, code alignment 1, data
    /// alignment −8, return address in r16 at CFA − 8, CFA = rsp + 8), then an FDE body.
    fn cie() -> Vec<u8> {
        vec![0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 16, 1, 0x1b, 0x0c, 7, 8, 0x90, 1]
    }

    fn rule_at(fde_instructions: &[u8], offset: u64) -> Option<Rule> {
        let cie = cie();
        let cie = Cie::parse(&cie)?;
        let mut machine = Machine::new(&cie);
        machine.run(cfi_cursor(cie.initial_instructions), &cie, u64::MAX, 0x1000)?;
        machine.initial = machine.row;
        machine.run(cfi_cursor(fde_instructions), &cie, 0x1000 + offset, 0x1000)?;
        machine.row.rule()
    }

    #[test]
    fn rows_of_a_function_with_a_frame_pointer() {
        // push rbp; mov rbp, rsp; ...; pop rbp; ret
        let code = [
            0x41, 0x0e, 16, 0x86, 2, // at +1: CFA = rsp + 16; rbp at CFA − 16
            0x43, 0x0d, 6, // at +4: CFA = rbp + 16
            0x4a, 0x0c, 7, 8, // at +14: CFA = rsp + 8
        ];
        let step = |in_rbp, off, rbp| Some(Rule::Step { cfa_in_rbp: in_rbp, cfa_offset: off, rbp_offset: rbp });
        assert_eq!(rule_at(&code, 0), step(false, 8, None));
        assert_eq!(rule_at(&code, 1), step(false, 16, Some(-16)));
        assert_eq!(rule_at(&code, 3), step(false, 16, Some(-16)));
        assert_eq!(rule_at(&code, 4), step(true, 16, Some(-16)));
        assert_eq!(rule_at(&code, 13), step(true, 16, Some(-16)));
        assert_eq!(rule_at(&code, 14), step(false, 8, Some(-16)));
    }

    #[test]
    fn remembered_state_restored_and_unsupported_rules() {
        // remember; CFA = rsp + 32; at +2 restore.
        let code = [0x0a, 0x0e, 32, 0x42, 0x0b];
        assert_eq!(rule_at(&code, 1), Some(Rule::Step { cfa_in_rbp: false, cfa_offset: 32, rbp_offset: None }));
        assert_eq!(rule_at(&code, 2), Some(Rule::Step { cfa_in_rbp: false, cfa_offset: 8, rbp_offset: None }));
        // A restore without a remember is malformed.
        assert_eq!(rule_at(&[0x0b], 0), None);
        // The CFA in r10 (stack realignment) or given by an expression: unsupported.
        assert_eq!(rule_at(&[0x0c, 10, 0], 0), None);
        assert_eq!(rule_at(&[0x0f, 2, 0x77, 8], 0), None);
        // ... and stays an expression when only its offset changes, as in libgcc.
        assert_eq!(rule_at(&[0x0f, 2, 0x77, 8, 0x0e, 16], 0), None);
        // Offsets that overflow when factored.
        let huge = [0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]; // 2^63
        assert_eq!(rule_at(&[[0x05, 6].as_slice(), &huge].concat(), 0), None);
        assert_eq!(
            rule_at(&[[0x86].as_slice(), &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]].concat(), 0),
            None
        );
        // rbp saved by an expression: unsupported; another register's: irrelevant.
        assert_eq!(rule_at(&[0x10, 6, 1, 0x96], 0), None);
        assert!(matches!(rule_at(&[0x10, 3, 1, 0x96], 0), Some(Rule::Step { .. })));
        // The return address undefined: the end of the stack.
        assert_eq!(rule_at(&[0x07, 16], 0), Some(Rule::End));
        // Truncated or unknown instructions.
        assert_eq!(rule_at(&[0x0c, 7], 0), None);
        assert_eq!(rule_at(&[0x3f], 0), None);
    }
}
