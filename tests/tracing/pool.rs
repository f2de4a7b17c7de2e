//! Sampled blocks served from the sampled-block pool: moved in and out of it by `realloc`,
//! zeroed by `alloc_zeroed`, freed after their session stopped, and reported freed.

use std::alloc::{alloc, alloc_zeroed, dealloc, realloc, Layout};
use std::hint::black_box;

use memtrace_rs::{start_tracing, trace_if_requested, TraceConfig};

use super::{run, temp_path, Trace, SECOND_FILE_VAR};

/// Sizes a block takes in turn: inside a slot, past it, past what the pool serves and back.
const SIZES: [usize; 6] = [20, 30, 700, 100_000, 10, 3000];
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

/// The child: at rate 1 most blocks are sampled. Blocks moved through the pool and zeroed
/// ones while tracing; blocks of the first session freed after it stopped, and moved in a
/// second session.
pub(super) fn child() {
    let guard = trace_if_requested();
    assert!(guard.is_some(), "not tracing");
    let freed_while_tracing = moved();
    site_zeroed();
    free_moved(freed_while_tracing);
    let freed_after = moved();
    drop(guard);
    free_moved(freed_after);
    let left_over = moved();
    let second = std::env::var(SECOND_FILE_VAR).unwrap();
    let guard = start_tracing(TraceConfig::new(second).rate(1.0)).unwrap();
    free_moved(left_over);
    free_moved(moved());
    site_zeroed();
    drop(guard);
}

/// Every block `site_moved` allocated while tracing is reported freed, whether it was in the
/// pool, moved out of it or never in it, and the blocks of the first session freed after it
/// stopped are not (nor do they disturb the second session).
#[test]
fn pooled_blocks_move_keep_their_bytes_and_are_reported_freed() {
    let (first, second) = (temp_path("pool-first"), temp_path("pool-second"));
    let env = [
        ("MEMTRACE_FILE", first.to_str().unwrap()),
        ("MEMTRACE_RATE", "1"),
        (SECOND_FILE_VAR, second.to_str().unwrap()),
    ];
    let out = run("pool:moves", &env);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for (path, live_at_end) in [(&first, BLOCKS), (&second, 0)] {
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
        let _ = std::fs::remove_file(path);
    }
}
