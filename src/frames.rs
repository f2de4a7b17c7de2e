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
/// future on a worker thread; rayon's worker loop and the splitting of a parallel iterator
/// that it runs; `tracing`'s `Instrumented` wrapper around a future.
const RUST_ROOT_PREFIXES: [&str; 16] = [
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
    "rayon_core::",
    "rayon::iter::plumbing::",
    "tracing::instrument::Instrumented",
    "alloc::boxed::Box<dyn core::ops::function::FnOnce",
    // The same with its generic arguments elided (`analysis::short_name`).
    "alloc::boxed::Box as core::ops::function::FnOnce",
];

/// Crates (the start of their source directory's name) and parts of the source paths in them of
/// the same code: tokio's scheduler and task harness, rayon's pool and its iterators' splitting,
/// `tracing`'s instrumented futures.
const CRATE_ROOT_FILES: [(&str, &[&str]); 4] = [
    ("/tokio-1.", &["/src/runtime/", "/src/task/", "/src/loom/"]),
    ("/rayon-core-1.", &["/src/"]),
    ("/rayon-1.", &["/src/iter/plumbing/"]),
    ("/tracing-0.1.", &["/src/instrument.rs"]),
];

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

/// The function whose closure or async body `function` is (`app::main` of
/// `app::main::{{closure}}`, `app::main::{async_block#0}` or `app::main::{closure#0}::{closure#1}`),
/// or `None` for a function that is no closure.
pub fn enclosing_function(function: &str) -> Option<&str> {
    let mut name = function;
    while let Some((outer, last)) = name.rsplit_once("::") {
        if !last.starts_with('{') {
            break;
        }
        name = outer;
    }
    (name.len() < function.len() && !name.is_empty()).then_some(name)
}

/// Whether the outermost frames of a stack that are the program's own begin with a hand-off to
/// a runtime: a function `outer` (the `main` that `#[tokio::main]` writes, a function that calls
/// `Runtime::block_on` or rayon's `install`) that runs its own closure or async body `inner`
/// through root frames ([`is_root_frame`]: the runtime's `block_on` and its scheduler). That
/// tower is start-up too: trimmed, the stack starts at `inner`. `between` is the number of root
/// frames between the two (at least one: a closure called directly is the program's own call).
pub(crate) fn hands_off_to_runtime(outer: &str, inner: &str, between: usize) -> bool {
    between > 0 && enclosing_function(inner) == Some(outer)
}

/// The indexes of the `len` frames of a stack (innermost first, `frame(i)` the function and
/// file of the `i`th) that are kept: without the allocator frames at the inner end unless
/// `keep_allocator_frames`, and without the root frames below the span and thread
/// pseudo-frames at the outer end (which are kept) unless `keep_root_frames`, nor a hand-off
/// to a runtime just inside them ([`hands_off_to_runtime`]). A stack of allocator frames only
/// is kept whole.
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
            // The outermost kept frame hands its body to a runtime: the stack starts there.
            let inner = (start..last).rev().find(|&i| !is_root_frame(frame(i).0, frame(i).1));
            if let Some(inner) = inner.filter(|&i| hands_off_to_runtime(frame(last).0, frame(i).0, last - i - 1)) {
                end = inner + 1;
            }
        }
    }
    (start..end).chain(code_end..len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closure_names_its_enclosing_function() {
        assert_eq!(enclosing_function("app::main::{{closure}}"), Some("app::main"));
        assert_eq!(enclosing_function("app::main::{async_block#0}"), Some("app::main"));
        assert_eq!(enclosing_function("app::main::{closure#0}::{closure#1}"), Some("app::main"));
        assert_eq!(enclosing_function("app::main"), None);
        assert_eq!(enclosing_function("{closure#0}"), None);
    }

    /// `#[tokio::main]`'s main thread, innermost first (see `tests/integration/cli_analysis.rs`
    /// for the same through the sites of an analysis).
    const TOKIO_MAIN: [(&str, &str); 7] = [
        ("alloc::raw_vec::finish_grow", "/rustc/x/library/alloc/src/raw_vec.rs"),
        ("app::main::{{closure}}", "src/main.rs"),
        ("tokio::runtime::park::CachedParkThread::block_on", "tokio-1.54.1/src/runtime/park.rs"),
        ("tokio::runtime::runtime::Runtime::block_on", "tokio-1.54.1/src/runtime/runtime.rs"),
        ("app::main", "src/main.rs"),
        ("std::rt::lang_start_internal", "/rustc/x/library/std/src/rt.rs"),
        ("main", "<thread>"),
    ];

    #[test]
    fn kept_frames_leave_out_a_hand_off_to_a_runtime() {
        let kept = |stack: &[(&'static str, &'static str)], keep_root_frames| {
            kept_frames(stack.len(), false, keep_root_frames, |i| stack[i]).collect::<Vec<_>>()
        };
        assert_eq!(kept(&TOKIO_MAIN, false), [1, 6]);
        assert_eq!(kept(&TOKIO_MAIN, true), [1, 2, 3, 4, 5, 6]);
        // `main` calling its closure itself is its own call.
        let direct = [TOKIO_MAIN[0], TOKIO_MAIN[1], TOKIO_MAIN[4], TOKIO_MAIN[5], TOKIO_MAIN[6]];
        assert_eq!(kept(&direct, false), [1, 2, 4]);
        // A stack that ends in the runtime, inside `main`, keeps `main`.
        assert_eq!(kept(&TOKIO_MAIN[2..], false), [0, 1, 2, 4]);
    }
}
