//! The memtrace trace format (v3, and reading v1–v2), layered as upstream's is: byte cursors
//! ([`buf`]), the backtrace and location codecs, and [`trace`]'s packets, writer and reader.
//! The specification is `docs/FORMAT.md`.

pub mod backtrace_codec;
pub mod buf;
pub(crate) mod error;
pub(crate) mod hash;
pub mod location_codec;
pub(crate) mod pprof;
pub(crate) mod trace;
