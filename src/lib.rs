#![warn(missing_docs)]
//! A sampling memory profiler for Rust that writes Jane Street memtrace traces.
//!
//! Install [`MemtraceAllocator`] as the global allocator and call [`trace_if_requested`]
//! at the start of `main`: when `MEMTRACE_FILE` names a file, allocations are sampled by
//! bytes and written, with their backtraces and frees, to a memtrace (v3) trace that
//! upstream's OCaml tools and this crate's `memtrace` command line can read.
//!
//! The format layers mirror upstream's: [`buf`], [`backtrace_codec`], [`location_codec`]
//! and [`trace`] (a writer and a streaming reader). The profiler is [`sampler`],
//! [`allocator`], [`tracer`] and [`symbolize`].

pub mod allocator;
pub mod backtrace_codec;
pub mod buf;
pub mod error;
mod handoff;
mod hash;
pub mod location_codec;
mod sampled_set;
pub mod sampler;
pub mod symbolize;
pub mod trace;
pub mod tracer;
mod unwind;

#[cfg(feature = "cli")]
pub mod cli;

pub use allocator::MemtraceAllocator;
pub use error::{Error, ErrorKind, Result};
pub use tracer::{
    currently_tracing, start_tracing, stop_tracing, trace_if_requested, StartError, TraceConfig, TraceGuard, Unwinder,
};
