//! Where a sampled allocation happened besides its stack, on the application's side: the
//! tracing spans its thread is inside and the thread itself, recorded as pseudo-frames.
//!
//! A pseudo-frame is a frame "address" that no code has: its top 16 bits are a tag above the
//! 47-bit user address space ([`Pseudo`]). The sampled path appends them at the outermost end
//! of a captured stack (spans innermost first, then the thread, outermost of all); the writer
//! turns them into locations (`span_table`) instead of symbolizing them.
//!
//! Each thread keeps the stack of the spans it is inside: a `const`-initialised thread-local
//! with no destructor holding up to [`MAX_SPANS`] span description numbers, which
//! `MemtraceLayer` updates on span enter and exit (a few cell writes) and the sampled path
//! copies (no allocation, no lock). Spans nested deeper than [`MAX_SPANS`] are counted but
//! not recorded. The thread's kernel id is read once, at its first sample, and its kernel name
//! (which std sets when it starts a named thread) at its first sample in each session, to be
//! sent to the writer ahead of the sample: the thread may be gone when the writer names it.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

use super::handoff::KernelName;
use super::state::MAX_FRAMES;

/// Spans of one thread a sample records, outermost first; deeper ones are left out.
pub(crate) const MAX_SPANS: usize = 16;

/// Bit position of a pseudo-frame's tag.
const TAG_SHIFT: u32 = 48;
/// Tags of the pseudo-frames (the top 16 bits; user-space code addresses have 0 there).
const SPAN_TAG: u64 = 0xFFFF;
const THREAD_TAG: u64 = 0xFFFE;
const THREAD_NAME_TAG: u64 = 0xFFFD;
const LOST_TAG: u64 = 0xFFFC;

/// What a pseudo-frame stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pseudo {
    /// The span description numbered so in `span_table`.
    Span(u32),
    /// The thread with this kernel id (as the sampled path records it).
    Thread(u32),
    /// The thread name numbered so by the writer (as the trace holds it: threads of one name
    /// share a location).
    ThreadName(u32),
    /// The samples lost to a cause (`record::Loss` as a number), which the writer writes as
    /// allocations of their own (the only frame of their stacks).
    Lost(u32),
}

impl Pseudo {
    /// The frame "address" of `self`.
    pub(crate) fn code(self) -> u64 {
        let (tag, value) = match self {
            Pseudo::Span(n) => (SPAN_TAG, n),
            Pseudo::Thread(n) => (THREAD_TAG, n),
            Pseudo::ThreadName(n) => (THREAD_NAME_TAG, n),
            Pseudo::Lost(n) => (LOST_TAG, n),
        };
        (tag << TAG_SHIFT) | u64::from(value)
    }

    /// The pseudo-frame `code` is, if it is one.
    pub(crate) fn of(code: u64) -> Option<Pseudo> {
        let value = code as u32;
        match code >> TAG_SHIFT {
            SPAN_TAG => Some(Pseudo::Span(value)),
            THREAD_TAG => Some(Pseudo::Thread(value)),
            THREAD_NAME_TAG => Some(Pseudo::ThreadName(value)),
            LOST_TAG => Some(Pseudo::Lost(value)),
            _ => None,
        }
    }
}

/// Whether samples record their thread as a pseudo-frame (the session's setting).
static THREAD_FRAMES: AtomicBool = AtomicBool::new(true);

/// Record the thread of each sample from now on, or not.
pub(crate) fn configure(thread_frames: bool) {
    THREAD_FRAMES.store(thread_frames, Ordering::Relaxed);
}

/// One thread's spans, id and name.
struct ThreadSpans {
    /// Description numbers of the spans entered, outermost first; the first
    /// `min(depth, MAX_SPANS)` are meaningful.
    stack: [Cell<u32>; MAX_SPANS],
    /// Spans entered and not yet exited (may exceed [`MAX_SPANS`]).
    depth: Cell<usize>,
    /// The kernel thread id; 0 until the first sample or span on the thread.
    tid: Cell<u32>,
    /// The thread's name has been registered with `span_table`.
    named: Cell<bool>,
    /// The session (hand-off tag) whose writer was sent the thread's kernel name; 0 for none.
    name_sent_to: Cell<u32>,
}

thread_local! {
    static THREAD: ThreadSpans = const {
        ThreadSpans {
            stack: [const { Cell::new(0) }; MAX_SPANS],
            depth: Cell::new(0),
            tid: Cell::new(0),
            named: Cell::new(false),
            name_sent_to: Cell::new(0),
        }
    };
}

impl ThreadSpans {
    fn tid(&self) -> u32 {
        if self.tid.get() == 0 {
            // SAFETY: gettid has no preconditions and cannot fail.
            self.tid.set(unsafe { libc::syscall(libc::SYS_gettid) } as u32);
        }
        self.tid.get()
    }
}

/// The thread entered the span described by `description`.
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
pub(crate) fn enter(description: u32) {
    let _ = THREAD.try_with(|t| {
        let depth = t.depth.get();
        if let Some(slot) = t.stack.get(depth) {
            slot.set(description);
        }
        t.depth.set(depth + 1);
    });
}

/// The thread left the span described by `description`: the innermost such span, which is
/// the innermost span but when guards are dropped out of order. Beyond [`MAX_SPANS`] the
/// innermost unrecorded span is taken to be the one left.
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
pub(crate) fn exit(description: u32) {
    let _ = THREAD.try_with(|t| {
        let depth = t.depth.get();
        if depth > MAX_SPANS {
            t.depth.set(depth - 1);
            return;
        }
        let stack = &t.stack[..depth];
        // A span entered before the layer was installed is not on the stack.
        if let Some(at) = stack.iter().rposition(|s| s.get() == description) {
            for i in at..depth - 1 {
                stack[i].set(stack[i + 1].get());
            }
            t.depth.set(depth - 1);
        }
    });
}

/// This thread's kernel id, the first time it is asked for on this thread (when its name
/// should be registered), else `None`.
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
pub(crate) fn thread_to_register() -> Option<u32> {
    THREAD.try_with(|t| (!t.named.replace(true)).then(|| t.tid())).ok().flatten()
}

/// This thread's id and kernel name, if samples record their thread and a sample of `session`
/// has not asked yet. Sampled path: one system call, no allocation.
pub(crate) fn kernel_name_to_send(session: u32) -> Option<(u32, KernelName)> {
    if !THREAD_FRAMES.load(Ordering::Relaxed) {
        return None;
    }
    THREAD
        .try_with(|t| {
            if t.name_sent_to.replace(session) == session {
                return None;
            }
            let mut name = [0; 16];
            // SAFETY: PR_GET_NAME writes the NUL-terminated name, 16 bytes at most, to the
            // buffer, which has 16.
            unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
            Some((t.tid(), name))
        })
        .ok()
        .flatten()
}

/// Append this thread's pseudo-frames to the stack in `frames[..n]` (innermost first): its
/// spans, innermost first, then the thread. Outermost real frames give way when the buffer is
/// full. Returns the new number of frames. Sampled path: no allocation, no lock.
pub(crate) fn append_pseudo_frames(frames: &mut [u64; MAX_FRAMES], n: usize) -> usize {
    let thread = THREAD_FRAMES.load(Ordering::Relaxed);
    THREAD
        .try_with(|t| {
            let spans = t.depth.get().min(MAX_SPANS);
            let mut n = n.min(MAX_FRAMES - spans - usize::from(thread));
            for span in t.stack[..spans].iter().rev() {
                frames[n] = Pseudo::Span(span.get()).code();
                n += 1;
            }
            if thread {
                frames[n] = Pseudo::Thread(t.tid()).code();
                n += 1;
            }
            n
        })
        .unwrap_or(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pseudo_frames_round_trip_and_are_no_code_address() {
        for pseudo in [Pseudo::Span(0), Pseudo::Span(u32::MAX), Pseudo::Thread(1234), Pseudo::ThreadName(7)] {
            assert_eq!(Pseudo::of(pseudo.code()), Some(pseudo));
            assert!(pseudo.code() > 0x0000_7FFF_FFFF_FFFF);
        }
        for address in [0, 8, 0x5555_5555_1234, 0x7FFF_FFFF_FFFF] {
            assert_eq!(Pseudo::of(address), None);
        }
    }

    fn appended(n: usize) -> Vec<Pseudo> {
        let mut frames = [1; MAX_FRAMES];
        let end = append_pseudo_frames(&mut frames, n);
        frames[..end].iter().filter_map(|&c| Pseudo::of(c)).collect()
    }

    #[test]
    fn spans_are_appended_innermost_first_then_the_thread() {
        std::thread::spawn(|| {
            configure(true);
            let tid = THREAD.with(ThreadSpans::tid);
            assert_eq!(appended(3), [Pseudo::Thread(tid)]);
            enter(10);
            enter(11);
            assert_eq!(appended(3), [Pseudo::Span(11), Pseudo::Span(10), Pseudo::Thread(tid)]);
            // Out of order: the outer span is left first.
            exit(10);
            assert_eq!(appended(3), [Pseudo::Span(11), Pseudo::Thread(tid)]);
            exit(11);
            exit(12); // never entered
            assert_eq!(appended(3), [Pseudo::Thread(tid)]);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn deep_nesting_keeps_the_outermost_spans_and_a_full_buffer_keeps_them_all() {
        std::thread::spawn(|| {
            for d in 0..MAX_SPANS as u32 + 5 {
                enter(d);
            }
            let spans = appended(MAX_FRAMES);
            assert_eq!(spans.len(), MAX_SPANS + 1);
            assert_eq!(spans[MAX_SPANS - 1], Pseudo::Span(0));
            assert_eq!(spans[0], Pseudo::Span(MAX_SPANS as u32 - 1));
            for d in (0..MAX_SPANS as u32 + 5).rev() {
                exit(d);
            }
            assert_eq!(appended(0).len(), 1);
        })
        .join()
        .unwrap();
    }
}
