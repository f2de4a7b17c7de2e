//! Analysing traces: the streaming pass that every view of a trace is built on
//! ([`Analysis`]), grouping its stacks into allocation sites ([`ranked`], with the
//! allocator-frame rule [`is_allocator_frame`]), and the two event-by-event passes of the
//! `memtrace` command line that need no analysis: [`dump`] and [`copy`].
//!
//! Byte figures are estimates: each sample of an allocation stands for
//! `word_size / 8 / sample_rate` bytes ([`Analysis::bytes`]).

mod copy;
mod dump;
mod pass;
mod sites;

pub use crate::frames::is_allocator_frame;
pub use copy::{copy, Copied};
pub use dump::dump;
pub use pass::{
    short_path, Analysis, Bucket, Counts, Frame, FrameId, FrameKind, Measure, Options, Peak, Stack, StackStats, Tally,
    Timeline,
};
pub use sites::{ranked, Grouping, Site};
