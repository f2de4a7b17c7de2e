//! The one list of frame names that are not the program's own code: the tracer, the entry
//! points `#[global_allocator]` generates, and the allocation machinery of the standard
//! library and its collections.
//!
//! The runtime uses the first two to find where a captured stack leaves the tracer
//! ([`is_allocator_shim`], [`is_tracer_frame`]); the analysis uses all of them to find the
//! frame that allocated ([`is_allocator_frame`], re-exported as
//! `memtrace_rs::analysis::is_allocator_frame`).

// Without the analysis, only the runtime's part of the list is used.
#![cfg_attr(not(feature = "analysis"), allow(dead_code))]

/// The allocating entry points that `#[global_allocator]` generates. With full debug info
/// their names carry a path (`__rustc::__rust_alloc`).
const SHIMS: [&str; 3] = ["__rust_alloc", "__rust_alloc_zeroed", "__rust_realloc"];

/// Names of the tracer's own code and of what it calls, and of the other entry points of the
/// global allocator: frames of a captured stack above the allocator shim. Deallocation never
/// samples, but `__rust_dealloc` is the tracer's as well.
const TRACER: [&str; 6] = ["memtrace_rs::", "backtrace::", "_Unwind_", "__rustc::", "__rg_", "__rust_dealloc"];

/// Prefixes (after any leading `<`) of the standard library's allocation machinery: the
/// `alloc` crate; `core` (which cannot allocate by itself, so its frames — formatting,
/// iterators, `Option` combinators — only pass requests on); std's allocator and
/// collections; hashbrown; the default allocator's `__rdl_` functions.
const LIBRARY_PREFIXES: [&str; 6] = ["alloc::", "std::alloc", "std::collections::", "core::", "hashbrown::", "__rdl_"];

/// Substrings that mark machinery wherever they appear (trait impls for foreign types,
/// raw vectors and tables of any path).
const LIBRARY_INFIXES: [&str; 5] = [" as alloc::", " as core::alloc::", " as std::alloc::", "RawVec", "RawTable"];

/// C allocator entry points, matched exactly.
const C_ALLOCATOR: [&str; 5] = ["malloc", "calloc", "realloc", "aligned_alloc", "posix_memalign"];

/// Parts of the source paths of the machinery. Paths matter because the names of inlined
/// frames carry no module path (`allocate`, `with_capacity_in<u8>`, …).
const LIBRARY_FILES: [&str; 6] = [
    "/library/alloc/src/",
    "/library/core/src/",
    "/library/std/src/alloc.rs",
    "/library/std/src/sys/alloc/",
    "/library/std/src/collections/",
    "/hashbrown-",
];

/// Whether `name` (demangled, without hash) is one of the allocation entry points that
/// `#[global_allocator]` generates (`__rust_alloc`, or `__rustc::__rust_alloc` with full debug
/// info), which call the global allocator's methods.
pub(crate) fn is_allocator_shim(name: &str) -> bool {
    SHIMS.iter().any(|shim| name == *shim || name.strip_suffix(shim).is_some_and(|path| path.ends_with("::")))
}

/// Whether a function named `name` (demangled) is the tracer's or the global allocator's,
/// wherever the name mentions them (`<memtrace_rs::… as core::alloc::GlobalAlloc>::alloc`).
pub(crate) fn is_tracer_frame(name: &str) -> bool {
    SHIMS.iter().chain(&TRACER).any(|part| name.contains(part))
}

/// True when a frame of `function` in source `file` is part of the allocation machinery
/// (the tracer, the global allocator, the standard library's allocation and collections)
/// rather than the program. Frames of OCaml programs never are.
pub fn is_allocator_frame(function: &str, file: &str) -> bool {
    let path = function.strip_prefix('<').unwrap_or(function);
    SHIMS.iter().chain(&TRACER).chain(&LIBRARY_PREFIXES).any(|p| path.starts_with(p))
        || LIBRARY_INFIXES.iter().any(|p| function.contains(p))
        || C_ALLOCATOR.contains(&function)
        || LIBRARY_FILES.iter().any(|p| file.contains(p))
}
