//! The one way a frame of a Rust program is named, in every output: the command line's
//! (`hotspots`, `flamegraph`, `pprof`, `diff`, the report's data, through
//! `Analysis::shorten_names`) and the live profiles' (pprof and folded stacks, `runtime::profile`).
//! [`function_names`] names the code frames of a program's stacks, [`profile_name`] is how a
//! profile shows a frame of any kind (a thread as `thread worker-0`), [`short_path`] is a
//! source path without its machine's prefixes.
//!
//! Debug info names a monomorphised function with all its generic arguments, which for
//! closures and iterator adaptors run to thousands of characters; line-tables-only builds
//! name inlined functions without their path (`insert`, `{closure#0}`, `{async_fn#0}`) and
//! out-of-line ones with it (`myservice::Cache::insert`, from the symbol table). A name here
//! has no generic arguments, is cut in the middle when very long, and always has a path: a
//! bare name takes the path given to it at its source line elsewhere in the stacks, else its
//! file's module path, so that no two functions of different files share a name (pprof merges
//! functions by name).

use std::borrow::Cow;
use std::collections::HashMap;

use crate::runtime::span_table::{SPAN_FILE_PREFIX, THREAD_FILE};

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

/// A frame as the debug info named it: a function (or a span's description, a thread's
/// name), its source file and line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Spelt<'a> {
    pub(crate) function: &'a str,
    pub(crate) file: &'a str,
    pub(crate) line: u32,
}

/// Whether a frame of `file` is a span or thread pseudo-frame (see `span_table`).
pub(crate) fn is_pseudo_frame(file: &str) -> bool {
    file == THREAD_FILE || file.starts_with(SPAN_FILE_PREFIX)
}

/// The function name of each of `frames`, the distinct frames of one Rust program's stacks:
/// shortened ([`short_name`]); a bare name at a source line where exactly one path ends with
/// it takes that path (an inlined closure, `{closure#0}`, and the same closure out of line,
/// `app::run::{{closure}}`, are one function); a bare name still left, of a Rust source file,
/// is qualified with the module path its file stands for (`app::net::{closure#0}`) when it is
/// a closure's or an async body's, or when it is found in two files or more. (Other bare
/// names of one file stay as they are: `__rust_alloc` must stay the allocator's shim.)
/// Span descriptions and thread names are no function names: they keep their text.
pub(crate) fn function_names(frames: &[Spelt<'_>]) -> Vec<String> {
    let short: Vec<Option<String>> =
        frames.iter().map(|f| (!is_pseudo_frame(f.file)).then(|| short_name(f.function))).collect();
    // For each source line, the paths of its functions by their last segment. (A
    // whole file would be too coarse: `call_once` is a dozen functions in one file.)
    let mut paths: HashMap<(&str, u32, &str), Option<&str>> = HashMap::new();
    for (frame, name) in frames.iter().zip(&short) {
        if let Some((_, last)) = name.as_deref().and_then(|name| name.rsplit_once("::")) {
            let name = name.as_deref().unwrap_or_default();
            paths
                .entry((frame.file, frame.line, closure_spelt_one_way(last)))
                .and_modify(|p| *p = p.filter(|p| *p == name))
                .or_insert(Some(name));
        }
    }
    let named: Vec<Option<&str>> = frames
        .iter()
        .zip(&short)
        .map(|(frame, name)| {
            let name = name.as_deref()?;
            match paths.get(&(frame.file, frame.line, closure_spelt_one_way(name))) {
                Some(Some(path)) if !name.contains("::") => Some(*path),
                _ => Some(name),
            }
        })
        .collect();
    // The Rust files of each name still bare: one in two files or more names two functions.
    let mut files_of: HashMap<&str, Option<&str>> = HashMap::new();
    for (frame, name) in frames.iter().zip(&named) {
        if let Some(name) = name.filter(|name| !name.contains("::") && frame.file.ends_with(".rs")) {
            files_of
                .entry(name)
                .and_modify(|file| *file = file.filter(|file| *file == frame.file))
                .or_insert(Some(frame.file));
        }
    }
    frames
        .iter()
        .zip(named)
        .map(|(frame, name)| {
            let Some(name) = name else { return frame.function.to_string() };
            let shared = files_of.get(name).is_some_and(Option::is_none);
            let qualify = shared || is_anonymous(name);
            qualify.then(|| qualified(name, frame.file)).flatten().unwrap_or_else(|| name.to_string())
        })
        .collect()
}

/// Whether `name` is a closure's or an async body's (`{closure#0}`, `{async_fn#0}`,
/// `{async_block#1}`): a name that says nothing without its path.
fn is_anonymous(name: &str) -> bool {
    name.starts_with('{') && name.ends_with('}')
}

/// How a profile names a frame of `function` (as [`function_names`] named it) at `file` and
/// `line`: a thread as `thread NAME`, a span as `span DESCRIPTION (file:line)` (never as a
/// function: a thread named `main` is not C's `main`), code as its function. The command line
/// labels frames the same way, with `(file:line)` after a function.
pub(crate) fn profile_name<'a>(function: &'a str, file: &str, line: u32) -> Cow<'a, str> {
    if file == THREAD_FILE {
        Cow::Owned(format!("thread {function}"))
    } else if let Some(site) = file.strip_prefix(SPAN_FILE_PREFIX) {
        Cow::Owned(format!("span {function} ({}:{line})", short_path(site)))
    } else {
        Cow::Borrowed(function)
    }
}

/// A closure's name segment as `{closure}`, however the demangler (`{{closure}}`) or the debug
/// info (`{closure#0}`) spelt it; any other segment as it is.
pub(crate) fn closure_spelt_one_way(segment: &str) -> &str {
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
/// → `app`; a file outside a `src` directory by its name: `examples/demo-app.rs` → `demo_app`).
/// `None` for a name with a path, or not of a Rust source file.
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

/// `path` without the prefixes that depend on the machine or toolchain that built the
/// program: `/rustc/<commit>/` of the standard library's sources, and everything up to the
/// registry directory of crates from crates.io (`…/registry/src/index.crates.io-<hash>/`).
pub fn short_path(path: &str) -> &str {
    if let Some(rest) = path.strip_prefix("/rustc/") {
        if let Some((commit, tail)) = rest.split_once('/') {
            if commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit()) {
                return tail;
            }
        }
    }
    if let Some(i) = path.find("/registry/src/") {
        let rest = &path[i + "/registry/src/".len()..];
        if let Some((_, tail)) = rest.split_once('/') {
            return tail;
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_specific_path_prefixes_are_dropped() {
        let commit = "59807616e1fa2540724bfbac14d7976d7e4a3860";
        assert_eq!(short_path(&format!("/rustc/{commit}/library/alloc/src/alloc.rs")), "library/alloc/src/alloc.rs");
        assert_eq!(
            short_path("/home/u/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/hashbrown-0.15.2/src/raw/mod.rs"),
            "hashbrown-0.15.2/src/raw/mod.rs"
        );
        assert_eq!(short_path("/rustc/abc/x.rs"), "/rustc/abc/x.rs");
        assert_eq!(short_path("src/main.rs"), "src/main.rs");
    }

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
        // In a program's frames: a bare name takes a path given at its line; else its file's,
        // if it is a closure's or an async body's, or names functions of two files; another
        // bare name of one file stays.
        let frame = |function, file, line| Spelt { function, file, line };
        let names = function_names(&[
            frame("{async_fn#0}", "/work/app/src/a.rs", 3),
            frame("next", "/work/app/src/b.rs", 12),
            frame("app::b::Walk::next", "/work/app/src/b.rs", 12),
            frame("insert", "/work/myservice/src/main.rs", 40),
            frame("insert", "/work/myservice/src/cache.rs", 7),
            frame("from_elem<u8>", "/work/app/src/c.rs", 50),
            frame("__rust_alloc", "/work/app/src/c.rs", 60),
            frame("malloc", "malloc.c", 50),
        ]);
        assert_eq!(
            names,
            [
                "app::a::{async_fn#0}",
                "app::b::Walk::next",
                "app::b::Walk::next",
                "myservice::insert",
                "myservice::cache::insert",
                "from_elem",
                "__rust_alloc",
                "malloc"
            ]
        );
        // A closure inlined (`{closure#0}`, from the debug info) and out of line (named by its
        // symbol) at one line is one function.
        let names = function_names(&[
            frame("{closure#0}", "/work/app/src/a.rs", 3),
            frame("app::run::{{closure}}", "/work/app/src/a.rs", 3),
        ]);
        assert_eq!(names, ["app::run::{{closure}}", "app::run::{{closure}}"]);
    }

    #[test]
    fn span_and_thread_names_are_kept_as_written() {
        let frame = |function, file| Spelt { function, file, line: 1 };
        let names = function_names(&[
            frame("decode{ty=Vec<u8>}", "<span>src/codec.rs"),
            frame("pool<2>", "<thread>"),
            frame("decode<u8>", "src/codec.rs"),
        ]);
        assert_eq!(names, ["decode{ty=Vec<u8>}", "pool<2>", "decode"]);
        assert_eq!(profile_name("pool<2>", "<thread>", 0), "thread pool<2>");
        assert_eq!(
            profile_name("decode{ty=Vec<u8>}", "<span>src/codec.rs", 7),
            "span decode{ty=Vec<u8>} (src/codec.rs:7)"
        );
        assert_eq!(profile_name("codec::decode", "src/codec.rs", 7), "codec::decode");
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
