//! The sampled path: what happens to an allocation the sampler picked, and to the free of a
//! sampled block, on the application's thread.
//!
//! A sampled allocation takes a pooled frame buffer, notes the block in the sampled-block
//! table, captures its stack, appends its spans and thread (`spans`) and queues an alloc
//! message for the writer (after its thread's kernel name, the first time in a session; the
//! session's first alloc message also wakes the writer, see `handoff`); a free of a sampled
//! block queues a free message. Nothing here blocks, takes a lock or (in the steady state)
//! allocates. The queue bound, the table, the pool and a thread's stack are the only
//! places a sample can be lost (a sample on a thread too close to the end of its stack for a
//! capture is dropped, not allowed to overflow it); every loss is counted here and reported
//! when the session ends.

use std::sync::atomic::{AtomicU64, Ordering};

use super::handoff::{self, Msg, NoFrames};
use super::sampled_set;
use super::sampler::{self, WORD_BYTES};
use super::spans;
use super::state::{now_us, Entry, CALIBRATING, ON, STATE};
use super::unwind::{self, capture};

/// Samples dropped since the current session started because the writer was far behind.
static DROPPED_QUEUE: AtomicU64 = AtomicU64::new(0);
/// Frees of sampled blocks lost since the current session started because the queue was
/// full (the blocks look alive in the trace).
static DROPPED_FREES: AtomicU64 = AtomicU64::new(0);
/// Samples dropped since the current session started because the sampled-block table
/// bucket, or the sampled-block pool's class, was full.
static DROPPED_TABLE: AtomicU64 = AtomicU64::new(0);
/// Samples dropped since the current session started because no memory was left for their
/// frames.
static DROPPED_MEMORY: AtomicU64 = AtomicU64::new(0);
/// Samples dropped since the current session started because their thread had too little
/// stack left to capture their stack.
static DROPPED_STACK: AtomicU64 = AtomicU64::new(0);
/// Frees of sampled blocks lost since the current session started because their thread had
/// too little stack left to send them.
static DROPPED_FREES_STACK: AtomicU64 = AtomicU64::new(0);
/// The stack sending a free message may take, with room to spare (docs/GUIDE.md, "Stopping and
/// stack needs"; `tests/tracing` checks the bound).
const FREE_STACK_NEEDED: usize = 4 << 10;

/// What the sampled path lost in a session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Losses {
    /// Samples dropped with the writer too far behind.
    pub(crate) writer_behind: u64,
    /// Samples dropped with their sampled-block table bucket or pool class full.
    pub(crate) table_full: u64,
    /// Samples dropped with no memory left for their frames.
    pub(crate) no_memory: u64,
    /// Samples dropped with too little stack left to capture them.
    pub(crate) no_stack: u64,
    /// Frees of sampled blocks lost with the writer too far behind.
    pub(crate) frees: u64,
    /// Frees of sampled blocks lost with too little stack left to send them.
    pub(crate) frees_no_stack: u64,
}

/// The losses counted since the last call (or the process start), and reset them.
pub(crate) fn take_losses() -> Losses {
    Losses {
        writer_behind: DROPPED_QUEUE.swap(0, Ordering::Relaxed),
        table_full: DROPPED_TABLE.swap(0, Ordering::Relaxed),
        no_memory: DROPPED_MEMORY.swap(0, Ordering::Relaxed),
        no_stack: DROPPED_STACK.swap(0, Ordering::Relaxed),
        frees: DROPPED_FREES.swap(0, Ordering::Relaxed),
        frees_no_stack: DROPPED_FREES_STACK.swap(0, Ordering::Relaxed),
    }
}

/// Count a sample dropped because the sampled-block pool had no slot for its block (which the
/// inner allocator then served, untracked).
pub(crate) fn pool_full() {
    DROPPED_TABLE.fetch_add(1, Ordering::Relaxed);
}

/// Called (inside the tracer) for a sampled block of `size` bytes just allocated at `addr`.
pub(crate) fn sampled_alloc(addr: usize, size: usize, nsamples: u64, entry: Entry) {
    let calibration = sampler::take_calibration_flag();
    let record = match STATE.load(Ordering::Relaxed) {
        // Checked here, in a small frame, before the path that takes the stack's measure.
        ON if !unwind::stack_left_for_capture() => {
            DROPPED_STACK.fetch_add(1, Ordering::Relaxed);
            false
        }
        ON => true,
        // Calibration needs its captures (and calibrates on the stack that starts tracing).
        CALIBRATING => calibration,
        _ => false,
    };
    // One call site for samples and calibration captures: see `record_alloc`.
    if record {
        record_alloc(addr, size, nsamples, entry, calibration);
    }
}

/// [`sampled_alloc`] of a session's sample with stack enough left, or of a `calibration`
/// capture. Both reach the capture (inlined here) through the same frames, from the same call
/// site (which the compiler may make a jump), so that calibration counts the tracer frames a
/// sample's stack starts with.
#[inline(never)]
fn record_alloc(addr: usize, size: usize, nsamples: u64, entry: Entry, calibration: bool) {
    if calibration {
        let mut slot = unwind::calibration_slot(entry);
        let (n, frames) = &mut *slot;
        *n = capture(entry, true, frames);
        return;
    }
    let Some((channel, session)) = handoff::current() else { return };
    let mut frames = match channel.frames_for_alloc() {
        Ok(frames) => frames,
        Err(NoFrames::WriterBehind) => {
            DROPPED_QUEUE.fetch_add(1, Ordering::Relaxed);
            return;
        }
        Err(NoFrames::NoMemory) => {
            DROPPED_MEMORY.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    if !sampled_set::insert(addr) {
        channel.recycle(frames);
        DROPPED_TABLE.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let nframes = capture(entry, false, &mut frames);
    let nframes = spans::append_pseudo_frames(&mut frames, nframes);
    if let Some((tid, name)) = spans::kernel_name_to_send(session) {
        // Lost with a full queue: the writer then names the thread `thread-<tid>`.
        channel.try_send(Msg::ThreadName { session, tid, name });
    }
    let length = (size as u64).div_ceil(WORD_BYTES);
    let nframes = nframes as u16;
    if channel.try_send(Msg::Alloc { session, nframes, addr, time: now_us(), length, nsamples, frames }) {
        channel.sample_sent(session);
    } else {
        sampled_set::remove(addr);
        DROPPED_QUEUE.fetch_add(1, Ordering::Relaxed);
    }
}

/// Called (inside the tracer) when the sampled block at `addr` is about to be freed.
pub(crate) fn sampled_free(addr: usize) {
    if let Some((channel, session)) = handoff::current() {
        if !unwind::stack_left(FREE_STACK_NEEDED) {
            DROPPED_FREES_STACK.fetch_add(1, Ordering::Relaxed);
        } else if !channel.try_send(Msg::Free { session, addr, time: now_us() }) {
            DROPPED_FREES.fetch_add(1, Ordering::Relaxed);
        }
    }
}
