//! The one streaming pass every analysis is built on.
//!
//! [`Analysis::run`] reads a trace event by event and keeps only what grows with the
//! program's structure, never with the trace's length:
//! - distinct stacks, as nodes of a trie of location codes ([`StackTrie`]), each with its
//!   allocation totals and its live estimate (at the end, at the peak of the total live
//!   estimate, and at an optional chosen time);
//! - the live set: every sampled object not yet collected, with its stack, samples and
//!   birth (for the temporary figure: what is freed within [`TEMPORARY_US`]);
//! - event counts, a histogram of sizes, and the total live estimate with its peak;
//! - a [`Timeline`] of fixed size, whose buckets widen as the trace gets longer.
//!
//! Stacks share the nodes of their common outer frames, and each allocation costs only the
//! frames its backtrace adds to the previous one's ([`StackInterner`]): a crafted trace of
//! ever deeper stacks takes memory and time linear in its size, not in stacks × depth.
//!
//! A trace that begins with the blocks live at its start (a window, a later file of a series:
//! [`Info::begins_with_live_blocks`]) has them as allocations of source `Major`: they count in
//! every live figure (at the end, at the peak, at a time) and in no allocated one
//! ([`Counts::live_at_start`]).
//!
//! At the end the location codes of the trie are resolved once each into [`Frame`]s.
//! Estimates follow the trace's rate and word size ([`Info::bytes_for_samples`]); the number
//! of objects an allocation of `length` words with `nsamples` samples stands for is
//! estimated as `nsamples / (length × rate)`, whose expectation is one when every word of
//! the object could be sampled.
//!
//! # Limitation: sizes that are not whole words
//!
//! The format records sizes in words. This crate's allocator records a Rust allocation of
//! `n` bytes as `length = ceil(n / 8)` words but samples only its `n` bytes (on average
//! `nsamples = n × rate / 8`), so the object estimate of an allocation whose size is not a
//! multiple of 8 bytes has expectation `n / (8 × length)` instead of one: object counts
//! are under-estimated, by 7/8 for 1-byte allocations, by 7/16 for 9-byte ones, and less
//! the larger the allocation. Byte estimates (`nsamples × word size / 8 / rate`) are
//! unaffected. The exact size is not in the trace, so the bias cannot be corrected here.
//! (OCaml traces allocate whole words and are not affected.)
//!
//! # Huge sample counts
//!
//! Sample and word totals saturate at `u64::MAX` instead of wrapping (a trace may hold
//! allocations of up to `i64::MAX` samples each); the live total and each stack's live
//! figures are kept exactly in 128 bits while reading and saturate only when reported.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use super::blocks::{PeakFinder, PROGRESS_EVERY};
use super::estimate::Estimate;
use super::stacks::{NodeId, StackInterner, StackTrie, ROOT};
use crate::format::hash::FastMap;
use crate::format::location_codec::Location;
use crate::format::trace::{AllocSource, EventKind, Info, LocationTable, ObjectId, Reader, Timestamp, Warning};
use crate::inert::inert_bytes;
use crate::trace::{LOST_SAMPLES_FILE, SPAN_FILE_PREFIX, THREAD_FILE};
use crate::Result;

/// Allocations freed within this many µs of their allocation count as temporary
/// ([`Measure::Temporary`]).
pub const TEMPORARY_US: u64 = 1_000;

/// Entries of [`Analysis::sizes`]: one per power of two of a `u64`, and one for zero.
const SIZE_BUCKETS: usize = 65;

/// The entry of [`Analysis::sizes`] for `bytes`: 0 for zero, else the `i` with
/// `2^(i-1) ≤ bytes < 2^i`, so that a power of two (a 4 KiB page) starts its class.
fn size_bucket(bytes: u64) -> usize {
    (64 - bytes.leading_zeros()) as usize
}

/// Most buckets a [`Timeline`] holds; adjacent buckets are merged when it would overflow.
const TIMELINE_BUCKETS: usize = 1024;

/// What the pass must collect beyond the totals.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Decode backtraces and keep per-stack figures (otherwise every allocation is counted
    /// under one empty stack, which is faster).
    pub stacks: bool,
    /// Also record each stack's live estimate at this time (µs after the trace start).
    pub live_at: Option<u64>,
}

/// A sample count with the number of objects it is estimated to stand for.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tally {
    /// Sampled words.
    pub samples: u64,
    /// Estimated number of objects: too low for allocations whose size is not a whole
    /// number of words (a Rust allocation of `n` bytes is recorded as `ceil(n / 8)` words
    /// but only its `n` bytes are sampled: 1-byte allocations count 1/8 each).
    pub objects: f64,
}

impl Tally {
    /// Add to the tally; the sample count saturates at `u64::MAX`.
    fn add(&mut self, samples: u64, objects: f64) {
        self.samples = self.samples.saturating_add(samples);
        self.objects += objects;
    }
}

/// A [`Tally`] while reading: live figures go up and down, so the sample count is kept
/// in 128 bits (2^64 allocations of `u64::MAX` samples each still fit) and never wraps.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Acc {
    samples: u128,
    objects: f64,
}

impl Acc {
    fn add(&mut self, samples: u64, objects: f64) {
        self.samples = self.samples.saturating_add(u128::from(samples));
        self.objects += objects;
    }

    fn sub(&mut self, samples: u64, objects: f64) {
        self.samples = self.samples.saturating_sub(u128::from(samples));
        self.objects = (self.objects - objects).max(0.0);
    }

    /// The reported tally (saturating at `u64::MAX` samples).
    fn tally(self) -> Tally {
        Tally { samples: saturate(self.samples), objects: self.objects }
    }
}

/// `n` as a `u64`, saturating.
fn saturate(n: u128) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// The number of objects an allocation of `length` words with `samples` samples stands for
/// at sampling rate `rate`. Its expectation is one only for sizes that are whole words (the
/// allocator records sizes rounded up to words but samples only their bytes).
pub fn estimated_objects(samples: u64, length: u64, rate: f64) -> f64 {
    samples as f64 / (length.max(1) as f64 * rate)
}

/// Which figure of a stack to rank or draw by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Measure {
    /// Everything allocated over the whole trace.
    Allocated,
    /// What is still live at the end of the trace.
    LiveEnd,
    /// What is live when the total live estimate peaks.
    LivePeak,
    /// What is live at [`Options::live_at`].
    LiveAt,
    /// What was freed within [`TEMPORARY_US`] of its allocation: short-lived, temporary
    /// allocations.
    Temporary,
}

/// The figures of one stack.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StackStats {
    /// Allocation events.
    pub allocs: u64,
    /// Everything allocated.
    pub allocated: Tally,
    /// Live at the end of the trace.
    pub live_end: Tally,
    /// Live at the peak of the total live estimate.
    pub live_peak: Tally,
    /// Live at [`Options::live_at`] (zero when no time was asked for).
    pub live_at: Tally,
    /// Freed within [`TEMPORARY_US`] of the allocation.
    pub temporary: Tally,
}

impl StackStats {
    /// The figure for `measure`.
    pub fn get(&self, measure: Measure) -> Tally {
        match measure {
            Measure::Allocated => self.allocated,
            Measure::LiveEnd => self.live_end,
            Measure::LivePeak => self.live_peak,
            Measure::LiveAt => self.live_at,
            Measure::Temporary => self.temporary,
        }
    }

    /// Add `other`'s figures to these.
    pub fn add(&mut self, other: &StackStats) {
        self.allocs = self.allocs.saturating_add(other.allocs);
        for (a, b) in [
            (&mut self.allocated, other.allocated),
            (&mut self.live_end, other.live_end),
            (&mut self.live_peak, other.live_peak),
            (&mut self.live_at, other.live_at),
            (&mut self.temporary, other.temporary),
        ] {
            a.add(b.samples, b.objects);
        }
    }
}

/// A distinct backtrace and its figures.
#[derive(Debug, Clone)]
pub struct Stack {
    /// The backtrace's node in [`Analysis::trie`] ([`ROOT`] when
    /// backtraces were not decoded).
    pub node: NodeId,
    /// The stack's figures.
    pub stats: StackStats,
}

/// What a frame stands for: the program's code, or one of the pseudo-frames of this crate's
/// runtime (a `tracing` span the allocation was made in, or its thread), told apart by their
/// file names ([`SPAN_FILE_PREFIX`], [`THREAD_FILE`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// A function at a line of a file.
    #[default]
    Code,
    /// A span: its description, and its call site's file and line.
    Span,
    /// A thread: its name.
    Thread,
}

/// One source frame: a function at a line of a file (or a span or a thread, see
/// [`FrameKind`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Frame {
    /// The function (or definition) name; for a code without locations, the code in hex.
    /// Made [`inert`](super::inert()), as is the file.
    pub function: String,
    /// The source file (empty when unknown).
    pub file: String,
    /// The line (0 when unknown).
    pub line: u32,
}

impl Frame {
    /// `function (file:line)`, or just the function when the file is unknown; `span
    /// description (file:line)` for a span and `thread name` for a thread. Machine-specific
    /// path prefixes are left out (see [`short_path`]), so labels match across machines.
    pub fn label(&self) -> String {
        match self.kind() {
            FrameKind::Thread | FrameKind::Span => self.profile_name().into_owned(),
            FrameKind::Code if self.file.is_empty() || self.records_lost_samples() => self.function.clone(),
            FrameKind::Code => format!("{} ({}:{})", self.function, short_path(&self.file), self.line),
        }
    }

    /// The name a profile gives the frame (pprof's function name, a folded stack's frame), the
    /// live profiles' as the command line's: a code frame's function, `thread name` for a
    /// thread and `span description (file:line)` for a span.
    pub fn profile_name(&self) -> std::borrow::Cow<'_, str> {
        crate::naming::profile_name(&self.function, &self.file, self.line)
    }

    /// Whether this is the location of the tracer's records of lost samples (see
    /// [`LostSamples`]), the one frame of their stacks.
    pub fn records_lost_samples(&self) -> bool {
        self.file == LOST_SAMPLES_FILE
    }

    /// Whether this is the frame of a span described as `span`: its whole description
    /// (`http_request{route=/api/users}`) or its name (`http_request`).
    pub fn is_span(&self, span: &str) -> bool {
        self.kind() == FrameKind::Span
            && (self.function == span || self.function.split_once('{').is_some_and(|(name, _)| name == span))
    }

    /// What the frame stands for.
    pub fn kind(&self) -> FrameKind {
        if self.file == THREAD_FILE {
            FrameKind::Thread
        } else if self.file.starts_with(SPAN_FILE_PREFIX) {
            FrameKind::Span
        } else {
            FrameKind::Code
        }
    }
}

pub use crate::naming::short_path;

/// Index of a [`Frame`] in [`Analysis::frames`].
pub type FrameId = usize;

/// Event counts by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Allocation, promote and collect events.
    pub events: u64,
    /// Allocations on the OCaml minor heap.
    pub allocs_minor: u64,
    /// Allocations on the OCaml major heap.
    pub allocs_major: u64,
    /// External allocations (every allocation of a Rust trace).
    pub allocs_external: u64,
    /// Promote events.
    pub promotes: u64,
    /// Collect events.
    pub collects: u64,
    /// Samples of all allocations (saturating at `u64::MAX`).
    pub samples: u64,
    /// Words of all sampled allocations (saturating at `u64::MAX`).
    pub words: u64,
    /// Blocks live at the trace's start, which it begins with (see
    /// [`Info::begins_with_live_blocks`]): in none of the counts above.
    pub live_at_start: u64,
}

impl Counts {
    /// All allocation events.
    pub fn allocs(&self) -> u64 {
        self.allocs_minor.saturating_add(self.allocs_major).saturating_add(self.allocs_external)
    }
}

/// One time slice of a [`Timeline`]. Sample counts saturate at `u64::MAX`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bucket {
    /// Samples allocated during the slice.
    pub allocated: u64,
    /// Highest live sample count during the slice.
    pub live_max: u64,
    /// Live sample count at the end of the slice.
    pub live_end: u64,
}

/// The live estimate and allocation volume over time, in at most 1024 equal slices.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    /// Width of each bucket in µs.
    pub width: u64,
    /// Buckets from the trace start on; bucket `i` covers `[i × width, (i + 1) × width)` µs.
    pub buckets: Vec<Bucket>,
}

impl Timeline {
    fn new() -> Timeline {
        Timeline { width: 1, buckets: Vec::new() }
    }

    /// Record that at `at` µs after the start, `allocated` samples were allocated and
    /// `live` samples are live afterwards.
    fn record(&mut self, at: u64, allocated: u64, live: u64) {
        let mut index = at / self.width;
        while index >= TIMELINE_BUCKETS as u64 {
            self.halve();
            index = at / self.width;
        }
        let index = index as usize;
        let carried = self.buckets.last().map_or(0, |b| b.live_end);
        if index >= self.buckets.len() {
            self.buckets.resize(index + 1, Bucket { allocated: 0, live_max: carried, live_end: carried });
        }
        let bucket = &mut self.buckets[index];
        bucket.allocated = bucket.allocated.saturating_add(allocated);
        bucket.live_max = bucket.live_max.max(live);
        bucket.live_end = live;
    }

    /// Merge adjacent buckets pairwise, doubling the width.
    fn halve(&mut self) {
        let merged = self
            .buckets
            .chunks(2)
            .map(|pair| Bucket {
                allocated: pair.iter().fold(0, |sum: u64, b| sum.saturating_add(b.allocated)),
                live_max: pair.iter().map(|b| b.live_max).max().unwrap_or(0),
                live_end: pair[pair.len() - 1].live_end,
            })
            .collect();
        self.buckets = merged;
        self.width *= 2;
    }
}

/// Where a trace comes from, which decides the words used for it: Rust traces have
/// allocations and frees of sampled blocks; OCaml traces have minor and major allocations,
/// promotions, collections and domains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// This crate's allocator (or any trace of external allocations only).
    Rust,
    /// OCaml's memtrace.
    OCaml,
}

impl Origin {
    /// The origin of a trace with `info`, given whether it has OCaml events (minor or major
    /// allocations, promotions) and external allocations (see [`Analysis::origin`]).
    pub fn of(info: &Info, ocaml_events: bool, external_allocs: bool) -> Origin {
        if info.runtime_params.starts_with(b"memtrace-rs") || (!ocaml_events && external_allocs) {
            Origin::Rust
        } else {
            Origin::OCaml
        }
    }
}

/// The total live estimate at its highest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Peak {
    /// Live samples at the peak (saturating at `u64::MAX`).
    pub samples: u64,
    /// When the peak was first reached (µs since the Unix epoch).
    pub time: Timestamp,
}

/// Everything the subcommands report about one trace.
#[derive(Debug, Clone)]
pub struct Analysis {
    /// The trace's metadata.
    pub info: Info,
    /// Event counts.
    pub counts: Counts,
    /// Time of the last event (the start time if there is none).
    pub end_time: Timestamp,
    /// Live samples at the end (saturating at `u64::MAX`).
    pub live_end: u64,
    /// The peak of the live estimate.
    pub peak: Peak,
    /// Distinct domains that recorded events.
    pub domains: usize,
    /// Location codes defined in the trace.
    pub location_codes: usize,
    /// Distinct locations among them.
    pub distinct_locations: usize,
    /// What the reader skipped (a truncated last packet, foreign packets).
    pub warnings: Vec<Warning>,
    /// The live estimate over time.
    pub timeline: Timeline,
    /// Every distinct stack, in the order of their first allocation.
    pub stacks: Vec<Stack>,
    /// The location codes of the stacks.
    pub trie: StackTrie,
    /// Every distinct frame of the stacks.
    pub frames: Vec<Frame>,
    /// The frames of each location code of the stacks, outermost first.
    pub code_frames: HashMap<u64, Vec<FrameId>>,
    /// Sampled allocations by size: entry `i` counts those of at least `2^(i-1)` and less
    /// than `2^i` bytes (entry 0: of zero bytes), their sizes rounded up to whole words.
    pub sizes: Vec<Tally>,
    /// The samples the tracer lost, by cause, as the trace records them (see [`LostSamples`];
    /// empty when backtraces were not decoded).
    pub lost: Vec<LostSamples>,
    /// Whether the trace's writer closed it: false for a trace still being written, or whose
    /// program was killed before its tracer stopped (see
    /// [`Reader::closed_by_writer`](crate::trace::Reader::closed_by_writer)).
    pub closed_by_writer: bool,
}

/// Samples a tracer lost to one cause (its writer far behind, no memory, no stack): this
/// crate's tracer writes them into the trace as allocations whose one frame is a location of
/// file [`LOST_SAMPLES_FILE`] named after the cause (`<samples lost: writer behind>`), freed
/// at once. They count in allocated totals, which so stay unbiased, and in no live figure.
#[derive(Debug, Clone, PartialEq)]
pub struct LostSamples {
    /// The cause, as the location names it.
    pub cause: String,
    /// The lost sample points.
    pub samples: u64,
}

/// Per-stack state while reading.
#[derive(Debug, Default)]
struct StackState {
    allocs: u64,
    allocated: Tally,
    live: Acc,
    /// `live` at the most recent peak, valid when `stamp` is that peak's number.
    at_peak: Acc,
    stamp: u64,
    at_time: Acc,
    temporary: Tally,
}

/// A sampled object not yet collected.
#[derive(Debug, Clone, Copy)]
struct LiveObject {
    stack: u32,
    samples: u64,
    objects: f64,
    /// When it was allocated.
    born: Timestamp,
}

/// The state of the pass.
struct Pass {
    start: Timestamp,
    rate: f64,
    interner: StackInterner,
    /// The stack of each trie node that is one (`u32::MAX` for the others).
    stack_of_node: Vec<u32>,
    /// The trie node of each stack.
    nodes: Vec<NodeId>,
    stacks: Vec<StackState>,
    live: FastMap<ObjectId, LiveObject>,
    /// Live samples, exact (see [`Acc`]).
    live_total: u128,
    /// The peak of `live_total` (the rule of [`blocks`](super::blocks): the total after
    /// the last event of a timestamp counts).
    peak: PeakFinder,
    /// Number of times the peak was raised; stamps [`StackState::at_peak`].
    peaks: u64,
    live_at: Option<u64>,
    snapshot_taken: bool,
    /// Bytes per word.
    word_bytes: u64,
    /// See [`Analysis::sizes`].
    sizes: Vec<Tally>,
    counts: Counts,
    domains: Vec<u16>,
    end_time: Timestamp,
    timeline: Timeline,
}

impl Pass {
    fn stack_id(&mut self, node: NodeId) -> u32 {
        let slot = node as usize;
        if slot >= self.stack_of_node.len() {
            self.stack_of_node.resize(self.interner.trie().len(), u32::MAX);
        }
        if self.stack_of_node[slot] == u32::MAX {
            self.stack_of_node[slot] = self.stacks.len() as u32;
            self.stacks.push(StackState::default());
            self.nodes.push(node);
        }
        self.stack_of_node[slot]
    }

    /// Save the stack's live figure for the current peak before it changes.
    fn touch(&mut self, stack: u32) -> &mut StackState {
        let state = &mut self.stacks[stack as usize];
        if state.stamp != self.peaks {
            state.at_peak = state.live;
            state.stamp = self.peaks;
        }
        state
    }

    fn snapshot_live_at(&mut self) {
        for s in &mut self.stacks {
            s.at_time = s.live;
        }
        self.snapshot_taken = true;
    }

    /// An allocation, or (`carried`) a block live at the trace's start, which counts as live
    /// only.
    fn alloc(&mut self, time: Timestamp, id: ObjectId, (length, samples): (u64, u64), node: NodeId, carried: bool) {
        let stack = self.stack_id(node);
        let objects = estimated_objects(samples, length, self.rate);
        if !carried {
            let size = length.saturating_mul(self.word_bytes);
            self.sizes[size_bucket(size)].add(samples, objects);
        }
        let state = self.touch(stack);
        if !carried {
            state.allocs = state.allocs.saturating_add(1);
            state.allocated.add(samples, objects);
        }
        state.live.add(samples, objects);
        // A block live at the start was allocated before the trace: never temporary.
        let born = if carried { 0 } else { time };
        if let Some(old) = self.live.insert(id, LiveObject { stack, samples, objects, born }) {
            // A reused id: the old object is gone.
            self.free(old);
        }
        self.live_total = self.live_total.saturating_add(u128::from(samples));
    }

    fn collect(&mut self, time: Timestamp, id: ObjectId) {
        if let Some(object) = self.live.remove(&id) {
            if time.saturating_sub(object.born) <= TEMPORARY_US {
                self.stacks[object.stack as usize].temporary.add(object.samples, object.objects);
            }
            self.free(object);
        }
    }

    fn free(&mut self, object: LiveObject) {
        self.touch(object.stack).live.sub(object.samples, object.objects);
        self.live_total = self.live_total.saturating_sub(u128::from(object.samples));
    }

    /// Before the event at `time` (or after the last one, with `None`): the total so far is
    /// final for the previous timestamp, and may be the new peak.
    fn settle_peak(&mut self, time: Option<Timestamp>) {
        if self.peak.settle(time, self.live_total) {
            self.peaks += 1;
        }
    }

    fn after_event(&mut self, time: Timestamp, allocated: u64) {
        self.timeline.record(time.saturating_sub(self.start), allocated, saturate(self.live_total));
        self.end_time = time;
    }

    fn finish(
        mut self,
        info: Info,
        locations: &LocationTable,
        warnings: Vec<Warning>,
        closed_by_writer: bool,
    ) -> Analysis {
        self.settle_peak(None);
        if self.live_at.is_some() && !self.snapshot_taken {
            self.snapshot_live_at();
        }
        let trie = self.interner.finish();
        // In the order of the nodes, which is the order of the stacks' first allocation.
        let mut frames = FrameTable::default();
        for node in 1..trie.len() as NodeId {
            frames.resolve(trie.item(node), locations);
        }
        let mut stacks = Vec::with_capacity(self.stacks.len());
        for (node, s) in self.nodes.into_iter().zip(self.stacks) {
            let live_peak = if s.stamp == self.peaks { s.at_peak } else { s.live };
            let stats = StackStats {
                allocs: s.allocs,
                allocated: s.allocated,
                live_end: s.live.tally(),
                live_peak: live_peak.tally(),
                live_at: s.at_time.tally(),
                temporary: s.temporary,
            };
            stacks.push(Stack { node, stats });
        }
        let distinct: std::collections::HashSet<&Location> = locations.iter().flat_map(|(_, l)| l).collect();
        let lost = lost_samples(&stacks, &trie, &frames);
        Analysis {
            counts: self.counts,
            end_time: self.end_time,
            live_end: saturate(self.live_total),
            peak: Peak { samples: saturate(self.peak.peak().0), time: self.peak.peak().1 },
            domains: self.domains.len(),
            location_codes: locations.len(),
            distinct_locations: distinct.len(),
            warnings,
            timeline: self.timeline,
            stacks,
            trie,
            frames: frames.frames,
            code_frames: frames.by_code,
            sizes: self.sizes,
            info,
            lost,
            closed_by_writer,
        }
    }
}

/// The stacks that record lost samples (one frame, at a location of [`LOST_SAMPLES_FILE`]), by
/// cause.
fn lost_samples(stacks: &[Stack], trie: &StackTrie, frames: &FrameTable) -> Vec<LostSamples> {
    let mut lost: Vec<LostSamples> = Vec::new();
    for stack in stacks.iter().filter(|s| s.node != ROOT && trie.parent(s.node) == ROOT) {
        let ids = frames.by_code.get(&trie.item(stack.node)).map_or(&[][..], Vec::as_slice);
        let [id] = ids else { continue };
        let frame = &frames.frames[*id];
        if !frame.records_lost_samples() {
            continue;
        }
        let samples = stack.stats.allocated.samples;
        match lost.iter_mut().find(|l| l.cause == frame.function) {
            Some(l) => l.samples = l.samples.saturating_add(samples),
            None => lost.push(LostSamples { cause: frame.function.clone(), samples }),
        }
    }
    lost
}

/// Frames interned by content, and the frames of each location code (shared by the traces
/// of a report diff, so that a frame id matches by function, file and line).
#[derive(Debug, Default)]
pub struct FrameTable {
    /// Every distinct frame, by [`FrameId`].
    pub frames: Vec<Frame>,
    by_frame: HashMap<Frame, FrameId>,
    by_code: HashMap<u64, Vec<FrameId>>,
}

impl FrameTable {
    /// Shorten the names of the frames as [`Analysis::shorten_names`] does (for a Rust
    /// trace); returns the new id of each old frame.
    pub fn shorten_names(&mut self) -> Vec<FrameId> {
        let remap = super::names::shorten(&mut self.frames, &mut self.by_code);
        self.by_frame = self.frames.iter().cloned().enumerate().map(|(id, f)| (f, id)).collect();
        remap
    }

    /// Merge the frames that are one thing in two traces ([`frame_identity`]), each spelt as
    /// a diff shows the first of them ([`matched_frame`]): for the page of a diff, whose two
    /// traces share this table. Returns the new id of each old frame.
    ///
    /// [`frame_identity`]: super::frame_identity
    /// [`matched_frame`]: super::matched_frame
    pub fn match_by_identity(&mut self) -> Vec<FrameId> {
        let (mut merged, mut ids) = (Vec::new(), HashMap::new());
        let remap: Vec<FrameId> = self
            .frames
            .iter()
            .map(|f| {
                *ids.entry(super::frame_identity(f)).or_insert_with(|| {
                    merged.push(super::matched_frame(f));
                    merged.len() - 1
                })
            })
            .collect();
        for id in self.by_code.values_mut().flatten() {
            *id = remap[*id];
        }
        self.frames = merged;
        self.by_frame = self.frames.iter().cloned().enumerate().map(|(id, f)| (f, id)).collect();
        remap
    }

    /// The frames of location `code`, outermost first, resolved once.
    pub fn of_code(&mut self, code: u64, locations: &LocationTable) -> &[FrameId] {
        self.resolve(code, locations);
        &self.by_code[&code]
    }

    fn resolve(&mut self, code: u64, locations: &LocationTable) {
        if self.by_code.contains_key(&code) {
            return;
        }
        // A code with no location list (or none at all: code 0 can hit the writer's
        // zero-initialised backtrace cache without ever being defined) is shown as itself.
        let list = locations.get(code).unwrap_or_default();
        // Names are made inert here, once, so that every output shows the same safe text.
        let frames: Vec<Frame> = if list.is_empty() {
            vec![Frame { function: format!("{code:#x}"), file: String::new(), line: 0 }]
        } else {
            list.iter()
                .map(|l| Frame {
                    function: inert_bytes(&l.defname).into_owned(),
                    file: inert_bytes(&l.filename).into_owned(),
                    line: l.line,
                })
                .collect()
        };
        let ids = frames
            .into_iter()
            .map(|f| {
                let next = self.frames.len();
                *self.by_frame.entry(f).or_insert_with_key(|f| {
                    self.frames.push(f.clone());
                    next
                })
            })
            .collect();
        self.by_code.insert(code, ids);
    }
}

impl Analysis {
    /// Read the trace at `path`.
    ///
    /// The top allocation sites of a trace by estimated bytes, as `memtrace hotspots` ranks
    /// them:
    ///
    /// ```no_run
    /// use memtrace_rs::analysis::{ranked, Analysis, Grouping, Measure, Options};
    ///
    /// let analysis = Analysis::run("trace.ctf".as_ref(), &Options { stacks: true, live_at: None })?;
    /// for site in ranked(&analysis, Grouping::default(), Measure::Allocated).iter().take(5) {
    ///     let bytes = analysis.estimate(site.stats.allocated.samples);
    ///     let frame = site.frames().next().map(|f| &analysis.frames[f]);
    ///     println!("{bytes:?} {:?}", frame.map(|f| &f.function));
    /// }
    /// # Ok::<(), memtrace_rs::Error>(())
    /// ```
    pub fn run(path: &Path, options: &Options) -> Result<Analysis> {
        Analysis::from_reader(Reader::open(path)?, options, |_| {})
    }

    /// Read every event of `reader`, calling `progress` now and then with the number of
    /// bytes read so far.
    pub fn from_reader<R: Read>(
        mut reader: Reader<R>,
        options: &Options,
        mut progress: impl FnMut(u64),
    ) -> Result<Analysis> {
        reader.set_decode_backtraces(options.stacks);
        let info = reader.info().clone();
        let carries = info.begins_with_live_blocks();
        let mut pass = Pass {
            start: info.start_time,
            rate: info.sample_rate,
            interner: StackInterner::default(),
            stack_of_node: Vec::new(),
            nodes: Vec::new(),
            stacks: Vec::new(),
            live: FastMap::default(),
            live_total: 0,
            peak: PeakFinder::new(info.start_time),
            peaks: 0,
            live_at: options.live_at,
            snapshot_taken: false,
            word_bytes: u64::from(info.word_size / 8),
            sizes: vec![Tally::default(); SIZE_BUCKETS],
            counts: Counts::default(),
            domains: Vec::new(),
            end_time: info.start_time,
            timeline: Timeline::new(),
        };
        while let Some(event) = reader.next_event()? {
            pass.settle_peak(Some(event.time));
            if let Some(at) = pass.live_at {
                if !pass.snapshot_taken && event.time.saturating_sub(pass.start) > at {
                    pass.snapshot_live_at();
                }
            }
            if !pass.domains.contains(&event.domain) {
                pass.domains.push(event.domain);
            }
            pass.counts.events = pass.counts.events.saturating_add(1);
            let mut allocated = 0;
            match event.kind {
                EventKind::Alloc(a) => {
                    let c = &mut pass.counts;
                    let carried = carries && a.source == AllocSource::Major;
                    match a.source {
                        _ if carried => c.live_at_start += 1,
                        AllocSource::Minor => c.allocs_minor += 1,
                        AllocSource::Major => c.allocs_major += 1,
                        AllocSource::External => c.allocs_external += 1,
                    }
                    if !carried {
                        c.samples = c.samples.saturating_add(a.nsamples);
                        c.words = c.words.saturating_add(a.length);
                        allocated = a.nsamples;
                    }
                    let node = pass.interner.intern(event.domain, &a);
                    pass.alloc(event.time, a.id, (a.length, a.nsamples), node, carried);
                }
                EventKind::Promote { .. } => pass.counts.promotes += 1,
                EventKind::Collect { id } => {
                    pass.counts.collects += 1;
                    pass.collect(event.time, id);
                }
            }
            pass.after_event(event.time, allocated);
            if pass.counts.events.is_multiple_of(PROGRESS_EVERY) {
                progress(reader.bytes_read());
            }
        }
        let warnings = reader.take_warnings();
        let closed = reader.closed_by_writer();
        Ok(pass.finish(info, reader.locations(), warnings, closed))
    }

    /// Estimated bytes for `samples` at this trace's rate and word size.
    pub fn bytes(&self, samples: u64) -> f64 {
        self.info.bytes_for_samples(samples)
    }

    /// The estimate of `samples` with its 95 % interval.
    pub fn estimate(&self, samples: u64) -> Estimate {
        Estimate::new(samples, self.bytes(1))
    }

    /// Where the trace comes from: this crate's allocator (its runtime parameters start with
    /// `memtrace-rs`, or every allocation is external and nothing was promoted) or OCaml.
    pub fn origin(&self) -> Origin {
        let c = &self.counts;
        // A carried block (source Major) is not an OCaml event: it counts in none of these.
        let ocaml_events = c.allocs_minor > 0 || c.allocs_major > 0 || c.promotes > 0;
        Origin::of(&self.info, ocaml_events, c.allocs_external > 0)
    }

    /// Time from the trace start to its last event, in µs.
    pub fn duration(&self) -> u64 {
        self.end_time.saturating_sub(self.info.start_time)
    }

    /// All the sample points lost (see [`Analysis::lost`]).
    pub fn lost_samples(&self) -> u64 {
        self.lost.iter().fold(0, |sum, l| sum.saturating_add(l.samples))
    }

    /// The share of the trace's samples that the lost ones are: of the allocated estimate,
    /// which counts them (0 when nothing was lost).
    pub fn lost_share(&self) -> f64 {
        match self.counts.samples {
            0 => 0.0,
            all => self.lost_samples() as f64 / all as f64,
        }
    }

    /// True when the file ended inside a packet.
    pub fn is_truncated(&self) -> bool {
        self.warnings.iter().any(|w| matches!(w, Warning::TruncatedPacket { .. }))
    }

    /// The frames of location `code`, outermost first.
    pub fn frames_of(&self, code: u64) -> &[FrameId] {
        self.code_frames.get(&code).map_or(&[], Vec::as_slice)
    }

    /// The sum of the figures of all stacks.
    pub fn totals(&self) -> StackStats {
        let mut total = StackStats::default();
        for s in &self.stacks {
            total.add(&s.stats);
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeline_widens_and_carries_the_live_figure() {
        let mut t = Timeline::new();
        t.record(0, 5, 5);
        t.record(3, 1, 6);
        assert_eq!(t.buckets.len(), 4);
        assert_eq!(t.buckets[1], Bucket { allocated: 0, live_max: 5, live_end: 5 });
        t.record(5000, 0, 2);
        assert!(t.buckets.len() <= TIMELINE_BUCKETS && t.width == 8);
        assert_eq!(t.buckets[0], Bucket { allocated: 6, live_max: 6, live_end: 6 });
        assert_eq!(t.buckets.last(), Some(&Bucket { allocated: 0, live_max: 6, live_end: 2 }));
    }
}
