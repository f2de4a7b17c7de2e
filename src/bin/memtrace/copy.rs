//! `memtrace copy`: re-encode a trace through this crate's writer, from file to file.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use memtrace_rs::trace::Reader;

use super::{Failure, Watched};

/// Read the trace at `input` and write it again to `output`; returns the number of events
/// dropped (see [`memtrace_rs::analysis::Copied::dropped`]). Errors name the file they
/// concern: `input` for reading it and for what it holds, `output` for creating and
/// writing the copy.
pub fn run(input: &Path, output: &Path) -> Result<u64, Failure> {
    let reader = Reader::open(input).map_err(|e| Failure::new(input, e))?;
    let file = File::create(output).map_err(|e| Failure::new(output, e))?;
    let (out, failed) = Watched::new(file);
    let out = BufWriter::new(out);
    let which = |e| Failure::new(if failed.get() { output } else { input }, e);
    let copied = memtrace_rs::analysis::copy(reader, out).map_err(which)?;
    let mut out = copied.out;
    out.flush().map_err(|e| which(e.into()))?;
    Ok(copied.dropped)
}
