//! The live profile the writer keeps beside the trace: the live sampled blocks by stack
//! (stacks interned), what each stack allocated since the start, and what was live when the
//! live heap was at its highest so far. Its memory grows with the live sampled blocks and the
//! distinct stacks sampled, not with the run's length.
//!
//! A profile is asked of the writer through the session's [`Mailbox`]: the writer answers
//! between two rounds of messages with a [`Snapshot`] (figures and shared frame names, no
//! encoding), and the thread that asked encodes it (`runtime::profile`). Application threads
//! take no part: their samples reach the writer as they do for the trace.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{Receiver, Sender};

use super::tracer_thread::Doorbell;
use crate::format::hash::FastMap;
use crate::format::location_codec::Location;

/// The source locations of one frame (a location code): the inlined functions, outermost
/// first.
pub(crate) type CodeLocations = Arc<[Location]>;

/// Sampled figures: sample points, and the objects they stand for (estimated as the
/// analysis does, `nsamples / (length × rate)`, summed).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Figures {
    pub(crate) samples: u64,
    pub(crate) objects: f64,
}

impl Figures {
    fn add(&mut self, other: Figures) {
        self.samples += other.samples;
        self.objects += other.objects;
    }

    fn remove(&mut self, other: Figures) {
        self.samples = self.samples.saturating_sub(other.samples);
        // Never below zero from rounding.
        self.objects = (self.objects - other.objects).max(0.0);
    }
}

/// One interned stack and its figures.
struct Stack {
    /// Its frames' locations, innermost frame first.
    frames: Arc<[CodeLocations]>,
    allocated: Figures,
    live: Figures,
}

/// The writer's live profile.
pub(crate) struct LiveProfile {
    rate: f64,
    started: SystemTime,
    /// Stack ids by location codes (innermost first).
    stack_ids: FastMap<Box<[u64]>, u32>,
    stacks: Vec<Stack>,
    /// The stack and figures of each live sampled block, by address.
    blocks: FastMap<usize, (u32, Figures)>,
    /// Sample points of all live blocks.
    live_samples: u64,
    peak: Peak,
    /// Requests taken, waiting for the writer to catch up with the queue.
    waiting: Vec<Request>,
}

/// The live heap at its highest so far (by sample points, which bytes are proportional to).
/// Copying every stack's live figures at each new high would cost as much as the stacks at
/// each sample of a growing heap: they are copied only when the heap first falls from a new
/// high (dhat's way), and until then the current live figures are the peak's. A heap that
/// rises and falls around its high would still make that a copy per sample: once copied, a
/// peak is replaced only by a higher one by more than 1/[`PEAK_MARGIN`] of it, so that the
/// peak profile is of a time when the live heap was within that of its highest.
const PEAK_MARGIN: u64 = 1024;

/// See [`PEAK_MARGIN`].
#[derive(Default)]
struct Peak {
    samples: u64,
    /// Whether the live heap is at the high now (its figures not copied).
    is_now: bool,
    /// Each stack's live figures at the high, once copied.
    live: Vec<Figures>,
    at: Option<SystemTime>,
}

impl LiveProfile {
    pub(crate) fn new(rate: f64) -> LiveProfile {
        LiveProfile {
            rate,
            started: SystemTime::now(),
            stack_ids: FastMap::default(),
            stacks: Vec::new(),
            blocks: FastMap::default(),
            live_samples: 0,
            peak: Peak::default(),
            waiting: Vec::new(),
        }
    }

    /// A sampled block of `length` words with `nsamples` sample points allocated at `addr` by
    /// the stack of location `codes` (innermost first), whose locations `locations_of` gives.
    pub(crate) fn alloc(
        &mut self,
        addr: usize,
        length: u64,
        nsamples: u64,
        codes: &[u64],
        mut locations_of: impl FnMut(u64) -> CodeLocations,
    ) {
        let stack = match self.stack_ids.get(codes) {
            Some(&id) => id,
            None => {
                let id = self.stacks.len() as u32;
                let frames = codes.iter().map(|&code| locations_of(code)).collect();
                self.stacks.push(Stack { frames, allocated: Figures::default(), live: Figures::default() });
                self.stack_ids.insert(codes.into(), id);
                id
            }
        };
        let figures = Figures { samples: nsamples, objects: nsamples as f64 / (length.max(1) as f64 * self.rate) };
        // A block at an address not freed (a lost free) is not live any more.
        if let Some(old) = self.blocks.insert(addr, (stack, figures)) {
            self.remove_live(old);
        }
        let entry = &mut self.stacks[stack as usize];
        entry.allocated.add(figures);
        entry.live.add(figures);
        self.live_samples += nsamples;
        // A new high while at the high, or one above the copied peak by more than its margin.
        let margin = if self.peak.is_now { 0 } else { self.peak.samples / PEAK_MARGIN };
        if self.live_samples > self.peak.samples + margin {
            self.peak.samples = self.live_samples;
            self.peak.is_now = true;
            self.peak.at = Some(SystemTime::now());
        }
    }

    /// Whether the sampled block at `addr` is live in the profile.
    pub(crate) fn holds(&self, addr: usize) -> bool {
        self.blocks.contains_key(&addr)
    }

    /// The sampled block at `addr` was freed: whether it was in the profile.
    pub(crate) fn free(&mut self, addr: usize) -> bool {
        let block = self.blocks.remove(&addr);
        block.map(|block| self.remove_live(block)).is_some()
    }

    fn remove_live(&mut self, (stack, figures): (u32, Figures)) {
        if self.peak.is_now {
            self.peak.is_now = false;
            self.peak.live.clear();
            self.peak.live.extend(self.stacks.iter().map(|s| s.live));
        }
        self.stacks[stack as usize].live.remove(figures);
        self.live_samples -= figures.samples;
    }

    /// The profile as it stands: every stack with something allocated.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let stacks = self
            .stacks
            .iter()
            .enumerate()
            .map(|(id, s)| StackFigures {
                id: id as u32,
                frames: Arc::clone(&s.frames),
                allocated: s.allocated,
                live: s.live,
                at_peak: if self.peak.is_now { s.live } else { self.peak.live.get(id).copied().unwrap_or_default() },
            })
            .collect();
        Snapshot { rate: self.rate, started: self.started, taken: SystemTime::now(), peak_at: self.peak.at, stacks }
    }
}

/// One stack's figures in a [`Snapshot`].
#[derive(Clone)]
pub(crate) struct StackFigures {
    /// The stack's id in its session (the same stack in two snapshots of a session).
    pub(crate) id: u32,
    /// Its frames' locations, innermost frame first.
    pub(crate) frames: Arc<[CodeLocations]>,
    /// Allocated since the start.
    pub(crate) allocated: Figures,
    /// Live now.
    pub(crate) live: Figures,
    /// Live when the live heap was at its highest.
    pub(crate) at_peak: Figures,
}

/// The live profile at one time.
#[derive(Clone)]
pub(crate) struct Snapshot {
    /// The session's sampling rate.
    pub(crate) rate: f64,
    /// When the session started.
    pub(crate) started: SystemTime,
    pub(crate) taken: SystemTime,
    /// When the live heap was last at its highest, if anything was sampled.
    pub(crate) peak_at: Option<SystemTime>,
    pub(crate) stacks: Vec<StackFigures>,
}

/// A request for a snapshot: where to send it, and when it was asked.
pub(crate) struct Request {
    reply: Sender<Snapshot>,
    asked: Instant,
}

/// Where a session's writer takes profile requests: the requests and the writer's doorbell,
/// rung so that a request is answered at once rather than after the writer's sleep.
#[derive(Clone)]
pub(crate) struct Mailbox {
    requests: Sender<Request>,
    doorbell: Arc<Doorbell>,
}

/// Requests waiting at most (more are refused at once).
const WAITING_REQUESTS: usize = 8;

/// A new mailbox for the writer that `doorbell` wakes, and its receiving end (the writer's).
pub(crate) fn mailbox(doorbell: Arc<Doorbell>) -> (Mailbox, Receiver<Request>) {
    let (requests, received) = crossbeam_channel::bounded(WAITING_REQUESTS);
    (Mailbox { requests, doorbell }, received)
}

/// Why no snapshot came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NoSnapshot {
    /// The session ended (or its writer did) before answering.
    Ended,
    /// Too many requests are waiting, or the writer did not answer in time.
    Busy,
}

impl Mailbox {
    /// A snapshot from the writer, waiting at most `timeout` for it.
    pub(crate) fn snapshot(&self, timeout: Duration) -> Result<Snapshot, NoSnapshot> {
        let (reply, answer) = crossbeam_channel::bounded(1);
        self.requests.try_send(Request { reply, asked: Instant::now() }).map_err(|e| match e {
            crossbeam_channel::TrySendError::Full(_) => NoSnapshot::Busy,
            crossbeam_channel::TrySendError::Disconnected(_) => NoSnapshot::Ended,
        })?;
        self.doorbell.ring();
        answer.recv_timeout(timeout).map_err(|e| match e {
            crossbeam_channel::RecvTimeoutError::Timeout => NoSnapshot::Busy,
            crossbeam_channel::RecvTimeoutError::Disconnected => NoSnapshot::Ended,
        })
    }
}

/// How long a request waits for the writer to find the queue empty: a program that keeps it
/// busy gets a snapshot that misses the samples queued last.
const CATCH_UP: Duration = Duration::from_millis(200);

impl LiveProfile {
    /// Take the requests waiting in `requests` (on the writer, as a round of messages begins:
    /// the samples of the allocations made before a request are queued before it is taken).
    pub(crate) fn take_requests(&mut self, requests: &Receiver<Request>) {
        let room = WAITING_REQUESTS.saturating_sub(self.waiting.len());
        self.waiting.extend(requests.try_iter().take(room));
    }

    /// Answer the requests taken, once the round `drained` the queue (the samples queued
    /// before them are counted), or once they waited [`CATCH_UP`].
    pub(crate) fn answer(&mut self, drained: bool) {
        if self.waiting.is_empty() || !(drained || self.waiting[0].asked.elapsed() >= CATCH_UP) {
            return;
        }
        let snapshot = self.snapshot();
        for request in self.waiting.drain(..) {
            // An asker that gave up has dropped its end.
            let _ = request.reply.try_send(snapshot.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(code: u64) -> CodeLocations {
        let name: Arc<[u8]> = format!("f{code}").into_bytes().into();
        Arc::new([Location { filename: b"f.rs"[..].into(), line: 1, start_char: 0, end_char: 0, defname: name }])
    }

    fn live_of(snapshot: &Snapshot, id: u32) -> (u64, u64) {
        let s = snapshot.stacks.iter().find(|s| s.id == id).unwrap();
        (s.live.samples, s.at_peak.samples)
    }

    /// Live figures follow allocations and frees by stack; allocated ones only grow; the peak
    /// keeps each stack's live figures at the highest live total, through later frees and
    /// lower highs.
    #[test]
    fn live_allocated_and_peak_figures_by_stack() {
        let mut p = LiveProfile::new(0.5);
        p.alloc(0x10, 4, 2, &[1, 2], named);
        p.alloc(0x20, 4, 3, &[3], named);
        p.alloc(0x30, 4, 1, &[1, 2], named);
        let s = p.snapshot();
        assert_eq!(s.stacks.len(), 2);
        assert_eq!(live_of(&s, 0), (3, 3));
        assert_eq!(s.stacks[0].allocated.objects, 2.0 / (4.0 * 0.5) + 1.0 / (4.0 * 0.5));
        assert_eq!(s.stacks[0].frames.len(), 2);
        p.free(0x20);
        p.free(0x10);
        // A lower high than the peak (6) leaves the peak's figures.
        p.alloc(0x40, 4, 4, &[3], named);
        let s = p.snapshot();
        assert_eq!((live_of(&s, 0), live_of(&s, 1)), ((1, 3), (4, 3)));
        assert_eq!(s.stacks[1].allocated.samples, 7);
        // A new high: the peak is the live heap until it falls.
        p.alloc(0x50, 4, 5, &[1, 2], named);
        assert_eq!(live_of(&p.snapshot(), 0), (6, 6));
        p.free(0x50);
        p.free(0x77);
        let s = p.snapshot();
        assert_eq!((live_of(&s, 0), live_of(&s, 1)), ((1, 6), (4, 4)));
    }

    /// Once copied, a peak is replaced only by a high above it by more than its margin.
    #[test]
    fn a_copied_peak_is_replaced_only_by_a_higher_one_beyond_its_margin() {
        let mut p = LiveProfile::new(1.0);
        p.alloc(0x10, 1, 2048, &[1], named);
        p.free(0x10);
        p.alloc(0x20, 1, 2050, &[2], named);
        p.free(0x20);
        let s = p.snapshot();
        assert_eq!((s.stacks[0].at_peak.samples, s.stacks[1].at_peak.samples), (2048, 0));
        p.alloc(0x30, 1, 2051, &[2], named);
        p.alloc(0x40, 1, 1, &[2], named);
        let s = p.snapshot();
        assert_eq!((s.stacks[0].at_peak.samples, s.stacks[1].at_peak.samples), (0, 2052));
    }

    /// A block allocated again at an address whose free was lost is counted once.
    #[test]
    fn a_block_at_a_live_address_replaces_it() {
        let mut p = LiveProfile::new(1.0);
        p.alloc(0x10, 1, 1, &[1], named);
        p.alloc(0x10, 1, 1, &[1], named);
        let s = p.snapshot();
        assert_eq!((s.stacks[0].live.samples, s.stacks[0].allocated.samples), (1, 2));
    }

    #[test]
    fn the_writer_answers_requests_and_an_ended_writer_says_so() {
        let (mailbox, requests) = mailbox(Arc::new(Doorbell::default()));
        let writer = std::thread::spawn(move || {
            let mut p = LiveProfile::new(1.0);
            p.alloc(0x10, 1, 1, &[1], named);
            while let Ok(request) = requests.recv() {
                let _ = request.reply.send(p.snapshot());
            }
        });
        assert_eq!(mailbox.snapshot(Duration::from_secs(10)).unwrap().stacks.len(), 1);
        let (ended, requests) = super::mailbox(Arc::new(Doorbell::default()));
        drop(requests);
        assert_eq!(ended.snapshot(Duration::from_secs(10)).err(), Some(NoSnapshot::Ended));
        drop(mailbox);
        writer.join().unwrap();
    }
}
