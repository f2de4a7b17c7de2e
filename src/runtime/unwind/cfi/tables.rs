//! Reading the unwind tables: the FDE of a code address through libgcc's `_Unwind_Find_FDE`
//! (its rule, and where its function starts), whether the address is in a loaded object, and
//! how many objects were unloaded.

use std::sync::atomic::Ordering;

use super::interp::rule_from_fde;
use super::rule::Rule;

/// What `_Unwind_Find_FDE` reports besides the FDE (libgcc's `struct dwarf_eh_bases`).
#[repr(C)]
struct EhBases {
    text: *const u8,
    data: *const u8,
    /// The start of the function the FDE covers.
    func: *const u8,
}

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
extern "C" {
    /// libgcc's lookup of the FDE covering `pc` (null when none does).
    fn _Unwind_Find_FDE(pc: *const u8, bases: *mut EhBases) -> *const u8;
}

/// The FDE covering `pc` and the start of the function it covers, by `_Unwind_Find_FDE`;
/// `None` when none does, or where the tables are not read.
fn find_fde(pc: u64) -> Option<(*const u8, u64)> {
    #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
    {
        let mut bases = EhBases { text: std::ptr::null(), data: std::ptr::null(), func: std::ptr::null() };
        // SAFETY: `_Unwind_Find_FDE` only reads the loader's tables and writes `bases`.
        let fde = unsafe { _Unwind_Find_FDE(pc as *const u8, &mut bases) };
        (!fde.is_null()).then_some((fde, bases.func as u64))
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")))]
    {
        let _ = pc;
        None
    }
}

/// The rule for `pc` from the unwind tables, and whether it may be cached: whether `pc` is in
/// a loaded ELF object (as far as can be told without the loader's lock).
pub(super) fn rule_from_tables(pc: u64) -> (Rule, bool) {
    let Some((fde, function)) = find_fde(pc) else { return (Rule::Rejected, false) };
    // SAFETY: a found FDE is in a mapped `.eh_frame` section (of a loaded object, or
    // registered with `__register_frame`), whose CIE precedes it in the same section. It stays
    // mapped while that code stays loaded; as for libgcc's own unwinder, a `dlclose` of it by
    // another thread during this call (possible only if `pc` is not a live frame of this
    // thread, i.e. a wrong rule read a stray word) is the caller's race.
    let rule = unsafe { rule_from_fde(fde, function, pc) };
    (rule, in_loaded_object(pc))
}

/// The start of the function whose FDE covers `pc`; `None` when none does, or where the
/// tables are not read.
pub(crate) fn function_start(pc: u64) -> Option<u64> {
    find_fde(pc).map(|(_, function)| function)
}

/// Whether `pc` is in an object the dynamic loader loaded, by glibc's lock-free
/// `_dl_find_object` (2.35 and later); assumed on older C libraries, which lack it. The
/// function is looked up (`dlsym`, which takes the loader's lock) on the first cache miss,
/// which is start-up calibration's, before any sample is taken.
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
pub(super) fn in_loaded_object(pc: u64) -> bool {
    use std::sync::atomic::AtomicUsize;
    /// `_dl_find_object`, looked up on first use: 0 before, 1 when absent.
    static FIND_OBJECT: AtomicUsize = AtomicUsize::new(0);
    /// Room for glibc's `struct dl_find_object` (flags, map start and end, link map, EH frame
    /// and 7 reserved words on x86_64: 12 words).
    #[repr(C)]
    struct DlFindObject([usize; 16]);
    type FindObject = unsafe extern "C" fn(*mut libc::c_void, *mut DlFindObject) -> libc::c_int;
    let mut find = FIND_OBJECT.load(Ordering::Relaxed);
    if find == 0 {
        // SAFETY: `dlsym` with `RTLD_DEFAULT` and a NUL-terminated name only looks the symbol up.
        let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_dl_find_object".as_ptr()) };
        find = if symbol.is_null() { 1 } else { symbol as usize };
        FIND_OBJECT.store(find, Ordering::Relaxed);
    }
    if find == 1 {
        return true;
    }
    let mut result = DlFindObject([0; 16]);
    // SAFETY: `find` is glibc's `_dl_find_object`, with that signature; it writes at most a
    // `struct dl_find_object` (smaller than `DlFindObject`) and reads nothing else.
    let find: FindObject = unsafe { std::mem::transmute::<usize, FindObject>(find) };
    // SAFETY: as above; `pc` is only compared with the loaded objects' ranges.
    unsafe { find(pc as *mut libc::c_void, &mut result) == 0 }
}

/// Elsewhere [`find_fde`] finds nothing, so this is never asked.
#[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")))]
pub(super) fn in_loaded_object(_pc: u64) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::unwind::calibrate::has_lock_free_table_lookup;
    use crate::runtime::unwind::cfi::SUPPORTED;

    #[test]
    fn rules_are_cached_only_for_code_of_loaded_objects() {
        if !SUPPORTED {
            return;
        }
        let code = rules_are_cached_only_for_code_of_loaded_objects as *const () as u64;
        assert!(in_loaded_object(code));
        assert!(rule_from_tables(code + 1).1);
        let heap = Box::new(0u64);
        let heap = &*heap as *const u64 as u64;
        if !has_lock_free_table_lookup() {
            println!("no _dl_find_object: every rule is cached");
            return;
        }
        assert!(!in_loaded_object(heap));
        assert_eq!(rule_from_tables(heap), (Rule::Rejected, false), "no FDE: the stack ends there");
    }
}
