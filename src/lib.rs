#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]
#![cfg_attr(docsrs, feature(doc_cfg))]
//! A sampling memory profiler for Rust that writes Jane Street memtrace traces.
//!
//! Install [`MemtraceAllocator`] as the global allocator and call [`trace_if_requested`]
//! at the start of `main`: when `MEMTRACE_FILE` names a file, allocations are sampled by
//! bytes (each 8-byte word with probability `MEMTRACE_RATE`, `1e-5` by default) and written,
//! with their backtraces and frees, to a memtrace (v3) trace that upstream's OCaml tools and
//! this crate's `memtrace` command line can read. Without the variable nothing starts.
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
//! Keep `debug = "line-tables-only"` in the release profile for function names, files and
//! lines in the trace.
//!
//! # Starting and stopping from code
//!
//! [`start_tracing`] takes a [`TraceConfig`]; the [`TraceGuard`] it returns stops the trace
//! when dropped, or with [`TraceGuard::finish`], which says what was written and lost
//! ([`TraceStats`]).
//!
//! ```no_run
//! # use memtrace_rs::{start_tracing, TraceConfig};
//! let guard = start_tracing(TraceConfig::new("run.ctf").rate(1e-4).context("nightly job"))?;
//! // ... the work to profile ...
//! let stats = guard.finish()?;
//! eprintln!("{} samples written, {} dropped", stats.samples_written, stats.samples_dropped());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Heap profiles of a running program
//!
//! [`profile`] takes a heap profile of the running session, in pprof's format (or folded
//! stacks), which [`TraceConfig::http`] and `MEMTRACE_HTTP` also serve over HTTP for
//! `go tool pprof`, Pyroscope or Parca; a session may run for profiles only, without a trace
//! file ([`TraceConfig::profile_only`]).
//!
//! # Controlling a running session
//!
//! [`trace_window`] writes a trace of the next seconds of the running session to any `Write`
//! (beginning with the blocks live at its start), [`set_rate`] changes the rate,
//! [`start_file_trace`] and [`stop_file_trace`] attach and detach the file trace, and
//! [`session_state`] says what runs; [`TraceConfig::file_limit`] splits the file into a series
//! of files of bounded size (docs/GUIDE.md, "Production use").
//!
//! # Reading traces
//!
//! [`trace::Reader`] streams the events of a trace, one packet in memory; the
//! [`analysis`] module (feature `analysis`, on by default) is what the command line is built
//! on: allocation sites, estimates with their intervals, sampled blocks and filters.
//!
//! ```no_run
//! use memtrace_rs::trace::{EventKind, Reader};
//!
//! let mut reader = Reader::open("trace.ctf")?;
//! let (rate, mut samples) = (reader.info().sample_rate, 0);
//! while let Some(event) = reader.next_event()? {
//!     if let EventKind::Alloc(alloc) = event.kind {
//!         samples += alloc.nsamples;
//!     }
//! }
//! println!("about {:.0} bytes allocated", samples as f64 * 8.0 / rate);
//! # Ok::<(), memtrace_rs::Error>(())
//! ```
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `analysis` | yes | [`analysis`]: the streaming analysis of traces (no dependency) |
//! | `tracing` | no | `MemtraceLayer`: `tracing` spans as the outermost frames of sampled allocations |
//! | `cli` | no | the `memtrace` binary: `cargo install memtrace-rs --features cli` |
//!
//! # Further reading
//!
//! The files below are in the crate's package (and on docs.rs, under "Source"):
//!
//! - `README.md`: what it costs, choosing a rate, what it cannot see.
//! - `docs/GUIDE.md`: every environment variable, names and `Cargo.toml`, spans and threads,
//!   stopping and stack needs, production use, reading estimates, troubleshooting.
//! - `docs/CLI.md`: the `memtrace` command line and its report page.
//! - `docs/BENCHMARKS.md`: the current figures and how to reproduce them.
//! - `docs/ARCHITECTURE.md`, `docs/FORMAT.md`, `docs/ALLOCATOR-PITFALLS.md`: for
//!   contributors: the modules and the hot path's invariants, the trace format, and what
//!   breaks when a global allocator captures stacks.

mod format;
mod frames;
mod inert;
#[cfg(feature = "tracing")]
mod layer;
mod naming;
mod runtime;
#[cfg(test)]
#[path = "../tests/common/skip.rs"]
mod test_skip;
pub mod testing;

#[cfg(feature = "analysis")]
#[cfg_attr(docsrs, doc(cfg(feature = "analysis")))]
pub mod analysis;

pub use format::error::{Error, ErrorKind, Result};
#[cfg(feature = "tracing")]
#[cfg_attr(docsrs, doc(cfg(feature = "tracing")))]
pub use layer::MemtraceLayer;
pub use runtime::allocator::MemtraceAllocator;
pub use runtime::config::{StartError, TraceConfig};
pub use runtime::control::{
    session_state, set_rate, start_file_trace, stop_file_trace, trace_window, ControlError, SessionState, WindowStats,
};
pub use runtime::profile::{profile, profile_delta, Profile, ProfileError, ProfileKind, MAX_DELTA};
pub use runtime::serve::{http_response, HttpResponse};
pub use runtime::session::{stop_tracing, TraceGuard, TraceStats};
pub use runtime::start::{start_tracing, trace_if_requested};
pub use runtime::state::currently_tracing;
pub use runtime::unwind::Unwinder;

/// Reading and writing memtrace traces: a streaming [`Reader`](trace::Reader) for format
/// versions 1–3 and a [`Writer`](trace::Writer) of version 3.
pub mod trace {
    pub use crate::format::location_codec::Location;
    pub use crate::format::trace::{
        writer_holds_lock, Alloc, AllocSource, Event, EventKind, Info, LocationTable, NewAlloc, ObjectId, Reader,
        Timestamp, Warning, Writer, FORMAT_VERSION, LIVE_AT_START_PARAM,
    };
    pub use crate::runtime::span_table::{LOST_SAMPLES_FILE, LOST_SAMPLES_PREFIX, SPAN_FILE_PREFIX, THREAD_FILE};
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
