//! Golden tests of the text outputs (`info`, `hotspots`, `diff`) on upstream's traces and on
//! traces built here. Expected outputs live in `tests/golden/`; run with `UPDATE_GOLDEN=1`
//! to regenerate them after an intended change, and review the diff.
use crate::util::cli::*;
use memtrace_rs::cli::analysis::{Analysis, Options};
use memtrace_rs::cli::sites::{By, Grouping, Ranking};
use memtrace_rs::cli::{diff, hotspots, info};

const STACKS: Options = Options { stacks: true, live_at: None };

fn hotspots_options(top: usize, by: By, stacks: bool, keep: bool) -> hotspots::Options {
    hotspots::Options { ranking: Ranking { top, by, grouping: Grouping::new(stacks, keep) }, frames: 6 }
}

fn info_text(a: &Analysis, name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    info::write(a, name, &mut out).unwrap();
    out
}

fn hotspots_text(a: &Analysis, name: &str, options: &hotspots::Options) -> Vec<u8> {
    let mut out = Vec::new();
    hotspots::write(a, name, options, &mut out).unwrap();
    out
}

fn diff_text(base: &Analysis, new: &Analysis, names: (&str, &str), by: By, stacks: bool) -> Vec<u8> {
    let options = diff::Options { ranking: Ranking { top: 10, by, grouping: Grouping::new(stacks, false) } };
    let mut out = Vec::new();
    diff::write(base, new, names, &options, &mut out).unwrap();
    out
}

#[test]
fn upstream_info() {
    for name in UPSTREAM {
        let a = upstream(name);
        golden(&format!("{name}.info.txt"), &info_text(a, &format!("{name}.ctf")));
    }
}

#[test]
fn upstream_info_without_backtraces_is_the_same() {
    for name in UPSTREAM {
        let a = Analysis::run(&data(&format!("{name}.ctf")), &Options::default()).unwrap();
        golden(&format!("{name}.info.txt"), &info_text(&a, &format!("{name}.ctf")));
    }
}

#[test]
fn upstream_hotspots() {
    for name in UPSTREAM {
        let a = upstream(name);
        let file = format!("{name}.ctf");
        for (suffix, options) in [
            ("allocated", hotspots_options(15, By::Allocated, false, false)),
            ("live-peak", hotspots_options(15, By::LivePeak, false, false)),
            ("live-end", hotspots_options(15, By::LiveEnd, false, false)),
            ("stacks", hotspots_options(5, By::Allocated, true, false)),
        ] {
            golden(&format!("{name}.hotspots-{suffix}.txt"), &hotspots_text(a, &file, &options));
        }
    }
}

#[test]
fn upstream_diff() {
    let (v3, v2, lists) = (upstream("ocamlopt"), upstream("ocamlopt-v2"), upstream("lists_and_sets-v1"));
    golden(
        "diff-ocamlopt-v2-ocamlopt.txt",
        &diff_text(v2, v3, ("ocamlopt-v2.ctf", "ocamlopt.ctf"), By::Allocated, false),
    );
    golden(
        "diff-lists_and_sets-ocamlopt.txt",
        &diff_text(lists, v3, ("lists_and_sets-v1.ctf", "ocamlopt.ctf"), By::LivePeak, false),
    );
}

#[test]
fn built_trace_info_and_hotspots() {
    let a = analyse(&known_trace(), STACKS);
    golden("known.info.txt", &info_text(&a, "known.ctf"));
    let mut out = Vec::new();
    for options in [
        hotspots_options(10, By::Allocated, false, false),
        hotspots_options(10, By::LivePeak, false, false),
        hotspots_options(10, By::LiveEnd, false, false),
        hotspots_options(10, By::Allocated, false, true),
        hotspots_options(1, By::Allocated, true, false),
        hotspots_options(10, By::Allocated, true, true),
    ] {
        out.extend(hotspots_text(&a, "known.ctf", &options));
        out.push(b'\n');
    }
    golden("known.hotspots.txt", &out);
}

#[test]
fn built_trace_diff() {
    let (base, new) = (analyse(&known_trace(), STACKS), analyse(&known_trace_new(), STACKS));
    let mut out = Vec::new();
    for (by, stacks) in [(By::Allocated, false), (By::LivePeak, false), (By::LiveEnd, false), (By::Allocated, true)] {
        out.extend(diff_text(&base, &new, ("known.ctf", "known-new.ctf"), by, stacks));
        out.push(b'\n');
    }
    golden("known.diff.txt", &out);
}
