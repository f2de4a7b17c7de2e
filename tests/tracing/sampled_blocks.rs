//! Sampled blocks, allocated at the sampled-block alignment: moved between that layout and
//! the program's by `realloc`, zeroed by `alloc_zeroed`, at every alignment up to a page and
//! beyond, freed after their session stopped, in a forked child, and by C's `free`, and
//! reported freed.

use std::alloc::{alloc, alloc_zeroed, dealloc, realloc, Layout};
use std::hint::black_box;

use memtrace_rs::{start_tracing, trace_if_requested, TraceConfig};

use super::{memtrace_messages, run, temp_path, Trace, SECOND_FILE_VAR};

/// Sizes a block takes in turn: small, in place, a little larger, large (glibc maps it), back
/// to small and large again, and shrunk.
const SIZES: [usize; 8] = [20, 30, 700, 200_000, 65_536, 10, 40_000, 3000];
/// Blocks put through [`SIZES`].
const BLOCKS: usize = 300;

/// A block of `size` bytes at `p` holds the pattern of `seed` (or its first `size` bytes).
fn fill(p: *mut u8, size: usize, seed: usize) {
    for i in 0..size {
        // SAFETY: `p` has room for `size` bytes.
        unsafe { *p.add(i) = (seed + i * 7) as u8 };
    }
}

fn holds(p: *const u8, size: usize, seed: usize) -> bool {
    // SAFETY: `p` holds `size` initialised bytes.
    (0..size).all(|i| unsafe { *p.add(i) } == (seed + i * 7) as u8)
}

/// Allocate [`BLOCKS`] blocks and put each through [`SIZES`] by `realloc`, checking that each
/// keeps its bytes; the blocks, at their last size (in a vector allocated elsewhere, so that
/// this site's only live blocks are these).
fn moved() -> Vec<*mut u8> {
    let mut blocks = Vec::with_capacity(BLOCKS);
    site_moved(&mut blocks);
    blocks
}

#[inline(never)]
fn site_moved(blocks: &mut Vec<*mut u8>) {
    blocks.extend((0..BLOCKS).map(|seed| {
        let mut layout = Layout::from_size_align(SIZES[0], 8).unwrap();
        // SAFETY: a nonzero-size layout.
        let mut p = unsafe { alloc(layout) };
        assert!(!p.is_null());
        fill(p, layout.size(), seed);
        for &size in &SIZES[1..] {
            // SAFETY: `p` is live with `layout`; `size` is nonzero.
            p = unsafe { realloc(p, layout, size) };
            assert!(!p.is_null());
            assert!(holds(p, layout.size().min(size), seed), "block {seed} lost its bytes growing to {size}");
            layout = Layout::from_size_align(size, 8).unwrap();
            fill(p, size, seed);
        }
        black_box(p)
    }));
}

/// Whether the blocks of [`moved`] all lie on 512-byte boundaries: the alignment of sampled
/// blocks. (The system allocator's blocks lie 16 bytes past a boundary, or anywhere.)
fn sampled_aligned(blocks: &[*mut u8]) -> bool {
    blocks.iter().all(|&p| (p as usize).is_multiple_of(512))
}

/// Free the blocks of [`moved`].
fn free_moved(blocks: Vec<*mut u8>) {
    let layout = Layout::from_size_align(SIZES[SIZES.len() - 1], 8).unwrap();
    for (seed, p) in blocks.into_iter().enumerate() {
        assert!(holds(p, layout.size(), seed), "block {seed} changed");
        // SAFETY: allocated with `layout`'s size and alignment by `moved`.
        unsafe { dealloc(p, layout) };
    }
}

/// Blocks of the same layout dirtied and freed, then zeroed ones allocated (some in the slots
/// just freed): every one reads zero.
#[inline(never)]
fn site_zeroed() {
    let layout = Layout::from_size_align(40, 8).unwrap();
    // SAFETY: a nonzero-size layout; the blocks are freed with it.
    unsafe {
        let dirty: Vec<*mut u8> = (0..2000).map(|_| alloc(layout)).collect();
        for &p in &dirty {
            p.write_bytes(0xff, layout.size());
        }
        dirty.into_iter().for_each(|p| dealloc(p, layout));
        for _ in 0..2000 {
            let p = alloc_zeroed(layout);
            assert!((0..layout.size()).all(|i| *p.add(i) == 0), "a zeroed block is not zero");
            dealloc(p, layout);
        }
    }
}

/// Blocks grown to 64 KiB, written to their last byte, and freed at that size.
#[inline(never)]
fn site_edge() {
    for _ in 0..100 {
        let small = Layout::from_size_align(40_000, 8).unwrap();
        // SAFETY: nonzero sizes; each block is freed once, with its current layout.
        unsafe {
            let p = alloc(small);
            assert!(!p.is_null());
            let p = realloc(p, small, 65_536);
            assert!(!p.is_null());
            p.add(65_535).write(1);
            dealloc(p, Layout::from_size_align(65_536, 8).unwrap());
        }
    }
}

/// Free `blocks` in a forked child, which must exit with 0.
fn free_in_a_forked_child(blocks: &[*mut u8]) {
    // SAFETY: the child only frees blocks it inherited and exits without running the parent's
    // exit handlers.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0);
        if pid == 0 {
            free_moved(blocks.to_vec());
            libc::_exit(0);
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "forked child failed: {status}");
    }
}

/// The child: at rate 1 most blocks are sampled. Blocks moved through the pool and zeroed
/// ones while tracing; blocks of the first session freed in a forked child and after the
/// session stopped, and moved in a second session.
pub(super) fn child() {
    let guard = trace_if_requested();
    assert!(guard.is_some(), "not tracing");
    let freed_while_tracing = moved();
    assert!(sampled_aligned(&freed_while_tracing), "sampled blocks not at the sampled alignment");
    site_zeroed();
    site_edge();
    site_aligned();
    free_moved(freed_while_tracing);
    let freed_after = moved();
    drop(guard);
    free_in_a_forked_child(&freed_after);
    free_moved(freed_after);
    let left_over = moved();
    let second = std::env::var(SECOND_FILE_VAR).unwrap();
    let guard = start_tracing(TraceConfig::new(second).rate(1.0)).unwrap();
    free_moved(left_over);
    free_moved(moved());
    site_zeroed();
    drop(guard);
}

/// Every block `site_moved` allocated while tracing is reported freed, whether it was
/// reallocated in place or moved, and the blocks of the first session freed after it stopped
/// are not (nor do they disturb the second session).
#[test]
fn sampled_blocks_move_keep_their_bytes_and_are_reported_freed() {
    let (first, second) = (temp_path("pool-first"), temp_path("pool-second"));
    let env = [
        ("MEMTRACE_FILE", first.to_str().unwrap()),
        ("MEMTRACE_RATE", "1"),
        (SECOND_FILE_VAR, second.to_str().unwrap()),
    ];
    let out = run("sampled-blocks:moves", &env);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Nothing was lost.
    assert_eq!(memtrace_messages(&out), Vec::<String>::new());
    for (path, live_at_end) in [(&first, BLOCKS), (&second, 0)] {
        // (First: the blocks freed after the stop are not reported.)
        let trace = Trace::read(path);
        assert!(trace.warnings.is_empty(), "{:?}", trace.warnings);
        let moved: Vec<_> = trace.at_site("::site_moved").collect();
        let live = moved.iter().filter(|(id, _)| !trace.collected.contains(id)).count();
        // Each block's last `realloc` is sampled unless its 3000 bytes (375 words) miss every
        // sample point at rate 1, which they do with probability e^-375; its earlier blocks
        // were all freed.
        assert!(moved.len() > BLOCKS * 4, "{}: {} samples", path.display(), moved.len());
        assert_eq!(live, live_at_end, "{}: blocks left alive", path.display());
        let zeroed = trace.at_site("::site_zeroed").count();
        assert!(zeroed > 2000, "{}: {zeroed} samples", path.display());
        assert!(trace.at_site("::site_zeroed").all(|(id, _)| trace.collected.contains(id)));
        // Each sample's stack ends at the call of the allocator, whichever way the allocator
        // took (in place, moved between layouts, or the inner allocator's).
        for (_, a) in moved.iter().copied().chain(trace.at_site("::site_zeroed")) {
            let innermost = trace.frames(a).last().unwrap();
            let call = ["alloc::alloc::alloc", "alloc::alloc::realloc", "alloc::alloc::alloc_zeroed"];
            assert!(
                innermost.iter().any(|l| call.contains(&&*l.defname_str())),
                "{}: {}",
                path.display(),
                super::describe(innermost)
            );
        }
        let _ = std::fs::remove_file(path);
    }
}

/// Blocks at every alignment from 1 byte to two pages, of sizes below, at and above it: each
/// is aligned as asked, keeps its bytes through a `realloc`, and is freed with its layout.
#[inline(never)]
fn site_aligned() {
    for shift in 0..=13 {
        let align = 1usize << shift;
        for size in [1, align, align + 24, 3 * align + 5, 70_000] {
            let layout = Layout::from_size_align(size, align).unwrap();
            // SAFETY: nonzero sizes; each block is freed once, with its current layout.
            unsafe {
                let p = alloc(layout);
                assert!(!p.is_null() && (p as usize).is_multiple_of(align), "{size} bytes at {align}");
                fill(p, size, shift);
                let grown = realloc(p, layout, size * 2 + 1);
                assert!(!grown.is_null() && (grown as usize).is_multiple_of(align), "{size} bytes at {align}, grown");
                assert!(holds(grown, size, shift), "{size} bytes at {align} lost their bytes");
                dealloc(grown, Layout::from_size_align(size * 2 + 1, align).unwrap());
            }
        }
    }
}

/// The child of the C `free` test: at rate 1 every block below is sampled, and C code frees
/// each of them with `free`, as FFI code does with Rust allocations over the system allocator.
pub(super) fn child_freed_by_c() {
    let guard = trace_if_requested();
    assert!(guard.is_some(), "not tracing");
    for round in 0..200 {
        for size in [8, 24, 100, 1000, 4096, 32_768, 65_536, 300_000] {
            let mut block = vec![round as u8; size];
            block[size - 1] = 1;
            let p = Box::into_raw(block.into_boxed_slice()) as *mut u8;
            // SAFETY: a block of the global allocator, which forwards to `malloc` for this
            // layout (`MemtraceAllocator::system()`), freed once, by C.
            unsafe { libc::free(p.cast()) };
        }
        let mut grown: Vec<u64> = Vec::new();
        grown.extend(0..(round * 50) as u64);
        let p = grown.as_mut_ptr();
        std::mem::forget(grown);
        // SAFETY: as above; an empty vector's dangling pointer is not freed.
        if round > 0 {
            unsafe { libc::free(p.cast()) };
        }
    }
    drop(guard);
}

/// C's `free` of blocks a traced program allocated through the global allocator works as it
/// does untraced, whether or not they were sampled (at rate 1, all of them are).
#[test]
fn c_free_of_sampled_blocks_works() {
    let path = temp_path("sampled-blocks-c-free");
    let out = run("sampled-blocks:c-free", &[("MEMTRACE_FILE", path.to_str().unwrap()), ("MEMTRACE_RATE", "1")]);
    assert!(out.status.success(), "{:?}: {}", out.status, String::from_utf8_lossy(&out.stderr));
    let trace = Trace::read(&path);
    assert!(trace.at_site("::child_freed_by_c").count() >= 200 * 8, "the blocks were not sampled");
    let _ = std::fs::remove_file(&path);
}
