//! Turning captured frame addresses into source [`Location`]s, with a symbolizer made for
//! running inside the traced process: lazy (an object's file is parsed when one of its
//! addresses is first asked for, a DWARF unit when one of its addresses is), bounded (parsed
//! state kept under a memory budget), with no process-wide lock (fork-safe), and aware of
//! objects loaded and unloaded while tracing.
//!
//! Runs on the writer's thread and then its symbols thread ([`Worker`]), with the thread that
//! stops a session naming some of the last frames beside it ([`Desk`]), and at start-up for
//! calibration (symbol tables only), never inside an allocation: symbolizing parses debug
//! info and allocates.
//!
//! Every address we capture is a return address (the instruction after a call), including
//! the innermost one kept: it is the return address of the call into the global allocator (or,
//! when an optimised build inlined the allocator shim into the allocating function, of that
//! function's call into the tracer: the shim's inlined locations are then trimmed).
//! [`Symbolizer::symbolize`] looks up `addr − 1`, inside the call instruction.

mod dwarf;
mod lending;
mod line_header;
mod line_program;
mod loaded_objects;
mod object_file;
mod symbolizer;
mod worker;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

#[cfg(debug_assertions)]
pub(crate) use self::lending::addresses_named_by_helpers;
pub(crate) use self::lending::{Desk, HELPING_STACK};
pub use self::symbolizer::{Options, Stats, Symbolizer};
pub(crate) use self::worker::Worker;
use crate::format::location_codec::{self, lossy_utf8, Location};
pub(crate) use crate::frames::is_allocator_shim;
use crate::runtime::state::say;

/// Bumped as the symbolizer works (every so many entries, rows or symbols read, and at each
/// address named): while the writer waits for names, stopping takes a moving count for
/// progress and a still one for a symbolizer stuck (on a file system that does not answer,
/// say), which it gives up on as it does on a writer stuck writing.
static WORK: AtomicU64 = AtomicU64::new(0);

/// How many steps of a loop over debug info or symbols go between two [`note_work`]s.
const WORK_STEP: usize = 1 << 12;

/// Say that the symbolizer is getting on with its work.
fn note_work() {
    WORK.fetch_add(1, Ordering::Relaxed);
}

/// Where addresses fall among a batch's addresses (distinct, in increasing order), for the
/// passes over an object's tables that file each entry under the batch address it may name
/// (symbols in [`object_file`], ranges in [`dwarf`]): an address's slot is how many of the
/// batch's are below it. A table's entries mostly come in address order (the symbols of one
/// source file, the ranges of one unit), so the slot of the entry before is tried first, and
/// searched for only when it is not that one: the search, a chain of dependent loads for each
/// entry, was most of a pass's time besides reading the table. Addresses below the batch's
/// take slot 0 without changing the one tried: half the ranges of a program's
/// `.debug_aranges` can be functions the linker dropped, left at address 0 among the ranges
/// of their unit.
struct Slots<'a> {
    sorted: &'a [u64],
    last: usize,
}

impl<'a> Slots<'a> {
    fn new(sorted: &'a [u64]) -> Slots<'a> {
        Slots { sorted, last: 0 }
    }

    /// The slot of `address`: `sorted.partition_point(|&p| p < address)`.
    fn of(&mut self, address: u64) -> usize {
        if self.sorted.first().is_none_or(|&first| address <= first) {
            return 0;
        }
        let k = self.last;
        let above_the_one_before = k == 0 || self.sorted[k - 1] < address;
        let at_or_below_this_one = self.sorted.get(k).is_none_or(|&p| address <= p);
        if !(above_the_one_before && at_or_below_this_one) {
            self.last = self.sorted.partition_point(|&p| p < address);
        }
        self.last
    }
}

/// A count that moves while the symbolizer works.
pub(crate) fn work_done() -> u64 {
    WORK.load(Ordering::Relaxed)
}

/// The symbolizer no writer is using: each writer's when it ends, handed to the next (and,
/// where calibration names frames, the one it named them with, unless the writer took the
/// slot's first), so that what they parsed is parsed once per process (within the budget).
/// Only ever `try_lock`ed: a child forked while another thread held it makes a new symbolizer
/// instead of waiting.
static SPARE: Mutex<Option<Symbolizer>> = parking_lot::const_mutex(None);

/// The spare symbolizer, or a new one with `options` when there is none (or it is in use).
pub(crate) fn take_spare(options: Options) -> Symbolizer {
    match SPARE.try_lock().and_then(|mut spare| spare.take()) {
        Some(mut symbolizer) => {
            symbolizer.set_options(options);
            symbolizer
        }
        None => Symbolizer::with_options(options),
    }
}

/// Keep `symbolizer` for the next user.
pub(crate) fn put_spare(symbolizer: Symbolizer) {
    if let Some(mut spare) = SPARE.try_lock() {
        *spare = Some(symbolizer);
    }
}

/// The number of objects the loader has loaded and unloaded so far (0 when it does not say):
/// one `dl_iterate_phdr` callback, no allocation.
pub(crate) fn loader_changes() -> u64 {
    crate::runtime::loader::counters().map_or(0, |(adds, subs)| adds.wrapping_add(subs))
}

/// Bounds the symbolizer's parsed state, in MiB (default [`Options::default`]'s).
pub(crate) const BUDGET_VAR: &str = "MEMTRACE_SYMBOLS_BUDGET_MIB";
/// `1` to read separate debug files (`/usr/lib/debug`) for objects without debug info.
pub(crate) const DEBUG_FILES_VAR: &str = "MEMTRACE_DEBUG_FILES";

/// The writer's symbolizer options: the defaults, changed by [`BUDGET_VAR`] and
/// [`DEBUG_FILES_VAR`]. A bad value is named on stderr and the default kept.
pub(crate) fn options_from_env() -> Options {
    let mut options = Options::default();
    if let Some(value) = crate::runtime::state::memtrace_var(BUDGET_VAR) {
        match value.to_str().and_then(|v| v.trim().parse::<usize>().ok()) {
            Some(mib) => options.memory_budget = mib.saturating_mul(1 << 20),
            None => say(&format!("memtrace: {BUDGET_VAR}={value:?} is not a number of MiB; using the default")),
        }
    }
    if let Some(value) = crate::runtime::state::memtrace_var(DEBUG_FILES_VAR) {
        match value.to_str() {
            Some("1") => options.separate_debug_files = true,
            Some("0") => options.separate_debug_files = false,
            _ => say(&format!("memtrace: {DEBUG_FILES_VAR}={value:?} is neither 0 nor 1; not reading debug files")),
        }
    }
    options
}

/// The locations of the code at return address `addr`, outermost first: the function that
/// contains the code, then one per inlined function, without the allocator shim and what is
/// inlined into it when the shim is itself inlined, shortened to fit a location record
/// ([`location_codec::shorten_to_fit`]). An address with no symbol gives one location named
/// after its object and its offset there ([`Symbolizer::place_in_object`]), or after the
/// address itself when it is in no object.
pub fn symbolize(symbolizer: &mut Symbolizer, addr: u64) -> Arc<[Location]> {
    let answer = symbolizer.symbolize(addr);
    locations(addr, answer, symbolizer)
}

/// The locations of the code at return address `addr` whose functions are `answer`, as
/// [`symbolize`] gives them.
fn locations(addr: u64, answer: symbolizer::Answer, symbolizer: &mut Symbolizer) -> Arc<[Location]> {
    let unknown_file: Arc<[u8]> = Arc::from(&b"<unknown>"[..]);
    let mut locations: Vec<Location> = answer
        .iter()
        .flat_map(|frames| frames.iter())
        .map(|frame| Location {
            filename: frame.file.as_deref().map_or_else(|| unknown_file.clone(), |f| f.as_bytes().into()),
            line: frame.line,
            start_char: frame.column,
            end_char: frame.column,
            defname: frame.function.as_deref().unwrap_or("??").as_bytes().into(),
        })
        .collect();
    if locations.is_empty() {
        let (name, file) = symbolizer.place_in_object(addr).unzip();
        locations.push(Location {
            filename: file.map_or(unknown_file, |f| f.into_bytes().into()),
            line: 0,
            start_char: 0,
            end_char: 0,
            defname: name.unwrap_or_else(|| format!("{addr:#x}")).into_bytes().into(),
        });
    }
    drop_inlined_shim(&mut locations);
    if location_codec::must_truncate(&locations) {
        // Too long for a location record, which would make it the unknown location.
        locations = location_codec::shorten_to_fit(&locations).into_owned();
    }
    locations.into()
}

/// Drop, from `locations` (outermost first), the global allocator's shim and what is inlined
/// into it (our allocator's methods), when the shim is itself inlined into the function that
/// allocates. An optimised build may do that in the crate that defines the global allocator;
/// the return address is then the allocating function's call into the tracer, and the
/// innermost kept frame the allocating function's, not the shim's (see `unwind::SHIM`).
fn drop_inlined_shim(locations: &mut Vec<Location>) {
    if let Some(shim) = locations.iter().position(|l| is_allocator_shim(&l.defname)) {
        if shim > 0 {
            locations.truncate(shim);
        }
    }
}

/// The demangled names (without hash) of the functions at return address `addr`, innermost
/// first.
pub fn function_names(symbolizer: &mut Symbolizer, addr: u64) -> Vec<String> {
    let frames = symbolizer.symbolize(addr);
    frames.iter().flat_map(|f| f.iter().rev()).map(|f| f.function.as_deref().unwrap_or("??").to_owned()).collect()
}

/// `function_names` with a symbolizer of its own, for tests and benchmarks.
pub fn function_names_once(addr: u64) -> Vec<String> {
    function_names(&mut Symbolizer::new(), addr)
}

/// Objects with DWARF for the tests to read: this test binary (DWARF 4 from rustc) and a few
/// dozen separate debug files under `/usr/lib/debug` where there are some (DWARF 5 from GCC).
#[cfg(test)]
fn test_objects() -> Vec<std::path::PathBuf> {
    let mut paths = vec![std::env::current_exe().unwrap()];
    let before = paths.len();
    paths.extend(
        std::fs::read_dir("/usr/lib/debug/.build-id")
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|dir| std::fs::read_dir(dir.path()).into_iter().flatten().flatten().map(|f| f.path()).take(2))
            .take(40),
    );
    if paths.len() == before {
        crate::test_skip::skip("no separate debug files, so no DWARF 5 from GCC (apt-get install libc6-dbg)");
    }
    paths
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn return_address_here() -> u64 {
        let mut symbolizer = Symbolizer::new();
        let mut ip = 0;
        let mut depth = 0;
        backtrace::trace(|frame| {
            depth += 1;
            // Frame 0 is inside backtrace; the first frame whose function is this test's
            // caller ends the walk.
            if function_names(&mut symbolizer, frame.ip() as u64).iter().any(|n| n.ends_with("known_caller")) {
                ip = frame.ip() as u64;
                return false;
            }
            depth < 64
        });
        ip
    }

    #[inline(never)]
    fn known_caller() -> (u64, u32) {
        let line = line!() + 1;
        let ip = return_address_here();
        // Used after the call, so that an optimised build cannot make it a tail call (which
        // would take this frame off the stack).
        (std::hint::black_box(ip), line)
    }

    #[test]
    fn resolves_return_addresses_to_the_call_line() {
        let (ip, line) = known_caller();
        assert_ne!(ip, 0, "caller frame not found");
        let locations = symbolize(&mut Symbolizer::new(), ip);
        let inner = locations.last().unwrap();
        // The full path, or with line-tables-only debug info (release) the bare name.
        let name = inner.defname_str();
        assert!(name.ends_with("symbolize::tests::known_caller") || name == "known_caller", "{inner:?}");
        assert!(inner.filename_str().ends_with("symbolize/mod.rs"), "{inner:?}");
        assert_eq!(inner.line, line);
        assert!(!inner.defname_str().contains("::h"), "hash not stripped: {inner:?}");
    }

    fn location(name: &str) -> Location {
        Location { filename: b"f.rs"[..].into(), line: 1, start_char: 0, end_char: 0, defname: name.as_bytes().into() }
    }

    fn names(locations: &[Location]) -> Vec<String> {
        locations.iter().map(|l| l.defname_str().into_owned()).collect()
    }

    #[test]
    fn an_inlined_allocator_shim_is_dropped() {
        // Outermost first: `site`, into which the shim is inlined, with our methods inlined.
        let mut inlined: Vec<_> =
            ["site", "alloc", "__rust_alloc", "alloc<std::alloc::System>", "sampled<A>"].map(location).into();
        drop_inlined_shim(&mut inlined);
        assert_eq!(names(&inlined), ["site", "alloc"]);
        let mut full_names: Vec<_> = ["site", "__rustc::__rust_realloc", "alloc<A>"].map(location).into();
        drop_inlined_shim(&mut full_names);
        assert_eq!(names(&full_names), ["site"]);
        // A frame of the shim's own (a failed skip) is kept whole; other code is untouched.
        for kept in [&["__rust_alloc_zeroed", "alloc<A>"][..], &["site", "my__rust_alloc"], &["site"]] {
            let mut locations: Vec<_> = kept.iter().map(|n| location(n)).collect();
            drop_inlined_shim(&mut locations);
            assert_eq!(names(&locations), kept);
        }
    }

    proptest::proptest! {
        /// Whatever order entries come in (runs in address order, addresses at 0 among them,
        /// any other), their slots are those a search gives.
        #[test]
        fn slots_are_where_a_search_puts_an_address(
            batch in proptest::collection::btree_set(1..1000u64, 0..24),
            runs in proptest::collection::vec((0..1100u64, 0..40u64, 1..60u64, proptest::bool::ANY), 0..12),
        ) {
            let sorted: Vec<u64> = batch.into_iter().collect();
            let mut slots = Slots::new(&sorted);
            for (start, len, step, with_zeros) in runs {
                for address in (0..len).map(|i| start + i * step) {
                    for address in [address, 0].into_iter().take(if with_zeros { 2 } else { 1 }) {
                        proptest::prop_assert_eq!(slots.of(address), sorted.partition_point(|&p| p < address));
                    }
                }
            }
        }
    }

    #[test]
    fn unknown_addresses_get_a_placeholder() {
        let locations = symbolize(&mut Symbolizer::new(), 8);
        assert_eq!(locations.len(), 1);
        assert_eq!(locations[0].defname_str(), "0x8");
    }

    /// Code that no symbol names (a library stripped of its symbol table and debug info, as
    /// Debian's libc is of its local functions) is named after its object and its offset there,
    /// the address less the object's load address, with the object's path and build-id.
    #[test]
    fn code_without_a_symbol_is_named_by_object_and_offset() {
        use std::os::unix::ffi::OsStrExt;
        let dir = std::env::temp_dir().join(format!("symbolize-place-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let source = dir.join("place.c");
        std::fs::write(
            &source,
            "static int hidden(int x) { return x * 7; }\nvoid *hidden_address(void) { return (void *)hidden; }\n",
        )
        .unwrap();
        let library = dir.join("libplace.so");
        let built = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-s", "-Wl,--build-id", "-o"])
            .arg(&library)
            .arg(&source)
            .status();
        if !built.is_ok_and(|s| s.success()) {
            symbolizer::tests::skip_without_compiler();
            return;
        }
        let path = std::ffi::CString::new(library.as_os_str().as_bytes()).unwrap();
        // SAFETY: NUL-terminated strings; the library has no constructors, and `hidden_address`
        // takes nothing and returns a pointer.
        let (hidden, base) = unsafe {
            let handle = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
            assert!(!handle.is_null(), "dlopen {library:?}");
            let f = libc::dlsym(handle, c"hidden_address".as_ptr());
            assert!(!f.is_null());
            let hidden_address: extern "C" fn() -> *mut libc::c_void = std::mem::transmute(f);
            let hidden = hidden_address() as u64;
            let mut info: libc::Dl_info = std::mem::zeroed();
            assert_ne!(libc::dladdr(hidden as *const libc::c_void, &mut info), 0);
            (hidden, info.dli_fbase as u64)
        };
        // A return address a few bytes into `hidden`.
        let locations = symbolize(&mut Symbolizer::new(), hidden + 2);
        assert_eq!(locations.len(), 1, "{locations:?}");
        assert_eq!(locations[0].defname_str(), format!("libplace.so+{:#x}", hidden + 2 - base));
        let file = locations[0].filename_str();
        assert!(file.starts_with(&format!("{} build-id ", library.display())), "{file}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
