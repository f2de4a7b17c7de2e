//! `memtrace copy`: re-encode a trace through this crate's writer (FORMAT.md §10.6).
//!
//! For traces written by upstream's current writer (such as `ocamlopt.ctf`) the copy is
//! byte-identical to the input, which is the format's conformance check. Other traces are
//! re-encoded faithfully but not necessarily identically: object ids are renumbered when
//! the writer's id chunks differ from the original's, and promotes and collects follow the
//! renumbering. A promote or collect of an object whose allocation is not in the trace
//! (e.g. it was in a packet the reader skipped) has no id in the copy and is dropped.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use super::{Failure, Watched};
use crate::format::hash::FastMap;
use crate::format::trace::{EventKind, NewAlloc, ObjectId, Reader, Writer};
use crate::Result;

/// The result of [`copy`].
#[derive(Debug)]
pub struct Copied<W> {
    /// The output, after the writer's last flush.
    pub out: W,
    /// Promote and collect events dropped because the trace never allocated their object
    /// (or collected it already).
    pub dropped: u64,
}

/// Read the trace at `input` and write it again to `output`; returns the number of events
/// dropped (see [`Copied::dropped`]). Errors name the file they concern: `input` for
/// reading it and for what it holds, `output` for creating and writing the copy.
pub fn run(input: &Path, output: &Path) -> Result<u64, Failure> {
    let reader = Reader::open(input).map_err(|e| Failure::new(input, e))?;
    let file = File::create(output).map_err(|e| Failure::new(output, e))?;
    let (out, failed) = Watched::new(file);
    let out = BufWriter::new(out);
    let which = |e| Failure::new(if failed.get() { output } else { input }, e);
    let copied = copy(reader, out).map_err(which)?;
    let mut out = copied.out;
    out.flush().map_err(|e| which(e.into()))?;
    Ok(copied.dropped)
}

/// Re-encode every event of `reader` into `out`.
pub fn copy<R: std::io::Read, W: Write>(mut reader: Reader<R>, out: W) -> Result<Copied<W>> {
    let mut writer = Writer::new(out, reader.info())?;
    // The copy's id of every object allocated and not yet collected, by original id.
    let mut ids: FastMap<ObjectId, ObjectId> = FastMap::default();
    let mut dropped = 0u64;
    let mut callstack = Vec::new();
    while let Some(event) = reader.next_event()? {
        match event.kind {
            EventKind::Alloc(alloc) => {
                callstack.clear();
                callstack.extend(alloc.backtrace.iter().rev());
                let new = NewAlloc {
                    length: alloc.length,
                    nsamples: alloc.nsamples,
                    source: alloc.source,
                    callstack: &callstack,
                    drop: 0,
                };
                let locations = event.locations;
                let id = writer.put_alloc(event.domain, event.time, &new, |code| {
                    locations.get_shared(code).unwrap_or_else(|| Vec::new().into())
                })?;
                ids.insert(alloc.id, id);
            }
            EventKind::Promote { id } => match ids.get(&id) {
                Some(&id) => writer.put_promote(event.domain, event.time, id)?,
                None => dropped += 1,
            },
            EventKind::Collect { id } => match ids.remove(&id) {
                Some(id) => writer.put_collect(event.domain, event.time, id)?,
                None => dropped += 1,
            },
        }
    }
    Ok(Copied { out: writer.close()?, dropped })
}
