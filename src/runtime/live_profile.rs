//! The live profile the writer keeps beside the trace: the live sampled blocks by stack
//! (stacks interned), what each stack allocated since the start, and what was live when the
//! live heap was at its highest so far.
//!
//! Its memory is bounded by the live samples, not by the run: a stack with live blocks is
//! always kept, and so is the peak's copy of the stacks live at the peak, but of the stacks
//! with nothing live (kept for the allocated figures only) at most [`IDLE_STACKS`]; beyond,
//! the least recently sampled are folded into one pseudo-stack, `<memtrace>` /
//! `<stacks folded: …>`, which carries their allocated totals. Totals stay exact in sum, and
//! every profile of allocated figures shows what lost its detail. Spans whose field values vary
//! per request make distinct stacks grow with the run; this is where that stops.
//!
//! The live blocks are also what a trace that starts while the session runs (a window, a new
//! file of a series) begins with ([`LiveProfile::live_blocks`]): each keeps its sample points
//! at the rate it was sampled at, so that it carries over with its own rate's weight. The
//! profile's figures are in the units of the session's first rate: a sample taken at another
//! (after `set_rate`) is rescaled to it, without bias (`sampler::rescale`).
//!
//! A profile is asked of the writer through the session's [`Mailbox`]: the writer answers
//! between two rounds of messages with a [`Snapshot`] (figures and shared frame names, no
//! encoding), and the thread that asked encodes it (`runtime::profile`). Application threads
//! take no part: their samples reach the writer as they do for the trace.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{Receiver, Sender};

use super::sampler;
use super::span_table::{pseudo_location, LOST_SAMPLES_FILE};
use super::spans::Pseudo;
use super::tracer_thread::Doorbell;
use crate::format::hash::FastMap;
use crate::format::location_codec::Location;

/// The source locations of one frame (a location code): the inlined functions, outermost
/// first.
pub(crate) type CodeLocations = Arc<[Location]>;

/// Stacks with no live block kept for their allocated figures (their memory is some hundreds
/// of bytes each, by their depth); the least recently sampled beyond are folded.
pub(crate) const IDLE_STACKS: usize = 8192;

/// The id of the pseudo-stack of the folded stacks' allocated totals (ids of stacks count up
/// from 0 and are never reused).
pub(crate) const FOLDED_STACK_ID: u64 = u64::MAX;

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
    /// Its location codes, innermost first (its key in `stack_ids`).
    codes: Arc<[u64]>,
    /// Its frames' locations, innermost first.
    frames: Arc<[CodeLocations]>,
    allocated: Figures,
    live: Figures,
    /// Its live sampled blocks.
    live_blocks: u64,
    /// When it was last sampled (a count of samples); its key in `idle` while it has no live
    /// block.
    last_sampled: u64,
    /// A site of lost samples: never folded, so that the loss stays in sight.
    pinned: bool,
}

/// The writer's live profile.
pub(crate) struct LiveProfile {
    rate: f64,
    started: SystemTime,
    /// Stack ids by location codes (innermost first).
    stack_ids: FastMap<Arc<[u64]>, u64>,
    stacks: FastMap<u64, Stack>,
    /// The next new stack's id.
    next_id: u64,
    /// The stacks with no live block (but pinned ones), by when they were last sampled.
    idle: BTreeMap<u64, u64>,
    /// How many of them are kept (see [`IDLE_STACKS`]).
    idle_budget: usize,
    /// The allocated figures of the stacks folded, and how many were.
    folded: Figures,
    folded_stacks: u64,
    /// Samples counted so far: the clock of `last_sampled`.
    sampled: u64,
    /// Each live sampled block, by address.
    blocks: FastMap<usize, Block>,
    /// The state of the draws that rescale samples taken at another rate.
    rng: u64,
    /// Sample points of all live blocks.
    live_samples: u64,
    peak: Peak,
    /// Requests taken, waiting for the writer to catch up with the queue.
    waiting: Vec<Request>,
}

/// A live sampled block.
struct Block {
    /// Its stack's id.
    stack: u64,
    /// Its figures, in the profile's units.
    figures: Figures,
    /// Its size in words, its sample points and the rate they were found at.
    length: u64,
    nsamples: u64,
    rate: f64,
}

/// A live sampled block as a trace that starts now carries it over (see
/// [`LiveProfile::live_blocks`]).
pub(crate) struct LiveBlock<'a> {
    pub(crate) addr: usize,
    /// Size in words.
    pub(crate) length: u64,
    /// Sample points, at `rate`.
    pub(crate) nsamples: u64,
    pub(crate) rate: f64,
    /// Its stack's location codes and their locations, innermost first.
    pub(crate) codes: &'a [u64],
    pub(crate) frames: &'a [CodeLocations],
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
    /// The stacks live at the high and their live figures then, by id, once copied: with
    /// their frames, as a stack may be folded since.
    live: FastMap<u64, (Arc<[CodeLocations]>, Figures)>,
    at: Option<SystemTime>,
}

impl LiveProfile {
    pub(crate) fn new(rate: f64) -> LiveProfile {
        LiveProfile::with_idle_budget(rate, IDLE_STACKS)
    }

    /// A profile that keeps `idle_budget` stacks with no live block (see [`IDLE_STACKS`]).
    pub(crate) fn with_idle_budget(rate: f64, idle_budget: usize) -> LiveProfile {
        LiveProfile {
            rate,
            started: SystemTime::now(),
            stack_ids: FastMap::default(),
            stacks: FastMap::default(),
            next_id: 0,
            idle: BTreeMap::new(),
            idle_budget,
            folded: Figures::default(),
            folded_stacks: 0,
            sampled: 0,
            blocks: FastMap::default(),
            rng: sampler::next_u64(&mut (std::process::id() as u64 ^ 0x6c69_7665)) | 1,
            live_samples: 0,
            peak: Peak::default(),
            waiting: Vec::new(),
        }
    }

    /// [`alloc_at`](LiveProfile::alloc_at) the profile's own rate.
    #[cfg(test)]
    pub(crate) fn alloc(
        &mut self,
        addr: usize,
        length: u64,
        nsamples: u64,
        codes: &[u64],
        locations_of: impl FnMut(u64) -> CodeLocations,
    ) {
        self.alloc_at(addr, length, nsamples, self.rate, codes, locations_of);
    }

    /// A sampled block of `length` words with `nsamples` sample points found at `rate`,
    /// allocated at `addr` by the stack of location `codes` (innermost first), whose locations
    /// `locations_of` gives.
    pub(crate) fn alloc_at(
        &mut self,
        addr: usize,
        length: u64,
        sampled: u64,
        rate: f64,
        codes: &[u64],
        mut locations_of: impl FnMut(u64) -> CodeLocations,
    ) {
        let nsamples = sampler::rescale(sampled, rate, self.rate, &mut self.rng);
        let figures = Figures { samples: nsamples, objects: nsamples as f64 / (length.max(1) as f64 * self.rate) };
        // A block at an address not freed (a lost free) is not live any more.
        if let Some(old) = self.blocks.remove(&addr) {
            self.remove_live(old.stack, old.figures);
        }
        self.sampled += 1;
        let id = match self.stack_ids.get(codes) {
            Some(&id) => id,
            None => {
                let id = self.next_id;
                self.next_id += 1;
                let codes: Arc<[u64]> = codes.into();
                let frames = codes.iter().map(|&code| locations_of(code)).collect();
                let pinned = matches!(codes[..], [code] if matches!(Pseudo::of(code), Some(Pseudo::Lost(_))));
                let stack = Stack {
                    codes: Arc::clone(&codes),
                    frames,
                    allocated: Figures::default(),
                    live: Figures::default(),
                    live_blocks: 0,
                    last_sampled: self.sampled,
                    pinned,
                };
                self.stacks.insert(id, stack);
                self.stack_ids.insert(codes, id);
                id
            }
        };
        let stack = self.stacks.get_mut(&id).expect("an interned stack is kept");
        if stack.live_blocks == 0 {
            self.idle.remove(&stack.last_sampled);
        }
        stack.last_sampled = self.sampled;
        stack.live_blocks += 1;
        stack.allocated.add(figures);
        stack.live.add(figures);
        self.blocks.insert(addr, Block { stack: id, figures, length, nsamples: sampled, rate });
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
        block.map(|block| self.remove_live(block.stack, block.figures)).is_some()
    }

    /// The live sampled blocks, each with its stack and the points it was sampled with.
    pub(crate) fn live_blocks(&self) -> impl Iterator<Item = LiveBlock<'_>> {
        self.blocks.iter().map(|(&addr, block)| {
            let stack = &self.stacks[&block.stack];
            LiveBlock {
                addr,
                length: block.length,
                nsamples: block.nsamples,
                rate: block.rate,
                codes: &stack.codes,
                frames: &stack.frames,
            }
        })
    }

    fn remove_live(&mut self, id: u64, figures: Figures) {
        if self.peak.is_now {
            self.peak.is_now = false;
            self.peak.live.clear();
            let live = self.stacks.iter().filter(|(_, s)| s.live_blocks > 0);
            self.peak.live.extend(live.map(|(&id, s)| (id, (Arc::clone(&s.frames), s.live))));
        }
        self.live_samples -= figures.samples;
        let stack = self.stacks.get_mut(&id).expect("a stack with a live block is kept");
        stack.live.remove(figures);
        stack.live_blocks -= 1;
        if stack.live_blocks == 0 && !stack.pinned {
            self.idle.insert(stack.last_sampled, id);
            self.fold_idle_beyond_budget();
        }
    }

    /// Fold the least recently sampled stacks with no live block beyond the budget.
    fn fold_idle_beyond_budget(&mut self) {
        while self.idle.len() > self.idle_budget {
            let Some((_, id)) = self.idle.pop_first() else { return };
            let stack = self.stacks.remove(&id).expect("an idle stack is kept");
            self.stack_ids.remove(&stack.codes);
            self.folded.add(stack.allocated);
            self.folded_stacks += 1;
        }
    }

    /// The profile as it stands: every stack with something allocated, the folded stacks'
    /// pseudo-stack, and the stacks live at the peak.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let at_peak = |id: u64, s: &Stack| {
            if self.peak.is_now {
                s.live
            } else {
                self.peak.live.get(&id).map(|(_, figures)| *figures).unwrap_or_default()
            }
        };
        let mut stacks: Vec<StackFigures> = self
            .stacks
            .iter()
            .map(|(&id, s)| StackFigures {
                id,
                frames: Arc::clone(&s.frames),
                allocated: s.allocated,
                live: s.live,
                at_peak: at_peak(id, s),
            })
            .collect();
        if self.folded_stacks > 0 {
            let name = format!("<stacks folded: allocated totals of {} stacks no longer live>", self.folded_stacks);
            let location = pseudo_location(LOST_SAMPLES_FILE, 0, &name);
            stacks.push(StackFigures {
                id: FOLDED_STACK_ID,
                frames: Arc::new([Arc::new([location]) as CodeLocations]),
                allocated: self.folded,
                live: Figures::default(),
                at_peak: Figures::default(),
            });
        }
        if !self.peak.is_now {
            // Stacks live at the peak and folded since.
            let folded = self.peak.live.iter().filter(|(id, _)| !self.stacks.contains_key(id));
            stacks.extend(folded.map(|(&id, (frames, at_peak))| StackFigures {
                id,
                frames: Arc::clone(frames),
                allocated: Figures::default(),
                live: Figures::default(),
                at_peak: *at_peak,
            }));
        }
        // In the order they were first sampled, whatever the maps' order.
        stacks.sort_unstable_by_key(|s| s.id);
        Snapshot { rate: self.rate, started: self.started, taken: SystemTime::now(), peak_at: self.peak.at, stacks }
    }
}

/// One stack's figures in a [`Snapshot`].
#[derive(Clone)]
pub(crate) struct StackFigures {
    /// The stack's id in its session (the same stack in two snapshots of a session; a folded
    /// stack's id is not reused), or [`FOLDED_STACK_ID`].
    pub(crate) id: u64,
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
pub(crate) mod tests {
    use super::*;

    /// Locations of `code`: one function, `f{code}`.
    pub(crate) fn named(code: u64) -> CodeLocations {
        let name: Arc<[u8]> = format!("f{code}").into_bytes().into();
        Arc::new([Location { filename: b"f.rs"[..].into(), line: 1, start_char: 0, end_char: 0, defname: name }])
    }

    fn live_of(snapshot: &Snapshot, id: u64) -> (u64, u64) {
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

    fn total_allocated(snapshot: &Snapshot) -> u64 {
        snapshot.stacks.iter().map(|s| s.allocated.samples).sum()
    }

    fn function_of(stack: &StackFigures) -> String {
        String::from_utf8_lossy(&stack.frames[0][0].defname).into_owned()
    }

    /// Beyond the budget, the least recently sampled stacks with no live block are folded
    /// into one pseudo-stack: totals stay exact, the stacks kept are the live ones, the
    /// budget's most recent idle ones and the lost samples' site, and the tables stay that
    /// small however many stacks were sampled.
    #[test]
    fn idle_stacks_beyond_the_budget_are_folded_and_totals_kept() {
        const BUDGET: usize = 4;
        let mut p = LiveProfile::with_idle_budget(1.0, BUDGET);
        let lost = Pseudo::Lost(0).code();
        p.alloc(0x8, 1, 9, &[lost], named);
        p.free(0x8);
        p.alloc(0x10, 1, 3, &[1000], named);
        p.alloc(0x20, 1, 4, &[1001], named);
        let mut truth = 9 + 3 + 4;
        for code in 0..1000u64 {
            p.alloc(0x100, 1, code % 5 + 1, &[code], named);
            p.free(0x100);
            truth += code % 5 + 1;
            // However many stacks were sampled: the live ones, the lost samples' site and the budget.
            assert!(p.stacks.len() <= 2 + 1 + BUDGET && p.stack_ids.len() == p.stacks.len(), "{}", p.stacks.len());
            assert!(p.idle.len() <= BUDGET);
        }
        let s = p.snapshot();
        assert_eq!(total_allocated(&s), truth);
        // Beside the stacks live at the peak (when `f4` was live), folded since.
        assert_eq!(s.stacks.iter().filter(|s| s.allocated.samples == 0).map(function_of).collect::<Vec<_>>(), ["f4"]);
        let kept: Vec<String> = s.stacks.iter().filter(|s| s.allocated.samples > 0).map(function_of).collect();
        let folded = "<stacks folded: allocated totals of 996 stacks no longer live>";
        let lost = format!("f{lost}");
        assert_eq!(kept, [&lost, "f1000", "f1001", "f996", "f997", "f998", "f999", folded]);
        let pseudo = s.stacks.last().unwrap();
        assert_eq!((pseudo.id, &pseudo.frames[0][0].filename[..]), (FOLDED_STACK_ID, LOST_SAMPLES_FILE.as_bytes()));
        assert_eq!((pseudo.live, pseudo.at_peak), (Figures::default(), Figures::default()));
        // A folded stack sampled again is a new stack, the folded figures unchanged.
        p.alloc(0x100, 1, 2, &[0], named);
        let s = p.snapshot();
        assert_eq!(total_allocated(&s), truth + 2);
        assert_eq!(s.stacks.iter().filter(|s| function_of(s) == "f0").count(), 1);
        // Stacks with live blocks are kept beyond the budget: they are bounded by the live samples.
        for code in 2000..2100 {
            p.alloc(0x1000 + code as usize * 16, 1, 1, &[code], named);
        }
        assert_eq!(p.snapshot().stacks.len(), 2 + 1 + 1 + BUDGET + 100 + 1);
    }

    /// The peak keeps the stacks live at the peak, and their frames, after they were folded.
    #[test]
    fn the_peak_keeps_its_stacks_when_they_are_folded() {
        let mut p = LiveProfile::with_idle_budget(1.0, 1);
        p.alloc(0x10, 1, 5, &[1], named);
        p.alloc(0x20, 1, 6, &[2], named);
        p.free(0x10);
        p.free(0x20);
        for code in 10..20 {
            p.alloc(0x30, 1, 1, &[code], named);
            p.free(0x30);
        }
        let s = p.snapshot();
        let at_peak: Vec<(String, u64)> =
            s.stacks.iter().filter(|s| s.at_peak.samples > 0).map(|s| (function_of(s), s.at_peak.samples)).collect();
        assert_eq!(at_peak, [("f1".to_owned(), 5), ("f2".to_owned(), 6)]);
        assert_eq!(total_allocated(&s), 5 + 6 + 10);
        // Only the budget's one idle stack and the folded ones' are kept beside the peak's.
        assert_eq!(p.stacks.len(), 1);
        assert_eq!(s.stacks.iter().filter(|s| s.allocated.samples > 0).count(), 2);
    }

    /// A block sampled at another rate counts in the profile's units, and is carried over
    /// with its own points and rate, its stack's codes and frames.
    #[test]
    fn live_blocks_keep_their_own_rate() {
        let mut p = LiveProfile::new(1e-5);
        p.alloc_at(0x10, 4, 3, 1e-7, &[7, 8], named);
        p.alloc(0x20, 2, 5, &[9], named);
        p.free(0x20);
        let blocks: Vec<_> =
            p.live_blocks().map(|b| (b.addr, b.length, b.nsamples, b.rate, b.codes.to_vec())).collect();
        assert_eq!(blocks, [(0x10, 4, 3, 1e-7, vec![7, 8])]);
        assert_eq!(p.live_blocks().next().unwrap().frames[1][0].defname[..], b"f8"[..]);
        // In the profile's units: each point at 1e-7 stands for 100 at 1e-5.
        assert_eq!(p.snapshot().stacks[0].live.samples, 300);
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
