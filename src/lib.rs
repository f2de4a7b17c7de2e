//! A sampling memory profiler for Rust that writes Jane Street memtrace traces.
pub mod backtrace_codec;
pub mod buf;
pub mod error;
pub mod location_codec;
pub mod trace;

pub use error::{Error, ErrorKind, Result};

#[cfg(feature = "cli")]
pub mod cli;
