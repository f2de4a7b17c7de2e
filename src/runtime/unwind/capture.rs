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
/// (docs/GUIDE.md, "Stopping and stack needs"; `tests/tracing` checks the bounds). The cached DWARF walk hands the stacks
/// it cannot follow to libgcc, so it needs libgcc's room too.
pub(crate) const STACK_NEEDED: [usize; 3] = [16 << 10, 8 << 10, 16 << 10];

/// Whether this thread has the stack left for a capture with the session's walker (see
/// [`stack_left`]).
#[inline]
pub(crate) fn stack_left_for_capture() -> bool {
    stack_left(STACK_NEEDED[WALKER.load(Ordering::Relaxed) as usize])
}

/// Whether this thread has at least `needed` bytes of stack left below the caller's frame. Also
/// true when nothing can be known: the thread's stack bounds are unknown, or the code runs on
/// another stack (a coroutine's, a signal handler's).
#[inline]
pub(crate) fn stack_left(needed: usize) -> bool {
    stack_remaining().is_none_or(|left| left >= needed)
}

/// The bytes of this thread's stack left below the caller's frame; `None` when the thread's
/// stack bounds are unknown or the code runs on another stack.
#[inline]
pub(crate) fn stack_remaining() -> Option<usize> {
    let marker = 0u8;
    let sp = std::ptr::addr_of!(marker) as usize;
    frame_pointers::stack_bounds().filter(|(lo, hi)| (lo..hi).contains(&&sp)).map(|(lo, _)| sp - lo)
}

/// Record the stack of a sample taken in `entry` with the session's walker into `frames`,
/// innermost first, without the tracer's own frames (all frames, up to [`MAX_FRAMES`], for a
/// calibration capture). Returns the number of frames written. Allocation-free, except that
/// the first capture on a thread asks for the thread's stack bounds and the cached DWARF
/// walk's cache misses read unwind tables.
///
/// A walk that cannot take a stack (stack bounds unknown on this thread, a sample taken on
/// another stack, a frame the cached DWARF walk cannot follow) hands it to libgcc, which drops
/// its own calibrated leading frames. A calibration capture is only ever its walker's own:
/// none when the walk fails.
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
