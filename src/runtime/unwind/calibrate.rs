//! Start-up calibration: how many leading frames of each walker's captures are the tracer's,
//! whether frame pointers or the cached DWARF walk can be trusted in this process, and which
//! walker a session should use.
//!
//! The captures must be taken on the thread that starts tracing, but little else is: they go
//! straight into a static table, not onto that thread's stack. Which of their frames are the
//! tracer's is read from the unwind tables (the functions the frames are in) where they settle
//! it, as in optimised builds; else the frames are named (from symbol tables alone, no DWARF:
//! cheap, but reading an object file takes tens of KiB of stack in unoptimised builds) on a
//! thread of its own, so that a thread with a small stack can start tracing.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};

use super::capture::WALKER;
use super::choice::{Unwinder, Walker};
use super::leading::{Leading, SHIM, SKIP};
use super::{cfi, frame_pointers};
use crate::runtime::state::{say, Entry, CALIBRATING, MAX_FRAMES, OFF, STATE};
use crate::runtime::symbolize;
use crate::runtime::tracer_thread;
use crate::runtime::{allocator, sampler};

/// Calibration found no sample of its own: allocations do not reach a `MemtraceAllocator`.
#[derive(Debug)]
pub(crate) struct NotGlobalAllocator;

/// Per [`Walker`]: whether its [`SKIP`] and [`SHIM`] have been measured in this process.
static CALIBRATED: [AtomicBool; 3] = [AtomicBool::new(false), AtomicBool::new(false), AtomicBool::new(false)];
/// Per [`Walker`]: whether its calibration found it usable in this process (for frame
/// pointers: a frame chain; for the cached DWARF walk: libgcc's stacks).
static USABLE: [AtomicBool; 3] = [AtomicBool::new(true), AtomicBool::new(false), AtomicBool::new(false)];
/// A calibration capture: its frame count and frames.
pub(crate) type Capture = (usize, [u64; MAX_FRAMES]);
const NO_CAPTURE: Capture = (0, [0; MAX_FRAMES]);
/// The captures made by the calibration markers, per [`Walker`] and [`Entry`].
static CALIBRATION: Mutex<[[Capture; 3]; 3]> = parking_lot::const_mutex([[NO_CAPTURE; 3]; 3]);
/// Frames at the outer end of a stack that a frame-pointer walk may miss and still count as
/// complete: the C library's thread or process start (`__libc_start_call_main`,
/// `__libc_start_main`, `_start`; `start_thread`, `clone3`), which keeps no frame pointers.
const C_START_FRAMES: usize = 3;

/// The slot of the table for a calibration capture taken in `entry` by the walker being
/// calibrated: the sampled path captures into it (the capture inlined where a sample's is,
/// so that both stacks hold the same tracer frames).
pub(crate) fn calibration_slot(entry: Entry) -> MappedMutexGuard<'static, Capture> {
    MutexGuard::map(CALIBRATION.lock(), |all| &mut all[WALKER.load(Ordering::Relaxed) as usize][entry as usize])
}

/// Measure, once per process, how many leading captured frames belong to the tracer, the
/// unwinder and the allocator shims for each entry point and walker, so that the innermost
/// frame kept is the code that called into the global allocator.
///
/// A forced sample is taken from an `#[inline(never)]` marker function per entry point; the
/// frames below the marker are the tracer's and the allocator machinery's, and everything up
/// to the last one that is ours (`memtrace_rs::`, `backtrace::`, `__rust_alloc`, `__rg_`,
/// `_Unwind_`, ...) is skipped: a count of frames ([`SKIP`]), then the allocator shim's frame
/// if it is at the address where calibration saw it ([`SHIM`]; an optimised build may inline
/// the shim into the allocating function, whose frame must be kept, and whose locations the
/// writer trims of the shim's). Which frames are ours is read from the unwind tables where
/// they settle it, else from the frames' names.
/// This also warms up the walkers before any real sample is taken. Called with the tracer's
/// session lock held and tracing off.
///
/// Every walker that can walk this stack is calibrated, whatever is wanted, from one call site,
/// so that their stacks can be compared: libgcc's always (the last resort of the others), and
/// the frame-pointer and cached DWARF walks on the thread's own stack. Returns the walker to
/// use: for [`Unwinder::Auto`], frame pointers when their walk is
/// [complete](frame_chain_complete); for DWARF, the cached walk when its stacks are libgcc's.
/// Frame pointers asked for but not walkable here give DWARF, with a note on stderr.
pub(crate) fn calibrate(wanted: Unwinder) -> Result<Walker, NotGlobalAllocator> {
    let walkable = frame_pointers::SUPPORTED && frame_pointers::on_thread_stack();
    let possible = |walker: Walker| match walker {
        Walker::Libgcc => true,
        Walker::FramePointers => walkable,
        Walker::Cfi => cfi::SUPPORTED && walkable,
    };
    // The others' stacks again whenever the cached DWARF walk is calibrated, so that its stacks
    // are compared with libgcc's, and libgcc's with the frame-pointer walk's, from one call site.
    let again = cfi::SUPPORTED && walkable && !CALIBRATED[Walker::Cfi as usize].load(Ordering::Relaxed);
    let due: Vec<Walker> = Walker::ALL
        .into_iter()
        .filter(|&walker| possible(walker) && (again || !CALIBRATED[walker as usize].load(Ordering::Relaxed)))
        .collect();
    for &walker in &due {
        capture_markers(walker);
    }
    if due.contains(&Walker::Libgcc) && CALIBRATION.lock()[Walker::Libgcc as usize].iter().any(|&(n, _)| n == 0) {
        return Err(NotGlobalAllocator);
    }
    let found = measure_leading_frames(&due);
    let mut usable = [false; 3];
    for walker in Walker::ALL.into_iter().filter(|&walker| possible(walker)) {
        usable[walker as usize] = match due.iter().position(|&w| w == walker) {
            Some(k) => settle(walker, found[k]),
            None => USABLE[walker as usize].load(Ordering::Relaxed),
        };
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
        say(&format!("memtrace: frame-pointer unwinding {why}; using DWARF unwinding"));
    }
    if !has_lock_free_table_lookup() {
        say("memtrace: note: this C library has no _dl_find_object (glibc < 2.35), so DWARF unwinding \
             can deadlock against dlopen/dlclose; building with -C force-frame-pointers=yes avoids it");
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
pub(crate) fn has_lock_free_table_lookup() -> bool {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        return true;
    }
    // SAFETY: `dlsym` with `RTLD_DEFAULT` and a NUL-terminated name only looks the symbol up.
    !unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_dl_find_object".as_ptr()) }.is_null()
}

/// A calibration marker: its function, and the function's name.
type Marker = (fn(), &'static str);

/// The calibration markers, one per entry point.
const MARKERS: [(Entry, Marker); 3] = [
    (Entry::Alloc, (marker_alloc, "marker_alloc")),
    (Entry::AllocZeroed, (marker_alloc_zeroed, "marker_alloc_zeroed")),
    (Entry::Realloc, (marker_realloc, "marker_realloc")),
];

/// Take `walker`'s calibration captures: one forced sample from each marker.
fn capture_markers(walker: Walker) {
    let w = walker as usize;
    CALIBRATION.lock()[w].iter_mut().for_each(|(n, _)| *n = 0);
    WALKER.store(w as u8, Ordering::Relaxed);
    STATE.store(CALIBRATING, Ordering::SeqCst);
    for (_, (marker, _)) in &MARKERS {
        marker();
    }
    STATE.store(OFF, Ordering::SeqCst);
    WALKER.store(Walker::Libgcc as u8, Ordering::Relaxed);
}

/// Measure [`SKIP`] and [`SHIM`] of each of `walkers` from its captures: from the unwind
/// tables, else naming the frames of all of them at once (one pass over each object's symbol
/// table). Returns, per walker, whether every marker was found in its captures.
fn measure_leading_frames(walkers: &[Walker]) -> Vec<bool> {
    let all = CALIBRATION.lock();
    let captures = marker_captures(&all, walkers);
    // Names only where the unwind tables leave it open (on a thread of its own if need be).
    let leadings = tracer_frames_from_unwind_tables(&captures)
        .unwrap_or_else(|| on_a_thread_of_its_own(|| tracer_frames(&captures)));
    let mut found = vec![true; walkers.len()];
    for (k, leading) in leadings.into_iter().enumerate() {
        let (w, entry) = (walkers[k / MARKERS.len()] as usize, MARKERS[k % MARKERS.len()].0 as usize);
        found[k / MARKERS.len()] &= leading.is_some();
        let leading = leading.unwrap_or(Leading::NONE);
        SKIP[w][entry].store(leading.tracer, Ordering::Relaxed);
        SHIM[w][entry].store(leading.shim, Ordering::Relaxed);
    }
    found
}

/// The captures of `walkers`, each with its marker: a walker's in the order of [`MARKERS`].
fn marker_captures<'a>(all: &'a [[Capture; 3]; 3], walkers: &[Walker]) -> Vec<(&'a [u64], Marker)> {
    walkers
        .iter()
        .flat_map(|&w| {
            MARKERS.iter().map(move |&(entry, marker)| {
                let (n, frames) = &all[w as usize][entry as usize];
                (&frames[..*n], marker)
            })
        })
        .collect()
}

/// Settle whether `walker`, just calibrated, is usable: libgcc always; frame pointers when
/// their captures reach the marker functions (`found`; when they do not, nothing is
/// skipped); the cached DWARF walk when its captures, tracer frames skipped, are those libgcc
/// took just before from the same call site. A failed comparison is not kept: the next
/// session tries again.
fn settle(walker: Walker, found: bool) -> bool {
    let all = CALIBRATION.lock();
    let usable = match walker {
        Walker::Libgcc => {
            if !found {
                say("memtrace: note: the tracer cannot find its own functions (a stripped program?); \
                     sampled stacks will start with its frames");
            }
            true
        }
        Walker::FramePointers => found,
        Walker::Cfi => {
            let callers = |walker: Walker, entry: usize| {
                (calibration_callers(&all, walker, entry), all[walker as usize][entry].0 == MAX_FRAMES)
            };
            found && (0..3).all(|entry| same_stack(callers(Walker::Cfi, entry), callers(Walker::Libgcc, entry)))
        }
    };
    USABLE[walker as usize].store(usable, Ordering::Relaxed);
    CALIBRATED[walker as usize].store(walker != Walker::Cfi || usable, Ordering::Relaxed);
    usable
}

/// Name the frames of the calibration stacks, with the spare symbolizer that the writer takes
/// (on a thread of its own): the program's start-up frames and the units they are in, which
/// most samples share, parsed before sampling starts. For the highest rates only, where the
/// queue cannot absorb the writer's first pause for them (see `session`): it costs start-up
/// milliseconds, tens for a large program.
pub(crate) fn name_start_up_frames(options: symbolize::Options) {
    let captures = CALIBRATION.lock();
    on_a_thread_of_its_own(|| {
        let mut symbolizer = symbolize::take_spare(options.clone());
        for (n, frames) in &captures[Walker::Libgcc as usize] {
            for &ip in &frames[..*n] {
                symbolize::symbolize(&mut symbolizer, ip);
            }
        }
        symbolize::put_spare(symbolizer);
    });
}

/// `f()` on a new thread with the default stack size, unless this thread has at least
/// [`INLINE_NAMING_STACK`] of stack left (as `main`'s has): reading object files is not a
/// small stack's to feed, and a thread costs a tenth of a millisecond or so to start.
fn on_a_thread_of_its_own<R: Send>(f: impl Fn() -> R + Sync) -> R {
    if super::capture::stack_remaining().is_some_and(|left| left >= INLINE_NAMING_STACK) {
        return f();
    }
    std::thread::scope(|scope| {
        // A tracer thread: the program's signals are not its to take.
        let spawned = tracer_thread::with_async_signals_blocked(|| {
            std::thread::Builder::new().name("memtrace-calibrate".into()).spawn_scoped(scope, &f)
        });
        match spawned {
            Ok(thread) => thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(_) => f(),
        }
    })
}

/// The stack left above which calibration names frames on the caller's thread: far more than
/// naming takes (tens of KiB in unoptimised builds), and more than a spawned thread's default.
const INLINE_NAMING_STACK: usize = 4 << 20;

/// For each capture's `frames` (innermost first), the leading ones that are tracer or
/// allocator machinery, given that the frame of the `marker` function called into the global
/// allocator. The last of them is the allocator shim's own frame, unless the shim was
/// inlined into the marker (as LTO may do): then it is a tracer frame, dropped by count like
/// the others. The marker's frame is the one whose code the unwind tables say is the
/// marker function's (or, where they cannot be read here, the one its name names), so that it
/// is found in a program without a symbol table too. `None` when it cannot be found (a broken
/// frame chain, or a program without symbols where the unwind tables are not read).
fn tracer_frames(captures: &[(&[u64], Marker)]) -> Vec<Option<Leading>> {
    // Symbol tables name these frames: the functions the walks return into are never inlined
    // (the markers, the allocator shim, our allocator's methods), and parsing the program's
    // DWARF would cost more than everything else start-up does. The writer parses what it
    // needs when the first sample comes.
    // Only the frames up to the markers' are named, in two batches (one pass over each
    // object's symbol table per batch): first those in the markers' own object, then those
    // before a marker in others (libgcc's unwinder, say); the objects of the markers' callers
    // only (the C library's start-up code) are not read.
    let mut symbolizer = symbolize::take_spare(symbolize::Options::default());
    let frames: Vec<u64> = captures.iter().flat_map(|(frames, _)| frames.iter().copied()).collect();
    let starts: Vec<usize> = captures
        .iter()
        .scan(0, |end, (frames, _)| {
            let start = *end;
            *end += frames.len();
            Some(start)
        })
        .collect();
    let ours = symbolizer.in_object_of(&frames, marker_alloc as *const () as u64 + 1);
    let mut names = vec![None; frames.len()];
    name_some(&mut symbolizer, &frames, &mut names, |k| ours[k]);
    let marker_at: Vec<Option<usize>> = captures
        .iter()
        .zip(&starts)
        .map(|((frames, (function, name)), &start)| {
            marker_frame(frames, *function).or_else(|| {
                names[start..start + frames.len()].iter().position(|n| n.as_ref().is_some_and(|n| n.ends_with(name)))
            })
        })
        .collect();
    let before_marker = |k: usize| {
        let c = starts.partition_point(|&start| start <= k) - 1;
        marker_at[c].is_some_and(|at| k - starts[c] < at)
    };
    name_some(&mut symbolizer, &frames, &mut names, |k| !ours[k] && before_marker(k));
    symbolize::put_spare(symbolizer);
    captures
        .iter()
        .zip(starts.iter().zip(&marker_at))
        .map(|((frames, _), (&start, &at))| leading(frames, &names[start..start + at?]))
        .collect()
}

/// Whether [`tracer_frames_from_unwind_tables`] settles the calibration captures taken so far
/// (of every walker calibrated), with what [`tracer_frames`] gives them: see
/// `__internals::calibration_settled_by_unwind_tables`. Inside the tracer: naming allocates,
/// which a running session must not sample.
pub(crate) fn settled_by_unwind_tables() -> bool {
    sampler::in_tracer(settled_by_unwind_tables_here).unwrap_or(false)
}

fn settled_by_unwind_tables_here() -> bool {
    let all = CALIBRATION.lock();
    let mut captures = marker_captures(&all, &Walker::ALL);
    captures.retain(|(frames, _)| !frames.is_empty());
    let pairs = |leadings: Vec<Option<Leading>>| -> Vec<Option<(usize, u64)>> {
        leadings.into_iter().map(|l| l.map(|l| (l.tracer, l.shim))).collect()
    };
    !captures.is_empty()
        && tracer_frames_from_unwind_tables(&captures).map(pairs) == Some(pairs(tracer_frames(&captures)))
}

/// The index of the frame of `frames` (return addresses, innermost first) whose code the
/// unwind tables say is `marker`'s.
fn marker_frame(frames: &[u64], marker: fn()) -> Option<usize> {
    frames.iter().position(|&ra| cfi::function_start(ra.wrapping_sub(1)) == Some(marker as usize as u64))
}

/// [`tracer_frames`] without naming a frame, where the unwind tables settle it: each capture's
/// marker frame is found by its function's start, and the frame before it is the allocator
/// method's out-of-line half (the one that called `record_alloc`), so that the marker called
/// straight into it: the shim and the method's hot path tail-call their way there, as in an
/// optimised build. Every frame before the marker's is then the tracer's and none is the
/// shim's, as the names say (where there are names: a stripped program's frame there, unnamed,
/// would be taken for the shim's; dropped either way). A capture without the marker's frame
/// has none that its name would show, since the tables know the markers' functions by the
/// addresses they start at (checked first: a build whose function addresses are not those
/// the tables give, such as jump tables for control-flow integrity, is left to names), and a
/// marker, a small function, is one entry of the tables (code split off it, a `.cold` part,
/// would be named apart too). `None` when a capture needs names: frames between the half and
/// the marker (an unoptimised build's shim, `__rust_alloc` and `alloc::alloc::alloc`, told
/// apart only by name).
fn tracer_frames_from_unwind_tables(captures: &[(&[u64], Marker)]) -> Option<Vec<Option<Leading>>> {
    // Nothing to settle (every walker calibrated by an earlier session), whatever the tables.
    if captures.is_empty() {
        return Some(Vec::new());
    }
    let record_alloc = allocator::record_alloc_address();
    let function = |ra: u64| cfi::function_start(ra.wrapping_sub(1));
    if !MARKERS
        .iter()
        .all(|&(_, (marker, _))| cfi::function_start(marker as usize as u64) == Some(marker as usize as u64))
    {
        return None;
    }
    captures
        .iter()
        .map(|&(frames, (marker, _))| match marker_frame(frames, marker) {
            Some(at) if at >= 2 && function(frames[at - 2]) == Some(record_alloc) => {
                Some(Some(Leading { tracer: at, shim: 0 }))
            }
            Some(_) => None,
            None => Some(None),
        })
        .collect()
}

/// Name the `frames` that `wanted` picks (by index) into `names`, in one batch.
fn name_some(
    symbolizer: &mut symbolize::Symbolizer,
    frames: &[u64],
    names: &mut [Option<String>],
    wanted: impl Fn(usize) -> bool,
) {
    let picked: Vec<usize> = (0..frames.len()).filter(|&k| wanted(k)).collect();
    let addresses: Vec<u64> = picked.iter().map(|&k| frames[k]).collect();
    for (k, name) in picked.into_iter().zip(symbolizer.symbol_names(&addresses)) {
        names[k] = name;
    }
}

/// The leading tracer frames of `frames`, whose callers from `names.len()` on are the
/// program's, given the names of the frames before.
fn leading(frames: &[u64], names: &[Option<String>]) -> Option<Leading> {
    if let [.., None] = names {
        // The frame that the marker called has no name (a program without a symbol table):
        // it is taken for the allocator shim's, which without LTO is called out of line.
        let last = names.len() - 1;
        return Some(Leading { tracer: last, shim: frames[last] });
    }
    let Some(last) = names.iter().rposition(|n| n.as_ref().is_some_and(|n| crate::frames::is_tracer_frame(n))) else {
        return Some(Leading::NONE);
    };
    Some(if names[last].as_ref().is_some_and(|n| symbolize::is_allocator_shim(n.as_bytes())) {
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

    /// The unwind tables settle a capture whose marker called the allocator method's
    /// out-of-line half (that called `record_alloc`) straight away, and one without the
    /// marker; they leave to names a capture with frames between the half and the marker.
    #[test]
    fn the_unwind_tables_settle_a_marker_that_called_the_tracer_straight_away() {
        if !cfi::SUPPORTED {
            return;
        }
        // Return addresses just past the functions' starts: each in its own function.
        let ra = |function: u64| function + 1;
        let (record_alloc, marker) = (ra(allocator::record_alloc_address()), ra(marker_alloc as *const () as u64));
        let half = ra(settle as *const () as u64);
        let glue = ra(leading as *const () as u64);
        let caller = ra(calibrate as *const () as u64);
        let settled = |frames: &[u64]| {
            tracer_frames_from_unwind_tables(&[(frames, MARKERS[0].1)])
                .map(|leadings| leadings[0].map(|leading| (leading.tracer, leading.shim)))
        };
        assert_eq!(settled(&[glue, record_alloc, half, marker, caller]), Some(Some((3, 0))));
        assert_eq!(settled(&[record_alloc, half, marker]), Some(Some((2, 0))));
        assert_eq!(
            settled(&[record_alloc, half, glue, marker, caller]),
            None,
            "a frame between the half and the marker"
        );
        assert_eq!(settled(&[half, marker]), None, "no record_alloc frame");
        assert_eq!(settled(&[record_alloc, half, caller]), Some(None), "no marker");
        assert_eq!(settled(&[record_alloc, 0x10, caller]), Some(None), "no marker, a frame the tables do not know");
        // One capture that needs names: all of them are named.
        let captures = [(&[record_alloc, half, marker][..], MARKERS[0].1), (&[half, glue, marker][..], MARKERS[0].1)];
        assert!(tracer_frames_from_unwind_tables(&captures).is_none());
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
        let m = super::super::libgcc::capture(Leading::NONE, MAX_FRAMES, &mut dwarf);
        let (walked, dwarf) = (&frames[..n], &dwarf[..m]);
        let into_this_test = |f: u64| {
            symbolize::function_names_once(f).iter().any(|n| n.contains("frame_pointer_walk_stays_on_the_stack"))
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
