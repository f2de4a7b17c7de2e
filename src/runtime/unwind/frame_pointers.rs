//! Stack capture by walking the frame-pointer chain (ALLOCATOR-PITFALLS §10): no DWARF
//! tables, no loader lock, no unwinder lock, safe next to signal-based profilers.
//!
//! Each frame that keeps a frame pointer stores the record `[caller's frame pointer, return
//! address]` at its frame pointer (x86_64 `rbp`, aarch64 `x29`). The walk follows the records
//! and stops at the first one that fails a check: every record must lie within this thread's
//! stack, above the current stack pointer (so it is mapped and readable: the walk never
//! faults), 8-byte aligned, and strictly above the previous record (so the walk ends). The
//! stack bounds come from `pthread_getattr_np` once per thread (for the initial thread, from
//! what the kernel left at exec: [`initial_stack`]) and are cached in `const`-initialised
//! thread-local cells; a thread whose bounds are unknown (or a sample taken on another
//! stack, such as a signal stack) falls back to DWARF unwinding.
//!
//! The chain is only complete if every function between `main` and the allocator keeps frame
//! pointers: build the program with `-C force-frame-pointers=yes` (Rust's precompiled std
//! keeps them since 1.79). A function without one leaves the frame-pointer register alone and
//! writes no frame record, so its caller's frame is missing from the stack (its own return
//! address is in its callee's record); one that uses the register for other data (C
//! code built with `-fomit-frame-pointer`, calling back into Rust) ends the walk there or,
//! when that data happens to be an address higher up the stack, adds stray frames above it.
//! The walk itself never faults and always ends.

use std::cell::Cell;

use super::leading::Leading;
use crate::runtime::state::MAX_FRAMES;

/// Whether this target has a frame-pointer walker.
pub(crate) const SUPPORTED: bool =
    cfg!(all(any(target_arch = "x86_64", target_arch = "aarch64"), any(target_os = "linux", target_os = "android")));

/// `hi` values with a special meaning in [`STACK`].
const UNKNOWN: usize = 0;
const UNAVAILABLE: usize = 1;

thread_local! {
    /// This thread's stack as `(lowest address, end)`; `end` is [`UNKNOWN`] until asked
    /// for, [`UNAVAILABLE`] when it cannot be known.
    static STACK: (Cell<usize>, Cell<usize>) = const { (Cell::new(0), Cell::new(UNKNOWN)) };
}

/// This thread's stack bounds, asked for on the first call (callers are inside the tracer:
/// `pthread_getattr_np` may allocate, reading `/proc/self/maps` for the main thread).
#[inline]
pub(crate) fn stack_bounds() -> Option<(usize, usize)> {
    STACK
        .try_with(|(lo, hi)| {
            if hi.get() == UNKNOWN {
                let (l, h) = query_stack_bounds().unwrap_or((0, UNAVAILABLE));
                lo.set(l);
                hi.set(h);
            }
            (hi.get() != UNAVAILABLE).then(|| (lo.get(), hi.get()))
        })
        .ok()
        .flatten()
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn query_stack_bounds() -> Option<(usize, usize)> {
    if let Some(bounds) = initial_stack_holding(registers().1) {
        return Some(bounds);
    }
    // SAFETY: `attr` is initialised by pthread_getattr_np before use and destroyed after;
    // the out-pointers are valid for writes.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let result = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        let lo = addr as usize;
        (result == 0 && lo > UNAVAILABLE && size > 0).then(|| (lo, lo.saturating_add(size)))
    }
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn query_stack_bounds() -> Option<(usize, usize)> {
    None
}

/// The largest stack limit [`initial_stack`] trusts: the kernel keeps at least this much room
/// below the initial stack free of the mappings it places (`mmap_base`), so no mapping lies
/// within the limit below the stack's top, where glibc would end the stack instead.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRUSTED_STACK_LIMIT: u64 = 128 << 20;

/// The initial thread's stack bounds, as `pthread_getattr_np` gives them on that thread,
/// without the read of `/proc/self/maps` it makes for them (the kernel writes out every
/// mapping for it, and std's start has read it once already).
/// glibc's top is the page after the one holding `__libc_stack_end` (the arguments,
/// environment and auxiliary vector above are left out); its bottom is the stack's soft limit
/// below the end of the stack's mapping, which is where the path of the program (`AT_EXECFN`,
/// the first string the kernel copied there at exec) and a null pointer end. `None` where
/// that does not hold (the mapping's end so found is not a page boundary above the top) or
/// the limit is not one glibc's answer would equal. The same on any thread
/// ([`initial_stack_holding`] is the one that checks it runs there).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn initial_stack() -> Option<(usize, usize)> {
    let stack_end = libc_stack_end();
    // SAFETY: a read of the auxiliary vector.
    let path = unsafe { libc::getauxval(libc::AT_EXECFN) } as usize;
    if path == 0 || stack_end == 0 {
        return None;
    }
    // SAFETY: the NUL-terminated string the kernel put where AT_EXECFN points (it stays
    // mapped: the program never unmaps its initial stack).
    let path_end = path + unsafe { libc::strlen(path as *const libc::c_char) } + 1;
    let mapping_end = path_end.checked_add(std::mem::size_of::<usize>())?;
    let page = page_size();
    let top = (stack_end & !(page - 1)) + page;
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `limit` is valid for writes.
    if unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut limit) } != 0 {
        return None;
    }
    let soft = limit.rlim_cur;
    let consistent = mapping_end.is_multiple_of(page) && top <= mapping_end && soft.is_multiple_of(page as u64);
    if !consistent || soft > TRUSTED_STACK_LIMIT {
        return None;
    }
    Some((mapping_end.checked_sub(soft as usize)?, top))
}

/// [`initial_stack`], if it holds `sp`: only the initial thread's stack does (not that of
/// the only thread of a process forked by another thread). Any other thread's stack lies
/// further below the program's entry than the stack may grow, and is told so without the
/// system call for the stack's limit.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn initial_stack_holding(sp: usize) -> Option<(usize, usize)> {
    let below_entry = libc_stack_end().checked_sub(sp)?;
    if below_entry as u64 > TRUSTED_STACK_LIMIT {
        return None;
    }
    initial_stack().filter(|(lo, hi)| (lo..hi).contains(&&sp))
}

/// The stack pointer at the program's entry, which glibc's dynamic loader keeps.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn libc_stack_end() -> usize {
    extern "C" {
        static __libc_stack_end: *mut libc::c_void;
    }
    // SAFETY: a read of a variable the loader set before any of the program ran.
    unsafe { __libc_stack_end as usize }
}

#[cfg(all(any(target_os = "linux", target_os = "android"), not(target_env = "gnu")))]
fn initial_stack_holding(_sp: usize) -> Option<(usize, usize)> {
    None
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn page_size() -> usize {
    // SAFETY: a query with no arguments to check.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

/// Whether this code runs on its thread's own stack, of known bounds: the only stack the
/// walk reads (a coroutine's or a signal handler's stack is unwound with DWARF).
pub(crate) fn on_thread_stack() -> bool {
    let sp = registers().1;
    stack_bounds().is_some_and(|(lo, hi)| lo <= sp && sp < hi)
}

/// The current `(frame pointer, stack pointer)`.
#[inline(always)]
fn registers() -> (usize, usize) {
    let (fp, sp): (usize, usize);
    // SAFETY: reads two registers; no memory access.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::asm!("mov {fp}, rbp", "mov {sp}, rsp", fp = out(reg) fp, sp = out(reg) sp,
            options(nomem, nostack, preserves_flags));
    }
    // SAFETY: reads two registers; no memory access.
    #[cfg(target_arch = "aarch64")]
    unsafe {
        std::arch::asm!("mov {fp}, x29", "mov {sp}, sp", fp = out(reg) fp, sp = out(reg) sp,
            options(nomem, nostack, preserves_flags));
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        (fp, sp) = (0, 0);
    }
    (fp, sp)
}

/// Up to `cap` return addresses, innermost first, after the `skip` ones; `stack` is this
/// thread's `(lowest address, end)`. Returns the number written, or `None` when the sample
/// was not taken on the thread's stack (the caller then unwinds with DWARF).
#[inline(never)]
pub(crate) fn capture(
    skip: Leading,
    cap: usize,
    frames: &mut [u64; MAX_FRAMES],
    stack: (usize, usize),
) -> Option<usize> {
    const WORD: usize = std::mem::size_of::<usize>();
    let cap = cap.min(MAX_FRAMES);
    let (mut fp, sp) = registers();
    let (lo, hi) = stack;
    if sp < lo || sp >= hi {
        // Another stack (a signal stack, a coroutine): not ours to walk.
        return None;
    }
    let mut n = 0;
    let mut seen = 0;
    // Every record read is within [sp, hi): the live part of this thread's stack.
    while n < cap && fp >= sp && fp % WORD == 0 && fp <= hi - 2 * WORD {
        // SAFETY: `[fp, fp + 16)` is inside the mapped, live part of this thread's stack
        // (checked above) and aligned; volatile reads of plain words, never dereferenced.
        let (next, ret) = unsafe {
            (std::ptr::read_volatile(fp as *const usize), std::ptr::read_volatile((fp + WORD) as *const usize))
        };
        if ret == 0 {
            break;
        }
        if !skip.drops(seen, ret as u64) {
            frames[n] = ret as u64;
            n += 1;
        }
        seen += 1;
        if next <= fp {
            break;
        }
        fp = next;
    }
    Some(n)
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// The initial thread's bounds are those `pthread_getattr_np` gives it: glibc's reading
    /// of `/proc/self/maps` for that thread, done here the same way (from any thread).
    #[test]
    fn the_initial_stack_is_where_glibc_puts_it() {
        let stack_end = libc_stack_end();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let mappings = maps.lines().map(|line| {
            let (from, to) = line.split_whitespace().next().unwrap().split_once('-').unwrap();
            (usize::from_str_radix(from, 16).unwrap(), usize::from_str_radix(to, 16).unwrap())
        });
        let mut last_to = 0;
        let mut to = None;
        for (from, end) in mappings {
            if from <= stack_end && stack_end < end {
                to = Some(end);
                break;
            }
            last_to = end;
        }
        let to = to.expect("the mapping of the initial stack");
        let page = page_size();
        let top = (stack_end & !(page - 1)) + page;
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: `limit` is valid for writes.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_STACK, &mut limit) }, 0);
        let soft = usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX);
        let size = (soft.saturating_sub(to - top) & !(page - 1)).min(top - last_to);
        let glibc = (top - size, top);
        match initial_stack() {
            Some(bounds) => assert_eq!(bounds, glibc, "mapping ends at {to:#x}, limit {soft:#x}"),
            None => assert!(limit.rlim_cur > TRUSTED_STACK_LIMIT, "no bounds with a limit of {soft:#x}"),
        }
        // An address on the initial stack is told to be, one just below its bottom is not.
        if let Some((lo, hi)) = initial_stack() {
            assert_eq!(initial_stack_holding(stack_end - 8), Some((lo, hi)));
            assert_eq!(initial_stack_holding(lo - 8), None, "below the initial stack");
        }
        // A thread of its own stack is not on the initial one.
        let sp = registers().1;
        assert!(!(glibc.0..glibc.1).contains(&sp), "this test runs on a thread of its own");
        let bounds = stack_bounds().expect("this thread's bounds");
        assert!((bounds.0..bounds.1).contains(&sp), "{bounds:x?} do not hold {sp:#x}");
    }
}
