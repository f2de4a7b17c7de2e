//! Stack capture with libgcc's DWARF unwinder (`_Unwind_Backtrace`): the walker that takes
//! every stack, used where the others cannot walk one (see `capture`).

use super::leading::Leading;
use crate::runtime::state::MAX_FRAMES;

/// [`capture`] with libgcc's DWARF unwinder: up to `cap` frame addresses after the `skip` ones.
#[inline(never)]
pub(crate) fn capture(skip: Leading, cap: usize, frames: &mut [u64; MAX_FRAMES]) -> usize {
    let cap = cap.min(MAX_FRAMES);
    let mut seen = 0;
    let mut n = 0;
    // SAFETY: on Unix the unwinder (libgcc `_Unwind_Backtrace`) is thread-safe; the
    // synchronized `trace` only adds a process-wide lock, which must not be taken inside an
    // allocator (ALLOCATOR-PITFALLS §2). The callback only writes into `frames`.
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            let ip = frame.ip() as u64;
            if ip == 0 {
                // The end of the stack.
                return false;
            }
            if !skip.drops(seen, ip) {
                if let Some(slot) = frames.get_mut(n) {
                    *slot = ip;
                    n += 1;
                }
            }
            seen += 1;
            n < cap
        });
    }
    n
}
