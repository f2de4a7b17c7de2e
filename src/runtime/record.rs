//! The sampled path: what happens to an allocation the sampler picked, and to the free of a
//! sampled block, on the application's thread.
//!
//! A sampled allocation takes a pooled frame buffer, notes the block in the sampled-block
//! table, captures its stack, appends its spans and thread (`spans`) and queues an alloc
//! message for the writer (after its thread's kernel name, the first time in a session); a
//! free of a sampled block queues a free message. Nothing here blocks, takes a lock or (in the
//! steady state) allocates. The queue bound and the table are the only places a sample can be
//! lost; every loss is counted here and reported when the session ends.

use std::sync::atomic::{AtomicU64, Ordering};

use super::handoff::{self, Msg, NoFrames};
use super::sampled_set;
use super::sampler::{self, WORD_BYTES};
use super::spans;
use super::state::{now_us, Entry, CALIBRATING, MAX_FRAMES, ON, STATE};
use super::unwind::{self, capture};

/// Samples dropped since the current session started because the writer was far behind.
static DROPPED_QUEUE: AtomicU64 = AtomicU64::new(0);
/// Frees of sampled blocks lost since the current session started because the queue was
/// full (the blocks look alive in the trace).
static DROPPED_FREES: AtomicU64 = AtomicU64::new(0);
/// Samples dropped since the current session started because the sampled-block table
/// bucket was full.
static DROPPED_TABLE: AtomicU64 = AtomicU64::new(0);
/// Samples dropped since the current session started because no memory was left for their
/// frames.
static DROPPED_MEMORY: AtomicU64 = AtomicU64::new(0);

/// What the sampled path lost in a session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Losses {
    /// Samples dropped with the writer too far behind.
    pub(crate) writer_behind: u64,
    /// Samples dropped with their sampled-block table bucket full.
    pub(crate) table_full: u64,
    /// Samples dropped with no memory left for their frames.
    pub(crate) no_memory: u64,
    /// Frees of sampled blocks lost with the writer too far behind.
    pub(crate) frees: u64,
}

/// The losses counted since the last call (or the process start), and reset them.
pub(crate) fn take_losses() -> Losses {
    Losses {
        writer_behind: DROPPED_QUEUE.swap(0, Ordering::Relaxed),
        table_full: DROPPED_TABLE.swap(0, Ordering::Relaxed),
        no_memory: DROPPED_MEMORY.swap(0, Ordering::Relaxed),
        frees: DROPPED_FREES.swap(0, Ordering::Relaxed),
    }
}

/// Called (inside the tracer) for a sampled block of `size` bytes just allocated at `addr`.
pub(crate) fn sampled_alloc(addr: usize, size: usize, nsamples: u64, entry: Entry) {
    let calibration = sampler::take_calibration_flag();
    match STATE.load(Ordering::Relaxed) {
        ON => {}
        CALIBRATING if calibration => {
            let mut frames = [0; MAX_FRAMES];
            let n = capture(entry, true, &mut frames);
            unwind::record_calibration(entry, n, frames);
            return;
        }
        _ => return,
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
    if !channel.try_send(Msg::Alloc { session, nframes, addr, time: now_us(), length, nsamples, frames }) {
        sampled_set::remove(addr);
        DROPPED_QUEUE.fetch_add(1, Ordering::Relaxed);
    }
}

/// Called (inside the tracer) when the sampled block at `addr` is about to be freed.
pub(crate) fn sampled_free(addr: usize) {
    if let Some((channel, session)) = handoff::current() {
        if !channel.try_send(Msg::Free { session, addr, time: now_us() }) {
            DROPPED_FREES.fetch_add(1, Ordering::Relaxed);
        }
    }
}
