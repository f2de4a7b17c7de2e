//! Capturing a sampled allocation's stack with the session's walker, dropping the tracer's
//! leading frames.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use super::choice::Walker;
use super::leading::{Leading, SHIM, SKIP};
use super::{cfi, frame_pointers, libgcc};
use crate::runtime::state::{Entry, DEFAULT_FRAME_CAP, MAX_FRAMES};

/// Frames recorded per sample in the current session.
pub(crate) static FRAME_CAP: AtomicUsize = AtomicUsize::new(DEFAULT_FRAME_CAP);
/// The walker of the current session (or of the calibration under way), as `Walker as u8`.
pub(crate) static WALKER: AtomicU8 = AtomicU8::new(Walker::Libgcc as u8);
/// Capture with `walker` and record `frame_cap` frames per sample from now on.
pub(crate) fn configure(walker: Walker, frame_cap: usize) {
    FRAME_CAP.store(frame_cap, Ordering::Relaxed);
    WALKER.store(walker as u8, Ordering::Relaxed);
}

/// Stack a capture may take below the sampled path's check, per [`Walker`] (indexed by
/// `Walker as usize`): what unoptimised builds were measured to take, with room to spare
/// (docs/GUIDE.md, "Stopping and stack needs"; `tests/tracing` checks the bounds). The cached DWARF walk hands a
/// sample taken on another stack (a signal handler's) to libgcc, so it needs libgcc's room too.
pub(crate) const STACK_NEEDED: [usize; 3] = [16 << 10, 8 << 10, 16 << 10];

/// Whether this thread has the stack left for a capture with the session's walker (see
/// [`stack_left`]).
#[inline]
pub(crate) fn stack_left_for_capture() -> bool {
    stack_left(STACK_NEEDED[WALKER.load(Ordering::Relaxed) as usize])
}

/// Whether this thread has at least `needed` bytes of stack left below the caller's frame.
/// False when that cannot be known (see [`stack_remaining`]): a capture on a stack of unknown
/// extent (a coroutine's) could overflow it, so the sample is dropped and counted instead.
#[inline]
pub(crate) fn stack_left(needed: usize) -> bool {
    stack_remaining().is_some_and(|left| left >= needed)
}

/// The bytes of stack left below the caller's frame, on this thread's stack or on the
/// alternate signal stack a handler runs on; `None` on a stack of unknown extent (a
/// coroutine's, switched to with `swapcontext`, or an alternate signal stack disarmed while
/// in use, `SS_AUTODISARM`), or when the thread's stack bounds are unknown.
#[inline]
pub(crate) fn stack_remaining() -> Option<usize> {
    let marker = 0u8;
    let sp = std::ptr::addr_of!(marker) as usize;
    match frame_pointers::stack_bounds() {
        Some((lo, hi)) if (lo..hi).contains(&sp) => Some(sp - lo),
        _ => alternate_stack_remaining(sp),
    }
}

/// The bytes below `sp` on the alternate signal stack, if `sp` is on the one this thread runs
/// a handler on.
#[cold]
fn alternate_stack_remaining(sp: usize) -> Option<usize> {
    // SAFETY: asks for the current alternate stack only, into a zeroed `stack_t`.
    let current = unsafe {
        let mut current: libc::stack_t = std::mem::zeroed();
        (libc::sigaltstack(std::ptr::null(), &mut current) == 0).then_some(current)
    }?;
    let lo = current.ss_sp as usize;
    let on_it = current.ss_flags & libc::SS_ONSTACK != 0 && (lo..lo.saturating_add(current.ss_size)).contains(&sp);
    on_it.then(|| sp - lo)
}

/// Record the stack of a sample taken in `entry` with the session's walker into `frames`,
/// innermost first, without the tracer's own frames (all frames, up to [`MAX_FRAMES`], for a
/// calibration capture). Returns the number of frames written. Allocation-free, except that
/// the first capture on a thread asks for the thread's stack bounds and the cached DWARF
/// walk's cache misses read unwind tables.
///
/// A walk that cannot take a stack (stack bounds unknown on this thread, a sample taken on
/// another stack) hands it to libgcc, which drops its own calibrated leading frames; a rule
/// the cached DWARF walk does not follow and unwind tables it rejects end the stack at that
/// frame instead (see `cfi`). A calibration capture is only ever its walker's own: none when
/// the walk fails.
#[inline(always)]
pub(crate) fn capture(entry: Entry, calibrating: bool, frames: &mut [u64; MAX_FRAMES]) -> usize {
    let cap = if calibrating { MAX_FRAMES } else { FRAME_CAP.load(Ordering::Relaxed) };
    let skip = |walker: Walker| {
        let (w, e) = (walker as usize, entry as usize);
        if calibrating {
            Leading::NONE
        } else {
            Leading { tracer: SKIP[w][e].load(Ordering::Relaxed), shim: SHIM[w][e].load(Ordering::Relaxed) }
        }
    };
    // The walkers are called straight from here, never from a closure (`Option::and_then`):
    // this function is inlined into the sampled path twice, for calibration captures and for
    // samples, and an optimised build inlined the closure into one copy and called it out of
    // line from the other, which gave samples one more leading frame than calibration counted.
    let walker = WALKER.load(Ordering::Relaxed);
    let bounds = if walker == Walker::Libgcc as u8 { None } else { frame_pointers::stack_bounds() };
    if let Some(bounds) = bounds {
        let walked = if walker == Walker::FramePointers as u8 {
            frame_pointers::capture(skip(Walker::FramePointers), cap, frames, bounds)
        } else {
            cfi::capture(skip(Walker::Cfi), cap, frames, bounds)
        };
        match walked {
            Some(n) => return n,
            None if calibrating => return 0,
            None => {}
        }
    } else if calibrating && walker != Walker::Libgcc as u8 {
        return 0;
    }
    libgcc::capture(skip(Walker::Libgcc), cap, frames)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the alternate signal stack a handler runs on, the stack left is what lies below the
    /// handler's frame there.
    #[test]
    fn the_stack_left_on_an_alternate_signal_stack_is_known() {
        use std::sync::atomic::AtomicIsize;
        const SIZE: usize = 64 << 10;
        /// What the handler found: -1 for nothing known.
        static FOUND: AtomicIsize = AtomicIsize::new(-2);
        extern "C" fn handler(_: libc::c_int) {
            FOUND.store(stack_remaining().map_or(-1, |left| left as isize), Ordering::SeqCst);
        }
        std::thread::spawn(|| {
            let mut memory = vec![0u8; SIZE];
            // SAFETY: the alternate stack lives until disabled below; the handler's signal is
            // sent to this thread only, and SIGURG is ignored by default elsewhere.
            unsafe {
                let stack = libc::stack_t { ss_sp: memory.as_mut_ptr().cast(), ss_flags: 0, ss_size: SIZE };
                assert_eq!(libc::sigaltstack(&stack, std::ptr::null_mut()), 0);
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = handler as *const () as libc::sighandler_t;
                action.sa_flags = libc::SA_ONSTACK;
                let mut before: libc::sigaction = std::mem::zeroed();
                assert_eq!(libc::sigaction(libc::SIGURG, &action, &mut before), 0);
                libc::pthread_kill(libc::pthread_self(), libc::SIGURG);
                libc::sigaction(libc::SIGURG, &before, std::ptr::null_mut());
                let disabled = libc::stack_t { ss_sp: std::ptr::null_mut(), ss_flags: libc::SS_DISABLE, ss_size: 0 };
                assert_eq!(libc::sigaltstack(&disabled, std::ptr::null_mut()), 0);
            }
            drop(memory);
        })
        .join()
        .unwrap();
        let found = FOUND.load(Ordering::SeqCst);
        assert!(found > 0 && (found as usize) < SIZE, "{found}");
    }
}
