//! The hand-off of samples from application threads to the writer thread: one process-wide,
//! bounded, lock-free queue of small messages, and the pool of frame buffers that alloc
//! messages carry.
//!
//! Application threads never wait here, and in the steady state never allocate: the queue is
//! a crossbeam array channel allocated when tracing first starts, and frame buffers come from
//! a pool that each writer fills up to [`INITIAL_POOL`] buffers, most of them once the program
//! has used some or has run a while (a new buffer is allocated, inside the tracer, when the
//! pool is empty; the writer gives it back to the pool, up to [`POOL_SIZE`], and frees the
//! surplus). Memory allocated on an application thread lands in that thread's malloc arena,
//! and the blocks of an unbounded channel, freed by the writer up to a poll interval later,
//! kept chunks of the arena pinned: glibc then trimmed and re-grew the arenas differently, and
//! the program paid in `madvise` calls and page faults in its own code.
//!
//! The queue is bounded, and sized for the sampling rate ([`capacity_for`]: 16 Ki messages at
//! the default rate, 128 Ki from about 1.25e-4 on); a session at a higher rate than the
//! process's queue was made for makes a larger one. Alloc samples stop once half the capacity
//! waits (the writer is far behind), so that frees of sampled blocks have the other half;
//! a free that still finds the queue full is not waited for (the writer may need the loader
//! lock, to symbolize, that an application thread in `dlclose` holds) but left in `late_frees`
//! for the writer to take. The queue's length is read
//! (a cache line the writer keeps writing) only when the pool of frame buffers is empty: a
//! pooled buffer is one the writer gave back after taking an alloc off the queue, so allocs
//! sent with pooled buffers can overshoot the limit by at most [`POOL_SIZE`], plus one for
//! each thread that read the length just before another filled it: a few thousand of the
//! slots kept for frees.
//!
//! The writer polls the queue rather than block on it (a receiver blocked in the queue would
//! make every send a futex wake-up), with one exception: a session's first alloc sample rings
//! the writer's doorbell ([`Channel::ring_at_first_sample`]), so that a short program's
//! frames are named while it still runs, not after it stopped and waits for them.
//!
//! Sessions share the queue. Every message carries its session's id, and the writer ignores
//! the messages of other sessions (sent by a thread that was still finishing a sample when
//! its session stopped); a new session also starts by draining what an earlier one left. A
//! forked child that starts tracing makes a new queue: a thread of the parent may have been
//! half-way through a send when the process forked.

use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender, TrySendError};

use crate::format::trace::Timestamp;
use crate::runtime::state::MAX_FRAMES;
use crate::runtime::tracer_thread::Doorbell;

/// A thread's kernel name: at most 15 bytes, padded with NULs.
pub(crate) type KernelName = [u8; 16];

/// The most messages a queue holds: 128 Ki × 56 bytes (a message and its slot's stamp), for
/// the highest rates.
pub(crate) const MAX_CAPACITY: usize = 1 << 17;
/// The fewest: 1 Ki × 56 bytes.
const MIN_CAPACITY: usize = 1 << 10;
/// The allocation rate, in bytes a second, that the queue is sized to absorb for
/// [`BACKLOG_SECONDS`] while the writer does not take from it (asleep between polls, or not
/// scheduled on a loaded machine). While it waits for a frame's name, it takes the queue into
/// a backlog of its own (see `writer_thread`), so a long symbolization needs no room here.
/// A second: allocs may take only half the queue and frees come with them; less lost samples
/// of a loop allocating and freeing 32 KiB blocks at 1e-4 next to other tests
/// (`tests/tracing/estimates.rs`, the churn case).
const SIZED_FOR_BYTES_PER_SECOND: f64 = 8e9;
const BACKLOG_SECONDS: f64 = 1.0;
/// Frame buffers the pool holds at most: 2 MiB. The writer returns buffers when it wakes, so
/// the pool must outlast a poll interval: with 512 buffers it ran dry at rate 1e-5 in the
/// allocation benchmark, and each new buffer was a `calloc` on the sampled path and a
/// cross-thread `free` in the writer.
pub(crate) const POOL_SIZE: usize = 2048;
/// Frame buffers the pool is filled with by a writer (256 KiB), [`STARTING_POOL`] of them as
/// it starts and the rest once the program has taken half of those, or the writer has run
/// 20 ms (see `writer_thread`): a short program, whose few samples take few buffers at a time,
/// never pays their page faults. It grows to [`POOL_SIZE`] on demand (a buffer allocated on
/// the sampled path when the pool is empty joins the pool when the writer gives it back).
pub(crate) const INITIAL_POOL: usize = 256;
/// Frame buffers a writer puts in the pool as it starts (32 KiB).
pub(crate) const STARTING_POOL: usize = 32;

/// The queue capacity for sampling `rate`: [`BACKLOG_SECONDS`] of samples of a program
/// allocating [`SIZED_FOR_BYTES_PER_SECOND`], a power of two in
/// [`MIN_CAPACITY`]..=[`MAX_CAPACITY`]. At the default rate, 16 Ki messages (896 KiB); from
/// about 1.25e-4 on, the maximum (7 MiB).
pub(crate) fn capacity_for(rate: f64) -> usize {
    let samples = rate * SIZED_FOR_BYTES_PER_SECOND / 8.0 * BACKLOG_SECONDS;
    let wanted = if samples.is_finite() { samples.clamp(1.0, MAX_CAPACITY as f64) as usize } else { MAX_CAPACITY };
    wanted.next_power_of_two().clamp(MIN_CAPACITY, MAX_CAPACITY)
}

/// The bytes a queue of `capacity` messages takes (each message and its slot's stamp), with
/// the pool's own queue.
pub(crate) fn bytes_for(capacity: usize) -> usize {
    capacity.saturating_mul(std::mem::size_of::<Msg>() + 8).saturating_add(POOL_SIZE * 16)
}

/// Whether `bytes` of memory can be had at once: mapped (and never touched, so nothing
/// becomes resident) and unmapped again, which fails as an allocation of that size would
/// under `RLIMIT_AS`, strict overcommit or an exhausted address space.
///
/// Not asked of `malloc`: glibc raises its threshold for serving blocks by `mmap` to the size
/// of any such block freed (up to 32 MiB). A probe of 8 MiB allocated and freed at start made
/// every later allocation of the program between 128 KiB and 8 MiB come from the heap instead,
/// vectors grown by copying instead of `mremap`, and more heap work on every call (CHANGELOG.md,
/// "Fixed").
pub(crate) fn memory_for(bytes: usize) -> bool {
    // SAFETY: a fresh private anonymous mapping, which nothing else refers to.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if map == libc::MAP_FAILED {
        return false;
    }
    // SAFETY: the mapping made above, of that length, unused.
    unsafe { libc::munmap(map, bytes) };
    true
}

/// A captured stack: frame addresses, innermost first.
pub(crate) type Frames = Box<[u64; MAX_FRAMES]>;

/// What application threads tell the writer: a few words, so that the queue stays small (the
/// frames travel in a pooled buffer). `session` is the id of the session that sent it.
pub(crate) enum Msg {
    /// A sampled block was allocated at `addr`.
    Alloc {
        session: u32,
        /// Frame addresses, innermost first; only the first `nframes` are meaningful.
        nframes: u8,
        /// The sampler's epoch (modulo 2^8) in whose rate's units `nsamples` is counted (see
        /// `sampler::rate_of_epoch`).
        epoch: u8,
        addr: usize,
        time: Timestamp,
        /// Size in words.
        length: u64,
        nsamples: u64,
        frames: Frames,
    },
    /// The sampled block at `addr` was freed.
    Free { session: u32, addr: usize, time: Timestamp },
    /// The thread with kernel id `tid`, whose samples follow, has the kernel name `name`.
    ThreadName { session: u32, tid: u32, name: KernelName },
    /// Close the trace and exit.
    Stop { session: u32 },
}

impl Msg {
    /// The session that sent the message.
    pub(crate) fn session(&self) -> u32 {
        match *self {
            Msg::Alloc { session, .. }
            | Msg::Free { session, .. }
            | Msg::ThreadName { session, .. }
            | Msg::Stop { session } => session,
        }
    }
}

/// The process's queue and pool of frame buffers.
pub(crate) struct Channel {
    /// The process that made it (a forked child makes its own).
    pid: u32,
    /// Messages the queue holds.
    capacity: usize,
    /// Messages waiting beyond which alloc samples are dropped (the writer is far behind): half
    /// the capacity, so that frees of sampled blocks have the other half.
    alloc_limit: usize,
    tx: Sender<Msg>,
    rx: Receiver<Msg>,
    /// Recycled frame buffers (a bounded, lock-free array queue).
    pool_tx: Sender<Frames>,
    pool_rx: Receiver<Frames>,
    /// The doorbell the next alloc sample of session [`Channel::first_sample_session`] rings,
    /// put there by its writer with no sample yet: an `Arc` given up by `Arc::into_raw`, which
    /// whoever swaps it out owns; null otherwise.
    first_sample_bell: AtomicPtr<Doorbell>,
    /// The session whose writer put the bell there (a thread still sending a sample of an
    /// earlier session leaves it alone).
    first_sample_session: AtomicU32,
    /// What the writer says of its work, on a cache line of its own, away from the fields the
    /// sampled path reads.
    progress: Progress,
}

#[repr(align(64))]
struct Progress {
    /// Bumped by the writer for each message it takes and each frame it names: how stopping
    /// tells a busy writer from a stalled one.
    count: AtomicU64,
    /// Messages the writer has taken off the queue ahead of their turn and not yet handled.
    taken_ahead: AtomicUsize,
}

/// The process's channel (leaked, never freed); null before the first session.
static PROCESS: AtomicPtr<Channel> = AtomicPtr::new(std::ptr::null_mut());
/// The id of the running session, which the sampled path sends to [`PROCESS`]; 0 when no
/// session is running. One word, so that a message is never sent with another session's id.
static RUNNING: AtomicU32 = AtomicU32::new(0);

impl Channel {
    /// A queue of `capacity` messages, its pool empty. The caller has checked with
    /// [`memory_for`] that [`bytes_for`] `capacity` can be had: crossbeam's allocation would
    /// abort the process.
    pub(crate) fn new(pid: u32, capacity: usize) -> Channel {
        let (tx, rx) = crossbeam_channel::bounded(capacity);
        let (pool_tx, pool_rx) = crossbeam_channel::bounded(POOL_SIZE);
        Channel {
            pid,
            capacity,
            alloc_limit: capacity / 2,
            tx,
            rx,
            pool_tx,
            pool_rx,
            first_sample_bell: AtomicPtr::new(std::ptr::null_mut()),
            first_sample_session: AtomicU32::new(0),
            progress: Progress { count: AtomicU64::new(0), taken_ahead: AtomicUsize::new(0) },
        }
    }

    /// Fill the pool of frame buffers up to `buffers`, as far as memory allows. Called by the
    /// writer, so that the buffers are allocated off the thread that starts tracing (a KiB of
    /// first-touched memory each; the sampled path allocates its own until they are there).
    pub(crate) fn fill_pool(&self, buffers: usize) {
        for frames in (self.pool_rx.len()..buffers).map_while(|_| new_frames()) {
            let _ = self.pool_tx.try_send(frames);
        }
    }

    /// Frame buffers in the pool.
    pub(crate) fn pooled(&self) -> usize {
        self.pool_rx.len()
    }

    /// Queue `msg` without waiting; false when the queue is full. A full queue gives the
    /// message back to be dropped here, which only frees a frame buffer (inside the tracer).
    pub(crate) fn try_send(&self, msg: Msg) -> bool {
        match self.tx.try_send(msg) {
            Ok(()) => true,
            Err(TrySendError::Full(msg) | TrySendError::Disconnected(msg)) => {
                self.dispose(msg);
                false
            }
        }
    }

    /// Have the next alloc sample that `session` sends ring `bell` (writer side, as it
    /// starts), in place of any bell an earlier writer left.
    pub(crate) fn ring_at_first_sample(&self, bell: Arc<Doorbell>, session: u32) {
        self.first_sample_session.store(session, Ordering::Relaxed);
        // Released by the swap: a sender that sees the bell sees its session.
        self.swap_first_sample_bell(Arc::into_raw(bell).cast_mut());
    }

    /// Take back the bell of [`Channel::ring_at_first_sample`] if no sample rang it (writer
    /// side, as it ends).
    pub(crate) fn no_first_sample_bell(&self) {
        self.swap_first_sample_bell(std::ptr::null_mut());
    }

    /// Say that an alloc sample of `session` was just queued (sampled side): the session's
    /// first rings its writer's bell. Otherwise only a load of a field written at a session's
    /// start and end.
    #[inline]
    pub(crate) fn sample_sent(&self, session: u32) {
        let bell = self.first_sample_bell.load(Ordering::Acquire);
        if !bell.is_null() {
            self.ring_first_sample_bell(bell, session);
        }
    }

    #[cold]
    #[inline(never)]
    fn ring_first_sample_bell(&self, bell: *mut Doorbell, session: u32) {
        if self.first_sample_session.load(Ordering::Relaxed) != session {
            return;
        }
        // Only the bell seen with the session: one put out since (by a session started after
        // this one stopped) is not this sample's to ring.
        let taken =
            self.first_sample_bell.compare_exchange(bell, std::ptr::null_mut(), Ordering::AcqRel, Ordering::Relaxed);
        // SAFETY: a non-null pointer swapped out of the field is an `Arc` that is now ours.
        if let Some(bell) = unsafe { take_bell(taken.unwrap_or(std::ptr::null_mut())) } {
            // On the sampled path: std parks threads on a futex of their own on Linux, so an
            // unpark is one `FUTEX_WAKE`, with no lock and no allocation.
            bell.ring();
        }
    }

    fn swap_first_sample_bell(&self, new: *mut Doorbell) {
        // SAFETY: as in `ring_first_sample_bell`; dropped here.
        drop(unsafe { take_bell(self.first_sample_bell.swap(new, Ordering::AcqRel)) });
    }

    /// The next message, if any (writer side).
    pub(crate) fn try_recv(&self) -> Option<Msg> {
        let msg = self.rx.try_recv().ok()?;
        self.note_progress();
        Some(msg)
    }

    /// Say that the writer is getting on with its work (writer side).
    pub(crate) fn note_progress(&self) {
        self.progress.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Say how many messages the writer holds taken ahead of their turn (writer side).
    pub(crate) fn note_taken_ahead(&self, held: usize) {
        self.progress.taken_ahead.store(held, Ordering::Relaxed);
    }

    /// A count that moves while the writer works.
    pub(crate) fn progress(&self) -> u64 {
        self.progress.count.load(Ordering::Relaxed)
    }

    /// How many messages wait for the writer: in the queue, and those it has taken ahead of
    /// their turn.
    pub(crate) fn queued(&self) -> usize {
        self.rx.len() + self.progress.taken_ahead.load(Ordering::Relaxed)
    }

    /// Queue `Stop` for `session`, waiting for room while `alive` says the writer is still
    /// draining the queue. Only called by the thread stopping a session.
    pub(crate) fn send_stop(&self, session: u32, mut alive: impl FnMut() -> bool) {
        let mut msg = Msg::Stop { session };
        loop {
            match self.tx.try_send(msg) {
                Err(TrySendError::Full(m)) if alive() => {
                    msg = m;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                _ => return,
            }
        }
    }

    /// A frame buffer for an alloc sample: from the pool or, when the pool is empty, a new one
    /// (callers are inside the tracer, so the allocation is not sampled), unless the writer is
    /// so far behind that alloc samples are dropped.
    #[inline]
    pub(crate) fn frames_for_alloc(&self) -> Result<Frames, NoFrames> {
        match self.pool_rx.try_recv() {
            Ok(frames) => Ok(frames),
            Err(_) => self.new_frames_unless_behind(),
        }
    }

    #[cold]
    fn new_frames_unless_behind(&self) -> Result<Frames, NoFrames> {
        if self.tx.len() >= self.alloc_limit {
            return Err(NoFrames::WriterBehind);
        }
        new_frames().ok_or(NoFrames::NoMemory)
    }

    /// Give a frame buffer back to the pool; it is freed when the pool is full.
    pub(crate) fn recycle(&self, frames: Frames) {
        let _ = self.pool_tx.try_send(frames);
    }

    /// Drop a message that will not be recorded, keeping its frame buffer.
    pub(crate) fn dispose(&self, msg: Msg) {
        if let Msg::Alloc { frames, .. } = msg {
            self.recycle(frames);
        }
    }
}

/// The doorbell `ptr` (if not null), owned from here on.
///
/// # Safety
/// `ptr` is null or comes from `Arc::into_raw` and no one else owns it.
unsafe fn take_bell(ptr: *mut Doorbell) -> Option<Arc<Doorbell>> {
    // SAFETY: under the caller's contract.
    (!ptr.is_null()).then(|| unsafe { Arc::from_raw(ptr) })
}

/// Why an alloc sample gets no frame buffer (and is dropped).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum NoFrames {
    /// At least half the queue's capacity waits.
    WriterBehind,
    /// The allocator has no memory for a new buffer.
    NoMemory,
}

/// A new frame buffer, or `None` when the allocator has no memory: `Box::new` would abort the
/// process, where the program's own allocation might have coped with a null.
#[cold]
#[inline(never)]
fn new_frames() -> Option<Frames> {
    let layout = std::alloc::Layout::new::<[u64; MAX_FRAMES]>();
    // SAFETY: the layout has a nonzero size.
    let block = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<[u64; MAX_FRAMES]>();
    // SAFETY: a non-null block is a fresh allocation from the global allocator with the layout
    // of `[u64; MAX_FRAMES]`, zeroed (a valid value of that type), so `Box` owns it and frees
    // it with the same layout.
    (!block.is_null()).then(|| unsafe { Box::from_raw(block) })
}

/// The running session's channel and id, if tracing.
#[inline]
pub(crate) fn current() -> Option<(&'static Channel, u32)> {
    let session = RUNNING.load(Ordering::Acquire);
    if session == 0 {
        return None;
    }
    // SAFETY: PROCESS is null or points to a leaked `Channel` that is never freed.
    let channel = unsafe { PROCESS.load(Ordering::Acquire).as_ref() }?;
    Some((channel, session))
}

/// The id messages of the session numbered `id` carry (never 0).
pub(crate) fn session_tag(id: u64) -> u32 {
    (id as u32).max(1)
}

/// The channel for a new session of process `pid` sampling at `rate`: the process's channel
/// (made on the first call, anew in a forked child, or larger for a higher rate than it was
/// made for), emptied of what earlier sessions left. Called by the tracer with its session
/// lock held and no session running, before the writer starts; [`publish`] then lets the
/// sampled path send to it. The caller has checked that a new channel's memory
/// ([`bytes_for`] [`capacity_for`] `rate`) can be had.
pub(crate) fn open(pid: u32, rate: f64) -> &'static Channel {
    let capacity = capacity_for(rate);
    // SAFETY: PROCESS is null or points to a leaked `Channel` that is never freed.
    let channel = match unsafe { PROCESS.load(Ordering::Acquire).as_ref() } {
        Some(channel) if channel.pid == pid && channel.capacity >= capacity => channel,
        // None, too small, or our parent's. The old one is leaked: a thread may have been
        // half-way through a send to it (in the parent, when it forked); its pooled buffers
        // are freed.
        old => {
            let channel: &'static Channel = Box::leak(Box::new(Channel::new(pid, capacity)));
            PROCESS.store(channel as *const Channel as *mut Channel, Ordering::Release);
            if let Some(old) = old.filter(|old| old.pid == pid) {
                while old.pool_rx.try_recv().is_ok() {}
            }
            channel
        }
    };
    while let Some(msg) = channel.try_recv() {
        channel.dispose(msg);
    }
    channel
}

/// Leave the process's channel to a writer thread that was given up on (it may still be
/// taking messages off it): the next session makes a new one.
pub(crate) fn abandon() {
    PROCESS.store(std::ptr::null_mut(), Ordering::Release);
}

/// How far the running session's writer has got ([`Channel::progress`]), 0 without one.
#[cfg(debug_assertions)]
pub(crate) fn writer_progress() -> u64 {
    current().map_or(0, |(channel, _)| channel.progress())
}

/// The frame buffers in the running session's pool, 0 without one.
#[cfg(debug_assertions)]
pub(crate) fn pooled_frame_buffers() -> usize {
    current().map_or(0, |(channel, _)| channel.pooled())
}

/// Let the sampled path send messages tagged `session` (the session is running).
pub(crate) fn publish(session: u32) {
    RUNNING.store(session, Ordering::Release);
}

/// Stop the sampled path from sending (the session stops, or a forked child starts).
pub(crate) fn unpublish() {
    RUNNING.store(0, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_is_sized_for_the_rate() {
        assert_eq!(capacity_for(1e-5), 16 << 10);
        assert_eq!(capacity_for(1e-4), 128 << 10);
        assert_eq!(capacity_for(1.0), MAX_CAPACITY);
        assert_eq!(capacity_for(1e-9), MIN_CAPACITY);
        assert_eq!(capacity_for(f64::NAN), MAX_CAPACITY);
        assert!(!memory_for(bytes_for(1 << 60)), "an impossible size is refused, not aborted on");
    }

    #[test]
    fn messages_are_small() {
        assert!(std::mem::size_of::<Msg>() <= 48, "{}", std::mem::size_of::<Msg>());
        const { assert!(MAX_FRAMES <= u8::MAX as usize) };
    }

    fn alloc(frames: Frames) -> Msg {
        Msg::Alloc { session: 1, nframes: 0, epoch: 0, addr: 8, time: 0, length: 1, nsamples: 1, frames }
    }

    fn free() -> Msg {
        Msg::Free { session: 1, addr: 8, time: 0 }
    }

    #[test]
    fn a_full_queue_refuses_without_waiting_and_keeps_frame_buffers() {
        let channel = Channel::new(0, MIN_CAPACITY);
        channel.fill_pool(INITIAL_POOL);
        assert!(channel.try_send(alloc(channel.frames_for_alloc().unwrap())));
        for _ in 1..MIN_CAPACITY {
            assert!(channel.try_send(free()));
        }
        let pooled = channel.pool_rx.len();
        assert!(!channel.try_send(alloc(channel.frames_for_alloc().unwrap())));
        assert_eq!(channel.pool_rx.len(), pooled, "the refused message's buffer went back to the pool");
        assert!(!channel.try_send(free()));
        assert!(matches!(channel.try_recv(), Some(Msg::Alloc { session: 1, .. })));
    }

    /// The first alloc sample after a writer put its bell out rings it, once, and gives the
    /// bell's share back; a writer that ends takes its bell back.
    #[test]
    fn the_first_sample_rings_the_writers_bell() {
        let channel = Channel::new(0, MIN_CAPACITY);
        let bell = Arc::new(Doorbell::default());
        channel.ring_at_first_sample(Arc::clone(&bell), 1);
        assert_eq!(Arc::strong_count(&bell), 2);
        channel.sample_sent(2);
        assert_eq!(Arc::strong_count(&bell), 2, "another session's sample leaves the bell alone");
        let waiter = {
            let bell = Arc::clone(&bell);
            std::thread::spawn(move || {
                let waiting = std::time::Instant::now();
                bell.wait(std::time::Duration::from_secs(60));
                waiting.elapsed()
            })
        };
        channel.sample_sent(1);
        assert!(waiter.join().unwrap() < std::time::Duration::from_secs(60), "woken by the ring");
        assert_eq!(Arc::strong_count(&bell), 1, "the channel's share was dropped");
        channel.sample_sent(1);
        channel.ring_at_first_sample(Arc::clone(&bell), 1);
        channel.ring_at_first_sample(Arc::clone(&bell), 1);
        assert_eq!(Arc::strong_count(&bell), 2, "a bell put out again replaces the one there");
        channel.no_first_sample_bell();
        assert_eq!(Arc::strong_count(&bell), 1);
    }

    #[test]
    fn allocs_stop_at_the_limit_once_the_pool_is_empty() {
        let channel = Channel::new(0, MIN_CAPACITY);
        channel.fill_pool(INITIAL_POOL);
        assert_eq!(channel.pool_rx.len(), INITIAL_POOL);
        let mut sent = 0;
        while channel.tx.len() < channel.alloc_limit {
            match channel.frames_for_alloc() {
                Ok(frames) => assert!(channel.try_send(alloc(frames))),
                Err(e) => panic!("{e:?} after {sent} allocs"),
            }
            sent += 1;
        }
        assert!(channel.pool_rx.is_empty(), "every pooled buffer is in the queue");
        assert!(sent > INITIAL_POOL, "the pool grew on demand");
        assert_eq!(channel.frames_for_alloc().unwrap_err(), NoFrames::WriterBehind);
        // Frees still have the other half of the queue.
        for _ in channel.alloc_limit..MIN_CAPACITY {
            assert!(channel.try_send(free()));
        }
        // The writer takes one alloc and gives its buffer back: one more alloc may go, past the
        // limit, with the pooled buffer (the overshoot is bounded by the pool's size).
        let Some(Msg::Alloc { frames, .. }) = channel.try_recv() else { panic!("an alloc first") };
        channel.recycle(frames);
        assert!(channel.try_send(alloc(channel.frames_for_alloc().unwrap())));
        assert_eq!(channel.frames_for_alloc().unwrap_err(), NoFrames::WriterBehind);
    }
}
