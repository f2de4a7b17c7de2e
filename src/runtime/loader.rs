//! The dynamic loader's list of objects, read with `dl_iterate_phdr` under a lock of our own
//! that `fork` waits for.
//!
//! `dl_iterate_phdr` holds the loader's `dl_load_write_lock` while it calls back, and glibc's
//! `fork` does not reset that lock in the child (2.36 resets `dl_load_lock`, not this one): a
//! fork while a tracer thread is inside the call leaves the child with the lock held by a
//! thread it does not have, and its first `dl_iterate_phdr`, `dlopen` or `dlclose` waits for
//! ever, be it its own trace's start or the program's own call. So every call of the runtime's
//! own goes through [`iterate`] (libgcc's unwinder, on program threads, makes its own where the
//! C library lacks `_dl_find_object`), which holds [`ITERATING`] around it, and the session's
//! fork handlers hold [`ITERATING`] across `fork` ([`before_fork`], [`after_fork`]): a fork
//! waits for a call in progress, which takes microseconds (the callbacks only copy what they
//! are given).
//!
//! The lock is a [`ForkSafeLock`], which the child sets free whatever the parent's threads
//! were doing.

use super::fork_safe_lock::ForkSafeLock;

/// A `dl_iterate_phdr` callback.
pub(crate) type Callback =
    unsafe extern "C" fn(*mut libc::dl_phdr_info, libc::size_t, *mut libc::c_void) -> libc::c_int;

/// Held by a thread of the runtime inside `dl_iterate_phdr`, and by a thread calling `fork`.
static ITERATING: ForkSafeLock<()> = ForkSafeLock::new(());

/// `dl_iterate_phdr(callback, data)`, which a `fork` does not interrupt.
///
/// # Safety
/// As for `dl_iterate_phdr`: `callback` must be sound to call with the loader's descriptions
/// and `data`. It must not call [`iterate`] (the lock is not reentrant) nor allocate.
pub(crate) unsafe fn iterate(callback: Callback, data: *mut libc::c_void) -> libc::c_int {
    let _held = ITERATING.lock();
    #[cfg(debug_assertions)]
    hold::inside_the_loader();
    // SAFETY: under the caller's contract.
    unsafe { libc::dl_iterate_phdr(Some(callback), data) }
}

/// Offset of the end of `dlpi_subs` in `dl_phdr_info`: the loader's counters are there when
/// the `size` it passes reaches past it.
pub(crate) const COUNTERS_END: usize =
    std::mem::offset_of!(libc::dl_phdr_info, dlpi_subs) + std::mem::size_of::<libc::c_ulonglong>();

/// The loader's counts of objects loaded and unloaded so far (`dlpi_adds`, `dlpi_subs`), from
/// the first object's callback; `None` from a loader that does not keep them.
pub(crate) fn counters() -> Option<(u64, u64)> {
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
    unsafe { iterate(first, &mut out as *mut _ as *mut libc::c_void) };
    out
}

/// Wait for any call in progress, and hold off new ones, until [`after_fork`].
pub(crate) fn before_fork() {
    std::mem::forget(ITERATING.lock());
}

/// Let calls go on again: in the parent, and in the child, where no call is in progress.
pub(crate) fn after_fork() {
    ITERATING.force_unlock();
}

/// The test hook behind `__internals::hold_in_the_loader` (debug builds only): the next calls
/// spend a while inside `dl_iterate_phdr`, where a fork would find the loader's lock held.
#[cfg(debug_assertions)]
pub(crate) mod hold {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Duration;

    /// How long each call stays inside the loader, in milliseconds.
    pub(crate) static FOR_MS: AtomicU64 = AtomicU64::new(0);
    /// Whether a call is inside the loader, held there.
    pub(crate) static INSIDE: AtomicBool = AtomicBool::new(false);

    pub(super) fn inside_the_loader() {
        unsafe extern "C" fn wait(_: *mut libc::dl_phdr_info, _: libc::size_t, _: *mut libc::c_void) -> libc::c_int {
            INSIDE.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(FOR_MS.load(Ordering::Relaxed)));
            INSIDE.store(false, Ordering::SeqCst);
            1
        }
        if FOR_MS.load(Ordering::Relaxed) > 0 {
            // SAFETY: the callback touches nothing the loader passes it.
            unsafe { libc::dl_iterate_phdr(Some(wait), std::ptr::null_mut()) };
        }
    }
}
