//! Golden tests of the text outputs (`info`, `hotspots`, `diff`) of the `memtrace` binary on
//! upstream's traces and on traces built here. Expected outputs live in `tests/golden/`; run
//! with `UPDATE_GOLDEN=1` to regenerate them after an intended change, and review the diff.
use std::path::Path;

use crate::util::cli::*;
use memtrace_rs::analysis::{Analysis, Options};

/// `memtrace hotspots FILE --top TOP --frames 6 EXTRA…` run in `dir`.
fn hotspots(dir: &Path, file: &str, top: usize, extra: &[&str]) -> String {
    let top = top.to_string();
    let mut args = vec!["hotspots", file, "--top", &top, "--frames", "6"];
    args.extend(extra);
    memtrace_ok(dir, &args)
}

/// `memtrace diff BASE NEW --top 10 EXTRA…` run in `dir`.
fn diff(dir: &Path, base: &str, new: &str, extra: &[&str]) -> String {
    let mut args = vec!["diff", base, new, "--top", "10"];
    args.extend(extra);
    memtrace_ok(dir, &args)
}

#[test]
fn upstream_info() {
    for name in UPSTREAM {
        let file = format!("{name}.ctf");
        golden(&format!("{name}.info.txt"), memtrace_ok(&data_dir(), &["info", &file]).as_bytes());
    }
}

#[test]
fn upstream_summary_with_backtraces_is_the_same() {
    // `info` reads without decoding backtraces; the views that decode them must agree with
    // it on every figure it prints.
    for name in UPSTREAM {
        let with = upstream(name);
        let without = Analysis::run(&data(&format!("{name}.ctf")), &Options::default()).unwrap();
        assert_eq!(with.counts, without.counts, "{name}");
        assert_eq!((with.end_time, with.live_end, with.peak), (without.end_time, without.live_end, without.peak));
        assert_eq!((with.domains, with.location_codes), (without.domains, without.location_codes), "{name}");
        assert_eq!(with.distinct_locations, without.distinct_locations, "{name}");
        assert_eq!(with.timeline, without.timeline, "{name}");
    }
}

#[test]
fn upstream_hotspots() {
    let dir = data_dir();
    for name in UPSTREAM {
        let file = format!("{name}.ctf");
        for (suffix, top, extra) in [
            ("allocated", 15, &["--by", "allocated"][..]),
            ("live-peak", 15, &["--by", "live-peak"]),
            ("live-end", 15, &["--by", "live-end"]),
            ("stacks", 5, &["--by", "allocated", "--stacks"]),
        ] {
            golden(&format!("{name}.hotspots-{suffix}.txt"), hotspots(&dir, &file, top, extra).as_bytes());
        }
    }
}

#[test]
fn upstream_diff() {
    let dir = data_dir();
    golden("diff-ocamlopt-v2-ocamlopt.txt", diff(&dir, "ocamlopt-v2.ctf", "ocamlopt.ctf", &[]).as_bytes());
    golden(
        "diff-lists_and_sets-ocamlopt.txt",
        diff(&dir, "lists_and_sets-v1.ctf", "ocamlopt.ctf", &["--by", "live-peak"]).as_bytes(),
    );
}

#[test]
fn built_trace_info_and_hotspots() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    write_trace(dir, "known.ctf", &known_trace());
    golden("known.info.txt", memtrace_ok(dir, &["info", "known.ctf"]).as_bytes());
    let mut out = String::new();
    for (top, extra) in [
        (10, &[][..]),
        (10, &["--by", "live-peak"]),
        (10, &["--by", "live-end"]),
        (10, &["--keep-allocator-frames"]),
        (1, &["--stacks"]),
        (10, &["--stacks", "--keep-allocator-frames"]),
    ] {
        out += &hotspots(dir, "known.ctf", top, extra);
        out.push('\n');
    }
    golden("known.hotspots.txt", out.as_bytes());
}

#[test]
fn built_trace_diff() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    write_trace(dir, "known.ctf", &known_trace());
    write_trace(dir, "known-new.ctf", &known_trace_new());
    let mut out = String::new();
    for extra in [&[][..], &["--by", "live-peak"], &["--by", "live-end"], &["--stacks"]] {
        out += &diff(dir, "known.ctf", "known-new.ctf", extra);
        out.push('\n');
    }
    golden("known.diff.txt", out.as_bytes());
}
