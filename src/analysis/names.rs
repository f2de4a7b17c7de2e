//! Short function names for Rust traces: generic arguments elided, very long names cut in
//! the middle, and one spelling per function.
//!
//! Debug info names a monomorphised function with all its generic arguments, which for
//! closures and iterator adaptors run to thousands of characters; line-tables-only builds
//! name inlined functions without their path (`alloc`) and out-of-line ones with it
//! (`alloc::alloc::alloc`). [`Analysis::shorten_names`] rewrites the frames so that a function
//! reads the same, and is one site, however the debug info spelled it. By the same rules,
//! [`frame_identity`] says which frames of two traces are one (`memtrace diff`, `report
//! --diff`), whatever the builds' debug info and the runs' thread ids.

use std::collections::HashMap;

use super::pass::{short_path, Analysis, Frame, FrameId, FrameKind, Origin};

/// Longest name kept whole (in bytes); longer ones keep their two ends.
const MAX_NAME: usize = 240;

/// `name` without generic arguments (`Vec<T>::push` → `Vec::push`, `f::<u8>` → `f`), keeping
/// qualified paths (`<T as Trait>::f` → `<T as Trait>::f` with the generics inside elided),
/// and cut in the middle (`…`) when still longer than 240 bytes.
pub fn short_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len().min(MAX_NAME + 8));
    // Depths of the open `<`: true for generic arguments (dropped), false for a qualified
    // path (kept).
    let mut open: Vec<bool> = Vec::new();
    let mut previous = ' ';
    for c in name.chars() {
        let dropping = open.contains(&true);
        let arrow = previous == '-';
        previous = c;
        match c {
            '<' => {
                let before = out.chars().last();
                let generic = dropping
                    || matches!(before, Some(b) if b.is_alphanumeric() || b == '_' || b == '}' || b == '>' || b == ':');
                if generic && !dropping && out.ends_with("::") {
                    // A turbofish: `f::<u8>` → `f`.
                    out.truncate(out.len() - 2);
                }
                open.push(generic);
                if !generic {
                    out.push(c);
                }
            }
            '>' if !open.is_empty() && !arrow => {
                // A qualified path's `>` stays, unless inside dropped arguments.
                let kept = open.pop() == Some(false) && !dropping;
                if kept {
                    out.push(c);
                }
            }
            c if !dropping => out.push(c),
            _ => {}
        }
    }
    cut(out)
}

/// `name` cut to its first and last 120 bytes around a `…` when longer than [`MAX_NAME`].
fn cut(name: String) -> String {
    if name.len() <= MAX_NAME {
        return name;
    }
    let boundary = |mut i: usize, up: bool| {
        while !name.is_char_boundary(i) {
            i = if up { i + 1 } else { i - 1 };
        }
        i
    };
    let head = boundary(MAX_NAME / 2, false);
    let tail = boundary(name.len() - MAX_NAME / 2, true);
    format!("{}…{}", &name[..head], &name[tail..])
}

impl Analysis {
    /// For a Rust trace, shorten every code frame's function name ([`short_name`]) and give a
    /// function the same name wherever the debug info left out its path: a bare name at a
    /// source line where exactly one path ends with it takes that path, and a bare name still
    /// found in two Rust files or more is qualified with its file's module path
    /// (`app::net::{closure#0}`). Frames that then agree are merged. OCaml traces are left
    /// alone.
    pub fn shorten_names(&mut self) {
        if self.origin() != Origin::Rust {
            return;
        }
        shorten(&mut self.frames, &mut self.code_frames);
    }
}

/// Shorten the names of `frames` as [`Analysis::shorten_names`] says, merging the frames
/// that then agree, and give the frames of each code of `code_frames` their new ids.
/// Returns the new id of each old frame (the report page renumbers its trie with it).
pub fn shorten(frames: &mut Vec<Frame>, code_frames: &mut HashMap<u64, Vec<FrameId>>) -> Vec<FrameId> {
    let (merged, remap) = shortened(frames);
    for id in code_frames.values_mut().flatten() {
        *id = remap[*id];
    }
    *frames = merged;
    remap
}

/// `frames` with their names shortened, frames that then agree merged, and the new id of
/// each old frame.
fn shortened(frames: &[Frame]) -> (Vec<Frame>, Vec<FrameId>) {
    // Span descriptions and thread names are no function names: they keep their text, which
    // is what `report --span` matches.
    let short: Vec<String> = frames
        .iter()
        .map(|f| if f.kind() == FrameKind::Code { short_name(&f.function) } else { f.function.clone() })
        .collect();
    // For each source line, the paths of its functions by their last segment. (A
    // whole file would be too coarse: `call_once` is a dozen functions in one file.)
    let mut paths: HashMap<(&str, u32, &str), Option<&str>> = HashMap::new();
    for (frame, name) in frames.iter().zip(&short) {
        if let Some((_, last)) = name.rsplit_once("::") {
            paths
                .entry((frame.file.as_str(), frame.line, closure_spelt_one_way(last)))
                .and_modify(|p| *p = p.filter(|p| *p == name.as_str()))
                .or_insert(Some(name.as_str()));
        }
    }
    let named: Vec<&str> = frames
        .iter()
        .zip(&short)
        .map(|(frame, name)| match paths.get(&(frame.file.as_str(), frame.line, closure_spelt_one_way(name))) {
            Some(Some(path)) if !name.contains("::") => path,
            _ => name.as_str(),
        })
        .collect();
    // The Rust files of each name still bare: one in two files or more names two functions.
    // (Thread and span pseudo-frames, and C functions, are not counted.)
    let mut files_of: HashMap<&str, Option<&str>> = HashMap::new();
    let bare = |(frame, name): &(&Frame, &&str)| !name.contains("::") && frame.file.ends_with(".rs");
    for (frame, name) in frames.iter().zip(&named).filter(bare) {
        files_of
            .entry(name)
            .and_modify(|file| *file = file.filter(|file| *file == frame.file.as_str()))
            .or_insert(Some(frame.file.as_str()));
    }
    let mut merged: Vec<Frame> = Vec::new();
    let mut index: HashMap<Frame, usize> = HashMap::new();
    let remap: Vec<usize> = frames
        .iter()
        .zip(&named)
        .map(|(frame, name)| {
            let shared = files_of.get(name).is_some_and(Option::is_none);
            let full = shared.then(|| qualified(name, &frame.file)).flatten().unwrap_or_else(|| name.to_string());
            let frame = Frame { function: full, file: frame.file.clone(), line: frame.line };
            *index.entry(frame).or_insert_with_key(|f| {
                merged.push(f.clone());
                merged.len() - 1
            })
        })
        .collect();
    (merged, remap)
}

/// A closure's name segment as `{closure}`, however the demangler (`{{closure}}`) or the debug
/// info (`{closure#0}`) spelt it; any other segment as it is.
fn closure_spelt_one_way(segment: &str) -> &str {
    if segment.starts_with("{{closure}}") || segment.starts_with("{closure#") {
        "{closure}"
    } else {
        segment
    }
}

/// A bare Rust function name (`{closure#0}`, `next`, `from_iter`: line-tables-only debug info
/// names inlined functions without their path) qualified with the module path its source
/// file stands for (`library/core/src/iter/traits/iterator.rs` → `core::iter::traits::iterator`,
/// `tokio-1.54.1/src/runtime/task/core.rs` → `tokio::runtime::task::core`, `…/app/src/main.rs`
/// → `app`; a file outside a `src` directory by its name: `examples/demo-app.rs` → `demo_app`),
/// so that no two functions of different places share a name (pprof merges functions by
/// name). `None` for a name with a path, or not of a Rust source file. Only names that two
/// files share are qualified (see [`shortened`]).
fn qualified(name: &str, file: &str) -> Option<String> {
    if name.contains("::") || name.starts_with('<') || name.is_empty() {
        return None;
    }
    let path = short_path(file).strip_suffix(".rs")?;
    let (krate, module) = match path.rsplit_once("/src/") {
        Some((dir, module)) => {
            let dir = dir.rsplit('/').next().unwrap_or(dir);
            // A crate from a registry has its version in its directory's name.
            let krate = match dir.rsplit_once('-') {
                Some((name, version)) if version.starts_with(|c: char| c.is_ascii_digit()) => name,
                _ => dir,
            };
            (krate, module)
        }
        None => (path.rsplit('/').next().unwrap_or(path), ""),
    };
    let mut parts: Vec<&str> = std::iter::once(krate).chain(module.split('/').filter(|p| !p.is_empty())).collect();
    if parts.len() > 1 && matches!(parts.last(), Some(&("mod" | "lib" | "main"))) {
        parts.pop();
    }
    Some(format!("{}::{name}", parts.join("::").replace('-', "_")))
}

/// How diffs name the threads that the runtime named after their kernel ids (`thread-12345`):
/// all as one thread, since an id says nothing of which thread of the other run it was.
/// (Matching them by order of creation would pair threads by the scheduler's timing.)
pub const UNNAMED_THREADS: &str = "thread-*";

/// Whether `frame` is a thread named after its kernel id, as the runtime names a thread that
/// has no name.
fn is_unnamed_thread(frame: &Frame) -> bool {
    frame.kind() == FrameKind::Thread
        && frame
            .function
            .strip_prefix("thread-")
            .is_some_and(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
}

/// `frame` as a diff shows it (`memtrace diff`, `report --diff`): an unnamed thread as
/// [`UNNAMED_THREADS`], any other frame as it is.
pub fn matched_frame(frame: &Frame) -> Frame {
    if is_unnamed_thread(frame) {
        Frame { function: UNNAMED_THREADS.to_string(), ..frame.clone() }
    } else {
        frame.clone()
    }
}

/// What a frame is, whatever the build and run that wrote it: the key by which the frames of
/// two traces are matched (`memtrace diff`, `report --diff`). A code frame with a source line is its file
/// (without the machine's prefixes, [`short_path`]), line and the last segment of its name,
/// with closures spelt one way: line-tables-only debug info names inlined functions without
/// their path (`reserve_entries`), fuller debug info with it
/// (`indexmap::map::core::reserve_entries`), and `{{closure}}` or `{closure#0}` by the
/// demangling. Other code frames are their name (object+offset names are the same in every
/// run). A thread the runtime named after its id (`thread-12345`, which changes from run to
/// run) is any such thread ([`UNNAMED_THREADS`]).
pub fn frame_identity(frame: &Frame) -> String {
    match frame.kind() {
        FrameKind::Thread | FrameKind::Span => matched_frame(frame).label(),
        FrameKind::Code if frame.file.is_empty() => frame.function.clone(),
        FrameKind::Code => {
            let name = short_name(&frame.function);
            let last = closure_spelt_one_way(name.rsplit_once("::").map_or(name.as_str(), |(_, last)| last));
            format!("{}:{}:{last}", short_path(&frame.file), frame.line)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generic_arguments_are_elided() {
        for (long, short) in [
            ("alloc::raw_vec::RawVec<T,A>::grow_one", "alloc::raw_vec::RawVec::grow_one"),
            ("with_capacity_in<u8, alloc::alloc::Global>", "with_capacity_in"),
            ("std::panicking::catch_unwind::do_call::<isize, i32>", "std::panicking::catch_unwind::do_call"),
            ("<alloc::string::String as core::clone::Clone>::clone", "<alloc::string::String as core::clone::Clone>::clone"),
            (
                "<alloc::boxed::Box<dyn core::ops::function::FnOnce<(), Output = ()>> as core::ops::function::FnOnce<()>>::call_once",
                "<alloc::boxed::Box as core::ops::function::FnOnce>::call_once",
            ),
            ("{closure#0}<app::run::{closure_env#0}, ()>", "{closure#0}"),
            ("<&T as core::fmt::Display>::fmt", "<&T as core::fmt::Display>::fmt"),
            ("main", "main"),
            ("call_once<fn() -> u8, ()>", "call_once"),
            ("<fn() -> u8 as core::ops::function::FnOnce<()>>::call_once", "<fn() -> u8 as core::ops::function::FnOnce>::call_once"),
            ("Stdlib.(<>)", "Stdlib.(<>)"),
        ] {
            assert_eq!(short_name(long), short, "{long}");
        }
    }

    #[test]
    fn bare_names_are_qualified_by_their_files_module() {
        let rustc = "/rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library";
        let registry = "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f";
        for (name, file, want) in [
            ("next", format!("{rustc}/core/src/iter/traits/iterator.rs"), Some("core::iter::traits::iterator::next")),
            (
                "poll",
                format!("{registry}/tokio-1.54.1/src/runtime/task/core.rs"),
                Some("tokio::runtime::task::core::poll"),
            ),
            ("{closure#0}", "/work/app/src/main.rs".to_string(), Some("app::{closure#0}")),
            ("{closure#0}", "/work/app/src/net/mod.rs".to_string(), Some("app::net::{closure#0}")),
            ("{closure#0}", "/work/examples/demo-app.rs".to_string(), Some("demo_app::{closure#0}")),
            ("app::run", "/work/app/src/main.rs".to_string(), None),
            ("<T as Clone>::clone", "/work/app/src/main.rs".to_string(), None),
            ("start_thread", "./nptl/pthread_create.c".to_string(), None),
            ("libc.so.6+0x2724a", "/lib/x86_64-linux-gnu/libc.so.6".to_string(), None),
            ("main", String::new(), None),
        ] {
            assert_eq!(qualified(name, &file).as_deref(), want, "{name} {file}");
        }
        // In a trace: the bare name takes a path given at its line; else, if it names functions
        // in two files, its file's; a name of one file is left alone.
        let frame = |function: &str, file: &str, line| Frame { function: function.into(), file: file.into(), line };
        let (merged, _) = shortened(&[
            frame("{closure#0}", "/work/app/src/a.rs", 3),
            frame("{closure#0}", "/work/app/src/b.rs", 9),
            frame("next", "/work/app/src/b.rs", 12),
            frame("app::b::Walk::next", "/work/app/src/b.rs", 12),
            frame("next", "/work/app/src/c.rs", 40),
            frame("from_elem", "/work/app/src/c.rs", 50),
            frame("from_elem", "/work/app/src/c.rs", 51),
        ]);
        let names: Vec<&str> = merged.iter().map(|f| f.function.as_str()).collect();
        assert_eq!(
            names,
            ["app::a::{closure#0}", "app::b::{closure#0}", "app::b::Walk::next", "next", "from_elem", "from_elem"]
        );
        // A closure inlined (`{closure#0}`, from the debug info) and out of line (named by its
        // symbol) at one line is one frame.
        let (merged, _) = shortened(&[
            frame("{closure#0}", "/work/app/src/a.rs", 3),
            frame("app::run::{{closure}}", "/work/app/src/a.rs", 3),
        ]);
        assert_eq!(merged.iter().map(|f| f.function.as_str()).collect::<Vec<_>>(), ["app::run::{{closure}}"]);
    }

    #[test]
    fn span_and_thread_names_are_kept_as_written() {
        let frame = |function: &str, file: &str| Frame { function: function.into(), file: file.into(), line: 1 };
        let (merged, _) = shortened(&[
            frame("decode{ty=Vec<u8>}", "<span>src/codec.rs"),
            frame("decode{ty=Vec<String>}", "<span>src/codec.rs"),
            frame("pool<2>", "<thread>"),
            frame("decode<u8>", "src/codec.rs"),
        ]);
        let names: Vec<&str> = merged.iter().map(|f| f.function.as_str()).collect();
        assert_eq!(names, ["decode{ty=Vec<u8>}", "decode{ty=Vec<String>}", "pool<2>", "decode"]);
    }

    #[test]
    fn a_function_is_one_frame_across_debug_levels_and_runs() {
        let frame = |function: &str, file: &str, line| Frame { function: function.into(), file: file.into(), line };
        let registry = "/home/u/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/indexmap-2.7.0/src/map/core.rs";
        for (a, b) in [
            (
                frame("reserve_entries<K, V>", registry, 228),
                frame("indexmap::map::core::reserve_entries", registry, 228),
            ),
            (frame("{closure#0}", "src/app.rs", 7), frame("app::run::{{closure}}", "src/app.rs", 7)),
            (frame("libc.so.6+0x2724a", "/lib/libc.so.6", 0), frame("libc.so.6+0x2724a", "/lib/libc.so.6", 0)),
            (frame("thread-12906", "<thread>", 0), frame("thread-19103", "<thread>", 0)),
        ] {
            assert_eq!(frame_identity(&a), frame_identity(&b), "{a:?} {b:?}");
        }
        for (a, b) in [
            (frame("reserve_entries", "src/a.rs", 228), frame("reserve_entries", "src/a.rs", 229)),
            (frame("app::f", "src/a.rs", 1), frame("app::g", "src/a.rs", 1)),
            (frame("main", "<thread>", 0), frame("thread-1", "<thread>", 0)),
            (frame("main", "<thread>", 0), frame("main", "", 0)),
            (frame("thread-", "<thread>", 0), frame("thread-1", "<thread>", 0)),
            (frame("thread-12", "src/a.rs", 1), frame("thread-13", "src/a.rs", 1)),
        ] {
            assert_ne!(frame_identity(&a), frame_identity(&b), "{a:?} {b:?}");
        }
        assert_eq!(matched_frame(&frame("thread-12906", "<thread>", 0)).label(), "thread thread-*");
    }

    #[test]
    fn long_names_keep_their_ends() {
        let long = format!("app::{}::end", "é".repeat(1000));
        let short = short_name(&long);
        assert!(
            short.len() <= MAX_NAME + "…".len() && short.starts_with("app::") && short.ends_with("::end"),
            "{short}"
        );
        assert!(short.contains('…'));
    }
}
