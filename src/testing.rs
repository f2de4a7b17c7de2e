//! Heap assertions for tests: the exact heap figures of one scope on one thread, and the sites
//! that allocated most in it, while the rest of the process runs untraced or traced.
//!
//! With [`MemtraceAllocator`](crate::MemtraceAllocator) as the global allocator,
//! [`measure`] runs a closure and counts every allocation the calling thread makes in it,
//! exactly (not sampled), and every free of those blocks, on whatever thread it happens. Tests
//! that measure run in parallel in one test binary, each counting its own thread only, and a
//! tracing session running meanwhile samples as it would (its estimates stay unbiased).
//!
//! ```
//! use memtrace_rs::MemtraceAllocator;
//!
//! #[global_allocator]
//! static GLOBAL: MemtraceAllocator = MemtraceAllocator::system();
//!
//! fn build() -> Vec<u64> {
//!     (0..1000).collect()
//! }
//!
//! fn main() {
//!     let (v, stats) = memtrace_rs::testing::measure(build);
//!     assert_eq!((stats.total_bytes, stats.total_blocks, stats.curr_blocks), (8000, 1, 1));
//!     drop(v);
//!     // A test asserting less fails, with the figures and the sites that allocated:
//!     let failed = std::panic::catch_unwind(|| stats.assert_max_bytes(4096)).unwrap_err();
//!     let message = failed.downcast_ref::<String>().unwrap();
//!     assert!(message.contains("the peak of live bytes, 8000, is above the limit of 4096"));
//!     assert!(message.contains("8000 B  rust_out::build at "), "{message}");
//!     println!("{message}");
//! }
//! ```
//!
//! What counts: the blocks the calling thread allocates inside the closure (`alloc`,
//! `alloc_zeroed`, and `realloc` as dhat counts it: a new block of the new size, the old one
//! freed if the scope allocated it), and the frees of those blocks, on any thread, while the
//! scope runs. Threads the closure spawns are not measured (their allocations count nowhere),
//! but their frees of the scope's blocks count. A scope nested in another on the same thread
//! counts in both. The tracer's own allocations are never counted.

use std::cell::RefCell;
use std::fmt;
use std::panic::{self, AssertUnwindSafe, Location};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::frames;
use crate::runtime::measure::{Figures, Scope, Sites};
use crate::runtime::sampler;
use crate::runtime::symbolize;

/// How many sites an assertion's message lists.
const SITES_SHOWN: usize = 5;

/// What a measured scope allocated, exactly (see the [module doc](self)), with the stacks of a
/// sample of its allocations, which name the sites that allocated most.
///
/// The figures are named as dhat-rs's `HeapStats` names them.
#[derive(Debug, Clone)]
pub struct HeapStats {
    /// Bytes allocated in the scope (each `realloc` counts its new size).
    pub total_bytes: u64,
    /// Blocks allocated in the scope (each `realloc` counts one).
    pub total_blocks: u64,
    /// The peak of the bytes of the scope's blocks live at once while it ran.
    pub max_bytes: u64,
    /// Bytes of the scope's blocks still live when it ended.
    pub curr_bytes: u64,
    /// The scope's blocks still live when it ended.
    pub curr_blocks: u64,
    /// Blocks of the scope whose free could not be followed (no memory was left to track
    /// them): counted in the totals but not in the live figures. Almost always 0.
    pub untracked_blocks: u64,
    /// Stacks (frame addresses, innermost first) and the bytes each stands for.
    stacks: Vec<(Box<[u64]>, u64)>,
}

/// An allocating site: the innermost frame of an allocation's stack that is the program's
/// own (not the allocator's or the standard library's allocation machinery).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    /// The function, demangled.
    pub function: String,
    /// The source file, as the debug info names it.
    pub file: String,
    /// The line, 0 if unknown.
    pub line: u32,
    /// The bytes the site allocated, as a sample of the scope's allocations estimates them
    /// (its first 64 allocations exactly, then one per 16 KiB allocated).
    pub bytes: u64,
}

thread_local! {
    /// The stats of the last scope on this thread whose closure panicked.
    static UNWOUND: RefCell<Option<HeapStats>> = const { RefCell::new(None) };
}

/// Run `f`, counting every allocation this thread makes in it (see the [module doc](self)):
/// its value and the scope's [`HeapStats`].
///
/// If `f` panics, the panic goes on after the scope has ended, and its stats are kept for
/// [`unwound_stats`].
///
/// # Panics
/// If the global allocator is not [`MemtraceAllocator`](crate::MemtraceAllocator), or if more
/// than 255 scopes (nested ones included) are measuring at once.
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, HeapStats) {
    check_global_allocator();
    let scope = outside_scopes(Scope::new)
        .unwrap_or_else(|_| panic!("memtrace_rs::testing::measure: more than 255 scopes are measuring at once"));
    let result = scope.run(|| panic::catch_unwind(AssertUnwindSafe(f)));
    let stats = outside_scopes(|| HeapStats::new(scope.end()));
    match result {
        Ok(value) => (value, stats),
        Err(payload) => {
            UNWOUND.with(|u| *u.borrow_mut() = Some(stats));
            panic::resume_unwind(payload)
        }
    }
}

/// The stats of the last [`measure`] on this thread whose closure panicked (taken: the next
/// call gives `None` until another one does).
pub fn unwound_stats() -> Option<HeapStats> {
    UNWOUND.with(|u| u.borrow_mut().take())
}

/// Run `f` as the tracer's own code: what it allocates counts in no scope (and is never
/// sampled).
fn outside_scopes<R>(f: impl FnOnce() -> R) -> R {
    let mut f = Some(f);
    let ran = sampler::in_tracer(|| f.take().expect("run once")());
    // `None` only with the thread's state gone (its teardown), where nothing is measured.
    ran.unwrap_or_else(|| f.take().expect("run once")())
}

/// Fail unless a measured allocation is counted: [`measure`] with another global allocator
/// would report nothing at all.
fn check_global_allocator() {
    static CHECKED: AtomicBool = AtomicBool::new(false);
    if CHECKED.load(Ordering::Relaxed) {
        return;
    }
    let Ok(scope) = Scope::new() else { return };
    scope.run(|| drop(std::hint::black_box(Box::new(1u8))));
    let (figures, _) = scope.end();
    assert!(
        figures.total_blocks == 1,
        "memtrace_rs::testing::measure needs MemtraceAllocator as the #[global_allocator]"
    );
    CHECKED.store(true, Ordering::Relaxed);
}

impl HeapStats {
    fn new((figures, sites): (Figures, Sites)) -> HeapStats {
        let Figures { total_bytes, total_blocks, max_bytes, curr_bytes, curr_blocks, untracked_blocks } = figures;
        let mut stacks: Vec<_> = sites.stacks.into_iter().collect();
        stacks.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        if sites.other_bytes != 0 {
            stacks.push((Box::new([]), sites.other_bytes));
        }
        HeapStats { total_bytes, total_blocks, max_bytes, curr_bytes, curr_blocks, untracked_blocks, stacks }
    }

    /// Panic, naming the top allocating sites, if the peak of live bytes went above `limit`.
    #[track_caller]
    pub fn assert_max_bytes(&self, limit: u64) {
        if self.max_bytes > limit {
            self.fail(
                Location::caller(),
                &format!("the peak of live bytes, {}, is above the limit of {limit}", self.max_bytes),
            );
        }
    }

    /// Panic, naming the top allocating sites, if more than `limit` bytes were allocated.
    #[track_caller]
    pub fn assert_total_bytes(&self, limit: u64) {
        if self.total_bytes > limit {
            let what = format!("{} bytes were allocated, above the limit of {limit}", self.total_bytes);
            self.fail(Location::caller(), &what);
        }
    }

    /// Panic, naming the top allocating sites, if any block of the scope was still live when it
    /// ended.
    #[track_caller]
    pub fn assert_no_leaks(&self) {
        if self.curr_blocks != 0 {
            let what = format!("{} blocks ({} bytes) are still live", self.curr_blocks, self.curr_bytes);
            self.fail(Location::caller(), &what);
        }
    }

    #[track_caller]
    fn fail(&self, at: &Location<'_>, what: &str) -> ! {
        panic!("heap assertion failed at {}:{}: {what}\n{self}", at.file(), at.line())
    }

    /// The sites that allocated most in the scope, most first, named by the crate's own
    /// symbolizer (which reads the program's debug info the first time).
    pub fn sites(&self) -> Vec<Site> {
        outside_scopes(|| {
            let mut symbolizer = symbolize::take_spare(symbolize::Options::default());
            let mut sites: Vec<Site> = Vec::new();
            for (frames, bytes) in &self.stacks {
                let site = site_of(&mut symbolizer, frames);
                match sites.iter_mut().find(|s| (&s.function, &s.file, s.line) == (&site.0, &site.1, site.2)) {
                    Some(known) => known.bytes += bytes,
                    None => sites.push(Site { function: site.0, file: site.1, line: site.2, bytes: *bytes }),
                }
            }
            symbolize::put_spare(symbolizer);
            sites.sort_by_key(|site| std::cmp::Reverse(site.bytes));
            sites
        })
    }
}

/// The program's innermost frame of `frames` (innermost first): function, file and line;
/// `<unknown>` for a stack with none (or none captured).
fn site_of(symbolizer: &mut symbolize::Symbolizer, frames: &[u64]) -> (String, String, u32) {
    for &addr in frames {
        // Each frame's locations are outermost first: its function, then the calls inlined.
        for location in symbolize::symbolize(symbolizer, addr).iter().rev() {
            let function = String::from_utf8_lossy(&location.defname);
            let file = String::from_utf8_lossy(&location.filename);
            if !frames::is_allocator_frame(&function, &file) && !frames::is_tracer_frame(&function) {
                return (function.into_owned(), file.into_owned(), location.line);
            }
        }
    }
    ("<unknown>".to_owned(), String::new(), 0)
}

/// The figures, then the top allocating sites.
impl fmt::Display for HeapStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "measured: {} bytes in {} blocks allocated, a peak of {} bytes live, {} bytes in {} blocks live at the end",
            self.total_bytes, self.total_blocks, self.max_bytes, self.curr_bytes, self.curr_blocks
        )?;
        if self.untracked_blocks != 0 {
            writeln!(f, "({} blocks could not be followed to their free)", self.untracked_blocks)?;
        }
        let sites = self.sites();
        if !sites.is_empty() {
            writeln!(f, "top allocating sites (bytes estimated from a sample of the allocations):")?;
        }
        for site in sites.iter().take(SITES_SHOWN) {
            writeln!(f, "  {:>10} B  {} at {}:{}", site.bytes, site.function, site.file, site.line)?;
        }
        Ok(())
    }
}
