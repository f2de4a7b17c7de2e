//! The integration tests that run on the system allocator: the format (round trips, golden
//! dumps and copies, corrupt input, the reader's memory) and the command line. One binary, a
//! module per topic; `tests/tracing` is the other binary, with `MemtraceAllocator` as its
//! global allocator.
//!
//! The global allocator here counts each thread's allocations and live bytes, so that the
//! reader's tests can bound what it allocates.

mod util;

#[cfg(feature = "cli")]
mod cli_analysis;
#[cfg(feature = "cli")]
mod cli_diff;
#[cfg(feature = "cli")]
mod cli_errors;
#[cfg(feature = "cli")]
mod cli_golden;
#[cfg(feature = "cli")]
mod cli_inert;
#[cfg(feature = "cli")]
mod cli_json;
#[cfg(feature = "cli")]
mod cli_markup;
#[cfg(feature = "cli")]
mod cli_pprof;
#[cfg(feature = "cli")]
mod cli_real_stacks;
#[cfg(feature = "cli")]
mod cli_robustness;
#[cfg(feature = "cli")]
mod cli_sample_app;
#[cfg(feature = "cli")]
mod cli_series;
#[cfg(feature = "cli")]
mod cli_spans;
mod corruption;
#[cfg(feature = "analysis")]
mod golden_copy;
#[cfg(feature = "analysis")]
mod golden_dump;
mod read_alloc_free;
#[cfg(feature = "cli")]
mod report_browser;
mod roundtrip;
#[cfg(feature = "cli")]
mod stack_trie;
mod symbolizer_memory;

#[global_allocator]
static GLOBAL: util::counting_alloc::Counting = util::counting_alloc::Counting;
