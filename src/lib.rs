#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
//! A sampling memory profiler for Rust that writes Jane Street memtrace traces.
//!
//! Install [`MemtraceAllocator`] as the global allocator and call [`trace_if_requested`]
//! at the start of `main`: when `MEMTRACE_FILE` names a file, allocations are sampled by
//! bytes and written, with their backtraces and frees, to a memtrace (v3) trace that
//! upstream's OCaml tools and this crate's `memtrace` command line can read.
//!
//! ```no_run
//! use memtrace_rs::MemtraceAllocator;
//!
//! #[global_allocator]
//! static GLOBAL: MemtraceAllocator = MemtraceAllocator::system();
//!
//! fn main() {
//!     let _trace = memtrace_rs::trace_if_requested();
//!     // ... the program ...
//! }
//! ```
//!
//! Heap profiles of the running program, in pprof's format, are taken with [`profile`] (or
//! served over HTTP: [`TraceConfig::http`], `MEMTRACE_HTTP`), also from a session without a
//! trace file ([`TraceConfig::profile_only`]).
//!
//! Traces are read with [`trace::Reader`] and written with [`trace::Writer`].

mod format;
mod frames;
#[cfg(feature = "tracing")]
mod layer;
mod runtime;

#[cfg(feature = "analysis")]
pub mod analysis;

pub use format::error::{Error, ErrorKind, Result};
#[cfg(feature = "tracing")]
pub use layer::MemtraceLayer;
pub use runtime::allocator::MemtraceAllocator;
pub use runtime::config::{StartError, TraceConfig};
pub use runtime::profile::{
    http_response, profile, profile_delta, HttpResponse, Profile, ProfileError, ProfileKind, MAX_DELTA,
};
pub use runtime::session::{start_tracing, stop_tracing, trace_if_requested, TraceGuard, TraceStats};
pub use runtime::state::currently_tracing;
pub use runtime::unwind::Unwinder;

/// Reading and writing memtrace traces: a streaming [`Reader`](trace::Reader) for format
/// versions 1–3 and a [`Writer`](trace::Writer) of version 3.
pub mod trace {
    pub use crate::format::location_codec::Location;
    pub use crate::format::trace::{
        Alloc, AllocSource, Event, EventKind, Info, LocationTable, NewAlloc, ObjectId, Reader, Timestamp, Warning,
        Writer, FORMAT_VERSION,
    };
    pub use crate::runtime::span_table::{SPAN_FILE_PREFIX, THREAD_FILE};
}

/// The format's internals and a test hook, for this crate's benchmarks, fuzz targets and
/// tests only: not a stable API.
#[doc(hidden)]
pub mod __internals {
    pub use crate::format::{backtrace_codec, buf, location_codec};
    pub use crate::runtime::symbolize::function_names_once as function_names;
    pub use crate::runtime::symbolize::{Options as SymbolizerOptions, Stats as SymbolizerStats, Symbolizer};
    /// Make the next sampled allocation panic inside the allocator's sampled path, to test
    /// that it aborts rather than unwinds (debug builds only).
    #[cfg(debug_assertions)]
    pub fn panic_in_next_sample() {
        crate::runtime::allocator::PANIC_IN_NEXT_SAMPLE.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    /// Make the writer threads of later sessions wait an hour between their polls of the
    /// queue, so that only their doorbell wakes them (debug builds only).
    #[cfg(debug_assertions)]
    pub fn writer_waits_for_its_doorbell() {
        crate::runtime::writer_thread::WAIT_FOR_DOORBELL.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    /// Whether the unwind tables settled the calibration's captures in this process, and gave
    /// what naming their frames gives (for tests of release builds).
    pub fn calibration_settled_by_unwind_tables() -> bool {
        crate::runtime::unwind::calibrate::settled_by_unwind_tables()
    }
    /// Make the runtime's next reads of the loader's object list stay `ms` milliseconds inside
    /// it (0: not at all), with the loader's lock held (debug builds only).
    #[cfg(debug_assertions)]
    pub fn hold_in_the_loader(ms: u64) {
        crate::runtime::loader::hold::FOR_MS.store(ms, std::sync::atomic::Ordering::Relaxed);
    }
    /// Whether a read of the loader's object list is being held inside it (debug builds only).
    #[cfg(debug_assertions)]
    pub fn held_in_the_loader() -> bool {
        crate::runtime::loader::hold::INSIDE.load(std::sync::atomic::Ordering::SeqCst)
    }
    /// A count that moves as the running session's writer takes messages and names frames
    /// (debug builds only).
    #[cfg(debug_assertions)]
    pub fn writer_progress() -> u64 {
        crate::runtime::handoff::writer_progress()
    }
    /// How many frame addresses the threads that stopped sessions named, helping their writers
    /// (debug builds only).
    #[cfg(debug_assertions)]
    pub fn addresses_named_while_stopping() -> u64 {
        crate::runtime::symbolize::addresses_named_by_helpers()
    }
    /// The frame buffers in the running session's pool, 0 without one (debug builds only).
    #[cfg(debug_assertions)]
    pub fn pooled_frame_buffers() -> usize {
        crate::runtime::handoff::pooled_frame_buffers()
    }
}
