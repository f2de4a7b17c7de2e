//! A differential test of the FDE lookup and the CFI interpreter: our rule (and function
//! start) and the rule read off gimli's `UnwindTable` row (and FDE) agree at every 16th
//! address of every FDE of the test binary and of libc.
//! gimli is an independent, fuzzed parser and evaluator; it is not used on the sampled path
//! because a rule computation with it costs 2.5–3 times ours and much more stack (see
//! docs/BENCHMARKS.md).

use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameOffset, EndianSlice, FrameDescriptionEntry, LittleEndian, ReaderOffset,
    Register, RegisterRule, UnwindContext, UnwindContextStorage, UnwindSection, UnwindTableRow, X86_64,
};

use super::rule::Rule;
use super::tables::{function_start, rule_from_tables};
use crate::format::buf::ReadCursor;

/// One loaded object's `.eh_frame_hdr` search table, from `dl_iterate_phdr`.
struct Object {
    /// The object's path; empty for the main program (this test binary).
    name: String,
    /// The address of `.eh_frame_hdr`.
    hdr: u64,
}

/// The loaded objects that have an `.eh_frame_hdr`.
fn objects() -> Vec<Object> {
    unsafe extern "C" fn add(info: *mut libc::dl_phdr_info, _size: usize, out: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `dl_iterate_phdr` passes a valid `info`, and `out` is the vector below.
        let (info, out) = unsafe { (&*info, &mut *out.cast::<Vec<Object>>()) };
        let name = if info.dlpi_name.is_null() {
            String::new()
        } else {
            // SAFETY: a non-null name is a NUL-terminated string owned by the loader.
            unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }.to_string_lossy().into_owned()
        };
        // SAFETY: `dlpi_phdr` points to `dlpi_phnum` program headers.
        let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        if let Some(h) = headers.iter().find(|h| h.p_type == libc::PT_GNU_EH_FRAME) {
            out.push(Object { name, hdr: info.dlpi_addr + h.p_vaddr });
        }
        0
    }
    let mut out = Vec::new();
    // SAFETY: the callback only reads the loader's description and pushes to `out`.
    unsafe { libc::dl_iterate_phdr(Some(add), (&raw mut out).cast()) };
    out
}

/// The `.eh_frame` section's start and the FDEs of the object's search table, as (start of
/// the code covered, address of the FDE).
fn fdes(object: &Object) -> (u64, Vec<(u64, u64)>) {
    // SAFETY: the header of a loaded object's `.eh_frame_hdr` is mapped (12 bytes).
    let header = unsafe { std::slice::from_raw_parts(object.hdr as *const u8, 12) };
    // Version 1; `.eh_frame` pointer pc-relative sdata4, count udata4, table datarel sdata4:
    // what GNU ld, gold and lld write on x86_64.
    assert_eq!(header[..4], [1, 0x1b, 0x03, 0x3b], "{}: an unusual .eh_frame_hdr", object.name);
    let mut cursor = ReadCursor::new(&header[4..], 0);
    let eh_frame = (object.hdr + 4).wrapping_add_signed(cursor.get_u32().unwrap() as i32 as i64);
    let count = cursor.get_u32().unwrap() as usize;
    // SAFETY: `count` pairs of 4-byte words follow the header.
    let table = unsafe { std::slice::from_raw_parts((object.hdr + 12) as *const u8, count * 8) };
    let mut cursor = ReadCursor::new(table, 0);
    let mut relative = || object.hdr.wrapping_add_signed(cursor.get_u32().unwrap() as i32 as i64);
    (eh_frame, (0..count).map(|_| (relative(), relative())).collect())
}

type Section = EhFrame<EndianSlice<'static, LittleEndian>>;
type Fde = FrameDescriptionEntry<EndianSlice<'static, LittleEndian>>;

/// gimli's unwind context with room for as many `DW_CFA_remember_state`s as ours (8), plus the
/// row it keeps for the CIE's initial rules.
struct Storage;

impl<T: ReaderOffset> UnwindContextStorage<T> for Storage {
    type Rules = [(Register, RegisterRule<T>); 192];
    type Stack = Box<[UnwindTableRow<T, Self>; 9]>;
}

/// The section gimli reads: `.eh_frame` from its start (so that offsets are the FDEs' own) up
/// to the end of the FDE at `fde`.
///
/// # Safety
/// `fde` is an FDE of the mapped `.eh_frame` section starting at `eh_frame`.
unsafe fn section_up_to(eh_frame: u64, fde: u64) -> Section {
    // SAFETY: an FDE starts with its length word, and that many bytes follow it.
    let length = unsafe { (fde as *const u32).read_unaligned() } as u64;
    // SAFETY: the section is mapped from its start to the FDE's end and stays mapped (libc
    // and the test binary are never unloaded).
    let bytes = unsafe { std::slice::from_raw_parts(eh_frame as *const u8, (fde + 4 + length - eh_frame) as usize) };
    let mut section = EhFrame::new(bytes, LittleEndian);
    section.set_address_size(8);
    section
}

/// The rule at `pc` from gimli's row for it, mapped as `interp` maps its own row: rejected
/// where gimli fails, unsupported where the rule is one the walk does not follow.
fn gimli_rule(section: &Section, bases: &BaseAddresses, fde: &Fde, pc: u64) -> Rule {
    if fde.is_signal_trampoline() {
        return Rule::Unsupported;
    }
    let mut context = UnwindContext::<usize, Storage>::new_in();
    let Ok(row) = fde.unwind_info_for_address(section, bases, &mut context, pc) else { return Rule::Rejected };
    followed_rule(row, fde).unwrap_or(Rule::Unsupported)
}

/// The rule of gimli's `row` of `fde`, if the walk follows it.
fn followed_rule(row: &gimli::UnwindTableRow<usize, Storage>, fde: &Fde) -> Option<Rule> {
    match row.register(fde.cie().return_address_register()) {
        Some(RegisterRule::Undefined) => return Some(Rule::End),
        Some(RegisterRule::Offset(-8)) => {}
        _ => return None,
    }
    let (cfa_in_rbp, cfa_offset) = match *row.cfa() {
        CfaRule::RegisterAndOffset { register: X86_64::RSP, offset } => (false, offset),
        CfaRule::RegisterAndOffset { register: X86_64::RBP, offset } => (true, offset),
        _ => return None,
    };
    let rbp_offset = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue) => None,
        Some(RegisterRule::Offset(offset)) => Some(i16::try_from(offset).ok()?),
        Some(_) => return None,
    };
    let Some(cfa_offset) = i32::try_from(cfa_offset).ok().filter(|&o| o >= 8) else { return Some(Rule::Rejected) };
    Some(Rule::Step { cfa_in_rbp, cfa_offset, rbp_offset })
}

/// In the object whose name `matches`: the number of addresses compared, how many of them
/// have a rule the walk follows, and the differences.
fn compare(matches: impl Fn(&str) -> bool) -> (usize, usize, Vec<String>) {
    let object = objects().into_iter().find(|o| matches(&o.name)).expect("the object is loaded");
    let (eh_frame, fdes) = fdes(&object);
    // Pointers in `.eh_frame` are pc-relative: with the section's address as its base, they
    // resolve to the addresses the code is loaded at.
    let bases = BaseAddresses::default().set_eh_frame(eh_frame);
    let (mut compared, mut followed, mut differences) = (0, 0, Vec::new());
    for (start, fde) in fdes {
        // SAFETY: the search table lists FDEs of the object's `.eh_frame`.
        let section = unsafe { section_up_to(eh_frame, fde) };
        let offset = EhFrameOffset((fde - eh_frame) as usize);
        let parsed = section.fde_from_offset(&bases, offset, EhFrame::cie_from_offset).expect("gimli parses the FDE");
        assert_eq!(parsed.initial_address(), start, "{}: the FDE at {fde:#x}", object.name);
        for pc in (start..start + parsed.len()).step_by(16) {
            // Ours through the whole lookup: the search table, the FDE and CIE, the rule.
            let ours = rule_from_tables(pc).0;
            if function_start(pc) != Some(start) {
                differences.push(format!(
                    "{} at {pc:#x}: the function starts at {start:#x}, not {:x?}",
                    object.name,
                    function_start(pc)
                ));
            }
            let theirs = gimli_rule(&section, &bases, &parsed, pc);
            compared += 1;
            followed += usize::from(matches!(ours, Rule::Step { .. } | Rule::End));
            if ours != theirs {
                differences.push(format!("{} at {pc:#x} (FDE {fde:#x}): ours {ours:?}, gimli {theirs:?}", object.name));
            }
        }
    }
    (compared, followed, differences)
}

/// Compare the rules in the object `what` whose name `matches`.
fn check(what: &str, matches: impl Fn(&str) -> bool) {
    let (compared, followed, differences) = compare(matches);
    assert!(compared > 1000, "{what}: only {compared} addresses");
    assert!(followed > compared / 2, "{what}: a rule the walk follows at only {followed} of {compared} addresses");
    let shown = differences[..differences.len().min(20)].join("\n");
    assert!(differences.is_empty(), "{what}: {} of {compared} addresses differ:\n{shown}", differences.len());
    println!("{what}: the same rules at {compared} addresses ({followed} followed by the walk)");
}

#[test]
fn rules_match_gimlis_in_this_binary_and_libc() {
    check("the test binary", str::is_empty);
    check("libc", |name| name.contains("/libc.so"));
}
