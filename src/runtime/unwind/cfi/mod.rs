//! DWARF unwinding with a cache of unwind rules (x86_64 Linux with glibc): the same stacks as
//! libgcc's unwinder, at a fraction of its cost once the rules are cached (the figures are in
//! docs/BENCHMARKS.md).
//!
//! To step from a frame to its caller, the walk needs three facts about the frame's code
//! address: how to compute the canonical frame address (the CFA: `rsp + n` or `rbp + n`), that
//! the return address is stored at CFA − 8, and where the caller's `rbp` was saved, if
//! anywhere. The first time the walk meets an address, it finds the address's FDE
//! ([`lookup`]: through glibc's lock-free `_dl_find_object`, every read of `.eh_frame_hdr`,
//! the FDE and its CIE checked to lie in a readable segment of the object, so that corrupt
//! tables give no FDE rather than a fault), runs the CIE's and the FDE's call-frame
//! instructions up to the address and keeps the resulting [`Rule`](rule::Rule) in a static
//! table (one page in use at first, doubling up to 1 MiB as evictions show that a program's
//! stacks need more). Every later sample through that address reads the table: no loader, no
//! lock, no allocation. Each table slot is a sequence lock (readers never wait: a slot being
//! written reads as a miss).
//!
//! The stack ends at a frame whose rule the walk does not follow (the CFA in another register
//! or given by an expression, the return address or `rbp` saved by an expression or in a
//! register, a signal frame), at code without an FDE, at unwind tables the lookup or the
//! parser rejects as malformed, and at a rule that would step off the stack or not up it: the
//! frames walked so far are kept, and nothing is handed to libgcc's unwinder, which trusts the
//! tables and could fault on a corrupt library's (and, at an address without an FDE, reads the
//! code there looking for a signal trampoline). Normal stacks end where the return address is
//! undefined (`_start`, `clone3`). Every memory read is a word inside the live part of this
//! thread's stack or a checked byte of an object's unwind tables, so a wrong rule can give
//! wrong frames but never a fault; start-up calibration compares this walk's stacks with
//! libgcc's and does not use it when they differ.
//!
//! libgcc's `_Unwind_Find_FDE`, which trusts the tables, remains the FDE lookup where
//! `_dl_find_object` cannot answer ([`tables`]): for code in no loaded object (generated at
//! run time, its tables registered by the program with `__register_frame`), and on C
//! libraries without `_dl_find_object` (glibc < 2.35), where a library's corrupt tables can
//! still fault the walk as they always could.
//!
//! Cached rules go stale when the code at an address changes. Rules are only cached for code
//! in a loaded ELF object (not for JIT code, whose memory may be reused), and
//! [`invalidate_if_unloaded`] starts a new cache generation whenever the dynamic loader's
//! count of unloaded objects has changed: when tracing starts, and at each poll of the writer
//! thread. A library unloaded and another loaded at its address, then sampled before the
//! writer's next poll (milliseconds), could still be walked with the old rules.

#[cfg(all(test, target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
mod against_gimli;
mod cache;
mod interp;
mod lookup;
mod rule;
mod tables;
mod walk;

pub(crate) use cache::invalidate_if_unloaded;
pub(crate) use tables::function_start;
pub(crate) use walk::capture;

/// Whether this target has the cached walker.
pub(crate) const SUPPORTED: bool = cfg!(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"));
