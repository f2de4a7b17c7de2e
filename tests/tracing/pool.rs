//! Sampled blocks served from the sampled-block pool: moved in and out of it by `realloc`,
//! zeroed by `alloc_zeroed`, freed after their session stopped and in a forked child, and
//! reported freed.

use std::alloc::{alloc, alloc_zeroed, dealloc, realloc, Layout};
use std::hint::black_box;

use memtrace_rs::{start_tracing, trace_if_requested, TraceConfig};

use super::{memtrace_messages, run, temp_path, Trace, SECOND_FILE_VAR};

/// Sizes a block takes in turn: inside a slot, past it, past what the pool serves, just at
/// it, back into the pool, into its largest slot, and shrunk out of it (a block shrunk in place
/// would keep its 64 KiB slot, and the class would fill up).
const SIZES: [usize; 8] = [20, 30, 700, 100_000, 65_536, 10, 40_000, 3000];
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

/// Whether the blocks of [`moved`] all lie on 4 KiB boundaries: the 4 KiB slots of the pool.
/// (The system allocator's blocks of 3 000 bytes lie 16 bytes past a boundary, or anywhere.)
fn pooled(blocks: &[*mut u8]) -> bool {
    blocks.iter().all(|&p| (p as usize).is_multiple_of(4096))
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

/// Blocks grown from a slot of the pool's largest class to its very size (a layout the pool
/// does not serve, so the block moves out of it), and freed at that size.
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
    assert!(pooled(&freed_while_tracing), "sampled blocks outside the pool");
    site_zeroed();
    site_edge();
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
    // No class of the pool filled up (a block shrunk in place would keep its larger slot).
    for message in memtrace_messages(&out) {
        let no_room = message.split_once(" with no room to track their blocks").map(|(before, _)| before);
        if let Some(count) = no_room.and_then(|before| before.rsplit(' ').next()) {
            assert_eq!(count, "0", "{message}");
        }
    }
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
        // took (in place, moved in or out of the pool, or the inner allocator's).
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
