//! A file trace's series read as one trace: the numbered files that a size limit or a rate
//! change splits a trace into (`trace.ctf`, `trace.1.ctf`, ...: docs/GUIDE.md, "Bounded
//! disk"), found from the first one's path ([`files`]), and streamed as one trace re-encoded
//! through this crate's writer ([`Joined`], a `Read` that every view of a trace reads).
//!
//! Each later file begins with the blocks live at its start, the previous file's carried over
//! (docs/FORMAT.md, "Series and windows"). The join ends the previous file's live blocks at
//! the boundary (collect events) and begins the next file's as blocks live at that time
//! (allocations of source `Major` in a trace whose runtime parameters say so), so that a block
//! is live once, and allocated once: in the file it was allocated in. Files at another rate
//! than the series' lowest (a rate change starts a file) are thinned to it: each sample point
//! kept with probability lowest / its file's rate, a Binomial draw with a fixed seed, which
//! is exactly a sampling at the lowest rate, so that estimates and their intervals stay
//! right. A block allocated less than the temporary threshold before a boundary and live
//! across it counts as temporary, and the blocks live at a boundary as frees in the event
//! counts.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::format::error::{Error, ErrorKind};
use crate::format::hash::FastMap;
use crate::format::trace::{AllocSource, EventKind, Info, NewAlloc, ObjectId, Reader, Writer, LIVE_AT_START_PARAM};
use crate::runtime::sampler::rescale;
use crate::runtime::series::part_path;
use crate::Result;

/// The files of the series whose first file is at `path`, in order: `path` alone when no
/// numbered file follows it (`trace.1.ctf`, ... beside `trace.ctf`); else the numbered files of
/// the longest run of consecutive numbers that ends at the highest, after `path` itself if the
/// run starts at 1 and `path` is there (the first files of a series may have been removed to
/// keep its number of files).
pub fn files(path: &Path) -> Vec<PathBuf> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut numbers: Vec<u32> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter_map(|name| part_number(path, &name))
        .collect();
    numbers.sort_unstable();
    let Some(&last) = numbers.last() else { return vec![path.to_owned()] };
    let mut first = last;
    while first > 1 && numbers.binary_search(&(first - 1)).is_ok() {
        first -= 1;
    }
    let with_base = first == 1 && path.exists();
    let base = with_base.then(|| path.to_owned());
    base.into_iter().chain((first..=last).map(|n| part_path(path, n))).collect()
}

/// The number of the part of the series at `base` whose file name is `name`, if it is one.
fn part_number(base: &Path, name: &str) -> Option<u32> {
    let stem = base.file_stem()?.to_str()?;
    let rest = name.strip_prefix(stem)?.strip_prefix('.')?;
    let number = match base.extension() {
        Some(extension) => rest.strip_suffix(extension.to_str()?)?.strip_suffix('.')?,
        None => rest,
    };
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    number.parse().ok().filter(|&n| n > 0)
}

/// The bytes the join's writer has written and the join's reader not yet taken.
#[derive(Clone, Default)]
struct Pending(Rc<RefCell<VecDeque<u8>>>);

impl Write for Pending {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.borrow_mut().extend(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The files of a series streamed as one trace (see the [module documentation](self)), read
/// a packet at a time: its memory is that of one file's reader and the live blocks.
pub struct Joined {
    /// The files still to read, with their readers.
    files: VecDeque<(PathBuf, Reader<BufReader<File>>)>,
    /// The file being read.
    current: Option<(PathBuf, Reader<BufReader<File>>)>,
    writer: Option<Writer<Pending>>,
    pending: Pending,
    /// The series' rate (its files' lowest).
    rate: f64,
    /// The join's id of each live block of the file being read, by the file's id.
    ids: FastMap<ObjectId, ObjectId>,
    /// The time of the last event written: events never go back.
    last_time: u64,
    /// Whether the last file was closed by its writer.
    closed: bool,
    rng: u64,
    callstack: Vec<u64>,
}

/// The fixed seed of the thinning draws: the same series always reads the same.
const SEED: u64 = 0x6d65_6d74_7261_6365;

impl Joined {
    /// The series of `paths`, in order: files of one process's trace (one pid, this crate's
    /// tracer's).
    pub fn open(paths: &[PathBuf]) -> Result<Joined> {
        let mut files = VecDeque::new();
        for path in paths {
            let reader = Reader::open(path).map_err(|e| in_file(path, e))?;
            files.push_back((path.clone(), reader));
        }
        let Some((_, first)) = files.front() else {
            return Err(Error::new(ErrorKind::BadTraceInfo("a series of no file")));
        };
        let mut info: Info = first.info().clone();
        for (path, reader) in &files {
            let other = reader.info();
            if other.pid != info.pid || !other.runtime_params.starts_with(b"memtrace-rs") {
                let what = "the files are not one series: they are of different processes (remove the files of an \
                            earlier run, or read each file alone)";
                return Err(in_file(path, Error::new(ErrorKind::BadTraceInfo(what))));
            }
            info.sample_rate = info.sample_rate.min(other.sample_rate);
        }
        if !info.begins_with_live_blocks() {
            info.runtime_params.extend_from_slice(format!(",{LIVE_AT_START_PARAM}").as_bytes());
        }
        let pending = Pending::default();
        let writer = Writer::new(pending.clone(), &info)?;
        Ok(Joined {
            files,
            current: None,
            writer: Some(writer),
            pending,
            rate: info.sample_rate,
            ids: FastMap::default(),
            last_time: info.start_time,
            closed: false,
            rng: SEED,
            callstack: Vec::new(),
        })
    }

    /// Write the next event of the series (or end the file being read, or the series):
    /// whether there is more.
    fn step(&mut self) -> Result<bool> {
        let Some(writer) = self.writer.as_mut() else { return Ok(false) };
        let Some((path, reader)) = self.current.as_mut() else {
            let Some((path, reader)) = self.files.pop_front() else {
                let writer = self.writer.take().expect("a writer until the end");
                if self.closed {
                    writer.close_marked()?;
                } else {
                    writer.close()?;
                }
                return Ok(true);
            };
            // The previous file's live blocks end here; this file begins with them again.
            self.last_time = self.last_time.max(reader.info().start_time);
            for (_, id) in self.ids.drain() {
                writer.put_collect(0, self.last_time, id)?;
            }
            self.current = Some((path, reader));
            return Ok(true);
        };
        let (file_rate, carries) = (reader.info().sample_rate, reader.info().begins_with_live_blocks());
        let Some(event) = reader.next_event().map_err(|e| in_file(path, e))? else {
            self.closed = reader.closed_by_writer();
            self.current = None;
            return Ok(true);
        };
        self.last_time = self.last_time.max(event.time);
        let time = self.last_time;
        match event.kind {
            EventKind::Alloc(alloc) => {
                let nsamples = rescale(alloc.nsamples, file_rate, self.rate, &mut self.rng);
                if nsamples == 0 {
                    // Not sampled at the series' rate.
                    return Ok(true);
                }
                let carried = carries && alloc.source == AllocSource::Major;
                let source = if carried { AllocSource::Major } else { AllocSource::External };
                self.callstack.clear();
                self.callstack.extend(alloc.backtrace.iter().rev());
                let new = NewAlloc { length: alloc.length, nsamples, source, callstack: &self.callstack, drop: 0 };
                let locations = event.locations;
                let id = writer
                    .put_alloc(0, time, &new, |code| locations.get_shared(code).unwrap_or_else(|| Vec::new().into()))?;
                self.ids.insert(alloc.id, id);
            }
            EventKind::Collect { id } => {
                if let Some(id) = self.ids.remove(&id) {
                    writer.put_collect(0, time, id)?;
                }
            }
            EventKind::Promote { .. } => {}
        }
        Ok(true)
    }
}

/// `e`, said to be about the file at `path`.
fn in_file(path: &Path, e: Error) -> Error {
    Error::new(ErrorKind::Io(io::Error::other(format!("{}: {e}", path.display()))))
}

impl Read for Joined {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut pending = self.pending.0.borrow_mut();
            if !pending.is_empty() {
                let n = pending.len().min(out.len());
                for (slot, byte) in out.iter_mut().zip(pending.drain(..n)) {
                    *slot = byte;
                }
                return Ok(n);
            }
            drop(pending);
            if !self.step().map_err(io::Error::other)? {
                return Ok(0);
            }
        }
    }
}
