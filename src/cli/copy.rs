//! `memtrace copy`: re-encode a trace through this crate's writer (FORMAT.md §10.6).
//!
//! For traces written by upstream's current writer (such as `ocamlopt.ctf`) the copy is
//! byte-identical to the input, which is the format's conformance check. Other traces are
//! re-encoded faithfully but not necessarily identically; object ids are renumbered when
//! the writer's id chunks differ from the original's, and collects follow the renumbering.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use crate::trace::{EventKind, NewAlloc, ObjectId, Reader, Writer};
use crate::Result;

/// Read the trace at `input` and write it again to `output`.
pub fn run(input: &Path, output: &Path) -> Result<()> {
    let reader = Reader::open(input)?;
    let out = BufWriter::new(File::create(output)?);
    copy(reader, out)?.flush()?;
    Ok(())
}

/// Re-encode every event of `reader` into `out`, returning `out`.
pub fn copy<R: std::io::Read, W: Write>(mut reader: Reader<R>, out: W) -> Result<W> {
    let mut writer = Writer::new(out, reader.info())?;
    let mut renumbered: HashMap<ObjectId, ObjectId> = HashMap::new();
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
                if id != alloc.id {
                    renumbered.insert(alloc.id, id);
                }
            }
            EventKind::Promote { id } => {
                let id = renumbered.get(&id).copied().unwrap_or(id);
                writer.put_promote(event.domain, event.time, id)?;
            }
            EventKind::Collect { id } => {
                let id = renumbered.remove(&id).unwrap_or(id);
                writer.put_collect(event.domain, event.time, id)?;
            }
        }
    }
    writer.close()
}
