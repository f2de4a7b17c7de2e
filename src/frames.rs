//! The one list of frame names that are not the program's own code: the tracer, the entry
//! points `#[global_allocator]` generates, the allocation machinery of the standard
//! library and its collections, and the runtime's frames that start the program and its
//! threads.
//!
//! The runtime uses the first two to find where a captured stack leaves the tracer
//! ([`is_allocator_shim`], [`is_tracer_frame`]); the analysis uses the others to find the
//! frame that allocated ([`is_allocator_frame`]) and where the program's own code starts
//! ([`is_root_frame`]), both re-exported by `memtrace_rs::analysis`; [`kept_frames`] is the
//! trimming of a stack by them that the CLI and the live profiles share.

// Without the analysis, only the runtime's part of the list is used.
#![cfg_attr(not(feature = "analysis"), allow(dead_code))]

use crate::naming::is_pseudo_frame;

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
pub(crate) fn is_allocator_shim(name: &[u8]) -> bool {
    // As bytes (the shims' names are ASCII): the writer asks of every sample's innermost
    // frame, whose names can be long.
    SHIMS
        .iter()
        .map(|shim| shim.as_bytes())
        .any(|shim| name == shim || name.strip_suffix(shim).is_some_and(|path| path.ends_with(b"::")))
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

/// C start-up and thread entry points, matched exactly; and `__rust_try`, the function without
/// debug info that std's `catch_unwind` calls through.
const C_ROOTS: [&str; 9] = [
    "_start",
    "__libc_start_main",
    "__libc_start_call_main",
    "start_thread",
    "clone",
    "clone3",
    "__clone",
    "__clone3",
    "__rust_try",
];

/// File names of the C libraries (glibc's libc and, before 2.34, its libpthread; musl's), whose
/// frames at the outer end of a stack are the code that starts the program or a thread. Their
/// start-up functions are local: with no symbol table (Debian's libc has only its exports) they
/// are named by object and offset (`libc.so.6+0x2724a`).
const C_LIBRARIES: [&str; 4] = ["libc.so", "libc-", "libpthread", "ld-musl-"];

/// Whether `function` names code by its object and offset (`libc.so.6+0x2724a`, see
/// `Symbolizer::place_in_object`), in an object of the C library.
fn is_c_library_offset(function: &str) -> bool {
    function.rsplit_once("+0x").is_some_and(|(object, offset)| {
        !offset.is_empty()
            && offset.bytes().all(|b| b.is_ascii_hexdigit())
            && C_LIBRARIES.iter().any(|library| object.starts_with(library))
    })
}

/// Prefixes (after any leading `<`) of the code that runs `main`, a spawned thread's closure
/// or an async task: the standard library's start, panic catching, thread spawn closures and
/// the `FnOnce` calls between them; tokio's scheduler and task harness, which poll a task's
/// future on a worker thread; `tracing`'s `Instrumented` wrapper around a future.
const RUST_ROOT_PREFIXES: [&str; 14] = [
    "std::rt::",
    "std::panicking::",
    "std::panic::",
    "std::sys::backtrace::",
    "std::sys::thread::",
    "std::thread::",
    "core::ops::function::",
    "core::panic::",
    "tokio::runtime::",
    "tokio::task::",
    "tokio::loom::",
    "tracing::instrument::Instrumented",
    "alloc::boxed::Box<dyn core::ops::function::FnOnce",
    // The same with its generic arguments elided (`analysis::short_name`).
    "alloc::boxed::Box as core::ops::function::FnOnce",
];

/// Crates (the start of their source directory's name) and parts of the source paths in them of
/// the same code: tokio's scheduler and task harness, `tracing`'s instrumented futures.
const CRATE_ROOT_FILES: [(&str, &[&str]); 2] =
    [("/tokio-1.", &["/src/runtime/", "/src/task/", "/src/loom/"]), ("/tracing-0.1.", &["/src/instrument.rs"])];

/// Source paths of the same code (line-tables-only debug info names inlined frames without
/// their path: `lang_start`, `call_once`, `{closure#0}`), and of the C library's start-up.
const ROOT_FILES: [&str; 11] = [
    "/library/std/src/rt.rs",
    "/library/std/src/panicking.rs",
    "/library/std/src/panic.rs",
    "/library/std/src/sys/backtrace.rs",
    "/library/std/src/sys/thread/",
    "/library/std/src/thread/",
    "/library/core/src/ops/function.rs",
    "/library/core/src/panic/unwind_safe.rs",
    "/library/alloc/src/boxed.rs",
    "/nptl/",
    "/csu/",
];

/// True when a frame of `function` in source `file` belongs to the code that starts the
/// program or one of its threads (`_start`, `std::rt::lang_start`, the thread-spawn
/// closures, …) rather than to the program. Only meant for the outer end of a stack:
/// `core::ops::function` frames between two of the program's functions are its own calls.
/// Frames of OCaml programs never are.
pub fn is_root_frame(function: &str, file: &str) -> bool {
    let path = function.strip_prefix('<').unwrap_or(function);
    // The C `main` that rustc generates has no source line; a program's own `main` has.
    let c_main = function == "main" && (file.is_empty() || file == "<unknown>");
    c_main
        || C_ROOTS.contains(&function)
        || is_c_library_offset(function)
        || RUST_ROOT_PREFIXES.iter().any(|p| path.starts_with(p))
        || ROOT_FILES.iter().any(|p| file.contains(p))
        || CRATE_ROOT_FILES.iter().any(|(krate, parts)| file.contains(krate) && parts.iter().any(|p| file.contains(p)))
}

/// The indexes of the `len` frames of a stack (innermost first, `frame(i)` the function and
/// file of the `i`th) that are kept: without the allocator frames at the inner end unless
/// `keep_allocator_frames`, and without the root frames below the span and thread
/// pseudo-frames at the outer end (which are kept) unless `keep_root_frames`. A stack of
/// allocator frames only is kept whole.
pub(crate) fn kept_frames<'a>(
    len: usize,
    keep_allocator_frames: bool,
    keep_root_frames: bool,
    frame: impl Fn(usize) -> (&'a str, &'a str),
) -> impl Iterator<Item = usize> {
    let mut start = 0;
    if !keep_allocator_frames {
        start = (0..len).find(|&i| !is_allocator_frame(frame(i).0, frame(i).1)).unwrap_or(0);
    }
    let code_end = (start..len).rev().find(|&i| !is_pseudo_frame(frame(i).1)).map_or(start, |i| i + 1);
    let mut end = code_end;
    if !keep_root_frames {
        if let Some(last) = (start..end).rev().find(|&i| !is_root_frame(frame(i).0, frame(i).1)) {
            end = last + 1;
        }
    }
    (start..end).chain(code_end..len)
}
