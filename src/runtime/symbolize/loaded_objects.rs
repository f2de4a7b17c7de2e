//! The objects loaded in this process (`dl_iterate_phdr`): their paths, load biases,
//! segments and build-ids, and the loader's counters of loads and unloads.

use std::ffi::{CStr, OsStr};
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use crate::runtime::loader;

/// A loaded object with a file.
pub(super) struct Scanned {
    pub(super) path: PathBuf,
    pub(super) base: u64,
    pub(super) segments: Vec<(u64, u64)>,
    pub(super) build_id: Option<Vec<u8>>,
    /// The file's device and inode, for an object without a build-id.
    pub(super) file_id: Option<(u64, u64)>,
}

/// What the loader says of one object: ranges of [`Reports`]' vectors.
struct Reported {
    /// Of `Reports::bytes`; empty for the main program (and the vDSO on older loaders).
    name: Range<usize>,
    base: u64,
    /// Of `Reports::segments`.
    segments: Range<usize>,
    /// Of `Reports::bytes`.
    build_id: Option<Range<usize>>,
}

/// What the loader says of the objects, copied out of its callback into room reserved before
/// it: the callback runs under the loader's lock and never allocates. An allocator that takes a
/// lock of its own and then the loader's (a `malloc` interposed to unwind every call, such as
/// heaptrack's, whose unwinder asks `dl_iterate_phdr`) would otherwise deadlock against the
/// program's thread, holding that lock while it waits for the loader's.
struct Reports {
    objects: Vec<Reported>,
    bytes: Vec<u8>,
    segments: Vec<(u64, u64)>,
    counters: Option<(u64, u64)>,
    /// An object did not fit in the room reserved: the scan is made again with more.
    full: bool,
}

impl Reports {
    /// Room for `objects` objects with names and segments of a usual size.
    fn with_room(objects: usize) -> Reports {
        Reports {
            objects: Vec::with_capacity(objects),
            bytes: Vec::with_capacity(objects * 256),
            segments: Vec::with_capacity(objects * 8),
            counters: None,
            full: false,
        }
    }

    /// Note one object if it fits in the room left, without allocating; false if it does not.
    fn note(
        &mut self,
        name: &[u8],
        base: u64,
        loads: impl Iterator<Item = (u64, u64)> + Clone,
        build_id: &[u8],
    ) -> bool {
        if self.objects.spare_capacity_mut().is_empty()
            || self.bytes.spare_capacity_mut().len() < name.len() + build_id.len()
            || self.segments.spare_capacity_mut().len() < loads.clone().count()
        {
            return false;
        }
        let mut copy = |bytes: &[u8]| {
            let start = self.bytes.len();
            self.bytes.extend_from_slice(bytes);
            start..self.bytes.len()
        };
        let (name, id) = (copy(name), copy(build_id));
        let first_segment = self.segments.len();
        self.segments.extend(loads);
        let segments = first_segment..self.segments.len();
        self.objects.push(Reported { name, base, segments, build_id: (!id.is_empty()).then_some(id) });
        true
    }
}

/// Room for this many objects at a first scan (a Rust program loads a handful).
const ROOM: usize = 64;

/// The loaded objects with a file (the vDSO has none), and the loader's counters. Files are
/// looked at only after the loader's lock is released.
pub(super) fn scan_objects() -> (Vec<Scanned>, Option<(u64, u64)>) {
    scan_with_room(ROOM)
}

/// [`scan_objects`], with room for `room` objects at first (and 4 times more at each scan the
/// objects did not fit in).
fn scan_with_room(mut room: usize) -> (Vec<Scanned>, Option<(u64, u64)>) {
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the `Reports` passed below, borrowed for the call; the loader passes
        // a valid `info` (fields up to `size` bytes), whose name is null or NUL-terminated and
        // whose program headers are `dlpi_phnum` entries, all valid during the call.
        let (reports, info) = unsafe { (&mut *(data as *mut Reports), &*info) };
        if size >= loader::COUNTERS_END && reports.objects.is_empty() {
            reports.counters = Some((info.dlpi_adds, info.dlpi_subs));
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
        let loads = phdrs.iter().filter(|ph| ph.p_type == libc::PT_LOAD && ph.p_memsz > 0).map(|ph| {
            let start = base.wrapping_add(ph.p_vaddr);
            (start, start.wrapping_add(ph.p_memsz))
        });
        let build_id = phdrs
            .iter()
            .filter(|ph| ph.p_type == libc::PT_NOTE)
            .find_map(|ph| {
                // SAFETY: a note segment is mapped (notes are in a loaded segment) while the
                // object is loaded, which it is during the callback.
                let notes = unsafe {
                    std::slice::from_raw_parts(base.wrapping_add(ph.p_vaddr) as *const u8, ph.p_memsz as usize)
                };
                gnu_build_id(notes, ph.p_align)
            })
            .unwrap_or_default();
        if reports.note(name, base, loads, build_id) {
            0
        } else {
            reports.full = true;
            1
        }
    }
    let reports = loop {
        let mut reports = Reports::with_room(room);
        // SAFETY: the callback reads only what the loader passes it and writes `reports`,
        // which outlives the call.
        unsafe { loader::iterate(each, &mut reports as *mut Reports as *mut libc::c_void) };
        if !reports.full {
            break reports;
        }
        room *= 4;
    };
    let objects = reports
        .objects
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let name = &reports.bytes[r.name.clone()];
            let path = match (i, name.is_empty()) {
                (_, false) => PathBuf::from(OsStr::from_bytes(name)),
                (0, true) => std::fs::read_link("/proc/self/exe").ok()?,
                // The vDSO on older loaders: no file.
                _ => return None,
            };
            let build_id = r.build_id.clone().map(|id| reports.bytes[id].to_vec());
            // A build-id already tells a rebuilt file from the one loaded before; the file's
            // identity is looked up (a walk of its path) only for an object without one.
            let file_id =
                build_id.is_none().then(|| std::fs::metadata(&path).ok().map(|m| (m.dev(), m.ino()))).flatten();
            Some(Scanned {
                path,
                base: r.base,
                segments: reports.segments[r.segments.clone()].to_vec(),
                build_id,
                file_id,
            })
        })
        .collect();
    (objects, reports.counters)
}

/// The NT_GNU_BUILD_ID descriptor in a note segment.
fn gnu_build_id(mut notes: &[u8], align: u64) -> Option<&[u8]> {
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
            return Some(&notes[desc_start..desc_end]);
        }
        notes = &notes[(12 + up(namesz) + up(descsz)).min(notes.len())..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scan whose first room holds one object makes room and scans again: it finds the
    /// objects, segments and build-ids a roomy scan finds.
    #[test]
    fn a_scan_that_runs_out_of_room_scans_again() {
        let describe = |(objects, counters): (Vec<Scanned>, Option<(u64, u64)>)| {
            let objects: Vec<_> =
                objects.into_iter().map(|o| (o.path, o.base, o.segments, o.build_id, o.file_id)).collect();
            (objects, counters)
        };
        let (roomy, tight) = (describe(scan_with_room(ROOM)), describe(scan_with_room(1)));
        assert!(roomy.0.len() > 1, "{} objects", roomy.0.len());
        assert!(roomy.0.iter().any(|o| o.3.is_some()), "no build-id read");
        assert_eq!(tight, roomy);
    }
}
