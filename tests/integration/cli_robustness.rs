//! Absurd but well-formed traces and damaged ones: every analysing subcommand must finish
//! (exit 0, or exit 1 with a one-line message), never panic, hang or print nonsense such as
//! `inf EiB`; and the analysis (with every output built on it) must not panic on randomly
//! damaged copies of a real trace.
use std::fs::File;
use std::io::Cursor;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::util::cli::*;
use memtrace_rs::cli::analysis::{Analysis, Measure, Options};
use memtrace_rs::cli::progress::Progress;
use memtrace_rs::cli::{copy, diff, flamegraph, hotspots, info, pprof, report, sites, timeline};
use memtrace_rs::trace::{AllocSource, Info, NewAlloc, Reader, Writer};

/// How long one command may take before it counts as hung.
const TIMEOUT: Duration = Duration::from_secs(20);

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

/// What one run of the binary did.
struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Run `memtrace args`, killing it (and failing) if it takes longer than [`TIMEOUT`].
/// Output goes to files, so a full pipe cannot stall the child.
fn memtrace(args: &[&str], dir: &Path) -> Run {
    let (out_path, err_path) = (dir.join("stdout"), dir.join("stderr"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_memtrace"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > TIMEOUT {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("memtrace {args:?} did not finish within {TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap()).into_owned();
    Run { status, stdout: read(&out_path), stderr: read(&err_path) }
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
        vec!["hotspots", t],
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
        let run = memtrace(args, dir.path());
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

fn write_trace(dir: &Path, name: &str, trace: &[u8]) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, trace).unwrap();
    path
}

#[test]
fn huge_sample_counts_are_analysed() {
    let dir = tempfile::tempdir().unwrap();
    let huge = write_trace(dir.path(), "huge.ctf", &huge_trace(0.01));
    let known = write_trace(dir.path(), "known.ctf", &known_trace());
    assert_eq!(run_all(&huge, &known), 15, "every command succeeds on a valid trace");

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
    assert_eq!(run_all(&huge, &known), 15, "every command succeeds on a valid trace");
    let o = memtrace(&["info", huge.to_str().unwrap()], dir.path());
    assert!(o.stdout.contains("1.5e29 B (1.47") && o.stdout.contains("e29 bytes"), "{}", o.stdout);
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

/// Analyse `trace` and, when `outputs`, build every output from the analysis. Returns
/// whether the analysis succeeded (a damaged trace may rightly fail to read).
fn analyse_and_write(trace: &[u8], outputs: bool) -> bool {
    let options = Options { stacks: true, live_at: Some(100_000) };
    let Ok(reader) = Reader::new(Cursor::new(trace)) else { return false };
    let Ok(a) = Analysis::from_reader(reader, &options, &mut Progress::hidden()) else { return false };
    if let Ok(reader) = Reader::new(Cursor::new(trace)) {
        let _ = copy::copy(reader, Vec::new());
    }
    if !outputs {
        return true;
    }
    let mut out = Vec::new();
    info::write(&a, "mutant", &mut out).unwrap();
    let ranking = sites::Ranking { top: 10, by: sites::By::LivePeak, grouping: sites::Grouping::new(true, false) };
    hotspots::write(&a, "mutant", &hotspots::Options { ranking, frames: 8 }, &mut out).unwrap();
    diff::write(&a, upstream("ocamlopt"), ("mutant", "ocamlopt"), &diff::Options { ranking }, &mut out).unwrap();
    let weight = flamegraph::Weight { live_at: Some(0.1), ..Default::default() };
    flamegraph::write(&a, &flamegraph::Options { weight, folded: false, trim: Default::default() }, &mut out).unwrap();
    pprof::write(&a, &mut out).unwrap();
    timeline::write(&a, true, &mut out).unwrap();
    timeline::write(&a, false, &mut out).unwrap();
    report::write(&a, "mutant", &report::Options { top: 10 }, &mut out).unwrap();
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
            let a = analyse(&trace, Options { stacks: true, live_at: None });
            let mut text = Vec::new();
            info::write(&a, "subnormal", &mut text).unwrap();
            let text = String::from_utf8(text).unwrap();
            assert!(text.contains("inf B (inf bytes, 11 samples)") && !text.contains("EiB"), "{text}");
        }
    }
}

#[test]
fn folded_counts_of_absurd_estimates_fit_flame_graph_tools() {
    for rate in [0.01, 1e-9] {
        let a = analyse(&huge_trace(rate), Options { stacks: true, live_at: None });
        let folded = flamegraph::folded(&a, Measure::Allocated, false);
        assert!(folded.unit_log2 > 0, "{rate}");
        let counts: Vec<u64> = folded.lines.iter().map(|l| l.rsplit(' ').next().unwrap().parse().unwrap()).collect();
        let total: u128 = counts.iter().map(|&c| u128::from(c)).sum();
        assert!(total <= 1 << 53 && total > 1 << 52, "{rate}: {counts:?}");
        let top = sites::ranked(&a, sites::Grouping::new(true, false), Measure::Allocated)[0].stats.allocated;
        assert!((counts[0] as f64 * folded.unit() / a.bytes(top.samples) - 1.0).abs() < 1e-6, "{rate}: the unit");
    }
    let known = analyse(&known_trace(), Options { stacks: true, live_at: None });
    let known = flamegraph::folded(&known, Measure::Allocated, false);
    assert_eq!(known.unit_log2, 0);
}
