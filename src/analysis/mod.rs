//! Analysing traces: the streaming pass that every view of a trace is built on
//! ([`Analysis`]), grouping its stacks into allocation sites ([`ranked`], with the frame
//! rules [`is_allocator_frame`] and [`is_root_frame`]), short names for Rust functions
//! ([`Analysis::shorten_names`]), and the two event-by-event passes of the `memtrace`
//! command line that need no analysis: [`dump()`] and [`copy()`]. The sampled [`blocks`] of a
//! trace (each allocation with its alloc and free times) and the [`filter`] that selects
//! among them are shared by `memtrace hotspots` and the report page. Stacks are kept as
//! [`stacks`] tries, so memory grows with distinct frames, not with stack depth × stacks.
//! Every name read from a trace is made [`inert`](fn@inert) as it becomes a [`Frame`], so no output
//! can pass a trace's control characters or bidi overrides on.
//!
//! Byte figures are estimates: each sample of an allocation stands for
//! `word_size / 8 / sample_rate` bytes ([`Analysis::bytes`]), with a 95 % interval from
//! the sample count ([`Analysis::estimate`], [`Estimate`]).

pub mod blocks;
mod copy;
mod dump;
mod estimate;
pub mod filter;
mod names;
mod pass;
pub mod series;
mod sites;
pub mod stacks;

pub use crate::frames::{enclosing_function, is_allocator_frame, is_root_frame};
pub use crate::inert::{inert, inert_bytes};
pub use copy::{copy, Copied};
pub use dump::dump;
pub use estimate::{poisson_interval, Estimate, FEW_SAMPLES, Z};
pub use names::{frame_identity, matched_frame, short_name, UNNAMED_THREADS};
pub use pass::{
    estimated_objects, short_path, Analysis, Bucket, Counts, Frame, FrameId, FrameKind, FrameTable, LostSamples,
    Measure, Options, Origin, Peak, Stack, StackStats, Tally, Timeline, TEMPORARY_US,
};
pub use sites::{ranked, Grouping, Site, Trim};
