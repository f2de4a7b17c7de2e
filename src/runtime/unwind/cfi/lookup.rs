//! Finding the FDE of a code address in a loaded object without trusting the object's unwind
//! tables: a corrupt `.eh_frame_hdr`, CIE or FDE gives no FDE, never a fault.
//!
//! glibc's `_dl_find_object` (2.35 and later; lock-free, allocation-free) names the object
//! holding the address: its mapping, its link map and its `PT_GNU_EH_FRAME` segment
//! (`.eh_frame_hdr`). Every byte the lookup then reads lies in a readable `PT_LOAD` segment
//! of that object, as the program headers the loader mapped it by describe them (in the
//! object's first page, where the loader maps its ELF header: checked against the link map's
//! load bias and the mapping's start). No system call per read (`process_vm_readv` would also
//! never fault, but costs one per word read and is what a sandbox may forbid), no lock, no
//! allocation: this runs on the sampled path's cache misses, inside the global allocator.
//!
//! The header's version and encodings must be those of a binary-search table (what GNU ld,
//! gold and lld write), the table must lie in the segment, the entries found around the
//! address must be in order, the FDE and its CIE must lie in the segment after the start of
//! `.eh_frame` with lengths that fit, the CIE pointer must point at a CIE, and the FDE must
//! start where its table entry says and cover the address. Anything else is no FDE: the walk
//! ends the stack at that frame. (A table out of order elsewhere can hide an FDE, never give
//! a wrong one.) What is trusted is the loader's: its answer, the link map, and that the
//! object's program headers describe memory it mapped; a library truncated on disk after
//! being loaded faults any reader of its pages, the program's own code too.

use super::interp::{read_pointer, Fde};
use crate::format::buf::ReadCursor;

/// Where a code address lies, as far as `_dl_find_object` tells.
pub(super) enum Lookup {
    /// In a loaded object: the FDE covering the address, if the object's tables have a
    /// well-formed one. It stays valid while the object stays loaded.
    Object(Option<Fde<'static>>),
    /// In no loaded object: code made at run time (whose tables, if any, were registered with
    /// `__register_frame`), or no code at all.
    Elsewhere,
    /// Not known: the C library has no `_dl_find_object`.
    Unknown,
}

/// Where `pc` lies, and its FDE if in a loaded object (see [`Lookup`]).
pub(super) fn lookup(pc: u64) -> Lookup {
    let Some(find) = find_object_function() else { return Lookup::Unknown };
    let mut found =
        DlFindObject { flags: 0, map_start: 0, map_end: 0, link_map: std::ptr::null(), eh_frame: 0, reserved: [0; 11] };
    // SAFETY: `find` is glibc's `_dl_find_object`, with that signature; it writes at most a
    // `struct dl_find_object` (no larger than `DlFindObject`) and only compares `pc` with the
    // loaded objects' ranges.
    if unsafe { find(pc as *mut libc::c_void, &mut found) } != 0 {
        return Lookup::Elsewhere;
    }
    // SAFETY: `found` is `_dl_find_object`'s answer for a loaded object.
    let fde = unsafe { Object::new(&found) }.and_then(|object| object.fde(found.eh_frame as u64, pc));
    Lookup::Object(fde)
}

/// glibc's `struct dl_find_object` on x86_64 (`<dlfcn.h>`).
#[repr(C)]
struct DlFindObject {
    flags: u64,
    map_start: usize,
    map_end: usize,
    /// The object's `struct link_map`, whose first member is the load bias (`l_addr`).
    link_map: *const u64,
    /// The address of the object's `PT_GNU_EH_FRAME` segment; 0 when it has none.
    eh_frame: usize,
    /// glibc reserves 7 words; room for more.
    reserved: [u64; 11],
}

type FindObject = unsafe extern "C" fn(*mut libc::c_void, *mut DlFindObject) -> libc::c_int;

/// `_dl_find_object`, or `None` where the C library lacks it (or the target is not the cached
/// walk's, whose layouts this module reads). Looked up (`dlsym`, which takes the loader's
/// lock) on the first cache miss, which is start-up calibration's, before any sample is taken.
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
fn find_object_function() -> Option<FindObject> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    /// `_dl_find_object`, looked up on first use: 0 before, 1 when absent.
    static FIND_OBJECT: AtomicUsize = AtomicUsize::new(0);
    let mut find = FIND_OBJECT.load(Ordering::Relaxed);
    if find == 0 {
        // SAFETY: `dlsym` with `RTLD_DEFAULT` and a NUL-terminated name only looks the symbol up.
        let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_dl_find_object".as_ptr()) };
        find = if symbol.is_null() { 1 } else { symbol as usize };
        FIND_OBJECT.store(find, Ordering::Relaxed);
    }
    // SAFETY: a nonzero value other than 1 is the address of `_dl_find_object`, which has
    // that signature.
    (find != 1).then(|| unsafe { std::mem::transmute::<usize, FindObject>(find) })
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")))]
fn find_object_function() -> Option<FindObject> {
    None
}

/// The smallest page size: the loader maps at least the object's first page at its start.
const PAGE: u64 = 4096;
/// `PT_LOAD`, `PF_R`, and the size of an ELF64 program header.
const LOAD: u32 = 1;
const READABLE: u32 = 4;
const PROGRAM_HEADER_SIZE: usize = 56;

/// A loaded object's memory, as its program headers describe it.
struct Object {
    /// The load bias: what the object's virtual addresses are offset by.
    bias: u64,
    /// Its program headers, in its first page.
    headers: &'static [u8],
    /// The mapping the loader reserved for it, `[start, end)`.
    map: (u64, u64),
}

/// A `PT_LOAD` segment with its flags, `[start, end)` in memory.
struct Segment {
    flags: u32,
    offset: u64,
    start: u64,
    end: u64,
}

impl Object {
    /// The object `found` describes; `None` when its first page does not hold the ELF header
    /// and program headers of what is mapped there.
    ///
    /// # Safety
    /// `found` is `_dl_find_object`'s answer for a loaded object; what is returned is valid
    /// while the object stays loaded.
    unsafe fn new(found: &DlFindObject) -> Option<Object> {
        let (start, end) = (found.map_start as u64, found.map_end as u64);
        if !start.is_multiple_of(PAGE) || end < start.checked_add(PAGE)? || found.link_map.is_null() {
            return None;
        }
        // SAFETY: the loader maps an object's first `PT_LOAD` segment, which holds its ELF
        // header and program headers, at the start of its mapping (checked below against the
        // program headers), a page at least.
        let first_page = unsafe { std::slice::from_raw_parts(start as *const u8, PAGE as usize) };
        // SAFETY: a loaded object's link map, whose first member is `l_addr`.
        let bias = unsafe { found.link_map.read() };
        let mut header = ReadCursor::new(first_page, 0);
        // `\x7fELF`, 64-bit, little-endian; then `e_phoff` at 32, `e_phentsize` and `e_phnum`
        // at 54.
        if header.try_bytes(6)? != b"\x7fELF\x02\x01" {
            return None;
        }
        header.try_skip(26)?;
        let headers_at = usize::try_from(header.get_u64().ok()?).ok()?;
        header.try_skip(14)?;
        let (size, count) = (header.try_u16()? as usize, header.try_u16()? as usize);
        if size != PROGRAM_HEADER_SIZE {
            return None;
        }
        let headers = first_page.get(headers_at..headers_at.checked_add(size * count)?)?;
        let object = Object { bias, headers, map: (start, end) };
        // The first `PT_LOAD` segment maps the file's start (the ELF header) at the mapping's
        // start: what was read is this object's.
        let first = (0..count).find_map(|i| object.segment(i))?;
        (first.offset == 0 && first.start & !(PAGE - 1) == start).then_some(object)
    }

    /// The segment of program header `i`, if it is a `PT_LOAD` within the address space.
    /// (Plain loops over these, not iterator chains: this runs inside the allocator, and
    /// unoptimised builds give every adapter a frame of its own.)
    fn segment(&self, i: usize) -> Option<Segment> {
        let header = self.headers.get(i * PROGRAM_HEADER_SIZE..(i + 1) * PROGRAM_HEADER_SIZE)?;
        let word = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().unwrap());
        let half = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().unwrap());
        if half(0) != LOAD {
            return None;
        }
        let start = self.bias.checked_add(word(16))?;
        Some(Segment { flags: half(4), offset: word(8), start, end: start.checked_add(word(40))? })
    }

    /// The bytes from `address` to the end of the readable segment holding it (within the
    /// object's mapping); `None` when no readable segment holds it.
    fn rest_of_segment(&self, address: u64) -> Option<&'static [u8]> {
        let mut end = None;
        for i in 0..self.headers.len() / PROGRAM_HEADER_SIZE {
            match self.segment(i) {
                Some(s) if s.flags & READABLE != 0 && (s.start..s.end).contains(&address) => {
                    end = Some(s.end.min(self.map.1));
                    break;
                }
                _ => {}
            }
        }
        let end = end?;
        if address < self.map.0 || address >= end {
            return None;
        }
        // SAFETY: `[address, end)` lies in a readable `PT_LOAD` segment of the object, inside
        // its mapping: the loader mapped it readable (its file bytes, then zeroes), and it
        // stays mapped while the object stays loaded.
        Some(unsafe { std::slice::from_raw_parts(address as *const u8, (end - address) as usize) })
    }

    /// The FDE covering `pc`, found through the `.eh_frame_hdr` at `hdr` (0 for none).
    fn fde(&self, hdr: u64, pc: u64) -> Option<Fde<'static>> {
        let (start, fde, eh_frame) = self.search(hdr, pc)?;
        self.fde_at(fde, eh_frame, start, pc)
    }

    /// The search table's entry for `pc` in the `.eh_frame_hdr` at `hdr`: the start of the
    /// code it is for, its FDE's address, and the start of `.eh_frame`.
    fn search(&self, hdr: u64, pc: u64) -> Option<(u64, u64, u64)> {
        /// The table's encoding: pairs of 4-byte signed offsets from the header's start.
        const TABLE_ENCODING: u8 = gimli::DW_EH_PE_datarel.0 | gimli::DW_EH_PE_sdata4.0;
        let mut cursor = ReadCursor::new(self.rest_of_segment(hdr)?, hdr);
        let (version, eh_frame_encoding, count_encoding, table_encoding) =
            (cursor.try_u8()?, cursor.try_u8()?, cursor.try_u8()?, cursor.try_u8()?);
        if version != 1 || table_encoding != TABLE_ENCODING {
            return None;
        }
        let eh_frame = read_pointer(&mut cursor, eh_frame_encoding, Some(hdr))?;
        let count = usize::try_from(read_pointer(&mut cursor, count_encoding, Some(hdr))?).ok()?;
        let table = cursor.try_bytes(count.checked_mul(8)?)?;
        let entry = |i: usize| {
            let word = |at: usize| i32::from_le_bytes(table[at..at + 4].try_into().unwrap()) as i64;
            (hdr.wrapping_add_signed(word(8 * i)), hdr.wrapping_add_signed(word(8 * i + 4)))
        };
        // The last entry for code at or before `pc`.
        let (mut low, mut high) = (0, count);
        while low < high {
            let middle = low + (high - low) / 2;
            if entry(middle).0 <= pc {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        let found = low.checked_sub(1)?;
        let (start, fde) = entry(found);
        // The entry after it starts past `pc` (the search compared it); the one before must
        // not start after it.
        if found > 0 && entry(found - 1).0 > start {
            return None;
        }
        Some((start, fde, eh_frame))
    }

    /// The FDE at `fde` (in `.eh_frame`, from `eh_frame` on), if it is one with a CIE, starts
    /// at `start` and covers `pc`.
    fn fde_at(&self, fde: u64, eh_frame: u64, start: u64, pc: u64) -> Option<Fde<'static>> {
        let fde_body = self.entry_body(fde, eh_frame)?;
        let cie_pointer = ReadCursor::new(fde_body, 0).try_u32()?;
        // A CIE pointer of 0 makes the entry a CIE; else it counts back from its own address.
        let cie = (fde + 4).checked_sub(cie_pointer as u64).filter(|_| cie_pointer != 0)?;
        let cie_body = self.entry_body(cie, eh_frame)?;
        let fde = Fde::parse(fde_body, fde + 4, cie_body)?;
        (fde.start == start && fde.covers(pc)).then_some(fde)
    }

    /// The body (the bytes after the length word) of the CIE or FDE at `address`, which must
    /// lie in `.eh_frame` (from `eh_frame` on) and in one readable segment.
    fn entry_body(&self, address: u64, eh_frame: u64) -> Option<&'static [u8]> {
        if address < eh_frame {
            return None;
        }
        let mut cursor = ReadCursor::new(self.rest_of_segment(address)?, address);
        let length = cursor.try_u32()?;
        // 0xffffffff would announce 64-bit DWARF, which .eh_frame does not use.
        if length == u32::MAX {
            return None;
        }
        cursor.try_bytes(length as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::unwind::calibrate::has_lock_free_table_lookup;

    /// The FDE of this function, found by the lookup, covers it from its start; the heap is in
    /// no loaded object.
    #[test]
    fn finds_the_fde_of_code_in_a_loaded_object() {
        if !super::super::SUPPORTED || !has_lock_free_table_lookup() {
            crate::test_skip::skip("no _dl_find_object (glibc 2.35 or later)");
            return;
        }
        let code = finds_the_fde_of_code_in_a_loaded_object as *const () as u64;
        let Lookup::Object(Some(fde)) = lookup(code + 1) else { panic!("no FDE for this function") };
        assert_eq!(fde.start, code);
        assert!(fde.covers(code + 1));
        let heap = Box::new(0u64);
        assert!(matches!(lookup(&*heap as *const u64 as u64), Lookup::Elsewhere));
    }
}
