//! The pprof profile `memtrace pprof` writes decodes back (with the binary's own prost
//! structs) into the expected samples, locations, functions and lines.
use crate::skip::skip;
use std::io::Read;
use std::path::Path;

use crate::util::cli::*;
use prost::Message;

#[path = "../../src/bin/memtrace/profile_proto.rs"]
#[allow(dead_code)]
mod profile_proto;
use profile_proto::Profile;

/// Write the gzipped profile of the trace at `trace` with the binary (and the flags `args`),
/// then gunzip and decode it.
fn round_trip(trace: &Path, args: &[&str]) -> Profile {
    let dir = tempfile::tempdir().unwrap();
    let mut all = vec!["pprof", trace.to_str().unwrap(), "-o", "heap.pb.gz"];
    all.extend(args);
    memtrace_ok(dir.path(), &all);
    let gz = std::fs::read(dir.path().join("heap.pb.gz")).unwrap();
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut raw).unwrap();
    Profile::decode(&raw[..]).unwrap()
}

fn string(p: &Profile, i: i64) -> &str {
    &p.string_table[i as usize]
}

/// A source line as `(function, file, line)`.
type SourceLine = (String, String, i64);

/// The source lines of each location of a sample, leaf first.
fn frames(p: &Profile, location_ids: &[u64]) -> Vec<SourceLine> {
    location_ids
        .iter()
        .flat_map(|&id| &p.location.iter().find(|l| l.id == id).unwrap().line)
        .map(|line| {
            let f = p.function.iter().find(|f| f.id == line.function_id).unwrap();
            (string(p, f.name).to_string(), string(p, f.filename).to_string(), line.line)
        })
        .collect()
}

/// The source lines of the known trace's codes in `stack` (innermost first).
fn expect(stack: &[u64]) -> Vec<SourceLine> {
    let name = |code: u64| FUNCTIONS.iter().find(|(c, _)| *c == code).unwrap().1.to_string();
    stack.iter().map(|&c| (name(c), "src/app.rs".to_string(), c as i64 * 10)).collect()
}

/// Each sample's source lines (leaf first) and values.
fn samples(p: &Profile) -> Vec<(Vec<SourceLine>, Vec<i64>)> {
    p.sample.iter().map(|s| (frames(p, &s.location_id), s.value.clone())).collect()
}

#[test]
fn known_trace_profile() {
    let dir = tempfile::tempdir().unwrap();
    let p =
        round_trip(&write_trace(dir.path(), "known.ctf", &known_trace()), &["--keep-allocator-frames", "--full-names"]);
    assert_eq!(p.string_table[0], "");
    let types: Vec<(&str, &str)> = p.sample_type.iter().map(|t| (string(&p, t.r#type), string(&p, t.unit))).collect();
    assert_eq!(
        types,
        [("alloc_objects", "count"), ("alloc_space", "bytes"), ("inuse_objects", "count"), ("inuse_space", "bytes")]
    );
    assert_eq!(string(&p, p.default_sample_type), "inuse_space");
    let period_type = p.period_type.as_ref().unwrap();
    assert_eq!((string(&p, period_type.r#type), string(&p, period_type.unit), p.period), ("space", "bytes", 800));
    assert_eq!(p.time_nanos, START as i64 * 1000);
    assert_eq!(p.duration_nanos, 70_000);
    assert_eq!(p.mapping.len(), 1);
    assert_eq!(string(&p, p.mapping[0].filename), "/usr/bin/test-app");

    // In use: live at the peak (40 µs: parse's second block and load's), by default.
    let samples = samples(&p);
    assert_eq!(
        samples,
        vec![
            (expect(&PARSE), vec![200, 5600, 100, 4000]),
            (expect(&LOAD), vec![100, 2400, 100, 2400]),
            (expect(&REHASH), vec![100, 800, 0, 0]),
        ]
    );
    assert!(p.comment.iter().any(|&c| string(&p, c).ends_with("what is live at the peak of the live estimate")));
    // One location per distinct code, with the code as its address.
    assert_eq!(p.location.len(), 8);
    let mut addresses: Vec<u64> = p.location.iter().map(|l| l.address).collect();
    addresses.sort();
    assert_eq!(addresses, (1..=8).collect::<Vec<_>>());
    assert!(p.location.iter().all(|l| l.mapping_id == 1 && l.line.len() == 1));
}

/// `--inuse-at` chooses when the in-use sample types count what is live: at the end, or at a
/// time; a time past the trace's end is refused, as `flamegraph --live-at` refuses it.
#[test]
fn in_use_at_the_end_or_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write_trace(dir.path(), "known.ctf", &known_trace());
    let inuse = |at: &str| -> Vec<Vec<i64>> {
        let p = round_trip(&trace, &["--keep-allocator-frames", "--inuse-at", at]);
        let moment = string(&p, *p.comment.last().unwrap()).to_string();
        assert!(moment.contains(if at == "end" { "the end of the trace" } else { "after the start" }), "{moment}");
        p.sample.iter().map(|s| s.value[2..].to_vec()).collect()
    };
    // PARSE, LOAD, REHASH: only rehash's block is live at the end; at 25 µs, parse's first
    // block and load's.
    assert_eq!(inuse("end"), [vec![0, 0], vec![0, 0], vec![100, 800]]);
    assert_eq!(inuse("25us"), [vec![100, 1600], vec![100, 2400], vec![0, 0]]);
    let run = memtrace(dir.path(), &["pprof", trace.to_str().unwrap(), "-o", "late.pb.gz", "--inuse-at", "1s"]);
    assert!(!run.status.success() && run.stderr.contains("after the trace's last event"), "{}", run.stderr);
    assert!(!dir.path().join("late.pb.gz").exists());
}

#[test]
fn allocator_frames_are_trimmed_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let p = round_trip(&write_trace(dir.path(), "known.ctf", &known_trace()), &["--full-names"]);
    let samples = samples(&p);
    // `load` and `rehash` differ only in their allocator frames: two samples of one stack.
    assert_eq!(
        samples,
        vec![
            (expect(&PARSE[2..]), vec![200, 5600, 100, 4000]),
            (expect(&LOAD[1..]), vec![100, 2400, 100, 2400]),
            (expect(&REHASH[1..]), vec![100, 800, 0, 0]),
        ]
    );
    assert_eq!(p.location.len(), 4, "one location per kept code");
    assert!(p.function.iter().all(|f| f.system_name == 0), "no system name for pprof to shorten");
}

#[test]
fn upstream_profile_keeps_totals_and_inlined_frames() {
    let a = upstream("ocamlopt");
    let p = round_trip(&data("ocamlopt.ctf"), &["--inuse-at", "end"]);
    assert_eq!(p.sample.len(), a.stacks.len());
    let total = |i: usize| p.sample.iter().map(|s| s.value[i]).sum::<i64>();
    assert_eq!(total(1), 670_400_000, "alloc_space: 1676 samples of 400000 bytes");
    assert_eq!(total(3), 44_000_000, "inuse_space: 110 samples live at the end");
    assert_eq!(p.location.len(), a.code_frames.len());
    assert!(p.location.iter().any(|l| l.line.len() > 1), "inlined frames share a location");
    // A sample's frames, leaf first, are the stack's frames reversed.
    let stack = &a.stacks[0];
    let leaf_first = a.trie.up(stack.node).flat_map(|code| a.frames_of(code).iter().rev());
    let want: Vec<String> = leaf_first.map(|&f| a.frames[f].function.clone()).collect();
    let got: Vec<String> = frames(&p, &p.sample[0].location_id).into_iter().map(|f| f.0).collect();
    assert_eq!(got, want);
}

#[test]
fn go_pprof_shows_full_names_and_no_allocator_frame_on_top() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write_trace(dir.path(), "known.ctf", &known_trace());
    let trace = trace.to_str().unwrap();
    memtrace_ok(dir.path(), &["pprof", trace, "-o", "trimmed.pb.gz"]);
    let Some(rows) = pprof_top(&dir.path().join("trimmed.pb.gz"), &["-sample_index=alloc_space"]) else {
        skip("go is not installed (apt-get install golang-go)");
        return;
    };
    let flat: Vec<&str> = rows.iter().filter(|(flat, _)| flat != "0").map(|(_, name)| name.as_str()).collect();
    assert_eq!(flat, ["app::parse", "app::load"], "{rows:?}");
    // With no flags pprof opens on in-use space, here at the peak: not empty.
    let rows = pprof_top(&dir.path().join("trimmed.pb.gz"), &[]).unwrap();
    let flat: Vec<&str> = rows.iter().filter(|(flat, _)| flat != "0").map(|(_, name)| name.as_str()).collect();
    assert_eq!(flat, ["app::parse", "app::load"], "{rows:?}");
    // With every frame kept, pprof must show the names whole: given a system name equal to
    // the name, it would shorten `<alloc::string::String as core::clone::Clone>::clone` to
    // `::clone` and drop generic arguments.
    memtrace_ok(dir.path(), &["pprof", trace, "-o", "kept.pb.gz", "--keep-allocator-frames", "--full-names"]);
    let rows = pprof_top(&dir.path().join("kept.pb.gz"), &["-sample_index=alloc_space"]).unwrap();
    let names: Vec<&str> = rows.iter().map(|(_, name)| name.as_str()).collect();
    for (_, function) in FUNCTIONS {
        assert!(names.contains(&function), "{function} not in {names:?}");
    }
}
