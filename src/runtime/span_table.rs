//! The names behind pseudo-frames (see `spans`): the table of span descriptions and the
//! registry of thread names, filled on application threads, and the locations the writer
//! makes of them.
//!
//! `MemtraceLayer` interns a span's description (its name and chosen fields) when the span is
//! created, on the thread that creates it (never inside the allocator), and registers a
//! thread's full name the first time the thread creates or enters a span. The writer reads
//! both when it first meets a pseudo-frame; a thread that never registered is named after
//! the kernel name (15 bytes at most) it sent ahead of its first sample, or `thread-<tid>`.
//!
//! Descriptions are bounded: at most [`MAX_DESCRIPTION_BYTES`] bytes, and at most
//! [`MAX_VALUES_PER_SITE`] distinct descriptions per span call site (and
//! [`MAX_DESCRIPTIONS`] in all); further values share the call site's `name{…}`.
//!
//! The locations follow a convention that analysis tools look for: a span is a location whose
//! file name is [`SPAN_FILE_PREFIX`] followed by the span's call-site file, with the call
//! site's line and the description as its function name; a thread is a location whose file
//! name is [`THREAD_FILE`], with line 0 and the thread's name as its function name.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use parking_lot::{Mutex, RwLock};

use super::handoff::KernelName;
use super::record::Loss;
use super::spans::Pseudo;
use crate::format::hash::FastMap;
use crate::format::location_codec::Location;

/// The file name of a span's location (a pseudo-frame written by
/// `MemtraceLayer`) starts so; the span's call-site file follows.
pub const SPAN_FILE_PREFIX: &str = "<span>";
/// The file name of a thread's location (the pseudo-frame written by
/// [`TraceConfig::thread_frames`](crate::TraceConfig::thread_frames)).
pub const THREAD_FILE: &str = "<thread>";
/// The file name of the location of samples the tracer lost (see `docs/FORMAT.md`, "Lost
/// samples"): allocations whose only frame is such a location stand for the samples lost to
/// the cause its function name gives, [`LOST_SAMPLES_PREFIX`] followed by the cause and `>`.
pub const LOST_SAMPLES_FILE: &str = "<memtrace>";
/// The start of the function name of a lost samples' location.
pub const LOST_SAMPLES_PREFIX: &str = "<samples lost: ";
/// Longest span description, in bytes (longer ones are cut and end with `…`).
pub const MAX_DESCRIPTION_BYTES: usize = 200;
/// Most distinct descriptions of one span call site; later values share `name{…}`.
pub const MAX_VALUES_PER_SITE: usize = 64;
/// Most span descriptions in all; beyond, new values share their call site's `name{…}`.
pub const MAX_DESCRIPTIONS: usize = 1 << 16;
/// Most threads whose full names are registered (kernel ids are reused, so a thread that
/// replaces one takes its place).
const MAX_THREAD_NAMES: usize = 1 << 16;
/// Longest call-site file name kept, in bytes (the location record must stay within the
/// format's 4 096 bytes).
const MAX_FILE_BYTES: usize = 1024;

/// A span description as the trace shows it.
struct Description {
    text: Box<str>,
    file: Box<str>,
    line: u32,
}

/// The descriptions of one span call site.
#[derive(Default)]
struct Site {
    numbers: FastMap<Box<str>, u32>,
    /// The number of the site's `name{…}`, once needed.
    other: Option<u32>,
}

#[derive(Default)]
struct Table {
    descriptions: Vec<Description>,
    /// By call site (the address of its static metadata).
    sites: FastMap<usize, Site>,
}

static TABLE: LazyLock<RwLock<Table>> = LazyLock::new(Default::default);

/// Full thread names by kernel thread id (`None`: the thread has no name), as registered.
static THREAD_NAMES: LazyLock<Mutex<FastMap<u32, Option<Box<str>>>>> = LazyLock::new(Default::default);
/// Bumped at each registration, so that the writer looks its threads up again.
static THREAD_NAMES_VERSION: AtomicU64 = AtomicU64::new(0);

/// `text` cut to at most `max` bytes on a character boundary, ending with `…` when cut.
fn bounded(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let mut end = max - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}…", &text[..end]))
}

/// The number of the description `text` (a span name with its fields, e.g.
/// `request{route=/api}`) of the span call site `site` named `name`, at `file:line`:
/// the same number for the same description, within the caps.
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
pub(crate) fn intern(site: usize, name: &str, text: &str, file: &str, line: u32) -> u32 {
    let text = &*bounded(text, MAX_DESCRIPTION_BYTES);
    if let Some(&n) = TABLE.read().sites.get(&site).and_then(|s| s.numbers.get(text)) {
        return n;
    }
    let mut table = TABLE.write();
    let Table { descriptions, sites } = &mut *table;
    let entry = sites.entry(site).or_default();
    if let Some(&n) = entry.numbers.get(text) {
        return n;
    }
    let room = entry.numbers.len() < MAX_VALUES_PER_SITE && descriptions.len() < MAX_DESCRIPTIONS;
    let mut add = |text: &str| {
        let file = bounded(file, MAX_FILE_BYTES).into();
        descriptions.push(Description { text: text.into(), file, line });
        descriptions.len() as u32 - 1
    };
    if room {
        let n = add(text);
        entry.numbers.insert(text.into(), n);
        n
    } else {
        *entry.other.get_or_insert_with(|| add(&format!("{}{{…}}", bounded(name, MAX_DESCRIPTION_BYTES - 5))))
    }
}

/// Register the name of the thread with kernel id `tid` (`None`: unnamed), unless
/// [`MAX_THREAD_NAMES`] other threads are registered (a program that keeps starting threads
/// would grow the registry without end): that thread is then named by its kernel name.
#[cfg_attr(not(feature = "tracing"), allow(dead_code))]
pub(crate) fn register_thread(tid: u32, name: Option<&str>) {
    let mut names = THREAD_NAMES.lock();
    if names.len() < MAX_THREAD_NAMES || names.contains_key(&tid) {
        names.insert(tid, name.map(|n| bounded(n, MAX_DESCRIPTION_BYTES).into()));
        THREAD_NAMES_VERSION.fetch_add(1, Ordering::Release);
    }
}

/// The writer's view of pseudo-frames: it numbers thread names (threads of one name share
/// one location) and makes locations.
#[derive(Default)]
pub(crate) struct PseudoFrames {
    /// The name number of each thread met, by kernel id, as of [`THREAD_NAMES_VERSION`]
    /// `version`.
    threads: FastMap<u32, u32>,
    version: u64,
    names: Vec<Arc<[Location]>>,
    numbers: FastMap<Box<str>, u32>,
    /// The kernel names threads sent, by kernel id.
    kernel_names: FastMap<u32, KernelName>,
}

impl PseudoFrames {
    /// Replace a thread pseudo-frame at the outermost end of `frames` by its name's.
    pub(crate) fn name_thread(&mut self, frames: &mut [u64]) {
        if let Some(last) = frames.last_mut() {
            if let Some(Pseudo::Thread(tid)) = Pseudo::of(*last) {
                *last = Pseudo::ThreadName(self.thread_name_number(tid)).code();
            }
        }
    }

    /// The thread `tid` (a new one, if the id is reused) has the kernel name `name`.
    pub(crate) fn kernel_name(&mut self, tid: u32, name: KernelName) {
        self.kernel_names.insert(tid, name);
        self.threads.remove(&tid);
    }

    /// The name of the thread `tid`: as registered, else its kernel name unless it is the
    /// process's (an unnamed thread has the kernel name of the thread that started it: the
    /// process's, for threads the main thread starts), else `thread-<tid>`.
    fn thread_name(&mut self, tid: u32) -> String {
        let unnamed = || format!("thread-{tid}");
        if let Some(registered) = THREAD_NAMES.lock().get(&tid) {
            return registered.as_deref().map_or_else(unnamed, str::to_owned);
        }
        if tid == std::process::id() {
            return "main".to_owned();
        }
        let Some(name) = self.kernel_names.get(&tid) else { return unnamed() };
        let name = name.split(|&b| b == 0).next().unwrap_or_default();
        if name.is_empty() || name == process_name() {
            return unnamed();
        }
        String::from_utf8_lossy(name).into_owned()
    }

    fn thread_name_number(&mut self, tid: u32) -> u32 {
        let version = THREAD_NAMES_VERSION.load(Ordering::Acquire);
        if version != self.version {
            self.version = version;
            self.threads.clear();
        }
        if let Some(&n) = self.threads.get(&tid) {
            return n;
        }
        let name = self.thread_name(tid);
        let n = match self.numbers.get(&name[..]) {
            Some(&n) => n,
            None => {
                let n = self.names.len() as u32;
                self.names.push(Arc::new([pseudo_location(THREAD_FILE, 0, &name)]));
                self.numbers.insert(name.into(), n);
                n
            }
        };
        self.threads.insert(tid, n);
        n
    }

    /// The locations of `code` if it is a pseudo-frame (one location), else `None`.
    pub(crate) fn locations(&mut self, code: u64) -> Option<Arc<[Location]>> {
        Some(match Pseudo::of(code)? {
            Pseudo::Span(n) => Arc::new([match TABLE.read().descriptions.get(n as usize) {
                Some(d) => pseudo_location(&format!("{SPAN_FILE_PREFIX}{}", d.file), d.line, &d.text),
                None => pseudo_location(SPAN_FILE_PREFIX, 0, "<unknown span>"),
            }]),
            // Only in a stack the writer did not name: name it now.
            Pseudo::Thread(tid) => {
                let n = self.thread_name_number(tid);
                self.names[n as usize].clone()
            }
            Pseudo::ThreadName(n) => self.names.get(n as usize)?.clone(),
            Pseudo::Lost(cause) => {
                let cause = Loss::ALL.get(cause as usize).map_or("unknown", |cause| cause.describe());
                Arc::new([pseudo_location(LOST_SAMPLES_FILE, 0, &format!("{LOST_SAMPLES_PREFIX}{cause}>"))])
            }
        })
    }
}

/// The location of a span, thread or other pseudo-frame `name`. A string ends at its first NUL (FORMAT.md §1.4),
/// so a NUL in a span's field value is written as the `\x00` that readers show for one
/// (`analysis::inert`): the text after it is kept.
pub(crate) fn pseudo_location(file: &str, line: u32, name: &str) -> Location {
    let defname = name.replace('\0', "\\x00");
    Location { filename: file.as_bytes().into(), line, start_char: 0, end_char: 0, defname: defname.as_bytes().into() }
}

/// The process's kernel name (which unnamed threads inherit), read once.
static PROCESS_NAME: std::sync::OnceLock<Box<[u8]>> = std::sync::OnceLock::new();

/// Read the process's name now, while tracing starts, if it was not read before: a sandbox
/// the program installs later may kill the process at the open.
pub(crate) fn read_process_name() {
    process_name();
}

fn process_name() -> &'static [u8] {
    PROCESS_NAME.get_or_init(|| {
        let comm = std::fs::read("/proc/self/comm").unwrap_or_default();
        comm.strip_suffix(b"\n").unwrap_or(&comm).into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: u32) -> String {
        TABLE.read().descriptions[n as usize].text.to_string()
    }

    #[test]
    fn descriptions_are_interned_per_site_within_the_caps() {
        let site = &text as *const _ as usize;
        let a = intern(site, "req", "req{route=/a}", "src/x.rs", 7);
        assert_eq!(intern(site, "req", "req{route=/a}", "src/x.rs", 7), a);
        assert_ne!(intern(site, "req", "req{route=/b}", "src/x.rs", 7), a);
        for i in 0..2 * MAX_VALUES_PER_SITE {
            let n = intern(site, "req", &format!("req{{id={i}}}"), "src/x.rs", 7);
            if i + 2 >= MAX_VALUES_PER_SITE {
                assert_eq!(text(n), "req{…}", "value {i}");
            }
        }
        let long = "x".repeat(1000);
        let n = intern(site + 1, "long", &long, "src/x.rs", 8);
        assert!(text(n).len() <= MAX_DESCRIPTION_BYTES && text(n).ends_with('…'));
        assert_eq!(intern(site + 1, "long", &long, "src/x.rs", 8), n);
        let location = PseudoFrames::default().locations(Pseudo::Span(a).code()).unwrap();
        assert_eq!(location[0].filename_str(), "<span>src/x.rs");
        assert_eq!((location[0].line, &*location[0].defname_str()), (7, "req{route=/a}"));
        let nul = intern(site + 2, "req", "req{v=a\0b}", "src/x.rs", 9);
        let location = PseudoFrames::default().locations(Pseudo::Span(nul).code()).unwrap();
        assert_eq!(&*location[0].defname_str(), "req{v=a\\x00b}", "a NUL is shown, not cut at");
    }

    #[test]
    fn threads_of_one_name_share_a_location() {
        let mut pseudo = PseudoFrames::default();
        // Thread ids above any the kernel gives out.
        let (a, b, c) = (u32::MAX - 1, u32::MAX - 2, u32::MAX - 3);
        register_thread(a, Some("pool"));
        register_thread(b, Some("pool"));
        register_thread(c, Some("other"));
        let mut frames = [1, Pseudo::Thread(a).code()];
        pseudo.name_thread(&mut frames);
        let named = frames[1];
        for (t, same) in [(b, true), (c, false)] {
            let mut frames = [Pseudo::Thread(t).code()];
            pseudo.name_thread(&mut frames);
            assert_eq!(frames[0] == named, same);
        }
        let location = pseudo.locations(named).unwrap();
        assert_eq!((&*location[0].filename_str(), &*location[0].defname_str()), ("<thread>", "pool"));
        assert_eq!(pseudo.locations(12345), None);
        register_thread(u32::MAX, None);
        assert_eq!(pseudo.thread_name(u32::MAX), format!("thread-{}", u32::MAX));
        assert_eq!(pseudo.thread_name(std::process::id()), "main");
        // Unregistered threads: by the kernel name they sent, unless it is the process's.
        let kernel_name = |name: &[u8]| {
            let mut padded = [0; 16];
            padded[..name.len()].copy_from_slice(name);
            padded
        };
        pseudo.kernel_name(1, kernel_name(b"io-pool"));
        assert_eq!(pseudo.thread_name(1), "io-pool");
        let process = std::fs::read_to_string("/proc/self/comm").unwrap();
        pseudo.kernel_name(1, kernel_name(process.trim_end().as_bytes()));
        assert_eq!(pseudo.thread_name(1), "thread-1");
        assert_eq!(pseudo.thread_name(2), "thread-2");
    }
}
