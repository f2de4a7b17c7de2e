//! `memtrace copy`: re-encode a trace through this crate's writer, from file to file.

use std::io::Write;
use std::path::Path;

use memtrace_rs::trace::Reader;

use super::output::Output;
use super::{Failure, Watched};

/// Read the trace at `input` and write it again to `output` (`-` for stdout, never `input`); returns the number of events
/// dropped (see [`memtrace_rs::analysis::Copied::dropped`]). Errors name the file they
/// concern: `input` for reading it and for what it holds, `output` for creating and
/// writing the copy.
pub fn run(input: &Path, output: &Path) -> Result<u64, Failure> {
    let reader = Reader::open(input).map_err(|e| Failure::new(input, e))?;
    let file = Output::create(output, &[input])?;
    let name = file.name(output);
    let (out, failed) = Watched::new(file);
    let which = |e| Failure::new(if failed.get() { name } else { input }, e);
    let copied = memtrace_rs::analysis::copy(reader, out).map_err(which)?;
    let mut out = copied.out;
    out.flush().map_err(|e| which(e.into()))?;
    Ok(copied.dropped)
}
