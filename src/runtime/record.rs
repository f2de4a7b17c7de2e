//! The sampled path: what happens to an allocation the sampler picked, and to the free of a
//! sampled block, on the application's thread; and the count of the samples lost.
//!
//! A sampled allocation takes a pooled frame buffer, captures its stack, appends its spans and
//! thread (`spans`) and queues an alloc message for the writer (after its thread's kernel
//! name, the first time in a session; the session's first alloc message also wakes the
//! writer, see `handoff`); a free of a sampled block queues a free message (or, the queue full,
//! leaves it in `late_frees`). Nothing here
//! blocks, takes a lock or (in the steady state) allocates.
//!
//! A sample is lost only where the writer is far behind (the queue full), no memory is left
//! for its frames or its block's sampled layout, its thread has too little stack left for a
//! capture (dropped, not allowed to overflow it), or its block cannot be tracked. Each loss is
//! counted here by cause, in sample points and bytes as well as samples: the writer writes
//! what was lost into the trace ([`take_unwritten_losses`]) as allocations at a pseudo-location
//! of their cause, freed at once, so that allocated totals stay unbiased and no reader takes
//! the loss for live memory; stopping reports the session's totals ([`take_losses`]).

use std::sync::atomic::{AtomicU64, Ordering};

use super::handoff::{self, Msg, NoFrames};
use super::late_frees;
use super::sampled_set::{self, SessionTag};
use super::sampler::{self, WORD_BYTES};
use super::spans;
use super::state::{now_us, Entry, CALIBRATING, ON, STATE};
use super::unwind::{self, capture};

/// Why a sample was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loss {
    /// The queue to the writer was full: the writer far behind.
    WriterBehind = 0,
    /// No memory was left for the sample's frames, or for its block at the sampled layout.
    NoMemory = 1,
    /// Its thread had too little stack left to capture it.
    NoStack = 2,
    /// Its block could not be tracked (no room in the sampled-block set).
    Untracked = 3,
}

impl Loss {
    pub(crate) const ALL: [Loss; 4] = [Loss::WriterBehind, Loss::NoMemory, Loss::NoStack, Loss::Untracked];

    /// The cause as the trace names it (after [`LOST_SAMPLES_PREFIX`](super::span_table::LOST_SAMPLES_PREFIX)).
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Loss::WriterBehind => "writer behind",
            Loss::NoMemory => "no memory",
            Loss::NoStack => "no stack",
            Loss::Untracked => "untracked",
        }
    }
}

/// What was lost to one cause: samples (blocks), their sample points, and their bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Lost {
    pub(crate) samples: u64,
    pub(crate) points: u64,
    pub(crate) bytes: u64,
}

/// Counters of one cause's losses.
struct LossCounters {
    samples: AtomicU64,
    points: AtomicU64,
    bytes: AtomicU64,
}

impl LossCounters {
    const fn new() -> LossCounters {
        LossCounters { samples: AtomicU64::new(0), points: AtomicU64::new(0), bytes: AtomicU64::new(0) }
    }

    fn add(&self, points: u64, bytes: u64) {
        self.samples.fetch_add(1, Ordering::Relaxed);
        self.points.fetch_add(points, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn load(&self) -> Lost {
        Lost {
            samples: self.samples.load(Ordering::Relaxed),
            points: self.points.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }

    fn take(&self) -> Lost {
        Lost {
            samples: self.samples.swap(0, Ordering::Relaxed),
            points: self.points.swap(0, Ordering::Relaxed),
            bytes: self.bytes.swap(0, Ordering::Relaxed),
        }
    }
}

#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise the arrays below.
const NO_LOSS: LossCounters = LossCounters::new();
/// Losses by cause since the current session started (reported when it stops).
static LOST: [LossCounters; 4] = [NO_LOSS; 4];
/// Losses by cause not yet written into the trace.
static UNWRITTEN: [LossCounters; 4] = [NO_LOSS; 4];

/// Frees of sampled blocks lost since the current session started because the queue was
/// full and so were the late frees' slots near their address (the blocks look alive in the
/// trace).
static DROPPED_FREES: AtomicU64 = AtomicU64::new(0);
/// Frees of sampled blocks lost since the current session started because their thread had
/// too little stack left to send them, and the late frees' slots near their address were
/// full.
static DROPPED_FREES_STACK: AtomicU64 = AtomicU64::new(0);
/// The stack sending a free message may take, with room to spare (docs/GUIDE.md, "Stopping and
/// stack needs"; `tests/tracing` checks the bound).
const FREE_STACK_NEEDED: usize = 4 << 10;

/// Count a sample of `nsamples` sample points and `size` bytes lost to `cause`.
pub(crate) fn lost(cause: Loss, nsamples: u64, size: usize) {
    LOST[cause as usize].add(nsamples, size as u64);
    UNWRITTEN[cause as usize].add(nsamples, size as u64);
}

/// What the sampled path lost in a session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Losses {
    /// Samples lost, by [`Loss`] cause.
    pub(crate) samples: [Lost; 4],
    /// Frees of sampled blocks lost with the writer too far behind.
    pub(crate) frees: u64,
    /// Frees of sampled blocks lost with too little stack left to send them.
    pub(crate) frees_no_stack: u64,
}

impl Losses {
    pub(crate) fn of(&self, cause: Loss) -> Lost {
        self.samples[cause as usize]
    }
}

/// The losses counted since the last call (or the process start), and reset them (also those
/// not yet written into a trace: a new session starts with none).
pub(crate) fn take_losses() -> Losses {
    Losses {
        samples: Loss::ALL.map(|cause| {
            UNWRITTEN[cause as usize].take();
            LOST[cause as usize].take()
        }),
        frees: DROPPED_FREES.swap(0, Ordering::Relaxed),
        frees_no_stack: DROPPED_FREES_STACK.swap(0, Ordering::Relaxed),
    }
}

/// The losses counted since the running session started, leaving them counted.
pub(crate) fn losses_so_far() -> Losses {
    Losses {
        samples: Loss::ALL.map(|cause| LOST[cause as usize].load()),
        frees: DROPPED_FREES.load(Ordering::Relaxed),
        frees_no_stack: DROPPED_FREES_STACK.load(Ordering::Relaxed),
    }
}

/// The losses by cause counted since the last call, for the writer to write into the trace.
pub(crate) fn take_unwritten_losses() -> [Lost; 4] {
    Loss::ALL.map(|cause| UNWRITTEN[cause as usize].take())
}

/// Whether a sample of `nsamples` points and `size` bytes is lost before anything is done for
/// it, and count it so: its thread has too little stack left for the sampled path (its block's
/// allocation at the sampled alignment, the capture), or runs on a stack of unknown extent.
/// Not while calibrating, which needs its captures and takes them on the stack that starts
/// tracing.
#[inline]
pub(crate) fn lost_for_want_of_stack(nsamples: u64, size: usize) -> bool {
    let lost_here = STATE.load(Ordering::Relaxed) == ON && !unwind::stack_left_for_capture();
    if lost_here {
        lost(Loss::NoStack, nsamples, size);
    }
    lost_here
}

/// Called (inside the tracer) for a sampled block of `size` bytes just allocated at `addr`:
/// the tag of the session that recorded it, if one did.
pub(crate) fn sampled_alloc(addr: usize, size: usize, nsamples: u64, entry: Entry) -> Option<SessionTag> {
    let calibration = sampler::take_calibration_flag();
    let record = match STATE.load(Ordering::Relaxed) {
        // Checked here, in a small frame, before the path that takes the stack's measure.
        ON if !unwind::stack_left_for_capture() => {
            lost(Loss::NoStack, nsamples, size);
            false
        }
        ON => true,
        // Calibration needs its captures (and calibrates on the stack that starts tracing).
        CALIBRATING => calibration,
        _ => false,
    };
    // One call site for samples and calibration captures: see `record_alloc`.
    if record {
        record_alloc(addr, size, nsamples, entry, calibration)
    } else {
        None
    }
}

/// [`sampled_alloc`] of a session's sample with stack enough left, or of a `calibration`
/// capture. Both reach the capture (inlined here) through the same frames, from the same call
/// site (which the compiler may make a jump), so that calibration counts the tracer frames a
/// sample's stack starts with.
#[inline(never)]
fn record_alloc(addr: usize, size: usize, nsamples: u64, entry: Entry, calibration: bool) -> Option<SessionTag> {
    if calibration {
        let mut slot = unwind::calibration_slot(entry);
        let (n, frames) = &mut *slot;
        *n = capture(entry, true, frames);
        return None;
    }
    let Some((channel, session)) = handoff::current() else {
        // The session stopped meanwhile: nothing to record it in.
        return None;
    };
    let mut frames = match channel.frames_for_alloc() {
        Ok(frames) => frames,
        Err(NoFrames::WriterBehind) => {
            lost(Loss::WriterBehind, nsamples, size);
            return None;
        }
        Err(NoFrames::NoMemory) => {
            lost(Loss::NoMemory, nsamples, size);
            return None;
        }
    };
    let nframes = capture(entry, false, &mut frames);
    let nframes = spans::append_pseudo_frames(&mut frames, nframes);
    if let Some((tid, name)) = spans::kernel_name_to_send(session) {
        // Lost with a full queue: the writer then names the thread `thread-<tid>`.
        channel.try_send(Msg::ThreadName { session, tid, name });
    }
    let length = (size as u64).div_ceil(WORD_BYTES);
    let nframes = nframes as u8;
    let epoch = sampler::thread_epoch() as u8;
    if channel.try_send(Msg::Alloc { session, nframes, epoch, addr, time: now_us(), length, nsamples, frames }) {
        channel.sample_sent(session);
        Some(sampled_set::session_tag(session))
    } else {
        lost(Loss::WriterBehind, nsamples, size);
        None
    }
}

/// Called (inside the tracer) when the sampled block at `addr`, recorded by the session of
/// `tag`, is about to be freed.
pub(crate) fn sampled_free(addr: usize, tag: SessionTag) {
    let Some((channel, session)) = handoff::current() else { return };
    if sampled_set::session_tag(session) != tag {
        // Recorded by an earlier session: not in this trace.
        return;
    }
    // Too little stack (or a stack of unknown extent: a coroutine's) to send the message: the
    // late frees' slots take it, which needs no more stack than the lookup that found the block.
    // A free lost would leave its block live in every estimate.
    if !unwind::stack_left(FREE_STACK_NEEDED) {
        if !late_frees::put(addr, tag) {
            DROPPED_FREES_STACK.fetch_add(1, Ordering::Relaxed);
        }
    } else if !channel.try_send(Msg::Free { session, addr, time: now_us() }) && !late_frees::put(addr, tag) {
        DROPPED_FREES.fetch_add(1, Ordering::Relaxed);
    }
}
