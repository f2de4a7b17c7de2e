//! Span and thread frames in the analysis and the command line: a built trace whose stacks
//! end, outermost, in the pseudo-frames memtrace-rs's runtime writes (`<span>` and `<thread>`
//! locations), ranked by span and thread, drawn rooted at either, reported inside a span and
//! diffed.

use std::sync::Arc;

use crate::util::cli::{self, analyse, info, memtrace_ok, write_trace, SAMPLE_BYTES, START};
use memtrace_rs::analysis::{ranked, FrameKind, Grouping, Measure, Options};
use memtrace_rs::trace::{AllocSource, Location, NewAlloc, Writer, SPAN_FILE_PREFIX, THREAD_FILE};

const USERS: u64 = 0xFFFF_0000_0000_0001;
const THUMBNAIL: u64 = 0xFFFF_0000_0000_0002;
const ENCODE: u64 = 0xFFFF_0000_0000_0003;
const WORKER: u64 = 0xFFFD_0000_0000_0000;
const MAIN: u64 = 0xFFFD_0000_0000_0001;
/// A start-up frame of the runtime, trimmed from the outer end of the code below the spans.
const LANG_START: u64 = 0x1_0000;

fn locations(code: u64) -> Arc<[Location]> {
    let pseudo = |file: String, line, name| cli::location_on_line(name, &file, line);
    let span = |line, name| pseudo(format!("{SPAN_FILE_PREFIX}src/server.rs"), line, name);
    match code {
        USERS => span(10, "http_request{route=/api/users}"),
        THUMBNAIL => span(12, "http_request{route=/api/thumbnail}"),
        ENCODE => span(20, "encode"),
        WORKER => pseudo(THREAD_FILE.into(), 0, "worker-0"),
        MAIN => pseudo(THREAD_FILE.into(), 0, "main"),
        LANG_START => cli::location_at("std::rt::lang_start_internal", "library/std/src/rt.rs"),
        code => cli::locations(code),
    }
}

/// Stacks innermost first: `app::parse` called from `main`, inside spans, on a thread.
/// `users` (5 samples, freed) on the worker; `encode` inside `thumbnail` (3, kept) on the
/// worker; no span (2, kept) on main. `users_more` adds 4 samples to users. The users
/// stacks start in a start-up frame of std's runtime, below their span.
fn trace(users_more: bool) -> Vec<u8> {
    let mut writer = Writer::new(Vec::new(), &info()).unwrap();
    let mut alloc = |at: u64, nsamples: u64, stack: &[u64]| {
        let alloc = NewAlloc { length: nsamples, nsamples, source: AllocSource::External, callstack: stack, drop: 0 };
        writer.put_alloc(0, START + at, &alloc, locations).unwrap()
    };
    let users = alloc(10, 5, &[4, 2, 1, LANG_START, USERS, WORKER]);
    alloc(20, 3, &[4, 2, 1, ENCODE, THUMBNAIL, WORKER]);
    alloc(30, 2, &[4, 2, 1, MAIN]);
    if users_more {
        alloc(35, 4, &[4, 2, 1, LANG_START, USERS, WORKER]);
    }
    writer.put_collect(0, START + 40, users).unwrap();
    writer.close().unwrap()
}

fn labels(trace: &[u8], grouping: Grouping, measure: Measure) -> Vec<(String, f64)> {
    let a = analyse(trace, Options { stacks: true, ..Default::default() });
    ranked(&a, grouping, measure).iter().map(|s| (s.label(&a), a.bytes(s.stats.get(measure).samples))).collect()
}

#[test]
fn spans_and_threads_are_ranked_as_such() {
    let trace = trace(false);
    let by = |kind, stacks| Grouping { kind, stacks, ..Default::default() };
    let users = "span http_request{route=/api/users} (src/server.rs:10)";
    let encode = "span encode (src/server.rs:20)";
    assert_eq!(
        labels(&trace, by(FrameKind::Span, false), Measure::Allocated),
        [
            (users.to_owned(), 5.0 * SAMPLE_BYTES),
            (encode.to_owned(), 3.0 * SAMPLE_BYTES),
            ("(no span)".to_owned(), 2.0 * SAMPLE_BYTES)
        ]
    );
    assert_eq!(
        labels(&trace, by(FrameKind::Span, false), Measure::LiveEnd),
        [(encode.to_owned(), 3.0 * SAMPLE_BYTES), ("(no span)".to_owned(), 2.0 * SAMPLE_BYTES)]
    );
    assert_eq!(
        labels(&trace, by(FrameKind::Thread, true), Measure::Allocated),
        [("thread worker-0".to_owned(), 8.0 * SAMPLE_BYTES), ("thread main".to_owned(), 2.0 * SAMPLE_BYTES)]
    );
    // Code sites are the code, never a span or a thread.
    assert_eq!(
        labels(&trace, Grouping::default(), Measure::Allocated),
        [("app::parse (src/app.rs:40)".to_owned(), 10.0 * SAMPLE_BYTES)]
    );
    // Whole stacks keep their spans and thread outermost, and lose the start-up frames
    // below them.
    let a = analyse(&trace, Options { stacks: true, ..Default::default() });
    let keys: Vec<String> =
        ranked(&a, by(FrameKind::Code, true), Measure::Allocated).iter().map(|s| s.key(&a)).collect();
    let code = "app::parse (src/app.rs:40) <- app::run (src/app.rs:20) <- main (src/app.rs:10)";
    assert_eq!(keys[0], format!("{code} <- {users} <- thread worker-0"), "{keys:?}");
}

#[test]
fn the_command_line_ranks_draws_reports_and_diffs_by_span() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_trace(dir.path(), "spans.ctf", &trace(false));
    let path = path.to_str().unwrap();
    let hotspots = memtrace_ok(dir.path(), &["hotspots", path, "--by", "span,live-end"]);
    assert!(hotspots.contains("Top 2 of 2 spans of"), "{hotspots}");
    assert!(hotspots.contains("by bytes live at the end"), "{hotspots}");
    let rows: Vec<&str> = hotspots.lines().skip(2).take(2).map(|l| l.split("  ").last().unwrap()).collect();
    assert_eq!(rows, ["span encode (src/server.rs:20)", "(no span)"], "{hotspots}");
    let stacks = memtrace_ok(dir.path(), &["hotspots", path, "--by", "span", "--stacks"]);
    assert!(
        stacks.contains("span encode (src/server.rs:20)\n")
            && stacks.contains("   span http_request{route=/api/thumbnail}"),
        "{stacks}"
    );
    let threads = memtrace_ok(dir.path(), &["hotspots", path, "--by", "thread"]);
    assert!(threads.contains("Top 2 of 2 threads") && threads.contains("thread worker-0"), "{threads}");

    let folded = |root: &str| {
        let out = dir.path().join(format!("{root}.folded"));
        memtrace_ok(dir.path(), &["flamegraph", path, "--folded", "--root", root, "-o", out.to_str().unwrap()]);
        std::fs::read_to_string(out).unwrap()
    };
    let by_thread = folded("thread");
    assert!(by_thread.lines().all(|l| l.starts_with("thread ")), "{by_thread}");
    assert!(by_thread.contains("thread worker-0;span http_request{route=/api/thumbnail} (src/server.rs:12);span encode (src/server.rs:20);main"), "{by_thread}");
    let by_span = folded("span");
    assert!(
        by_span.contains("\nspan http_request{route=/api/users} (src/server.rs:10);main")
            || by_span.starts_with("span http_request{route=/api/users} (src/server.rs:10);main"),
        "{by_span}"
    );
    assert!(!by_span.contains("thread "), "{by_span}");
    let code = folded("code");
    assert!(code.lines().all(|l| l.starts_with("main (src/app.rs:10)")), "{code}");

    // The report embeds only the blocks allocated inside the span (users: 1, encode inside
    // thumbnail: 1, main: 1).
    let report = |span: &[&str]| {
        let out = dir.path().join("report.html");
        memtrace_ok(dir.path(), &[&["report", path, "-o", out.to_str().unwrap()], span].concat());
        let html = std::fs::read_to_string(out).unwrap();
        let blocks = html.split("\"nblocks\":").nth(1).unwrap().split(',').next().unwrap().to_owned();
        (html, blocks)
    };
    let (all_requests, blocks) = report(&["--span", "http_request"]);
    assert!(all_requests.contains("<title>memtrace report: spans.ctf, inside span http_request"));
    assert_eq!(blocks, "2");
    assert_eq!(report(&["--span", "http_request{route=/api/users}"]).1, "1");
    assert_eq!(report(&["--span", "encode"]).1, "1");
    // A span the trace does not have is refused (`span_text_is_kept_and_taken_back`).
    let run = cli::memtrace(dir.path(), &["report", path, "-o", "nothing.html", "--span", "nothing"]);
    assert!(!run.status.success() && run.stderr.contains("no span has this name"), "{}", run.stderr);
    assert_eq!(report(&[]).1, "3");

    let new = write_trace(dir.path(), "spans-new.ctf", &trace(true));
    let diff = memtrace_ok(dir.path(), &["diff", path, new.to_str().unwrap(), "--by", "span"]);
    let users_line =
        diff.lines().find(|l| l.contains("span http_request{route=/api/users}")).unwrap_or_else(|| panic!("{diff}"));
    assert!(users_line.contains("+3.1 KiB") || users_line.contains("3200"), "{diff}");
}

/// pprof's trim (`Trim::kept`) keeps the span and thread frames at the outer end and trims the
/// runtime's start-up frames below them, as the rankings do: a default Rust trace, whose
/// outermost frame is its thread's, has no `lang_start` in its profile.
#[test]
fn pprof_trims_start_up_frames_below_spans_and_threads() {
    let a = analyse(&trace(false), Options { stacks: true, ..Default::default() });
    let mut kept_labels = Vec::new();
    for stack in &a.stacks {
        let frames: Vec<_> = a.trie.up(stack.node).flat_map(|code| a.frames_of(code).iter().rev().copied()).collect();
        let kept = memtrace_rs::analysis::Trim::default().kept(&a, &frames);
        kept_labels.push(kept.iter().map(|&i| a.frames[frames[i]].label()).collect::<Vec<_>>());
    }
    let users = kept_labels.iter().find(|l| l.iter().any(|f| f.contains("/api/users"))).expect("the users stack");
    assert!(!users.iter().any(|f| f.contains("lang_start")), "{users:?}");
    assert!(users.last().is_some_and(|f| f == "thread worker-0"), "{users:?}");
    assert!(users.iter().any(|f| f.starts_with("app::")), "{users:?}");
}

/// A span's description is shown as written (its field values keep their `<…>`), so that two
/// spans that differ only there stay two, and the text shown is text `report --span` takes; a
/// span the trace does not have is refused, saying which it has.
#[test]
fn span_text_is_kept_and_taken_back() {
    const BYTES: u64 = 0xFFFF_0000_0000_0010;
    const STRINGS: u64 = 0xFFFF_0000_0000_0011;
    let locations = |code| match code {
        BYTES => cli::location_on_line("decode{ty=Vec<u8>}", &format!("{SPAN_FILE_PREFIX}src/codec.rs"), 5),
        STRINGS => cli::location_on_line("decode{ty=Vec<String>}", &format!("{SPAN_FILE_PREFIX}src/codec.rs"), 5),
        code => locations(code),
    };
    let mut writer = Writer::new(Vec::new(), &info()).unwrap();
    for (at, nsamples, span) in [(10, 3, BYTES), (20, 5, STRINGS)] {
        let stack = [4, 2, 1, span, MAIN];
        let alloc = NewAlloc { length: nsamples, nsamples, source: AllocSource::External, callstack: &stack, drop: 0 };
        writer.put_alloc(0, START + at, &alloc, locations).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = write_trace(dir.path(), "spans.ctf", &writer.close().unwrap());
    let path = trace.to_str().unwrap();
    let spans = memtrace_ok(dir.path(), &["hotspots", path, "--by", "span"]);
    assert!(spans.contains("span decode{ty=Vec<String>} (src/codec.rs:5)"), "{spans}");
    assert!(spans.contains("span decode{ty=Vec<u8>} (src/codec.rs:5)"), "{spans}");
    memtrace_ok(dir.path(), &["report", path, "--span", "decode{ty=Vec<u8>}", "-o", "u8.html"]);
    let page = std::fs::read_to_string(dir.path().join("u8.html")).unwrap();
    assert!(page.contains("inside span decode{ty=Vec"), "the title names the span");
    let run = cli::memtrace(dir.path(), &["report", path, "--span", "decode{ty=Vec}", "-o", "none.html"]);
    assert!(!run.status.success(), "{}", run.stderr);
    assert!(run.stderr.contains("`decode{ty=Vec<String>}`, `decode{ty=Vec<u8>}`"), "{}", run.stderr);
    assert!(!dir.path().join("none.html").exists());
}

/// The `memtrace hotspots` command that the page of `report --span` prints gives the page's
/// figures: run as printed (its `--span` included) on a trace of the tokio example, alone
/// and with the flag the page adds for "live at the peak", its totals are those of the
/// blocks the page embeds.
#[test]
fn the_command_a_span_report_prints_gives_the_pages_figures() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("tokio.ctf");
    crate::cli_real_stacks::trace_run("tokio-spans", "1e-3", &trace);
    let t = trace.to_str().unwrap();
    for span in ["http_request", "http_request{route=/api/users}"] {
        let html = dir.path().join("span.html");
        memtrace_ok(dir.path(), &["report", t, "--span", span, "-o", html.to_str().unwrap()]);
        let page = Page::read(&html);
        assert!(page.cli.starts_with("memtrace hotspots TRACE --span "), "{}", page.cli);
        let run = |extra: &[&str]| {
            let words: Vec<String> = shell_words(&page.cli).into_iter().skip(2).collect();
            let args: Vec<&str> = words.iter().map(|w| if w == "TRACE" { t } else { w.as_str() }).collect();
            let out = memtrace_ok(dir.path(), &[&["hotspots"], &args[..], extra].concat());
            let heading = out.lines().next().unwrap().to_string();
            // "… in N samples, M sampled allocations"
            let numbers: Vec<u64> = heading
                .rsplit(" in ")
                .next()
                .unwrap()
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|n| n.parse().ok())
                .collect();
            assert_eq!(numbers.len(), 2, "{heading}");
            (numbers[0], numbers[1])
        };
        let all = page.blocks.iter().map(|b| b.samples).sum::<u64>();
        assert!(page.blocks.len() > 10, "{span}: {} blocks", page.blocks.len());
        assert_eq!(run(&[]), (all, page.blocks.len() as u64), "{span}");
        let peak: Vec<&Block> = page.blocks.iter().filter(|b| b.live_at(page.peak_us)).collect();
        assert!(!peak.is_empty(), "{span}");
        let at_peak = (peak.iter().map(|b| b.samples).sum::<u64>(), peak.len() as u64);
        assert_eq!(run(&["--live-at", "peak"]), at_peak, "{span}");
    }
    let run = cli::memtrace(dir.path(), &["hotspots", t, "--span", "http_req"]);
    assert!(!run.status.success() && run.stderr.contains("no span has this name"), "{}", run.stderr);
}

/// The words of a POSIX shell command line of plain words and single-quoted ones (`'\''` in
/// one is a quote).
fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
    for c in line.chars() {
        match c {
            '\'' => (quoted, any) = (!quoted, true),
            ' ' if !quoted => {
                if any || !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
                any = false;
            }
            '\\' if !quoted => {}
            c => word.push(c),
        }
    }
    if any || !word.is_empty() {
        words.push(word);
    }
    words
}

/// A sampled block as a report page embeds it.
struct Block {
    alloc_us: u64,
    /// The free time, if it was freed.
    free_us: Option<u64>,
    samples: u64,
}

impl Block {
    /// `filter::Filter`'s (and the page's) rule: allocated by `t` and not freed by then.
    fn live_at(&self, t: u64) -> bool {
        self.alloc_us <= t && self.free_us.is_none_or(|f| f > t)
    }
}

/// What a report page embeds (`report/data.rs`): its command line, the peak and the blocks
/// of its one trace.
struct Page {
    cli: String,
    peak_us: u64,
    blocks: Vec<Block>,
}

impl Page {
    fn read(html: &std::path::Path) -> Page {
        use std::io::Read;
        let doc = cli::report_data(html);
        let trace = &doc["traces"][0];
        let n = trace["nblocks"].as_u64().unwrap() as usize;
        let tick = trace["tick_us"].as_u64().unwrap();
        let mut raw = Vec::new();
        let gz = base64(trace["cols"].as_str().unwrap());
        flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut raw).unwrap();
        let column = |k: usize| -> Vec<u64> {
            raw[4 * n * k..4 * n * (k + 1)]
                .chunks(4)
                .map(|b| u64::from(u32::from_le_bytes(b.try_into().unwrap())))
                .collect()
        };
        let (delta, life, samples) = (column(0), column(1), column(2));
        let mut at = 0;
        let blocks = (0..n)
            .map(|i| {
                at += delta[i];
                let free_us = (life[i] > 0).then(|| (at + life[i] - 1) * tick);
                Block { alloc_us: at * tick, free_us, samples: samples[i] }
            })
            .collect();
        Page { cli: doc["cli"].as_str().unwrap().to_string(), peak_us: trace["peak"]["t"].as_u64().unwrap(), blocks }
    }
}

/// Standard base64 with padding, decoded.
fn base64(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let sextets: Vec<u32> =
        text.bytes().filter(|&b| b != b'=').map(|b| ALPHABET.iter().position(|&a| a == b).unwrap() as u32).collect();
    let mut out = Vec::with_capacity(sextets.len() * 3 / 4);
    for chunk in sextets.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, s)| n | s << (18 - 6 * i));
        out.extend(n.to_be_bytes()[1..chunk.len()].iter());
    }
    out
}
