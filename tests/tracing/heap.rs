//! What starting a trace leaves of the C allocator's own behaviour.
//!
//! glibc serves blocks of 128 KiB and more by `mmap`, and raises that threshold to the size of
//! any such block freed (up to 32 MiB): one large temporary block of the tracer's at start
//! would move every later large block of the program into the heap (copied on growth instead
//! of remapped, with more heap work on every call).

use std::hint::black_box;
use std::time::Duration;

use memtrace_rs::trace_if_requested;

use super::{run, site_freed, temp_path};

/// A new block of 1 MiB, and whether glibc mapped it on its own: a mapped block spans whole
/// pages, so `malloc_usable_size` exceeds the request by most of a page; a block from the heap,
/// by a few bytes. The caller keeps the block until the end: freeing it would raise the
/// threshold itself.
fn large_block() -> (Vec<u8>, bool) {
    const BYTES: usize = 1 << 20;
    let block: Vec<u8> = black_box(Vec::with_capacity(BYTES));
    // SAFETY: the block is a live allocation of the system allocator (the global allocator
    // forwards alignments up to 16 to `malloc`).
    let usable = unsafe { libc::malloc_usable_size(block.as_ptr() as *mut libc::c_void) };
    (block, usable >= BYTES + 2048)
}

/// The child: large blocks are still mapped once tracing has started, once the writer has
/// named a few thousand samples, and once tracing has stopped.
pub(super) fn child() {
    let guard = trace_if_requested();
    assert!(guard.is_some(), "not tracing");
    let (started, mapped) = large_block();
    assert!(mapped, "after the start");
    site_freed();
    std::thread::sleep(Duration::from_millis(300));
    let (tracing, mapped) = large_block();
    assert!(mapped, "while tracing");
    drop(guard);
    let (stopped, mapped) = large_block();
    assert!(mapped, "after the stop");
    drop((started, tracing, stopped));
}

#[test]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tracing_leaves_glibcs_mmap_threshold_alone() {
    for rate in ["1e-9", "1e-2"] {
        let path = temp_path(&format!("heap-mmap-threshold-{rate}"));
        let out = run("heap:mmap-threshold", &[("MEMTRACE_FILE", path.to_str().unwrap()), ("MEMTRACE_RATE", rate)]);
        assert!(out.status.success(), "rate {rate}: {}", String::from_utf8_lossy(&out.stderr));
        let _ = std::fs::remove_file(&path);
    }
}
