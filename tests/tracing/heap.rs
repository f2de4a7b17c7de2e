//! What starting a trace leaves of the C allocator's own behaviour.
//!
//! glibc serves blocks of 128 KiB and more by `mmap`, and raises that threshold to the size of
//! any such block freed (up to 32 MiB): one large temporary block of the tracer's at start
//! would move every later large block of the program into the heap (copied on growth instead
//! of remapped, with more heap work on every call).

use std::hint::black_box;

use memtrace_rs::trace_if_requested;

use super::{run, temp_path};

/// The child: start tracing, then allocate 1 MiB and check that glibc mapped it on its own. A
/// mapped block spans whole pages, so `malloc_usable_size` exceeds the request by most of a
/// page; a block from the heap, by a few bytes.
pub(super) fn child() {
    const BYTES: usize = 1 << 20;
    let guard = trace_if_requested();
    assert!(guard.is_some(), "not tracing");
    let block: Vec<u8> = black_box(Vec::with_capacity(BYTES));
    // SAFETY: the block is a live allocation of the system allocator (the global allocator
    // forwards alignments up to 16 to `malloc`).
    let usable = unsafe { libc::malloc_usable_size(block.as_ptr() as *mut libc::c_void) };
    assert!(
        usable >= BYTES + 2048,
        "1 MiB came from the heap ({usable} B usable): starting raised glibc's mmap threshold"
    );
    drop(block);
    drop(guard);
}

#[test]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn starting_leaves_glibcs_mmap_threshold_alone() {
    let path = temp_path("heap-mmap-threshold");
    let out = run("heap:mmap-threshold", &[("MEMTRACE_FILE", path.to_str().unwrap()), ("MEMTRACE_RATE", "1e-9")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_file(&path);
}
