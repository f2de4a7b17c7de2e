//! Capturing the stack of a sampled allocation: the stack walkers (a frame-pointer walk, a
//! DWARF walk with a cache of unwind rules in [`cfi`], and libgcc's DWARF unwinder), the
//! per-walker, per-entry-point leading frames that belong to the tracer (a count, then the
//! allocator shim's frame when it is at its calibrated address), and the start-up calibration
//! that measures them.
//!
//! Everything here runs inside the tracer (allocations are not sampled) and, on the sampled
//! path, allocates nothing.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::allocator::Entry;
use crate::sampler;
use crate::symbolize;
use crate::tracer::{StartError, CALIBRATING, DEFAULT_FRAME_CAP, MAX_FRAMES, OFF, STATE};

pub(crate) mod cfi;

/// The stack walkers behind the [`Unwinder`]s (`Walker as usize` indexes the per-walker
/// calibration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Walker {
    /// libgcc's `_Unwind_Backtrace`, through `backtrace::trace_unsynchronized`.
    Libgcc = 0,
    FramePointers = 1,
    /// The DWARF walk with cached rules ([`cfi`]); libgcc unwinds the stacks it cannot.
    Cfi = 2,
}

impl Walker {
    const ALL: [Walker; 3] = [Walker::Libgcc, Walker::FramePointers, Walker::Cfi];

    /// The name in the trace's runtime parameters.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Walker::Libgcc if cfg!(target_vendor = "apple") => "libunwind",
            Walker::Libgcc => "libgcc",
            Walker::FramePointers => "frame-pointers",
            Walker::Cfi => "dwarf",
        }
    }
}

/// Per [`Walker`] and [`Entry`]: leading captured frames that belong to the tracer and the
/// unwinder, below the allocator shim's frame (measured by [`calibrate`]).
#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `SKIP`.
const NO_SKIP: [AtomicUsize; 3] = [AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0)];
static SKIP: [[AtomicUsize; 3]; 3] = [NO_SKIP, NO_SKIP, NO_SKIP];
/// Per [`Walker`] and [`Entry`]: the address, in the allocator shim (`__rust_alloc` and co.,
/// with the global allocator's methods inlined), at which it calls into the tracer; 0 when
/// calibration saw no shim frame. The frame after the [`SKIP`] ones is dropped too when it is
/// at that address: the shim's own frame. In an optimised build LLVM may inline the shim into
/// a function of the crate that defines the global allocator; the frame of that function is at
/// another address, and is kept (the writer trims the shim's inlined locations from it). With
/// LTO the shim may also be inlined into the calibration's marker functions (no shim frame to
/// see) yet called out of line elsewhere: the writer drops such a frame, whose outermost
/// location is the shim.
#[allow(clippy::declare_interior_mutable_const)] // Only used to initialise `SHIM`.
const NO_SHIM: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
static SHIM: [[AtomicU64; 3]; 3] = [NO_SHIM, NO_SHIM, NO_SHIM];
/// Frames recorded per sample in the current session.
pub(crate) static FRAME_CAP: AtomicUsize = AtomicUsize::new(DEFAULT_FRAME_CAP);
/// The walker of the current session (or of the calibration under way), as `Walker as u8`.
pub(crate) static WALKER: AtomicU8 = AtomicU8::new(Walker::Libgcc as u8);
/// Per [`Walker`]: whether its [`SKIP`] and [`SHIM`] have been measured in this process.
static CALIBRATED: [AtomicBool; 3] = [AtomicBool::new(false), AtomicBool::new(false), AtomicBool::new(false)];
/// Per [`Walker`]: whether its calibration found it usable in this process (for frame
/// pointers: a frame chain; for the cached DWARF walk: libgcc's stacks).
static USABLE: [AtomicBool; 3] = [AtomicBool::new(true), AtomicBool::new(false), AtomicBool::new(false)];
/// A calibration capture: its frame count and frames.
type Capture = (usize, [u64; MAX_FRAMES]);
const NO_CAPTURE: Capture = (0, [0; MAX_FRAMES]);
/// The captures made by the calibration markers, per [`Walker`] and [`Entry`].
pub(crate) static CALIBRATION: Mutex<[[Capture; 3]; 3]> = parking_lot::const_mutex([[NO_CAPTURE; 3]; 3]);
/// Frames at the outer end of a stack that a frame-pointer walk may miss and still count as
/// complete: the C library's thread or process start (`__libc_start_call_main`,
/// `__libc_start_main`, `_start`; `start_thread`, `clone3`), which keeps no frame pointers.
const C_START_FRAMES: usize = 3;

/// How a sampled allocation's stack is captured.
///
/// Starting a trace resolves [`Auto`](Unwinder::Auto) to one of the others; the trace's
/// runtime parameters name the walker used: `frame-pointers`, `dwarf` (the cached walk) or
/// `libgcc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Unwinder {
    /// Frame pointers when the program keeps them, DWARF otherwise. The default.
    ///
    /// Tracing starts by capturing a few stacks with both unwinders (the calibration it
    /// needs anyway). When the frame-pointer walk finds every frame the DWARF unwinder finds,
    /// from the allocation up to the C library's start-up code, the program was built with
    /// frame pointers (`-C force-frame-pointers=yes`), and sampling uses
    /// [`Unwinder::FramePointers`]; otherwise it uses [`Unwinder::Dwarf`]. Only the stack that
    /// starts tracing is checked: code reached otherwise that keeps no frame pointers (a C
    /// library calling back into Rust, say) loses frames from the stacks that pass through it.
    #[default]
    Auto = 2,
    /// Unwind with the DWARF call-frame information of the unwind tables: works for any
    /// program that has them (Rust's default).
    ///
    /// On x86_64 Linux with glibc, the stack is walked with the rules of each return address,
    /// worked out from the tables the first time the address is met and cached: within a
    /// factor of two of a frame-pointer walk once the program's call sites have been seen. A
    /// stack that needs more than those rules can express (rare: stack realignment, a signal
    /// frame) is unwound by libgcc's `_Unwind_Backtrace`, as every stack is on other
    /// platforms or if start-up calibration finds the cached walk's stacks differ from
    /// libgcc's; that costs a few µs per sample.
    ///
    /// Both find unwind tables with libgcc's `_Unwind_Find_FDE` (the cached walk only on a
    /// cache miss), which uses glibc's lock-free `_dl_find_object` (glibc 2.35 and later with
    /// libgcc 12 and later). Older C libraries make it take the dynamic loader's lock, so a
    /// sample could deadlock against a thread inside `dlopen`/`dlclose`; tracing then says so
    /// on stderr when it starts (ALLOCATOR-PITFALLS §3).
    Dwarf = 0,
    /// Walk the frame-pointer chain: the cheapest (about 13–15 ns a frame less than cached DWARF
    /// rules), and never touches the dynamic loader or an unwinder lock. Needs the program
    /// built with `-C force-frame-pointers=yes` (e.g. `RUSTFLAGS="-C force-frame-pointers=yes"`;
    /// the precompiled std keeps frame pointers since Rust 1.79); a function without one hides
    /// its caller's frame from the stacks that pass through it, and C code that uses the
    /// frame-pointer register for data (calling back into Rust) ends them there or adds stray
    /// frames past it. x86_64 and aarch64 Linux only; elsewhere, or when start-up calibration
    /// finds no usable frame chain, tracing uses [`Unwinder::Dwarf`] and says so on stderr.
    FramePointers = 1,
}

impl Unwinder {
    /// The name used by [`UNWINDER_VAR`](crate::tracer::UNWINDER_VAR) and in the trace's runtime parameters.
    pub fn name(self) -> &'static str {
        match self {
            Unwinder::Auto => "auto",
            Unwinder::Dwarf => "dwarf",
            Unwinder::FramePointers => "frame-pointers",
        }
    }
}

/// Record the stack of a sample taken in `entry` with the session's walker into `frames`,
/// innermost first, without the tracer's own frames (all frames, up to [`MAX_FRAMES`], for a
/// calibration capture). Returns the number of frames written. Allocation-free, except that
/// the first capture on a thread asks for the thread's stack bounds and the cached DWARF
/// walk's cache misses read unwind tables.
///
/// A walk that cannot take a stack (stack bounds unknown on this thread, a sample taken on
/// another stack, a frame the cached DWARF walk cannot follow) hands it to libgcc, which drops
/// its own calibrated leading frames. A calibration capture is only ever its walker's own:
/// none when the walk fails.
#[inline(always)]
pub(crate) fn capture(entry: Entry, calibrating: bool, frames: &mut [u64; MAX_FRAMES]) -> usize {
    let cap = if calibrating { MAX_FRAMES } else { FRAME_CAP.load(Ordering::Relaxed) };
    let skip = |walker: Walker| {
        let (w, e) = (walker as usize, entry as usize);
        if calibrating {
            Leading::NONE
        } else {
            Leading { tracer: SKIP[w][e].load(Ordering::Relaxed), shim: SHIM[w][e].load(Ordering::Relaxed) }
        }
    };
    let walker = WALKER.load(Ordering::Relaxed);
    if walker == Walker::FramePointers as u8 {
        match frame_pointers::stack_bounds()
            .and_then(|b| frame_pointers::capture(skip(Walker::FramePointers), cap, frames, b))
        {
            Some(n) => return n,
            None if calibrating => return 0,
            None => {}
        }
    }
    if walker == Walker::Cfi as u8 {
        match frame_pointers::stack_bounds().and_then(|b| cfi::capture(skip(Walker::Cfi), cap, frames, b)) {
            Some(n) => return n,
            None if calibrating => return 0,
            None => {}
        }
    }
    capture_libgcc(skip(Walker::Libgcc), cap, frames)
}

/// The leading frames of a capture that are dropped: `tracer` frames, then one more if it is at
/// the address `shim` (see [`SHIM`]).
#[derive(Clone, Copy)]
struct Leading {
    tracer: usize,
    shim: u64,
}

impl Leading {
    /// Drop nothing (return addresses are never 0).
    const NONE: Leading = Leading { tracer: 0, shim: 0 };

    /// Whether the frame at `index` (innermost first), at address `ip`, is dropped.
    #[inline(always)]
    fn drops(self, index: usize, ip: u64) -> bool {
        index < self.tracer || (index == self.tracer && ip == self.shim)
    }
}

/// [`capture`] with libgcc's DWARF unwinder: up to `cap` frame addresses after the `skip` ones.
#[inline(never)]
fn capture_libgcc(skip: Leading, cap: usize, frames: &mut [u64; MAX_FRAMES]) -> usize {
    let cap = cap.min(MAX_FRAMES);
    let mut seen = 0;
    let mut n = 0;
    // SAFETY: on Unix the unwinder (libgcc `_Unwind_Backtrace`) is thread-safe; the
    // synchronized `trace` only adds a process-wide lock, which must not be taken inside an
    // allocator (ALLOCATOR-PITFALLS §2). The callback only writes into `frames`.
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            let ip = frame.ip() as u64;
            if ip == 0 {
                // The end of the stack.
                return false;
            }
            if !skip.drops(seen, ip) {
                if let Some(slot) = frames.get_mut(n) {
                    *slot = ip;
                    n += 1;
                }
            }
            seen += 1;
            n < cap
        });
    }
    n
}

/// Stack capture by walking the frame-pointer chain (ALLOCATOR-PITFALLS §10): no DWARF
/// tables, no loader lock, no unwinder lock, safe next to signal-based profilers.
///
/// Each frame that keeps a frame pointer stores the record `[caller's frame pointer, return
/// address]` at its frame pointer (x86_64 `rbp`, aarch64 `x29`). The walk follows the records
/// and stops at the first one that fails a check: every record must lie within this thread's
/// stack, above the current stack pointer (so it is mapped and readable: the walk never
/// faults), 8-byte aligned, and strictly above the previous record (so the walk ends). The
/// stack bounds come from `pthread_getattr_np` once per thread and are cached in
/// `const`-initialised thread-local cells; a thread whose bounds are unknown (or a sample
/// taken on another stack, such as a signal stack) falls back to DWARF unwinding.
///
/// The chain is only complete if every function between `main` and the allocator keeps frame
/// pointers: build the program with `-C force-frame-pointers=yes` (Rust's precompiled std
/// keeps them since 1.79). A function without one leaves the frame-pointer register alone and
/// writes no frame record, so its caller's frame is missing from the stack (its own return
/// address is in its callee's record); one that uses the register for other data (C
/// code built with `-fomit-frame-pointer`, calling back into Rust) ends the walk there or,
/// when that data happens to be an address higher up the stack, adds stray frames above it.
/// The walk itself never faults and always ends.
mod frame_pointers {
    use super::*;

    /// Whether this target has a frame-pointer walker.
    pub(super) const SUPPORTED: bool = cfg!(all(
        any(target_arch = "x86_64", target_arch = "aarch64"),
        any(target_os = "linux", target_os = "android")
    ));

    /// `hi` values with a special meaning in [`STACK`].
    const UNKNOWN: usize = 0;
    const UNAVAILABLE: usize = 1;

    thread_local! {
        /// This thread's stack as `(lowest address, end)`; `end` is [`UNKNOWN`] until asked
        /// for, [`UNAVAILABLE`] when it cannot be known.
        static STACK: (Cell<usize>, Cell<usize>) = const { (Cell::new(0), Cell::new(UNKNOWN)) };
    }

    /// This thread's stack bounds, asked for on the first call (callers are inside the tracer:
    /// `pthread_getattr_np` may allocate, reading `/proc/self/maps` for the main thread).
    #[inline]
    pub(super) fn stack_bounds() -> Option<(usize, usize)> {
        STACK
            .try_with(|(lo, hi)| {
                if hi.get() == UNKNOWN {
                    let (l, h) = query_stack_bounds().unwrap_or((0, UNAVAILABLE));
                    lo.set(l);
                    hi.set(h);
                }
                (hi.get() != UNAVAILABLE).then(|| (lo.get(), hi.get()))
            })
            .ok()
            .flatten()
    }

    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn query_stack_bounds() -> Option<(usize, usize)> {
        // SAFETY: `attr` is initialised by pthread_getattr_np before use and destroyed after;
        // the out-pointers are valid for writes.
        unsafe {
            let mut attr: libc::pthread_attr_t = std::mem::zeroed();
            if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
                return None;
            }
            let mut addr: *mut libc::c_void = std::ptr::null_mut();
            let mut size: libc::size_t = 0;
            let result = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
            libc::pthread_attr_destroy(&mut attr);
            let lo = addr as usize;
            (result == 0 && lo > UNAVAILABLE && size > 0).then(|| (lo, lo.saturating_add(size)))
        }
    }

    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    fn query_stack_bounds() -> Option<(usize, usize)> {
        None
    }

    /// Whether this code runs on its thread's own stack, of known bounds: the only stack the
    /// walk reads (a coroutine's or a signal handler's stack is unwound with DWARF).
    pub(super) fn on_thread_stack() -> bool {
        let sp = registers().1;
        stack_bounds().is_some_and(|(lo, hi)| lo <= sp && sp < hi)
    }

    /// The current `(frame pointer, stack pointer)`.
    #[inline(always)]
    fn registers() -> (usize, usize) {
        let (fp, sp): (usize, usize);
        // SAFETY: reads two registers; no memory access.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            std::arch::asm!("mov {fp}, rbp", "mov {sp}, rsp", fp = out(reg) fp, sp = out(reg) sp,
                options(nomem, nostack, preserves_flags));
        }
        // SAFETY: reads two registers; no memory access.
        #[cfg(target_arch = "aarch64")]
        unsafe {
            std::arch::asm!("mov {fp}, x29", "mov {sp}, sp", fp = out(reg) fp, sp = out(reg) sp,
                options(nomem, nostack, preserves_flags));
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            (fp, sp) = (0, 0);
        }
        (fp, sp)
    }

    /// Up to `cap` return addresses, innermost first, after the `skip` ones; `stack` is this
    /// thread's `(lowest address, end)`. Returns the number written, or `None` when the sample
    /// was not taken on the thread's stack (the caller then unwinds with DWARF).
    #[inline(never)]
    pub(super) fn capture(
        skip: Leading,
        cap: usize,
        frames: &mut [u64; MAX_FRAMES],
        stack: (usize, usize),
    ) -> Option<usize> {
        const WORD: usize = std::mem::size_of::<usize>();
        let cap = cap.min(MAX_FRAMES);
        let (mut fp, sp) = registers();
        let (lo, hi) = stack;
        if sp < lo || sp >= hi {
            // Another stack (a signal stack, a coroutine): not ours to walk.
            return None;
        }
        let mut n = 0;
        let mut seen = 0;
        // Every record read is within [sp, hi): the live part of this thread's stack.
        while n < cap && fp >= sp && fp % WORD == 0 && fp <= hi - 2 * WORD {
            // SAFETY: `[fp, fp + 16)` is inside the mapped, live part of this thread's stack
            // (checked above) and aligned; volatile reads of plain words, never dereferenced.
            let (next, ret) = unsafe {
                (std::ptr::read_volatile(fp as *const usize), std::ptr::read_volatile((fp + WORD) as *const usize))
            };
            if ret == 0 {
                break;
            }
            if !skip.drops(seen, ret as u64) {
                frames[n] = ret as u64;
                n += 1;
            }
            seen += 1;
            if next <= fp {
                break;
            }
            fp = next;
        }
        Some(n)
    }
}

// ---------------------------------------------------------------------------------------------
// Calibration

/// Measure, once per process, how many leading captured frames belong to the tracer, the
/// unwinder and the allocator shims for each entry point and walker, so that the innermost
/// frame kept is the code that called into the global allocator.
///
/// A forced sample is taken from an `#[inline(never)]` marker function per entry point; the
/// frames below the marker are resolved once, and everything up to the last one that is ours
/// (`memtrace_rs::`, `backtrace::`, `__rust_alloc`, `__rg_`, `_Unwind_`, ...) is skipped: a
/// count of frames ([`SKIP`]), then the allocator shim's frame if it is at the address where
/// calibration saw it ([`SHIM`]; an optimised build may inline the shim into the allocating
/// function, whose frame must be kept, and whose locations the writer trims of the shim's).
/// This also warms up the walkers before any real sample is taken. Called with the tracer's
/// session lock held and tracing off.
///
/// Every walker that can walk this stack is calibrated, whatever is wanted, from one call site,
/// so that their stacks can be compared: libgcc's always (the last resort of the others), and
/// the frame-pointer and cached DWARF walks on the thread's own stack. Returns the walker to
/// use: for [`Unwinder::Auto`], frame pointers when their walk is
/// [complete](frame_chain_complete); for DWARF, the cached walk when its stacks are libgcc's.
/// Frame pointers asked for but not walkable here give DWARF, with a note on stderr.
pub(crate) fn calibrate(wanted: Unwinder) -> Result<Walker, StartError> {
    let walkable = frame_pointers::SUPPORTED && frame_pointers::on_thread_stack();
    let mut usable = [false; 3];
    // The others' stacks again whenever the cached DWARF walk is calibrated, so that its stacks
    // are compared with libgcc's, and libgcc's with the frame-pointer walk's, from one call site.
    let again = cfi::SUPPORTED && walkable && !CALIBRATED[Walker::Cfi as usize].load(Ordering::Relaxed);
    for walker in Walker::ALL {
        let possible = match walker {
            Walker::Libgcc => true,
            Walker::FramePointers => walkable,
            Walker::Cfi => cfi::SUPPORTED && walkable,
        };
        if possible {
            usable[walker as usize] = calibrate_walker(walker, again)?;
        }
    }
    let dwarf = if usable[Walker::Cfi as usize] { Walker::Cfi } else { Walker::Libgcc };
    let why_not_frame_pointers = match wanted {
        Unwinder::Dwarf => None,
        _ if !frame_pointers::SUPPORTED => Some("is not supported on this platform"),
        _ if !walkable => Some("cannot walk this stack (not the thread's own, or of unknown bounds)"),
        _ if !usable[Walker::FramePointers as usize] => {
            Some("finds no frame chain (build with -C force-frame-pointers=yes)")
        }
        Unwinder::Auto if !frame_chain_complete() => None,
        _ => return Ok(Walker::FramePointers),
    };
    if wanted == Unwinder::FramePointers {
        let why = why_not_frame_pointers.unwrap_or("finds an incomplete frame chain");
        eprintln!("memtrace: frame-pointer unwinding {why}; using DWARF unwinding");
    }
    if !has_lock_free_table_lookup() {
        eprintln!(
            "memtrace: note: this C library has no _dl_find_object (glibc < 2.35), so DWARF unwinding \
             can deadlock against dlopen/dlclose; building with -C force-frame-pointers=yes avoids it"
        );
    }
    Ok(dwarf)
}

/// The callers of each calibration marker as `walker` captured them (its tracer frames skipped).
fn calibration_callers(captures: &[[Capture; 3]; 3], walker: Walker, entry: usize) -> &[u64] {
    let (n, frames) = &captures[walker as usize][entry];
    let skip = SKIP[walker as usize][entry].load(Ordering::Relaxed).min(*n);
    &frames[skip..*n]
}

/// Whether the frame-pointer walks of the calibration stacks found every frame the DWARF
/// unwinder found, but for the C library's start-up frames: then the program keeps frame
/// pointers. Both walkers must have been calibrated.
fn frame_chain_complete() -> bool {
    let captures = CALIBRATION.lock();
    (0..3).all(|entry| {
        chain_complete(
            calibration_callers(&captures, Walker::Libgcc, entry),
            calibration_callers(&captures, Walker::FramePointers, entry),
        )
    })
}

/// Whether a frame-pointer walk that found `walked` (innermost first, the tracer's frames
/// skipped) found everything the DWARF unwinder found (`dwarf`) up to the C library's
/// start-up frames.
fn chain_complete(dwarf: &[u64], walked: &[u64]) -> bool {
    let common = dwarf.iter().zip(walked).take_while(|(d, w)| d == w).count();
    common > 0 && common + C_START_FRAMES >= dwarf.len()
}

/// Whether two walks found the same callers, given as (callers, whether the capture was cut at
/// [`MAX_FRAMES`]): equal, or one a prefix of the other that was cut short (the walkers have
/// different numbers of leading frames of their own).
fn same_stack((a, a_cut): (&[u64], bool), (b, b_cut): (&[u64], bool)) -> bool {
    let common = a.len().min(b.len());
    common > 0
        && a[..common] == b[..common]
        && (a.len() == b.len() || (a.len() < b.len() && a_cut) || (b.len() < a.len() && b_cut))
}

/// Whether the C library offers `_dl_find_object`, which lets libgcc find unwind tables
/// without the dynamic loader's lock. Assumed on C libraries other than glibc.
fn has_lock_free_table_lookup() -> bool {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        return true;
    }
    // SAFETY: `dlsym` with `RTLD_DEFAULT` and a NUL-terminated name only looks the symbol up.
    !unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_dl_find_object".as_ptr()) }.is_null()
}

/// Calibrate `walker` (once per process, or `again`). Returns whether it is usable: libgcc
/// always; frame pointers when their captures reach the marker functions (when they do not,
/// nothing is skipped); the cached DWARF walk when its captures, tracer frames skipped, are
/// those libgcc took just before from the same call site. A failed comparison is not kept:
/// the next session tries again.
fn calibrate_walker(walker: Walker, again: bool) -> Result<bool, StartError> {
    let w = walker as usize;
    if CALIBRATED[w].load(Ordering::Relaxed) && !again {
        return Ok(USABLE[w].load(Ordering::Relaxed));
    }
    let markers: [(Entry, fn(), &str); 3] = [
        (Entry::Alloc, marker_alloc, "marker_alloc"),
        (Entry::AllocZeroed, marker_alloc_zeroed, "marker_alloc_zeroed"),
        (Entry::Realloc, marker_realloc, "marker_realloc"),
    ];
    CALIBRATION.lock()[w] = [NO_CAPTURE; 3];
    WALKER.store(w as u8, Ordering::Relaxed);
    STATE.store(CALIBRATING, Ordering::SeqCst);
    for (_, marker, _) in &markers {
        marker();
    }
    STATE.store(OFF, Ordering::SeqCst);
    WALKER.store(Walker::Libgcc as u8, Ordering::Relaxed);
    let captures = CALIBRATION.lock()[w];
    if walker == Walker::Libgcc && captures.iter().any(|&(n, _)| n == 0) {
        return Err(StartError::NotGlobalAllocator);
    }
    let mut found = true;
    for (entry, _, name) in markers {
        let (n, frames) = &captures[entry as usize];
        let leading = tracer_frames(&frames[..*n], name);
        found &= leading.is_some();
        let leading = leading.unwrap_or(Leading::NONE);
        SKIP[w][entry as usize].store(leading.tracer, Ordering::Relaxed);
        SHIM[w][entry as usize].store(leading.shim, Ordering::Relaxed);
    }
    let usable = match walker {
        Walker::Libgcc => {
            if !found {
                eprintln!(
                    "memtrace: note: the tracer cannot find its own functions by name (a stripped program?); \
                     sampled stacks will start with its frames"
                );
            }
            true
        }
        Walker::FramePointers => found,
        Walker::Cfi => {
            let all = CALIBRATION.lock();
            let callers = |walker: Walker, entry: usize| {
                (calibration_callers(&all, walker, entry), all[walker as usize][entry].0 == MAX_FRAMES)
            };
            found && (0..3).all(|entry| same_stack(callers(Walker::Cfi, entry), callers(Walker::Libgcc, entry)))
        }
    };
    USABLE[w].store(usable, Ordering::Relaxed);
    CALIBRATED[w].store(walker != Walker::Cfi || usable, Ordering::Relaxed);
    Ok(usable)
}

/// The leading `frames` (innermost first) that are tracer or allocator machinery, given that
/// the frame of the function named `marker` called into the global allocator. The last of them
/// is the allocator shim's own frame, unless the shim was inlined into the marker (as LTO may
/// do): then it is a tracer frame, dropped by count like the others. `None` when the marker
/// cannot be found (no symbols, or a broken frame chain).
fn tracer_frames(frames: &[u64], marker: &str) -> Option<Leading> {
    const OURS: [&str; 9] = [
        "memtrace_rs::",
        "backtrace::",
        "__rust_alloc",
        "__rust_realloc",
        "__rust_dealloc",
        "__rust_alloc_zeroed",
        "__rg_",
        "__rustc::",
        "_Unwind_",
    ];
    let names: Vec<Vec<String>> = frames.iter().map(|&ip| symbolize::function_names(ip)).collect();
    let marker_at = names.iter().position(|n| n.iter().any(|n| n.ends_with(marker)))?;
    let Some(last) = names[..marker_at].iter().rposition(|n| n.iter().any(|n| OURS.iter().any(|o| n.contains(o))))
    else {
        return Some(Leading::NONE);
    };
    Some(if names[last].iter().any(|n| symbolize::is_allocator_shim(n)) {
        Leading { tracer: last, shim: frames[last] }
    } else {
        Leading { tracer: last + 1, shim: 0 }
    })
}

const MARKER_LAYOUT: std::alloc::Layout = std::alloc::Layout::new::<[u64; 4]>();

#[inline(never)]
fn marker_alloc() {
    sampler::force_sample();
    // SAFETY: the layout has a nonzero size; the block is freed with the same layout.
    unsafe {
        let p = std::hint::black_box(std::alloc::alloc(MARKER_LAYOUT));
        if !p.is_null() {
            std::alloc::dealloc(p, MARKER_LAYOUT);
        }
    }
}

#[inline(never)]
fn marker_alloc_zeroed() {
    sampler::force_sample();
    // SAFETY: the layout has a nonzero size; the block is freed with the same layout.
    unsafe {
        let p = std::hint::black_box(std::alloc::alloc_zeroed(MARKER_LAYOUT));
        if !p.is_null() {
            std::alloc::dealloc(p, MARKER_LAYOUT);
        }
    }
}

#[inline(never)]
fn marker_realloc() {
    // SAFETY: the layouts have nonzero sizes; `realloc` gets a live block with its layout
    // and a nonzero new size, and each block is freed once with its current layout.
    unsafe {
        let p = std::hint::black_box(std::alloc::alloc(MARKER_LAYOUT));
        if p.is_null() {
            return;
        }
        sampler::force_sample();
        let new_size = 2 * MARKER_LAYOUT.size();
        let q = std::hint::black_box(std::alloc::realloc(p, MARKER_LAYOUT, new_size));
        if q.is_null() {
            std::alloc::dealloc(p, MARKER_LAYOUT);
        } else {
            std::alloc::dealloc(q, std::alloc::Layout::from_size_align_unchecked(new_size, MARKER_LAYOUT.align()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn lock_free_table_lookup_matches_the_glibc_version() {
        // SAFETY: returns a pointer to a static NUL-terminated string.
        let version = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) }.to_str().unwrap();
        let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap());
        let (major, minor) = (parts.next().unwrap(), parts.next().unwrap());
        assert_eq!(has_lock_free_table_lookup(), (major, minor) >= (2, 35), "glibc {version}");
    }

    #[test]
    fn the_shim_frame_is_dropped_only_at_its_own_address() {
        let leading = Leading { tracer: 2, shim: 0x50 };
        let kept = |frames: &[u64]| -> Vec<u64> {
            frames.iter().enumerate().filter(|&(i, &ip)| !leading.drops(i, ip)).map(|(_, &ip)| ip).collect()
        };
        // Tracer, tracer, the shim's own frame, the allocating function, its caller.
        assert_eq!(kept(&[0x10, 0x20, 0x50, 0x60, 0x70]), [0x60, 0x70]);
        // The shim inlined into the allocating function: its frame is at another address.
        assert_eq!(kept(&[0x10, 0x20, 0x61, 0x70]), [0x61, 0x70]);
        // The shim's address further out is a frame like any other.
        assert_eq!(kept(&[0x10, 0x20, 0x61, 0x50]), [0x61, 0x50]);
        assert!(!Leading::NONE.drops(0, 0x50));
    }

    #[test]
    fn walks_agree_when_equal_or_cut_short() {
        let stack = [1, 2, 3, 4];
        assert!(same_stack((&stack, false), (&stack, false)));
        assert!(same_stack((&stack, true), (&stack[..3], true)), "the shorter one cut at the cap");
        assert!(!same_stack((&stack, false), (&stack[..3], false)), "the shorter one ended early");
        assert!(!same_stack((&stack, false), (&[1, 2, 9, 4], false)));
        assert!(!same_stack((&[], false), (&[], false)));
    }

    #[test]
    fn a_frame_chain_is_complete_when_it_misses_only_the_c_start_frames() {
        let dwarf = [1, 2, 3, 4, 5, 6];
        assert!(chain_complete(&dwarf, &dwarf));
        assert!(chain_complete(&dwarf, &[1, 2, 3]), "the C start-up frames missing");
        assert!(chain_complete(&dwarf, &[1, 2, 3, 4, 99]), "a stray word past main");
        assert!(!chain_complete(&dwarf, &[1, 2]), "ends early");
        assert!(!chain_complete(&dwarf, &[1, 3, 4, 5, 6]), "misses the caller of a function without a frame pointer");
        assert!(!chain_complete(&dwarf, &[]), "no chain");
        assert!(!chain_complete(&[], &[]), "nothing to compare");
    }

    #[test]
    fn frame_pointer_walk_stays_on_the_stack() {
        if !frame_pointers::SUPPORTED {
            return;
        }
        let bounds = frame_pointers::stack_bounds().expect("stack bounds");
        let local = 0u64;
        let here = std::ptr::addr_of!(local) as usize;
        assert!(bounds.0 <= here && here < bounds.1, "{bounds:x?} {here:x}");
        let mut frames = [0; MAX_FRAMES];
        // Whatever the build flags, the walk ends without faulting, and the return addresses it
        // finds are ones the DWARF unwinder finds, in the same order: a frame-pointer walk may
        // miss frames (those built without frame pointers), never invent them. Both captures
        // are called from this function at different places, so a first frame returning into
        // this function is compared by name, the rest by address.
        let n = frame_pointers::capture(Leading::NONE, 8, &mut frames, bounds).expect("on this thread's stack");
        let mut dwarf = [0; MAX_FRAMES];
        let m = capture_libgcc(Leading::NONE, MAX_FRAMES, &mut dwarf);
        let (walked, dwarf) = (&frames[..n], &dwarf[..m]);
        let into_this_test = |f: u64| {
            crate::symbolize::function_names(f).iter().any(|n| n.contains("frame_pointer_walk_stays_on_the_stack"))
        };
        let callers = if walked.first().is_some_and(|&f| into_this_test(f)) { &walked[1..] } else { walked };
        match callers.first().and_then(|f| dwarf.iter().position(|d| d == f)) {
            Some(at) => {
                let mut rest = dwarf[at..].iter();
                for f in callers {
                    assert!(rest.any(|d| d == f), "frame {f:#x} of {walked:x?} not in DWARF's {dwarf:x?}");
                }
            }
            None => println!("no frame-pointer chain found here: only checked that the walk ends"),
        }
        // Bounds that exclude the current stack: nothing is walked, and the caller falls back.
        assert_eq!(frame_pointers::capture(Leading::NONE, 5, &mut frames, (1 << 20, 2 << 20)), None);
    }
}
