//! Re-encoding a trace through this crate's writer (`memtrace copy`, FORMAT.md §10.6).
//!
//! For traces written by upstream's current writer (such as `ocamlopt.ctf`) the copy is
//! byte-identical to the input, which is the format's conformance check. Other traces are
//! re-encoded faithfully but not necessarily identically: object ids are renumbered when
//! the writer's id chunks differ from the original's, and promotes and collects follow the
//! renumbering. A promote or collect of an object whose allocation is not in the trace
//! (e.g. it was in a packet the reader skipped) has no id in the copy and is dropped.

use std::io::Write;

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
