//! The objects loaded in this process (`dl_iterate_phdr`): their paths, load biases,
//! segments and build-ids, and the loader's counters of loads and unloads.

use std::ffi::{CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// A loaded object with a file.
pub(super) struct Scanned {
    pub(super) path: PathBuf,
    pub(super) base: u64,
    pub(super) segments: Vec<(u64, u64)>,
    pub(super) build_id: Option<Vec<u8>>,
    pub(super) file_id: Option<(u64, u64)>,
}

/// Offset of the end of `dlpi_subs` in `dl_phdr_info`: the loader's counters are there when
/// the `size` it passes reaches past it.
const COUNTERS_END: usize =
    std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + std::mem::size_of::<libc::c_ulonglong>();

/// The loader's (adds, subs) counters, from the first object's callback.
pub(super) fn loader_counters() -> Option<(u64, u64)> {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the `Option` passed below, borrowed for the call; the loader passes
        // a valid `info` whose fields up to `size` bytes exist.
        unsafe {
            if size >= COUNTERS_END {
                *(data as *mut Option<(u64, u64)>) = Some(((*info).dlpi_adds, (*info).dlpi_subs));
            }
        }
        1
    }
    let mut out: Option<(u64, u64)> = None;
    // SAFETY: the callback only reads `info` and writes `out`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut out as *mut _ as *mut libc::c_void) };
    out
}

/// What the loader says of one object, copied out of its callback.
struct Reported {
    /// Empty for the main program (and the vDSO on older loaders).
    name: Vec<u8>,
    base: u64,
    segments: Vec<(u64, u64)>,
    build_id: Option<Vec<u8>>,
}

/// The loaded objects with a file (the vDSO has none), and the loader's counters. Files are
/// looked at only after the loader's lock is released.
pub(super) fn scan_objects() -> (Vec<Scanned>, Option<(u64, u64)>) {
    struct Acc {
        objects: Vec<Reported>,
        counters: Option<(u64, u64)>,
    }
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the `Acc` passed below, borrowed for the call; the loader passes a
        // valid `info` (fields up to `size` bytes), whose name is null or NUL-terminated and
        // whose program headers are `dlpi_phnum` entries, all valid during the call.
        let (acc, info) = unsafe { (&mut *(data as *mut Acc), &*info) };
        if size >= COUNTERS_END && acc.objects.is_empty() {
            acc.counters = Some((info.dlpi_adds, info.dlpi_subs));
        }
        let name = if info.dlpi_name.is_null() {
            &[][..]
        } else {
            // SAFETY: as above.
            unsafe { CStr::from_ptr(info.dlpi_name) }.to_bytes()
        };
        let phdrs: &[libc::Elf64_Phdr] = if info.dlpi_phdr.is_null() {
            &[]
        } else {
            // SAFETY: as above.
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) }
        };
        let base = info.dlpi_addr;
        let mut segments = Vec::new();
        let mut build_id = None;
        for ph in phdrs {
            let start = base.wrapping_add(ph.p_vaddr);
            if ph.p_type == libc::PT_LOAD && ph.p_memsz > 0 {
                segments.push((start, start.wrapping_add(ph.p_memsz)));
            } else if ph.p_type == libc::PT_NOTE && build_id.is_none() {
                // SAFETY: a note segment is mapped (notes are in a loaded segment) while the
                // object is loaded, which it is during the callback.
                let notes = unsafe { std::slice::from_raw_parts(start as *const u8, ph.p_memsz as usize) };
                build_id = gnu_build_id(notes, ph.p_align);
            }
        }
        acc.objects.push(Reported { name: name.to_vec(), base, segments, build_id });
        0
    }
    let mut acc = Acc { objects: Vec::new(), counters: None };
    // SAFETY: the callback reads only what the loader passes it and writes `acc`, which
    // outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut acc as *mut Acc as *mut libc::c_void) };
    let objects = acc
        .objects
        .into_iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let path = match (i, r.name.is_empty()) {
                (_, false) => PathBuf::from(OsStr::from_bytes(&r.name)),
                (0, true) => std::fs::read_link("/proc/self/exe").ok()?,
                // The vDSO on older loaders: no file.
                _ => return None,
            };
            let file_id = std::fs::metadata(&path).ok().map(|m| (m.dev(), m.ino()));
            Some(Scanned { path, base: r.base, segments: r.segments, build_id: r.build_id, file_id })
        })
        .collect();
    (objects, acc.counters)
}

/// The NT_GNU_BUILD_ID descriptor in a note segment.
fn gnu_build_id(mut notes: &[u8], align: u64) -> Option<Vec<u8>> {
    let align = if align == 8 { 8 } else { 4 };
    let up = |n: usize| (n + align - 1) & !(align - 1);
    while notes.len() >= 12 {
        let word = |i: usize| u32::from_ne_bytes([notes[i], notes[i + 1], notes[i + 2], notes[i + 3]]) as usize;
        let (namesz, descsz, kind) = (word(0), word(4), word(8));
        let name_end = 12 + namesz;
        let desc_start = 12 + up(namesz);
        let desc_end = desc_start + descsz;
        if desc_end > notes.len() {
            return None;
        }
        if kind == 3 && &notes[12..name_end] == b"GNU\0" {
            return Some(notes[desc_start..desc_end].to_vec());
        }
        notes = &notes[(12 + up(namesz) + up(descsz)).min(notes.len())..];
    }
    None
}
