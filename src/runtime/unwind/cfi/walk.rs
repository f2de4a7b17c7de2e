//! The walk: from the sampled frame outwards, one cached rule per return address.

use super::cache::rule_for;
use super::rule::Rule;
use crate::runtime::state::MAX_FRAMES;
use crate::runtime::unwind::leading::Leading;

/// Up to `cap` return addresses, innermost first, after the `skip` ones; `stack` is this
/// thread's `(lowest address, end)`. `None` when the sample is taken on another stack (the
/// caller then unwinds with libgcc). A rule it does not follow, unwind tables it rejects as
/// malformed, and a step that would leave the stack or not go up it end the stack there:
/// libgcc's unwinder, which trusts the tables, could fault on them (a library with a corrupt
/// `.eh_frame`).
#[inline(never)]
pub(crate) fn capture(
    skip: Leading,
    cap: usize,
    frames: &mut [u64; MAX_FRAMES],
    stack: (usize, usize),
) -> Option<usize> {
    const WORD: u64 = 8;
    let cap = cap.min(MAX_FRAMES);
    let (pc, sp, fp) = registers();
    let (lo, hi) = (stack.0 as u64, stack.1 as u64);
    if sp < lo || sp >= hi {
        return None;
    }
    // Reads of a word at `at`, only inside the live part of this thread's stack.
    let read = |at: u64| -> Option<u64> {
        // SAFETY: `[at, at + 8)` lies within `[sp, hi)`, the mapped, live part of this thread's
        // stack (the frames of this function's callers); an aligned, volatile read of a word.
        (at >= sp && at.is_multiple_of(WORD) && at <= hi - WORD)
            .then(|| unsafe { std::ptr::read_volatile(at as *const u64) })
    };
    // The frame being stepped from: its registers, and the address to look its rule up by
    // (a return address minus one, inside the call instruction, for every frame but the first).
    let (mut rsp, mut rbp, mut lookup) = (sp, fp, pc);
    let (mut n, mut seen) = (0, 0);
    while n < cap {
        let (cfa_in_rbp, cfa_offset, rbp_offset) = match rule_for(lookup) {
            Rule::Step { cfa_in_rbp, cfa_offset, rbp_offset } => (cfa_in_rbp, cfa_offset, rbp_offset),
            Rule::End | Rule::Rejected | Rule::Unsupported => break,
        };
        let Some(cfa) = (if cfa_in_rbp { rbp } else { rsp }).checked_add_signed(cfa_offset as i64) else { break };
        // The caller's frame is above this one: the walk always ends.
        if cfa <= rsp {
            break;
        }
        let Some(ret) = read(cfa - WORD) else { break };
        if let Some(offset) = rbp_offset {
            let Some(saved) = cfa.checked_add_signed(offset as i64).and_then(read) else { break };
            rbp = saved;
        }
        rsp = cfa;
        if ret == 0 {
            break;
        }
        if !skip.drops(seen, ret) {
            frames[n] = ret;
            n += 1;
        }
        seen += 1;
        lookup = ret - 1;
    }
    Some(n)
}

/// The current `(instruction address, stack pointer, frame pointer)`.
#[inline(always)]
fn registers() -> (u64, u64, u64) {
    let (pc, sp, fp): (u64, u64, u64);
    // SAFETY: reads the instruction pointer and two registers; no memory access.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::asm!("lea {pc}, [rip]", "mov {sp}, rsp", "mov {fp}, rbp", pc = out(reg) pc, sp = out(reg) sp,
            fp = out(reg) fp, options(nomem, nostack, preserves_flags));
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        (pc, sp, fp) = (0, 0, 0);
    }
    (pc, sp, fp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::unwind::cfi::SUPPORTED;
    use crate::runtime::unwind::{frame_pointers, libgcc};

    /// Stacks `depth` frames deeper than the caller's, captured by both walkers.
    #[inline(never)]
    fn both_at(depth: usize, out: &mut (Vec<u64>, Vec<u64>)) {
        if depth > 0 {
            both_at(std::hint::black_box(depth - 1), out);
            std::hint::black_box(());
            return;
        }
        let bounds = frame_pointers::stack_bounds().expect("stack bounds");
        let mut frames = [0; MAX_FRAMES];
        let n = capture(Leading::NONE, MAX_FRAMES, &mut frames, bounds).expect("a stack the walk can follow");
        out.0 = frames[..n].to_vec();
        let n = libgcc::capture(Leading::NONE, MAX_FRAMES, &mut frames);
        out.1 = frames[..n].to_vec();
    }

    #[test]
    fn stacks_match_libgcc() {
        if !SUPPORTED {
            return;
        }
        for depth in [0, 1, 7, 40] {
            let mut stacks = Default::default();
            // Twice: computed, then from the cache.
            for _ in 0..2 {
                both_at(depth, &mut stacks);
                let (ours, libgcc) = &stacks;
                // Both stacks start with the frame of `both_at` (at different calls); the rest
                // are the same return addresses.
                assert!(ours.len() > depth + 2, "{ours:x?}");
                assert_eq!(ours[1..], libgcc[libgcc.len() + 1 - ours.len()..], "depth {depth}");
            }
        }
    }

    #[test]
    fn the_walk_stays_on_the_given_stack() {
        let mut frames = [0; MAX_FRAMES];
        assert_eq!(capture(Leading::NONE, 5, &mut frames, (1 << 20, 2 << 20)), None);
    }
}
