//! Analysing traces: the streaming pass that every view of a trace is built on
//! ([`Analysis`]), grouping its stacks into allocation sites ([`ranked`], with the frame
//! rules [`is_allocator_frame`] and [`is_root_frame`]), short names for Rust functions
//! ([`Analysis::shorten_names`]), and the two event-by-event passes of the `memtrace`
//! command line that need no analysis: [`dump`] and [`copy`].
//!
//! Byte figures are estimates: each sample of an allocation stands for
//! `word_size / 8 / sample_rate` bytes ([`Analysis::bytes`]), with a 95 % interval from
//! the sample count ([`Analysis::estimate`], [`Estimate`]).

mod copy;
mod dump;
mod estimate;
mod names;
mod pass;
mod sites;

pub use crate::frames::{is_allocator_frame, is_root_frame};
pub use copy::{copy, Copied};
pub use dump::dump;
pub use estimate::{poisson_interval, Estimate, FEW_SAMPLES};
pub use names::short_name;
pub use pass::{
    short_path, Analysis, Bucket, Counts, Frame, FrameId, Measure, Options, Origin, Peak, Stack, StackStats, Tally,
    Timeline, MAX_STACK_FRAMES, TEMPORARY_US,
};
pub use sites::{ranked, Grouping, Site, Trim};
