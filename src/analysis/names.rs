//! The names of a Rust trace's frames, as every output shows them (by `crate::naming`'s
//! rules: [`Analysis::shorten_names`]), and which frames of two traces are one
//! ([`frame_identity`], for `memtrace diff` and `report --diff`), whatever the builds' debug
//! info and the runs' thread ids.

use std::collections::HashMap;

pub use crate::naming::short_name;
use crate::naming::{closure_spelt_one_way, function_names, Spelt};

use super::pass::{short_path, Analysis, Frame, FrameId, FrameKind, Origin};

impl Analysis {
    /// For a Rust trace, name every code frame as every output does (`crate::naming`): no
    /// generic arguments; a bare name takes the path given at its line, or its file's module
    /// path when it is a closure's or names functions of two files (`app::net::{closure#0}`).
    /// Frames that then agree are merged. OCaml traces are left alone.
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
    let spelt: Vec<Spelt<'_>> =
        frames.iter().map(|f| Spelt { function: &f.function, file: &f.file, line: f.line }).collect();
    let names = function_names(&spelt);
    let mut merged: Vec<Frame> = Vec::new();
    let mut index: HashMap<Frame, usize> = HashMap::new();
    let remap: Vec<usize> = frames
        .iter()
        .zip(names)
        .map(|(frame, function)| {
            let frame = Frame { function, file: frame.file.clone(), line: frame.line };
            *index.entry(frame).or_insert_with_key(|f| {
                merged.push(f.clone());
                merged.len() - 1
            })
        })
        .collect();
    (merged, remap)
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

    /// Frames whose names then agree are one frame (the naming itself is `crate::naming`'s,
    /// tested there).
    #[test]
    fn frames_named_alike_are_merged() {
        // (function, file in /work/app/src, line)
        let frames = [
            ("{closure#0}", "a.rs", 3),
            ("app::run::{{closure}}", "a.rs", 3),
            ("from_elem<u8>", "c.rs", 50),
            ("from_elem<u16>", "c.rs", 50),
            ("from_elem", "c.rs", 51),
        ]
        .map(|(function, file, line)| Frame {
            function: function.into(),
            file: format!("/work/app/src/{file}"),
            line,
        });
        let thread = Frame { function: "pool<2>".into(), file: "<thread>".into(), line: 0 };
        let (merged, remap) = shortened(&[&frames[..], &[thread]].concat());
        let names: Vec<&str> = merged.iter().map(|f| f.function.as_str()).collect();
        assert_eq!(names, ["app::run::{{closure}}", "from_elem", "from_elem", "pool<2>"]);
        assert_eq!(remap, [0, 0, 1, 1, 2, 3]);
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
}
