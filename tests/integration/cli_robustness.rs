//! Absurd but well-formed traces and damaged ones: every analysing subcommand must finish
//! (exit 0, or exit 1 with a one-line message), never panic, hang or print nonsense such as
//! `inf EiB`; and the analysis (with every output built on it) must not panic on randomly
//! damaged copies of a real trace.
use std::io::Cursor;
use std::path::Path;

use crate::util::cli::*;
use crate::util::handmade::{ever_deeper, Handmade};
use memtrace_rs::analysis::{self, Analysis, Grouping, Measure, Options};
use memtrace_rs::trace::{AllocSource, Info, NewAlloc, Reader, Writer};

/// The most samples one allocation can have (the writer's limit).
const HUGE: u64 = i64::MAX as u64;

/// Byte offset of the trace-info event's sample rate: the v3 packet header (68 bytes), then
/// the event's 4-byte header.
const RATE_OFFSET: usize = 72;

/// A valid trace at `rate` whose allocations each have `HUGE` samples: several live at
/// once (so totals pass 2^64), some collected, on two stacks, with a long quiet stretch.
fn huge_trace(rate: f64) -> Vec<u8> {
    let info = Info { sample_rate: rate, ..crate::util::cli::info() };
    let mut w = Writer::new(Vec::new(), &info).unwrap();
    let alloc = |w: &mut Writer<Vec<u8>>, at: u64, length: u64, stack: &[u64]| {
        let a = NewAlloc { length, nsamples: HUGE, source: AllocSource::External, callstack: stack, drop: 0 };
        w.put_alloc(0, START + at, &a, locations).unwrap()
    };
    let a = alloc(&mut w, 10, 1, &PARSE);
    let b = alloc(&mut w, 20, HUGE, &LOAD);
    let c = alloc(&mut w, 30, 3, &PARSE);
    w.put_collect(0, START + 40, b).unwrap();
    let d = alloc(&mut w, 50, 1, &REHASH);
    alloc(&mut w, 60, 2, &PARSE);
    w.put_collect(0, START + 70, a).unwrap();
    w.put_collect(0, START + 1_000_000_000, c).unwrap();
    alloc(&mut w, 3_000_000_000, 1, &LOAD);
    w.put_collect(0, START + 3_000_000_001, d).unwrap();
    w.close().unwrap()
}

/// `trace` (a v3 trace) with its sample rate overwritten by `rate`, bypassing the writer's
/// checks.
fn with_rate(trace: &[u8], rate: f64) -> Vec<u8> {
    let mut trace = trace.to_vec();
    let old = f64::from_le_bytes(trace[RATE_OFFSET..RATE_OFFSET + 8].try_into().unwrap());
    assert!(old > 0.0 && old <= 1.0, "no sample rate at byte {RATE_OFFSET}: {old}");
    trace[RATE_OFFSET..RATE_OFFSET + 8].copy_from_slice(&rate.to_le_bytes());
    trace
}

/// Run every analysing subcommand on the trace at `trace` (and `diff` against `other`);
/// each must exit 0 or exit 1 with one line of error. Returns how many exited 0.
fn run_all(trace: &Path, other: &Path) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let t = trace.to_str().unwrap();
    let o = other.to_str().unwrap();
    let file = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (svg, folded, pb, chart, csv, html, copied) =
        (file("f.svg"), file("f.txt"), file("p.pb.gz"), file("t.svg"), file("t.csv"), file("r.html"), file("c.ctf"));
    let commands: Vec<Vec<&str>> = vec![
        vec!["info", t],
        vec!["sizes", t],
        vec!["hotspots", t],
        vec!["hotspots", t, "--by", "temporary"],
        vec!["hotspots", t, "--stacks", "--by", "live-peak"],
        vec!["hotspots", t, "--by", "live-end", "--keep-allocator-frames"],
        vec!["flamegraph", t, "-o", &svg],
        vec!["flamegraph", t, "-o", &folded, "--folded", "--live-peak"],
        vec!["flamegraph", t, "-o", &svg, "--live-at", "0.00005"],
        vec!["pprof", t, "-o", &pb],
        vec!["timeline", t, "-o", &chart],
        vec!["timeline", t, "-o", &csv],
        vec!["diff", t, o],
        vec!["diff", o, t, "--by", "live-peak", "--stacks"],
        vec!["report", t, "-o", &html],
        vec!["dump", t],
        vec!["copy", t, &copied],
    ];
    let mut succeeded = 0;
    for args in &commands {
        let run = memtrace(dir.path(), args);
        let what = format!("memtrace {args:?}: {:?}\nstderr: {}", run.status, run.stderr);
        assert!(!run.stderr.contains("panicked"), "{what}");
        match run.status.code() {
            Some(0) => {
                succeeded += 1;
                // Sane figures: no unit after an infinity, no NaN.
                for text in [&run.stdout, &run.stderr] {
                    assert!(!text.contains("inf EiB") && !text.contains("NaN"), "{what}\n{text}");
                }
            }
            Some(1) => {
                assert_eq!(run.stderr.lines().count(), 1, "{what}");
                assert!(run.stderr.starts_with("memtrace: "), "{what}");
            }
            _ => panic!("{what}"),
        }
    }
    if succeeded == commands.len() {
        for (path, start) in [(&svg, "<svg"), (&chart, "<svg"), (&html, "<!DOCTYPE html>")] {
            let text = std::fs::read_to_string(path).unwrap();
            assert!(text.starts_with(start) || text.starts_with("<?xml"), "{path}");
            assert!(!text.contains("NaN") && !text.contains("inf EiB"), "{path}");
        }
    }
    succeeded
}

#[test]
fn huge_sample_counts_are_analysed() {
    let dir = tempfile::tempdir().unwrap();
    let huge = write_trace(dir.path(), "huge.ctf", &huge_trace(0.01));
    let known = write_trace(dir.path(), "known.ctf", &known_trace());
    assert_eq!(run_all(&huge, &known), 17, "every command succeeds on a valid trace");

    // The totals saturate instead of wrapping; the live figures are exact until reported.
    let a = analyse(&huge_trace(0.01), Options { stacks: true, live_at: Some(45) });
    assert_eq!(a.counts.samples, u64::MAX);
    assert_eq!(a.counts.allocs(), 6);
    assert_eq!(a.peak.samples, u64::MAX, "three objects of 2^63 - 1 samples were live at once");
    assert_eq!(a.live_end, 2 * HUGE, "two objects are never collected");
    assert_eq!(a.totals().live_end.samples, 2 * HUGE);
    assert_eq!(a.totals().live_at.samples, 2 * HUGE, "a and c were live at 45 µs");
    assert!(a.timeline.buckets.iter().all(|b| b.live_end <= b.live_max));
}

#[test]
fn huge_but_finite_estimates_are_analysed() {
    // 2^63 samples at a rate of 1e-9: about 7e28 bytes each, finite but absurd.
    let dir = tempfile::tempdir().unwrap();
    let huge = write_trace(dir.path(), "huge.ctf", &huge_trace(1e-9));
    let known = write_trace(dir.path(), "known.ctf", &known_trace());
    assert_eq!(run_all(&huge, &known), 17, "every command succeeds on a valid trace");
    let o = memtrace(dir.path(), &["info", huge.to_str().unwrap()]);
    assert!(o.stdout.contains("1.5e29 B ±0.0% (1.47") && o.stdout.contains("e29 bytes"), "{}", o.stdout);
}

#[test]
fn a_subnormal_sample_rate_is_rejected_or_analysed() {
    // Every estimate divides by the rate: at 5e-324 even one sample is infinitely many bytes.
    let dir = tempfile::tempdir().unwrap();
    for (name, trace) in [("huge", huge_trace(0.01)), ("known", known_trace())] {
        let patched = write_trace(dir.path(), &format!("{name}-subnormal.ctf"), &with_rate(&trace, 5e-324));
        let known = write_trace(dir.path(), "known.ctf", &known_trace());
        run_all(&patched, &known);
    }
}

/// A tiny xorshift generator, so that every mutant can be rebuilt from its seed.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> XorShift {
        XorShift(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `original` with a few bytes flipped, chosen by `seed`.
fn mutant(original: &[u8], seed: u64) -> Vec<u8> {
    let mut rng = XorShift::new(seed);
    let mut trace = original.to_vec();
    for _ in 0..1 + rng.below(8) {
        // Half of the flips hit the first packet (trace info, first events) where a change
        // matters most; the rest anywhere.
        let at = if rng.next().is_multiple_of(2) { rng.below(512.min(trace.len())) } else { rng.below(trace.len()) };
        trace[at] ^= (rng.next() as u8) | 1;
    }
    trace
}

/// Analyse `trace` and, when `outputs`, have the binary build every output from it: each
/// must succeed when the analysis does. Returns whether the analysis succeeded (a damaged
/// trace may rightly fail to read).
fn analyse_and_write(trace: &[u8], outputs: bool) -> bool {
    let options = Options { stacks: true, live_at: Some(100_000) };
    let Ok(reader) = Reader::new(Cursor::new(trace)) else { return false };
    let Ok(_) = Analysis::from_reader(reader, &options, |_| {}) else { return false };
    if let Ok(reader) = Reader::new(Cursor::new(trace)) {
        let _ = analysis::copy(reader, Vec::new());
    }
    if !outputs {
        return true;
    }
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    write_trace(dir, "mutant.ctf", trace);
    let ocamlopt = data("ocamlopt.ctf");
    let ocamlopt = ocamlopt.to_str().unwrap();
    for args in [
        &["info", "mutant.ctf"][..],
        &["hotspots", "mutant.ctf", "--top", "10", "--by", "live-peak", "--stacks", "--frames", "8"],
        &["diff", "mutant.ctf", ocamlopt, "--top", "10", "--by", "live-peak", "--stacks"],
        &["flamegraph", "mutant.ctf", "-o", "f.svg", "--live-at", "0"],
        &["pprof", "mutant.ctf", "-o", "p.pb.gz"],
        &["timeline", "mutant.ctf", "-o", "t.csv"],
        &["timeline", "mutant.ctf", "-o", "t.svg"],
        &["report", "mutant.ctf", "-o", "r.html", "--top", "10"],
    ] {
        let run = memtrace(dir, args);
        assert!(run.status.success(), "memtrace {args:?}: {:?}\n{}", run.status, run.stderr);
    }
    true
}

#[test]
fn damaged_traces_never_panic_the_analysis() {
    let original = std::fs::read(data("ocamlopt.ctf")).unwrap();
    let seeds = 0..300u64;
    let (mut failed, mut analysed) = (Vec::new(), 0);
    for seed in seeds.clone() {
        let trace = mutant(&original, seed);
        // Every output for one mutant in ten: the flame graph and report are slow to draw.
        let outputs = seed.is_multiple_of(10);
        match std::panic::catch_unwind(|| analyse_and_write(&trace, outputs)) {
            Ok(ok) => analysed += usize::from(ok),
            Err(_) => failed.push(seed),
        }
    }
    assert!(failed.is_empty(), "the analysis panicked on the mutants of ocamlopt.ctf with seeds {failed:?}");
    eprintln!("{analysed} of {} mutants were analysed, the others rejected", seeds.end);
    assert!(analysed >= 10, "only {analysed} mutants could be read: the test would prove little");
    // The same mutants with a subnormal rate: infinite estimates all the way through.
    let original = with_rate(&original, 5e-324);
    for seed in seeds.step_by(10) {
        let trace = mutant(&original, seed);
        if std::panic::catch_unwind(|| analyse_and_write(&trace, true)).is_err() {
            failed.push(seed);
        }
    }
    assert!(failed.is_empty(), "the analysis panicked on mutants with rate 5e-324, seeds {failed:?}");
}

#[test]
fn the_reader_accepts_a_subnormal_rate_or_rejects_it_at_its_offset() {
    // Either is fine for the command line; the analysis of an accepted one must be sane.
    let trace = with_rate(&known_trace(), 5e-324);
    match Reader::new(Cursor::new(&trace)) {
        Err(e) => assert_eq!(e.offset(), Some(RATE_OFFSET as u64), "{e}"),
        Ok(_) => {
            let dir = tempfile::tempdir().unwrap();
            write_trace(dir.path(), "subnormal.ctf", &trace);
            let text = memtrace_ok(dir.path(), &["info", "subnormal.ctf"]);
            assert!(text.contains("inf B (inf bytes, 11 samples)") && !text.contains("EiB"), "{text}");
        }
    }
}

/// The folded stacks `memtrace flamegraph --folded` writes for `trace`, and the power of
/// two bytes their counts are in (0 unless the warning gives one).
fn folded(trace: &[u8]) -> (Vec<String>, u32) {
    let dir = tempfile::tempdir().unwrap();
    write_trace(dir.path(), "t.ctf", trace);
    let run = memtrace(dir.path(), &["flamegraph", "t.ctf", "-o", "f.txt", "--folded"]);
    assert!(run.status.success(), "{}", run.stderr);
    let lines = std::fs::read_to_string(dir.path().join("f.txt")).unwrap().lines().map(str::to_string).collect();
    let unit_log2 = run
        .stderr
        .split("units of 2^")
        .nth(1)
        .map_or(0, |rest| rest.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap());
    (lines, unit_log2)
}

#[test]
fn folded_counts_of_absurd_estimates_fit_flame_graph_tools() {
    for rate in [0.01, 1e-9] {
        let trace = huge_trace(rate);
        let (lines, unit_log2) = folded(&trace);
        assert!(unit_log2 > 0, "{rate}");
        let counts: Vec<u64> = lines.iter().map(|l| l.rsplit(' ').next().unwrap().parse().unwrap()).collect();
        let total: u128 = counts.iter().map(|&c| u128::from(c)).sum();
        assert!(total <= 1 << 53 && total > 1 << 52, "{rate}: {counts:?}");
        let a = analyse(&trace, Options { stacks: true, live_at: None });
        let grouping = Grouping { stacks: true, ..Default::default() };
        let top = analysis::ranked(&a, grouping, Measure::Allocated)[0].stats.allocated;
        let unit = 2f64.powi(unit_log2 as i32);
        assert!((counts[0] as f64 * unit / a.bytes(top.samples) - 1.0).abs() < 1e-6, "{rate}: the unit");
    }
    assert_eq!(folded(&known_trace()).1, 0);
}

/// The first crafted trace, written byte by byte since our writer keeps location
/// lists within the format's 4096-byte bound and backtraces within their budget: one
/// allocation of an OCaml trace (so names are shown as they are) whose stack is `main`
/// and then 59 999 calls of a recursive function named with 200 000 characters. Every view
/// that wrote each frame's label would write 12 GB.
fn deep_trace_with_a_long_name() -> Vec<u8> {
    let long = format!("Deep.recurse_{}", "x".repeat(200_000));
    let mut t = Handmade::new(0.01);
    t.locations(0, &[(0x1000, "Main.main", "main.ml"), (0x2000, &long, "deep.ml")]);
    t.alloc(10, 3, 0, &[(0x1000, 1), (0x2000, 59_999)]);
    t.finish()
}

/// Run `memtrace args` in `dir` under an address-space limit of 2 GiB; its exit status,
/// stdout (thrown away unless `keep_stdout`) and stderr.
fn memtrace_in_2_gib(dir: &Path, args: &[&str], keep_stdout: bool) -> (Option<i32>, String, String) {
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_memtrace"));
    let stdout = if keep_stdout { Stdio::piped() } else { Stdio::null() };
    command.args(args).current_dir(dir).stdout(stdout).stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe and touches no memory of the parent; the
    // closure runs in the child between fork and exec.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit { rlim_cur: 2 << 30, rlim_max: 2 << 30 };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let out = command.output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// Stacks of the ever deeper trace of the test below: 8 200 stacks of 1 to 8 200 frames,
/// 33.6 million frames in all if each were kept whole (which the analysis once refused).
/// Views that write every stack out whole (dump, folded stacks, pprof) are quadratic in
/// it whatever the analysis does, and this test runs an unoptimised build.
const EVER_DEEPER: u64 = 8_200;

/// Stacks of the 6.5 MB trace of ever deeper stacks: 1.35 billion frames in all.
/// Its dump would be 27 GB of text (each line holds its allocation's stack whole, as
/// upstream's does), so it runs every subcommand but that one.
const DEEPEST: u64 = 52_000;

#[test]
fn crafted_deep_traces_run_every_subcommand_in_2_gib() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    write_trace(dir, "deep.ctf", &deep_trace_with_a_long_name());
    write_trace(dir, "deeper.ctf", &ever_deeper(EVER_DEEPER));
    let deepest = ever_deeper(DEEPEST);
    assert!((6_000_000..7_000_000).contains(&deepest.len()), "{} bytes", deepest.len());
    write_trace(dir, "deepest.ctf", &deepest);
    let traces =
        [("deep.ctf", "deeper.ctf", true), ("deeper.ctf", "deep.ctf", true), ("deepest.ctf", "deep.ctf", false)];
    for (t, other, every) in traces {
        for args in [
            &["info", t][..],
            &["info", t, "--format", "json"],
            &["sizes", t],
            &["hotspots", t],
            &["hotspots", t, "--stacks"],
            &["hotspots", t, "--stacks", "--format", "json", "--keep-allocator-frames", "--keep-root-frames"],
            &["hotspots", t, "--inside", "recurse", "--live-at", "end"],
            &["flamegraph", t, "-o", "f.svg"],
            &["flamegraph", t, "-o", "f.txt", "--folded", "--live-end", "--keep-root-frames"],
            &["pprof", t, "-o", "p.pb.gz"],
            &["timeline", t, "-o", "t.svg"],
            &["timeline", t, "-o", "t.csv"],
            &["diff", t, other, "--stacks"],
            &["diff", other, t, "--format", "json"],
            &["report", t, "-o", "r.html"],
            &["report", t, "--diff", other, "-o", "r.html"],
            &["dump", t],
            &["copy", t, "c.ctf"],
        ] {
            if !every && args[0] == "dump" {
                continue;
            }
            let started = std::time::Instant::now();
            let (code, _, stderr) = memtrace_in_2_gib(dir, args, false);
            eprintln!("memtrace {args:?}: {code:?} in {:?}", started.elapsed());
            assert!(matches!(code, Some(0 | 1)), "memtrace {args:?}: {code:?}\n{stderr}");
            if code == Some(1) {
                assert!(stderr.starts_with("memtrace: ") && stderr.lines().count() == 1, "{args:?}: {stderr}");
            }
        }
    }
    // Both are analysed, whole stacks and all.
    let (code, out, stderr) = memtrace_in_2_gib(dir, &["hotspots", "deep.ctf", "--stacks", "--frames", "2"], true);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        out.contains("Deep.recurse_xxx") && out.contains("... 59998 more frames"),
        "{}",
        &out[..out.len().min(2000)]
    );
    let (code, out, stderr) = memtrace_in_2_gib(dir, &["hotspots", "deeper.ctf", "--stacks", "--top", "1"], true);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(out.starts_with(&format!("Top 1 of {EVER_DEEPER} stacks of deeper.ctf")), "{out}");
    // Clauses on functions see every frame: of the ever deeper stacks, only the three
    // shortest have no `Deep.a` frame (code 0x100000 + i is one when divisible by 7).
    let args = ["hotspots", "deepest.ctf", "--inside", "Deep.b", "--not-inside", "Deep.a"];
    let (code, out, stderr) = memtrace_in_2_gib(dir, &args, true);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(out.lines().next().unwrap().ends_with(" in 3 samples, 3 sampled allocations"), "{out}");
}

/// Counts the bytes written to it, and keeps none.
struct Counted(u64);

impl std::io::Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn dump_streams_a_deep_stack_of_a_long_name() {
    use crate::util::counting_alloc::{live_bytes, peak_since, reset_peak};
    let dir = tempfile::tempdir().unwrap();
    let path = write_trace(dir.path(), "deep.ctf", &deep_trace_with_a_long_name());
    let base = live_bytes();
    reset_peak();
    let mut out = Counted(0);
    analysis::dump(&path, &mut out, &mut std::io::sink()).unwrap();
    let peak = peak_since(base);
    // One line: the long name's text 59 999 times, 12 GB, from a few MiB of memory (the
    // reader's packets and its copy of the backtrace, each code's text once).
    assert!(out.0 > 59_999 * 200_000, "{} bytes", out.0);
    assert!(peak < 16 << 20, "dump took {} MiB", peak >> 20);
}
