//! Reading the unwind tables: the rule at a code address and where its function starts, from
//! the FDE covering it, and whether the rule may be cached.
//!
//! In a loaded object the FDE is found by [`lookup`](super::lookup), which checks every read
//! and never trusts the tables. libgcc's `_Unwind_Find_FDE`, which trusts them, finds it
//! only where that lookup cannot: for code in no loaded object (made at run time, its tables
//! registered with `__register_frame` by the program), and on C libraries without
//! `_dl_find_object` (glibc < 2.35), where it is what the walk has always used.

use super::interp::Fde;
use super::lookup::{lookup, Lookup};
use super::rule::Rule;

/// The rule for `pc` from the unwind tables, and whether it may be cached: whether `pc` is in
/// a loaded ELF object (as far as can be told without the loader's lock). A loaded object's
/// tables that give no FDE for `pc`, well formed or not, give [`Rule::Rejected`].
pub(super) fn rule_from_tables(pc: u64) -> (Rule, bool) {
    let (fde, in_loaded_object) = find_fde(pc);
    (rule_at(fde, pc), in_loaded_object)
}

/// The rule at `pc` of `fde`; [`Rule::Rejected`] without one. (A function of its own, so
/// that unoptimised builds keep one copy of the FDE in [`rule_from_tables`]'s frame, which
/// calibration's captures take inside the allocator.)
fn rule_at(fde: Option<Fde<'_>>, pc: u64) -> Rule {
    match fde {
        Some(fde) => fde.rule_at(pc),
        None => Rule::Rejected,
    }
}

/// The start of the function whose FDE covers `pc`; `None` when none does, or where the
/// tables are not read.
pub(crate) fn function_start(pc: u64) -> Option<u64> {
    find_fde(pc).0.map(|fde| fde.start)
}

/// The FDE covering `pc`, if any, and whether `pc` is in a loaded ELF object (see
/// [`rule_from_tables`]).
fn find_fde(pc: u64) -> (Option<Fde<'static>>, bool) {
    match lookup(pc) {
        Lookup::Object(fde) => (fde, true),
        Lookup::Elsewhere => (registered_fde(pc), false),
        // Assumed to be in a loaded object.
        Lookup::Unknown => (registered_fde(pc), true),
    }
}

/// What `_Unwind_Find_FDE` reports besides the FDE (libgcc's `struct dwarf_eh_bases`).
#[repr(C)]
struct EhBases {
    text: *const u8,
    data: *const u8,
    func: *const u8,
}

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
extern "C" {
    /// libgcc's lookup of the FDE covering `pc` (null when none does).
    fn _Unwind_Find_FDE(pc: *const u8, bases: *mut EhBases) -> *const u8;
}

/// The FDE covering `pc` by libgcc's `_Unwind_Find_FDE`, which trusts the tables it reads (see
/// the module doc for where it is used); `None` when none does, or where the tables are not
/// read.
fn registered_fde(pc: u64) -> Option<Fde<'static>> {
    #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
    {
        let mut bases = EhBases { text: std::ptr::null(), data: std::ptr::null(), func: std::ptr::null() };
        // SAFETY: `_Unwind_Find_FDE` only reads the loader's and the registered tables and
        // writes `bases`.
        let fde = unsafe { _Unwind_Find_FDE(pc as *const u8, &mut bases) };
        if fde.is_null() {
            return None;
        }
        /// The body of the CIE or FDE at `at`: the bytes after its length word.
        ///
        /// # Safety
        /// `at` points to a CIE or FDE of a mapped `.eh_frame` section, which stays mapped.
        unsafe fn body(at: *const u8) -> Option<&'static [u8]> {
            // SAFETY: an entry starts with its length word, and that many bytes follow it.
            let length = unsafe { at.cast::<u32>().read_unaligned() };
            // 0xffffffff would announce 64-bit DWARF, which .eh_frame does not use.
            // SAFETY: as above.
            (length != u32::MAX).then(|| unsafe { std::slice::from_raw_parts(at.add(4), length as usize) })
        }
        // SAFETY: a found FDE is in a mapped `.eh_frame` section (of a loaded object, or
        // registered with `__register_frame`), whose CIE lies at the distance its CIE pointer
        // (its body's first word) gives back from that word, in the same section. They stay
        // mapped while that code stays loaded; as for libgcc's own unwinder, a `dlclose` of it
        // by another thread during this call (possible only if `pc` is not a live frame of this
        // thread, i.e. a wrong rule read a stray word) is the caller's race.
        unsafe {
            let fde_body = body(fde)?;
            let cie_pointer = fde_body.get(..4)?.try_into().map(u32::from_le_bytes).ok()?;
            let cie_body = body(fde.add(4).wrapping_sub(cie_pointer as usize))?;
            Fde::parse(fde_body, fde as u64 + 4, cie_body)
        }
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")))]
    {
        let _ = pc;
        None
    }
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
        assert!(rule_from_tables(code + 1).1);
        assert_eq!(function_start(code + 1), Some(code));
        let heap = Box::new(0u64);
        let heap = &*heap as *const u64 as u64;
        if !has_lock_free_table_lookup() {
            println!("no _dl_find_object: every rule is cached");
            return;
        }
        assert_eq!(rule_from_tables(heap), (Rule::Rejected, false), "no FDE: the stack ends there");
    }
}
