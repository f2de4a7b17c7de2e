//! The report page in a browser, and the same filter on the command line.
//!
//! A trace with known answers is built here; `memtrace report` writes its page (and a diff
//! page), and `tests/browser/report.test.mjs` (node's test runner with puppeteer-core,
//! driving Debian's chromium and firefox-esr in turn) checks that the page opens on what is
//! live at the peak, with everything allocated a click away, drags on the chart, applies a
//! lifetime bound, checks the figures of the flame graph, the tables and the chart, that the
//! view is in the URL and a page opened at it shows the same view, that every column of the
//! sites table is reachable at 760 px, that the console stays clean, and saves screenshots at
//! 760 and 1400 px in `target/test-artifacts/` (or `$CARGO_TARGET_DIR/test-artifacts/`), one per browser; it
//! also opens the diff page, a page thinned by `--limit` and the page of a trace with
//! start-up frames ([`startup_trace`]), whose sites it compares with `hotspots`', the page
//! of the tokio example's trace (no runtime start-up tower) and the page of `cli_inert`'s
//! trace of hostile names (no markup runs, no control or bidi character is shown raw). `hotspots_gives_the_figures_the_page_shows` checks that
//! `memtrace hotspots` with the same filter flags gives the same figures.
//!
//! Without `tests/browser/node_modules` (`npm ci` there) the browser test says why and
//! passes, and without one of the browsers it runs in the other, unless `CI` is set: then
//! either fails.

use crate::skip::skip;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use memtrace_rs::trace::{AllocSource, Info, Location, NewAlloc, Writer};

/// One sample stands for 1 KiB: rate 1/128 per 8-byte word.
const RATE: f64 = 1.0 / 128.0;

/// The location codes of the known trace: (function, file, line).
fn location(code: u64) -> Arc<[Location]> {
    let (function, file, line) = match code {
        1 => ("main", "src/main.rs", 10),
        2 => ("app::init", "src/app.rs", 20),
        3 => ("app::load_config", "src/config.rs", 30),
        4 => ("app::run", "src/app.rs", 40),
        5 => ("app::build_index", "src/index.rs", 50),
        6 => ("app::cache::insert", "src/cache.rs", 60),
        7 => (
            "alloc::vec::Vec<T,A>::push",
            "/rustc/0123456789abcdef0123456789abcdef01234567/library/alloc/src/vec/mod.rs",
            2400,
        ),
        _ => ("__rust_alloc", "", 0),
    };
    crate::util::cli::location_on_line(function, file, line)
}

/// The known-answer trace, with `cache_blocks` cache insertions (20 in the base trace):
///
/// | site | stack | blocks | each | allocated at | freed | total |
/// |---|---|---|---|---|---|---|
/// | `app::load_config` | main → app::init | 100 | 4 KiB | 0, 1, …, 99 ms | 0.5 ms later | 400 KiB |
/// | `app::build_index` | main → app::run → Vec::push → __rust_alloc | 50 | 10 KiB | 200 … 249 ms | at 600 ms | 500 KiB |
/// | `app::cache::insert` | main → app::run | 20 | 8 KiB | 300 … 319 ms | never | 160 KiB |
///
/// The peak is 660 KiB at 319 ms and the trace lasts 600 ms.
fn known_trace(path: &Path, cache_blocks: u64) {
    let info = Info {
        sample_rate: RATE,
        word_size: 64,
        executable_name: b"/usr/bin/known-app".to_vec(),
        host_name: b"testhost".to_vec(),
        runtime_params: b"memtrace-rs report test".to_vec(),
        pid: 42,
        initial_domain: 0,
        start_time: 1_700_000_000_000_000,
        context: Some(b"known answers".to_vec()),
    };
    let s0 = info.start_time;
    let mut w = Writer::new(std::fs::File::create(path).unwrap(), &info).unwrap();
    let alloc = |words, nsamples, callstack| NewAlloc {
        length: words,
        nsamples,
        source: AllocSource::External,
        callstack,
        drop: 0,
    };
    for i in 0..100u64 {
        let id = w.put_alloc(0, s0 + i * 1000, &alloc(512, 4, &[3, 2, 1]), location).unwrap();
        w.put_collect(0, s0 + i * 1000 + 500, id).unwrap();
    }
    let index: Vec<_> = (0..50u64)
        .map(|j| w.put_alloc(0, s0 + 200_000 + j * 1000, &alloc(1280, 10, &[8, 7, 5, 4, 1]), location).unwrap())
        .collect();
    for k in 0..cache_blocks {
        w.put_alloc(0, s0 + 300_000 + k * 1000, &alloc(1024, 8, &[6, 4, 1]), location).unwrap();
    }
    for id in index {
        w.put_collect(0, s0 + 600_000, id).unwrap();
    }
    w.close().unwrap();
}

/// Run the `memtrace` binary with `args` (absolute paths); its stdout.
fn memtrace(args: &[&str]) -> String {
    crate::util::cli::memtrace_ok(&repo("."), args)
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The filter the browser test sets (its drag lands within a few pixels of 150 and 450 ms).
const FILTER: [&str; 6] = ["--allocated-between", "150ms:450ms", "--live-at", "peak", "--lifetime-under", "500ms"];

#[test]
fn hotspots_gives_the_figures_the_page_shows() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("known.ctf");
    known_trace(&trace, 20);
    let t = trace.to_str().unwrap();
    let lines =
        |args: &[&str]| memtrace(&[&["hotspots", t], args].concat()).lines().map(str::to_string).collect::<Vec<_>>();
    // The page: "50 of 170 blocks, 500 KiB (500 samples)", one site, app::build_index.
    let out = lines(&FILTER);
    let heading = "--allocated-between 150ms:450ms --live-at peak --lifetime-under 500ms (estimated): total 500.0 KiB";
    assert!(out[0].contains(heading), "{out:?}");
    assert_totals(&out, 500, 50);
    assert_eq!(sites(&out), [("   500.0 KiB", "app::build_index (src/index.rs:50)")], "{out:?}");
    // The drag and "live at peak" before the lifetime bound: 70 blocks, 660 KiB, the peak.
    let out = lines(&FILTER[..4]);
    assert!(out[0].contains("total 660.0 KiB"), "{out:?}");
    assert_totals(&out, 660, 70);
    let info = memtrace(&["info", t]);
    assert!(info.contains("(675840 bytes, 660 samples) at 0.319000 s"), "{info}");
    // Never freed: the cache, 160 KiB; short-lived: the configuration, 400 KiB.
    assert_totals(&lines(&["--never-collected"]), 160, 20);
    assert_totals(&lines(&["--lifetime-under", "1ms", "--inside", "app::init", "--not-inside", "run"]), 400, 100);
    assert_totals(&lines(&["--size-at-least", "8KiB", "--size-under", "10KiB", "--collected-between", "0:1s"]), 0, 0);
    // Hidden functions choose no block: the index's bytes count for app::run (past Vec::push,
    // allocator machinery), and every other figure stays.
    let out = lines(&["--hide", "build_index", "--hide", "app::init"]);
    let heading = "by bytes allocated, --hide 'build_index' --hide 'app::init' (estimated)";
    assert!(out[0].contains(heading) && out[0].ends_with(" in 1060 samples"), "{out:?}");
    let expected = [
        ("   500.0 KiB", "app::run (src/app.rs:40)"),
        ("   400.0 KiB", "app::load_config (src/config.rs:30)"),
        ("   160.0 KiB", "app::cache::insert (src/cache.rs:60)"),
    ];
    assert_eq!(sites(&out), expected, "{out:?}");
    // A stack whose every frame is hidden has no site, and one left with allocator frames
    // only keeps them: the page shows the same.
    let out = lines(&["--hide", "app::", "--hide", "main"]);
    assert_eq!(sites(&out), [("   560.0 KiB", "(no backtrace)"), ("   500.0 KiB", "__rust_alloc")], "{out:?}");
}

/// The sites of `hotspots` output `out`: each one's bytes column and label.
fn sites(out: &[String]) -> Vec<(&str, &str)> {
    out.iter().skip(2).map(|l| (&l[..12], l.rsplit("  ").next().unwrap())).collect()
}

/// The heading of `hotspots` output `out` ends with these totals.
fn assert_totals(out: &[String], samples: u64, allocations: u64) {
    let end = format!(" in {samples} samples, {allocations} sampled allocations");
    assert!(out[0].ends_with(&end), "{out:?} does not end with {end:?}");
}

/// The browsers the page is tested in: name (as `report.test.mjs` knows it), executable
/// and the Debian package that installs it.
const BROWSERS: [(&str, &str, &str); 2] =
    [("chromium", "/usr/bin/chromium", "chromium"), ("firefox", "/usr/bin/firefox-esr", "firefox-esr")];

#[test]
fn the_page_shows_the_known_figures_in_a_browser() {
    let browser_dir = repo("tests/browser");
    let driver = browser_dir.join("node_modules/puppeteer-core");
    if !driver.exists() {
        skip(&format!("{} is missing (npm ci in tests/browser)", driver.display()));
        return;
    }
    let mut browsers = Vec::new();
    for (name, exe, package) in BROWSERS {
        if Path::new(exe).exists() {
            browsers.push(name);
        } else {
            skip(&format!("{exe} is missing, for {name} (apt-get install {package})"));
        }
    }
    if browsers.is_empty() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (base, new) = (dir.path().join("known.ctf"), dir.path().join("known-more-cache.ctf"));
    known_trace(&base, 20);
    known_trace(&new, 40);
    let (report, diff) = (dir.path().join("known.html"), dir.path().join("diff.html"));
    let path = |p: &Path| p.to_str().unwrap().to_string();
    memtrace(&["report", &path(&base), "-o", &path(&report)]);
    memtrace(&["report", "--diff", &path(&base), &path(&new), "-o", &path(&diff)]);
    let thin = dir.path().join("thin.html");
    memtrace(&["report", &path(&base), "--limit", "50", "-o", &path(&thin)]);
    let (startup, startup_html) = (dir.path().join("startup.ctf"), dir.path().join("startup.html"));
    std::fs::write(&startup, startup_trace()).unwrap();
    memtrace(&["report", &path(&startup), "-o", &path(&startup_html)]);
    let (hostile, hostile_html) = (dir.path().join("hostile.ctf"), dir.path().join("hostile.html"));
    std::fs::write(&hostile, crate::cli_inert::hostile_trace(0)).unwrap();
    memtrace(&["report", &path(&hostile), "-o", &path(&hostile_html)]);
    // The tokio example's trace: a `#[tokio::main]`-style `block_on` tower on its main thread.
    let (tokio, tokio_html) = (dir.path().join("tokio.ctf"), dir.path().join("tokio.html"));
    crate::cli_real_stacks::trace_run("tokio-spans", "1e-3", &tokio);
    memtrace(&["report", &path(&tokio), "-o", &path(&tokio_html)]);
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| repo("target"), PathBuf::from);
    let artifacts = target.join("test-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let shots: Vec<PathBuf> = browsers
        .iter()
        .flat_map(|browser| {
            ["report-760", "report-1400", "diff-760", "diff-1400"]
                .map(|shot| artifacts.join(format!("{shot}-{browser}.png")))
        })
        .collect();
    // Screenshots of an earlier run must not pass for this one's.
    for file in &shots {
        let _ = std::fs::remove_file(file);
    }
    let status = Command::new("node")
        .args(["--test", "--test-reporter=spec", "report.test.mjs"])
        .current_dir(&browser_dir)
        .env("MEMTRACE_BIN", env!("CARGO_BIN_EXE_memtrace"))
        .env("REPORT_TRACE", &base)
        .env("REPORT_HTML", &report)
        .env("DIFF_HTML", &diff)
        .env("THIN_HTML", &thin)
        .env("STARTUP_TRACE", &startup)
        .env("STARTUP_HTML", &startup_html)
        .env("HOSTILE_HTML", &hostile_html)
        .env("TOKIO_HTML", &tokio_html)
        .env("ARTIFACTS", &artifacts)
        .env("BROWSERS", browsers.join(","))
        .status()
        .expect("node runs");
    assert!(status.success(), "the browser test failed: {status}");
    for file in &shots {
        assert!(file.exists(), "{}", file.display());
    }
}

/// A trace with start-up frames below the thread's pseudo-frame (the C `main`, the C
/// library's start-up code named by object and offset as Debian's libc leaves it, `_start`):
/// one stack made only of them (and the allocator), whose site is then its innermost start-up
/// frame, and one through `app::run`, whose site is `app::run`; and the trace's peak, a block of
/// `app::parse` live for a microsecond.
fn startup_trace() -> Vec<u8> {
    use crate::util::cli::{location_at, locations, TraceBuilder};
    let startup = |code| match code {
        20 => location_at(
            "std::rt::lang_start_internal",
            "/rustc/0123456789abcdef0123456789abcdef01234567/library/std/src/rt.rs",
        ),
        21 => location_at("_start", ""),
        22 => location_at("main", ""),
        23 => location_at("libc.so.6+0x2724a", "/lib/x86_64-linux-gnu/libc.so.6"),
        24 => location_at("main", "<thread>"),
        code => locations(code),
    };
    let mut t = TraceBuilder::new();
    t.alloc_with(10, 3, &[6, 20, 22, 23, 21, 24], startup);
    t.alloc_with(20, 5, &[6, 2, 22, 23, 21, 24], startup);
    // The peak: 50 samples more, live for 1 µs a second in, between two points of the chart.
    let brief = t.alloc_with(1_000_000, 50, &[6, 4, 2, 22, 23, 21, 24], startup);
    t.free(1_000_001, brief);
    t.finish()
}

/// Events at one timestamp count together, for the peak `info` reports and for the blocks
/// `--live-at peak` selects (the page takes the same peak from the same finder).
#[test]
fn the_peak_and_live_at_peak_agree_at_coincident_timestamps() {
    let mut t = crate::util::cli::TraceBuilder::new();
    let a = t.alloc(10, 4, &crate::util::cli::LOAD);
    let b = t.alloc(20, 5, &crate::util::cli::PARSE);
    t.free(20, a); // after b, at b's time: 9 samples are never live at once
    t.free(30, b);
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("coincident.ctf");
    std::fs::write(&trace, t.finish()).unwrap();
    let t = trace.to_str().unwrap();
    let info = memtrace(&["info", t]);
    assert!(info.contains("(4000 bytes, 5 samples") && info.contains("at 0.000020 s"), "{info}");
    let hot = memtrace(&["hotspots", t, "--live-at", "peak"]);
    let out: Vec<String> = hot.lines().map(str::to_string).collect();
    assert!(out[0].contains("total 3.9 KiB"), "{hot}");
    assert_totals(&out, 5, 1);
    assert!(hot.contains("app::parse"), "{hot}");
}

/// The page names frames as the other subcommands do: generic arguments elided unless
/// `--full-names`.
#[test]
fn the_page_shortens_names_as_the_command_line_does() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("known.ctf");
    known_trace(&trace, 20);
    let html = dir.path().join("known.html");
    let (t, h) = (trace.to_str().unwrap(), html.to_str().unwrap());
    memtrace(&["report", t, "-o", h]);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("\"alloc::vec::Vec::push\"") && !page.contains("Vec\\u003cT,A>::push"));
    assert!(memtrace(&["hotspots", t, "--keep-allocator-frames", "--stacks"]).contains("alloc::vec::Vec::push ("));
    memtrace(&["report", t, "-o", h, "--full-names"]);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("\"alloc::vec::Vec\\u003cT,A>::push\""));
}
