//! The `memtrace` binary end to end: `--help` everywhere, exit codes and one-line messages
//! for missing, corrupt and truncated files, and every subcommand writing its output.
use std::path::Path;
use std::process::{Command, Output};

use crate::util::cli::*;

fn memtrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memtrace")).args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const SUBCOMMANDS: [&str; 10] =
    ["info", "sizes", "dump", "copy", "hotspots", "flamegraph", "pprof", "timeline", "diff", "report"];

#[test]
fn every_subcommand_has_help() {
    let top = memtrace(&["--help"]);
    assert!(top.status.success());
    let text = String::from_utf8_lossy(&top.stdout).into_owned();
    for sub in SUBCOMMANDS {
        assert!(text.contains(sub), "{sub} missing from --help");
        let o = memtrace(&[sub, "--help"]);
        assert!(o.status.success(), "{sub} --help");
        assert!(String::from_utf8_lossy(&o.stdout).contains("Usage: memtrace"), "{sub} --help");
    }
}

/// Run `args` with `{}` replaced by `path` and expect exit code 1 with one line on stderr
/// containing every one of `needles`.
fn expect_failure(args: &[&str], path: &Path, needles: &[&str]) {
    let path = path.to_str().unwrap();
    let args: Vec<&str> = args.iter().map(|a| if *a == "{}" { path } else { a }).collect();
    let o = memtrace(&args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: one line expected: {err}");
    for n in needles.iter().chain([&path]) {
        assert!(err.contains(n), "{args:?}: {n:?} not in {err:?}");
    }
}

fn all_commands(out: &str) -> Vec<Vec<&str>> {
    vec![
        vec!["info", "{}"],
        vec!["sizes", "{}"],
        vec!["dump", "{}"],
        vec!["copy", "{}", out],
        vec!["hotspots", "{}"],
        vec!["flamegraph", "{}", "-o", out],
        vec!["pprof", "{}", "-o", out],
        vec!["timeline", "{}", "-o", out],
        vec!["diff", "{}", "{}"],
        vec!["report", "{}", "-o", out],
    ]
}

#[test]
fn missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let missing = dir.path().join("no-such-trace.ctf");
    for args in all_commands(out.to_str().unwrap()) {
        expect_failure(&args, &missing, &["No such file"]);
    }
}

#[test]
fn corrupt_files_name_the_byte_offset() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let garbage = dir.path().join("garbage.ctf");
    std::fs::write(&garbage, vec![0x5a; 200]).unwrap();
    let empty = dir.path().join("empty.ctf");
    std::fs::write(&empty, b"").unwrap();
    // A bad magic number in the second packet of a real trace.
    let mut trace = std::fs::read(data("lists_and_sets-v1.ctf")).unwrap();
    let second = u32::from_le_bytes(trace[4..8].try_into().unwrap()) as usize / 8;
    trace[second] ^= 0xff;
    let damaged = dir.path().join("damaged.ctf");
    std::fs::write(&damaged, &trace).unwrap();
    for args in all_commands(out.to_str().unwrap()) {
        expect_failure(&args, &garbage, &["at byte 0:", "bad packet magic"]);
        expect_failure(&args, &empty, &["at byte 0:"]);
        expect_failure(&args, &damaged, &[&format!("at byte {second}:"), "bad packet magic"]);
    }
}

#[test]
fn truncated_trace_is_analysed_up_to_the_cut() {
    let dir = tempfile::tempdir().unwrap();
    let trace = std::fs::read(data("ocamlopt.ctf")).unwrap();
    let cut = dir.path().join("cut.ctf");
    std::fs::write(&cut, &trace[..trace.len() / 2]).unwrap();
    let o = memtrace(&["info", cut.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("warning") && err.contains("truncated") && err.contains("at byte"), "{err}");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(text.contains("Truncated:          yes"), "{text}");
    let events: u64 = text.lines().find(|l| l.starts_with("Events:")).unwrap()[20..].parse().unwrap();
    assert!(events > 0 && events < 3499, "{events}");
    let o = memtrace(&["hotspots", cut.to_str().unwrap()]);
    assert!(o.status.success() && stderr(&o).contains("truncated"));
}

#[test]
fn every_subcommand_writes_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("known.ctf");
    std::fs::write(&trace, known_trace()).unwrap();
    let t = trace.to_str().unwrap();
    let file = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (svg, folded, pb, chart, csv, html, copy) =
        (file("f.svg"), file("f.txt"), file("p.pb.gz"), file("t.svg"), file("t.csv"), file("r.html"), file("c.ctf"));
    for args in [
        vec!["info", t],
        vec!["dump", t],
        vec!["copy", t, &copy],
        vec!["hotspots", t, "--by", "live-peak", "--stacks", "--top", "3"],
        vec!["flamegraph", t, "-o", &svg, "--live-at", "0.00004"],
        vec!["flamegraph", t, "--folded", "--live-end", "-o", &folded],
        vec!["pprof", t, "-o", &pb],
        vec!["timeline", t, "-o", &chart],
        vec!["timeline", t, "-o", &csv],
        vec!["diff", t, &copy, "--by", "live-end"],
        vec!["report", t, "-o", &html],
    ] {
        let o = memtrace(&args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        assert!(o.stderr.is_empty(), "{args:?}: {}", stderr(&o));
    }
    assert!(std::fs::read_to_string(&svg).unwrap().contains("Bytes live at 0.00004 s"));
    assert_eq!(
        std::fs::read_to_string(&folded).unwrap(),
        "main (src/app.rs:10);app::run (src/app.rs:20);app::load (src/app.rs:30) 800\n"
    );
    assert_eq!(std::fs::read(&pb).unwrap()[..2], [0x1f, 0x8b], "gzip");
    assert!(std::fs::read_to_string(&chart).unwrap().starts_with("<svg"));
    assert!(std::fs::read_to_string(&csv).unwrap().starts_with("time_s,"));
    assert!(std::fs::read_to_string(&html).unwrap().starts_with("<!DOCTYPE html>"));
    let o = memtrace(&["hotspots", t, "--top", "1"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("app::parse (src/app.rs:40)"));
}

#[test]
fn bad_arguments_are_usage_errors() {
    for args in [
        vec!["flamegraph", "x.ctf", "-o", "x.svg", "--live-end", "--allocated"],
        vec!["flamegraph", "x.ctf", "-o", "x.svg", "--live-at", "-1"],
        vec!["hotspots", "x.ctf", "--by", "nonsense"],
        vec!["pprof", "x.ctf"],
    ] {
        assert_eq!(memtrace(&args).status.code(), Some(2), "{args:?}");
    }
}

#[test]
fn write_errors_name_the_output() {
    if !Path::new("/dev/full").exists() {
        eprintln!("skipped: no /dev/full");
        return;
    }
    let input = data("ocamlopt.ctf");
    let input = input.to_str().unwrap();
    for args in [vec!["copy", input, "/dev/full"], vec!["pprof", input, "-o", "/dev/full"]] {
        let o = memtrace(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("memtrace: /dev/full: ") && !err.contains(input), "{args:?}: {err}");
    }
}

#[test]
fn copy_drops_collects_of_unknown_objects_with_one_warning() {
    let mut t = TraceBuilder::new();
    let a = t.alloc(10, 2, &PARSE);
    let b = t.alloc(20, 1, &LOAD);
    t.free(30, a);
    t.free(40, a);
    t.free(50, b);
    t.free(60, a);
    let dir = tempfile::tempdir().unwrap();
    let (trace, copy) = (dir.path().join("double-free.ctf"), dir.path().join("copy.ctf"));
    std::fs::write(&trace, t.finish()).unwrap();
    let o = memtrace(&["copy", trace.to_str().unwrap(), copy.to_str().unwrap()]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("warning") && err.contains("dropped 2 ") && err.contains("double-free.ctf"), "{err}");
    let dump = memtrace(&["dump", copy.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&dump.stdout).into_owned();
    assert_eq!(text.lines().filter(|l| l.ends_with(" collect")).count(), 2, "{text}");
}

#[test]
fn an_output_that_is_the_input_is_refused_and_the_input_kept() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write_trace(dir.path(), "t.ctf", &known_trace());
    std::os::unix::fs::symlink(&trace, dir.path().join("link.ctf")).unwrap();
    let t = trace.to_str().unwrap();
    let link = dir.path().join("link.ctf");
    let link = link.to_str().unwrap();
    let dotted = format!("{}/./t.ctf", dir.path().display());
    for args in [
        vec!["copy", t, t],
        vec!["copy", t, &dotted],
        vec!["report", t, "-o", link],
        vec!["flamegraph", t, "-o", t],
        vec!["pprof", t, "-o", link],
        vec!["timeline", t, "-o", &dotted],
    ] {
        let o = memtrace(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.starts_with("memtrace: ") && err.contains("refusing to overwrite it"), "{args:?}: {err}");
        assert_eq!(std::fs::read(&trace).unwrap(), known_trace(), "{args:?} damaged the input");
    }
}

#[test]
fn dash_writes_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write_trace(dir.path(), "t.ctf", &known_trace());
    let t = trace.to_str().unwrap();
    let copied = memtrace(&["copy", t, "-"]);
    assert!(copied.status.success(), "{}", stderr(&copied));
    assert_eq!(copied.stdout, known_trace(), "copy to stdout");
    for (args, start) in [
        (vec!["flamegraph", t, "-o", "-", "--folded"], "main (src/app.rs:10);"),
        (vec!["flamegraph", t, "-o", "-"], "<?xml"),
        (vec!["timeline", t, "-o", "-"], "<svg"),
        (vec!["report", t, "-o", "-"], "<!DOCTYPE html>"),
        (vec!["pprof", t, "-o", "-"], "\u{1f}"),
    ] {
        let o = memtrace(&args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(text.starts_with(start), "{args:?}: {}", &text[..text.len().min(80)]);
    }
    assert!(!Path::new("-").exists() && !dir.path().join("-").exists(), "a file named `-`");
}

#[test]
fn times_outside_the_trace_and_empty_results_are_said() {
    let dir = tempfile::tempdir().unwrap();
    let trace = write_trace(dir.path(), "t.ctf", &known_trace());
    let t = trace.to_str().unwrap();
    let out = dir.path().join("f.txt");
    let out = out.to_str().unwrap();
    // The known trace lasts 70 µs.
    expect_failure(&["flamegraph", "{}", "-o", out, "--live-at", "99"], &trace, &["after the trace's last event"]);
    let empty = memtrace(&["flamegraph", t, "-o", out, "--folded", "--live-at", "0"]);
    assert!(empty.status.success());
    assert_eq!(stderr(&empty), format!("memtrace: warning: {t}: nothing to draw: nothing sampled is live at 0 s\n"));
    let none = write_trace(dir.path(), "none.ctf", &TraceBuilder::new().finish());
    let hot = memtrace(&["hotspots", none.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&hot.stdout).contains("(none: no sampled allocation"), "{hot:?}");
}

#[test]
fn short_and_long_help_agree() {
    let short = String::from_utf8(memtrace(&["-h"]).stdout).unwrap();
    let long = String::from_utf8(memtrace(&["--help"]).stdout).unwrap();
    // (clap drops the summary's final period in the short form.)
    let first = |text: &str| text.lines().next().unwrap().trim_end_matches('.').to_string();
    assert_eq!(first(&short), first(&long), "-h and --help begin differently");
    assert!(short.starts_with("Analyse memtrace traces"), "{short}");
}

/// The edges of the command line's options, made consistent: a time past the trace's end is
/// refused by every option that takes one; a time has units everywhere; a range that ends
/// before it starts is refused; a gzip profile is not written to a terminal; ranking by span
/// a trace without spans says why there are none; figures read as English ("1 sample", the
/// column named after what is ranked); `--fail-above` says the limit it compared against.
#[test]
fn option_edges_are_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let known = write_trace(dir.path(), "known.ctf", &known_trace());
    // The known trace lasts 70 µs.
    expect_failure(
        &["hotspots", "{}", "--live-at", "1s"],
        &known,
        &["--live-at 1.000000 s", "after the trace's last event"],
    );
    expect_failure(&["pprof", "{}", "-o", "x.pb.gz", "--inuse-at", "1s"], &known, &["after the trace's last event"]);
    let folded = dir.path().join("at.folded");
    let folded = folded.to_str().unwrap();
    memtrace_ok(dir.path(), &["flamegraph", known.to_str().unwrap(), "--folded", "--live-at", "25us", "-o", folded]);
    assert!(std::fs::read_to_string(folded).unwrap().contains("app::load"), "25 µs in, load's block is live");
    let o = memtrace(&["hotspots", known.to_str().unwrap(), "--allocated-between", "5ms:1ms"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("ends before it starts"), "{}", stderr(&o));

    let by_span = memtrace_ok(dir.path(), &["hotspots", known.to_str().unwrap(), "--by", "span"]);
    assert!(by_span.lines().nth(1).unwrap().ends_with("  span"), "{by_span}");
    assert!(by_span.contains("note: the trace has no spans"), "{by_span}");
    let mut one = TraceBuilder::new();
    one.alloc(10, 1, &[4, 1]);
    let one = write_trace(dir.path(), "one.ctf", &one.finish());
    let hotspots = memtrace_ok(dir.path(), &["hotspots", one.to_str().unwrap()]);
    assert!(hotspots.lines().next().unwrap().ends_with(" in 1 sample"), "{hotspots}");

    let mut grown = TraceBuilder::new();
    grown.alloc(10, 1000, &[4, 1]);
    let grown = write_trace(dir.path(), "grown.ctf", &grown.finish());
    let o = memtrace(&["diff", one.to_str().unwrap(), grown.to_str().unwrap(), "--fail-above", "10%"]);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(stderr(&o).contains("more than the limit of 10% of the base, 80 B, beyond"), "{}", stderr(&o));

    // A terminal, as `script` gives one.
    let command = format!("{} pprof {} -o -", env!("CARGO_BIN_EXE_memtrace"), known.display());
    match Command::new("script").args(["-qec", &command, "/dev/null"]).output() {
        Ok(o) => {
            let shown = String::from_utf8_lossy(&o.stdout);
            assert!(!o.status.success() && shown.contains("not for a terminal"), "{shown}");
        }
        Err(_) => eprintln!("no script (util-linux): the terminal case is not checked"),
    }
}

/// `--full-names` is offered by the subcommands that show function names, and by them only:
/// each one that offers it (by its `--help`) writes other output with it, on a trace whose
/// one site is a generic Rust function; any other refuses it.
#[test]
fn full_names_is_offered_where_it_changes_the_output() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let generic = |code| match code {
        1 => location_at("main", "src/main.rs"),
        _ => location_at("app::Parser<alloc::vec::Vec<u8>>::parse", "src/parser.rs"),
    };
    for (name, nsamples) in [("generic.ctf", 4), ("generic-more.ctf", 40)] {
        let mut t = TraceBuilder::new();
        t.alloc_with(10, nsamples, &[2, 1], generic);
        write_trace(dir, name, &t.finish());
    }
    // Each subcommand's run, and the file it writes (or `None`: stdout).
    let runs: [(&str, &[&str], Option<&str>); 5] = [
        ("hotspots", &["hotspots", "generic.ctf", "--stacks"], None),
        ("flamegraph", &["flamegraph", "generic.ctf", "--folded", "-o", "out"], Some("out")),
        ("pprof", &["pprof", "generic.ctf", "-o", "out"], Some("out")),
        ("diff", &["diff", "generic.ctf", "generic-more.ctf"], None),
        ("report", &["report", "generic.ctf", "-o", "out"], Some("out")),
    ];
    let output = |args: &[&str], file: Option<&str>| -> Vec<u8> {
        let stdout = memtrace_ok(dir, args);
        file.map_or(stdout.into_bytes(), |f| std::fs::read(dir.join(f)).unwrap())
    };
    let mut offered = Vec::new();
    for sub in SUBCOMMANDS {
        let help = String::from_utf8(memtrace(&[sub, "--help"]).stdout).unwrap();
        if !help.contains("--full-names") {
            let o = memtrace(&[sub, "--full-names", "--help"]);
            assert_eq!(o.status.code(), Some(2), "{sub} takes --full-names but does not offer it");
            continue;
        }
        offered.push(sub);
        let (_, args, file) = runs.iter().find(|(name, ..)| *name == sub).unwrap_or_else(|| panic!("no run of {sub}"));
        let short = output(args, *file);
        let full = output(&[*args, &["--full-names"]].concat(), *file);
        assert_ne!(short, full, "{sub}: --full-names changes nothing: {}", String::from_utf8_lossy(&short));
    }
    assert_eq!(offered, ["hotspots", "flamegraph", "pprof", "diff", "report"]);
    let top = String::from_utf8(memtrace(&["--help"]).stdout).unwrap();
    assert!(!top.contains("--full-names"), "{top}");
}
