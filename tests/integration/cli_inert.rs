//! Untrusted trace text is inert in every output: a trace whose thread name, span field
//! values, function and file names and metadata hold terminal escapes (`\x1b]0;PWNED\x07`
//! retitles a terminal, `\x1b[2J` clears it), CR, BEL, bidi overrides and isolates, invalid
//! UTF-8 and markup (`</script>`, `<img onerror>`) goes through every subcommand; no output
//! may carry a raw control or bidi character, an invalid byte or live markup, and each shows
//! the hostile text in its visible escaped form (`memtrace_rs::analysis::inert`). The name
//! shown is the one `--inside` and `report --span` accept. (A NUL cannot be in a trace's
//! string: the format ends strings with one. The runtime writes a NUL of a span's field value
//! as `\x00`; `tests/tracing/spans.rs` checks that.) `report_browser` opens the report of
//! this trace in the browsers.

use crate::skip::skip;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use crate::util::cli::{self, memtrace_ok, write_trace, START};
use memtrace_rs::trace::{AllocSource, Info, Location, NewAlloc, Writer, SPAN_FILE_PREFIX, THREAD_FILE};

const MAIN: u64 = 1;
/// A function whose name holds a screen clear, invalid UTF-8 and U+2066, in a file whose
/// name holds U+202E.
const HANDLE: u64 = 2;
/// A function whose name is markup.
const RENDER: u64 = 3;
const SPAN: u64 = 0xFFFF_0000_0000_0001;
const THREAD: u64 = 0xFFFD_0000_0000_0000;

const HANDLE_NAME: &[u8] = b"app::handle\x1b[2J\xff\xfe\xe2\x81\xa6";
const HANDLE_SHOWN: &str = r"app::handle\x1b[2J\xff\xfe\u{2066}";
const HANDLE_FILE: &str = "src/\u{202e}sr.evil";
const HANDLE_FILE_SHOWN: &str = r"src/\u{202e}sr.evil";
const RENDER_NAME: &str = "app::render</script><img src=x onerror=alert(1)>";
const SPAN_NAME: &str = "request{user=</script><img src=x onerror=alert(1)>\x1b[31m\u{202e}txt.exe\x07}";
const SPAN_SHOWN: &str = r"request{user=</script><img src=x onerror=alert(1)>\x1b[31m\u{202e}txt.exe\x07}";
const THREAD_NAME: &str = "worker\x1b]0;PWNED\x07\x1b[2J\r\u{200f}";
const THREAD_SHOWN: &str = r"worker\x1b]0;PWNED\x07\x1b[2J\x0d\u{200f}";
const EXECUTABLE: &[u8] = b"/usr/bin/app\x1b]0;PWNED\x07\xff";
const EXECUTABLE_SHOWN: &str = r"/usr/bin/app\x1b]0;PWNED\x07\xff";

fn locations(code: u64) -> Arc<[Location]> {
    let at = |function: &[u8], file: &[u8], line| {
        Arc::from(vec![Location { filename: file.into(), line, start_char: 0, end_char: 0, defname: function.into() }])
    };
    match code {
        MAIN => at(b"main", b"src/main.rs", 3),
        HANDLE => at(HANDLE_NAME, HANDLE_FILE.as_bytes(), 7),
        RENDER => at(RENDER_NAME.as_bytes(), b"src/app.rs", 9),
        SPAN => at(SPAN_NAME.as_bytes(), format!("{SPAN_FILE_PREFIX}src/server.rs").as_bytes(), 5),
        THREAD => at(THREAD_NAME.as_bytes(), THREAD_FILE.as_bytes(), 0),
        code => panic!("no code {code}"),
    }
}

/// The hostile trace: `handle` (5 samples) and `render` (3, freed) inside the span on the
/// thread, and `render` (2) on the thread outside the span; with `more`, `handle` allocates
/// that many samples more (a trace to diff with).
pub(crate) fn hostile_trace(more: u64) -> Vec<u8> {
    let info = Info {
        executable_name: EXECUTABLE.to_vec(),
        host_name: "host\u{202e}\u{2067}".into(),
        runtime_params: b"</script><img src=x onerror=alert(1)>".to_vec(),
        context: Some("ctx\x1b[2J\u{9b}31m".into()),
        ..cli::info()
    };
    let mut writer = Writer::new(Vec::new(), &info).unwrap();
    let mut alloc = |at: u64, nsamples: u64, stack: &[u64]| {
        let alloc = NewAlloc { length: nsamples, nsamples, source: AllocSource::External, callstack: stack, drop: 0 };
        writer.put_alloc(0, START + at, &alloc, locations).unwrap()
    };
    alloc(10, 5, &[HANDLE, MAIN, SPAN, THREAD]);
    let freed = alloc(20, 3, &[RENDER, MAIN, SPAN, THREAD]);
    alloc(30, 2, &[RENDER, MAIN, THREAD]);
    if more > 0 {
        alloc(35, more, &[HANDLE, MAIN, SPAN, THREAD]);
    }
    writer.put_collect(0, START + 40, freed).unwrap();
    writer.close().unwrap()
}

/// The characters of `text` that must not reach an output: controls but the newline that
/// ends its lines, format characters that steer or hide text, and U+FFFD, which stands for
/// an invalid byte once the output is read lossily.
fn hazards(text: &str) -> Vec<char> {
    text.chars()
        .filter(|&c| {
            (c.is_control() && c != '\n')
                || matches!(c, '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
                || c == '\u{fffd}'
        })
        .collect()
}

/// Check that the output `what` is valid UTF-8 without [`hazards`]; returns it as text.
fn inert_text(what: &str, bytes: Vec<u8>) -> String {
    let text = String::from_utf8(bytes).unwrap_or_else(|e| panic!("{what}: not UTF-8: {e}"));
    assert_eq!(hazards(&text), [], "{what}:\n{text}");
    text
}

/// The stdout of `memtrace args` (in `dir`), checked by [`inert_text`].
fn stdout(dir: &Path, args: &[&str]) -> String {
    inert_text(&format!("memtrace {args:?}"), memtrace_ok(dir, args).into_bytes())
}

/// The file `memtrace args` writes to `dir/out`, checked by [`inert_text`].
fn written(dir: &Path, out: &str, args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.extend(["-o", out]);
    memtrace_ok(dir, &all);
    inert_text(&format!("memtrace {all:?}"), std::fs::read(dir.join(out)).unwrap())
}

fn assert_shows(what: &str, text: &str, shown: &[&str]) {
    for s in shown {
        assert!(text.contains(s), "{what} does not show {s}:\n{text}");
    }
}

#[test]
fn terminal_text_and_json_show_the_hostile_text_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    write_trace(dir, "hostile.ctf", &hostile_trace(0));
    let info = stdout(dir, &["info", "hostile.ctf"]);
    assert_shows("info", &info, &[EXECUTABLE_SHOWN, r"host\u{202e}\u{2067}", r"ctx\x1b[2J\u{9b}31m"]);
    stdout(dir, &["sizes", "hostile.ctf"]);
    let dump = stdout(dir, &["dump", "hostile.ctf"]);
    assert_shows("dump", &dump, &[&format!("{HANDLE_SHOWN}@{HANDLE_FILE_SHOWN}:7"), THREAD_SHOWN, SPAN_SHOWN]);
    // `--full-names`: short names would elide the markup as generic arguments.
    let code = stdout(dir, &["hotspots", "hostile.ctf", "--stacks", "--keep-root-frames", "--full-names"]);
    assert_shows("hotspots", &code, &[HANDLE_SHOWN, HANDLE_FILE_SHOWN, RENDER_NAME]);
    let spans = stdout(dir, &["hotspots", "hostile.ctf", "--by", "span"]);
    assert_shows("hotspots --by span", &spans, &[&format!("span {SPAN_SHOWN} (src/server.rs:5)")]);
    let threads = stdout(dir, &["hotspots", "hostile.ctf", "--by", "thread"]);
    assert_shows("hotspots --by thread", &threads, &[&format!("thread {THREAD_SHOWN}")]);
    write_trace(dir, "more.ctf", &hostile_trace(4));
    let diff = stdout(dir, &["diff", "hostile.ctf", "more.ctf", "--by", "span"]);
    assert_shows("diff", &diff, &[SPAN_SHOWN]);

    // JSON is data, escaped by serde_json on top: its names are the shown ones, so that a
    // consumer that prints them prints them inert, and they match the text outputs.
    let json = |args: &[&str]| -> serde_json::Value { serde_json::from_str(&stdout(dir, args)).unwrap() };
    let info = json(&["info", "hostile.ctf", "--json"]);
    assert_eq!(info["executable"], EXECUTABLE_SHOWN);
    let holds = |value: &serde_json::Value, shown: &str| {
        let string = serde_json::to_string(shown).unwrap();
        assert!(value.to_string().contains(string.trim_matches('"')), "no {shown} in {value:#}");
    };
    holds(&json(&["hotspots", "hostile.ctf", "--by", "span", "--json"]), SPAN_SHOWN);
    holds(&json(&["hotspots", "hostile.ctf", "--by", "thread", "--json"]), THREAD_SHOWN);
    holds(&json(&["diff", "hostile.ctf", "more.ctf", "--json"]), HANDLE_SHOWN);
}

#[test]
fn a_name_shown_is_a_name_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    write_trace(dir, "hostile.ctf", &hostile_trace(0));
    let inside = stdout(dir, &["hotspots", "hostile.ctf", "--inside", HANDLE_SHOWN]);
    assert_shows("hotspots --inside", &inside, &["3.9 KiB", HANDLE_SHOWN]);
    assert!(!inside.contains("app::render"), "{inside}");
    // As shown, and with the raw characters it shows escaped (the page's title shows the
    // argument inert).
    for span in [SPAN_SHOWN, SPAN_NAME] {
        let report = written(dir, "span.html", &["report", "hostile.ctf", "--span", span]);
        assert!(report.contains(r#""nblocks":2"#), "the span's two blocks");
    }
    for (thread, span) in [(THREAD_SHOWN, SPAN_SHOWN), (THREAD_NAME, SPAN_NAME)] {
        let hidden = stdout(dir, &["hotspots", "hostile.ctf", "--by", "span", "--inside", thread, "--hide", span]);
        assert_shows("hotspots --inside --hide", &hidden, &["total 7.8 KiB", "(no span)"]);
        assert!(!hidden.contains("span request"), "{hidden}");
    }
}

#[test]
fn folded_stacks_svgs_and_the_report_hold_no_live_markup() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    write_trace(dir, "hostile.ctf", &hostile_trace(0));
    let folded = written(dir, "folded.txt", &["flamegraph", "hostile.ctf", "--folded"]);
    // `;` separates frames: a name's own are shown as `,`.
    let thread =
        format!("thread {};span {SPAN_SHOWN} (src/server.rs:5);main (src/main.rs:3)", THREAD_SHOWN.replace(';', ","));
    assert_eq!(folded.lines().next(), Some(format!("{thread};{HANDLE_SHOWN} ({HANDLE_FILE_SHOWN}:7) 4000").as_str()));
    assert_eq!(folded.lines().count(), 3, "{folded}");

    let markup = ["<img", "</script><img", "onerror=alert(1)>"];
    for (out, args) in [
        ("flame.svg", &["flamegraph", "hostile.ctf", "--full-names"][..]),
        ("spans.svg", &["flamegraph", "hostile.ctf", "--root", "span"]),
        ("chart.svg", &["timeline", "hostile.ctf"]),
    ] {
        let svg = written(dir, out, args);
        assert_eq!(crate::cli_markup::assert_well_formed(svg.as_bytes()), "svg", "{out}");
        for m in markup {
            assert!(!svg.contains(m), "{out} holds {m}");
        }
    }
    let svg = written(dir, "flame.svg", &["flamegraph", "hostile.ctf"]);
    assert_shows("flame.svg", &svg, &[EXECUTABLE_SHOWN, "&lt;img src=x onerror=alert(1)&gt;", r"\u{202e}txt.exe"]);
    written(dir, "chart.csv", &["timeline", "hostile.ctf"]);

    let html = written(dir, "report.html", &["report", "hostile.ctf", "--full-names"]);
    // The data is JSON in a `<script>` element, its `<` escaped: `onerror=…>` may be text there.
    for m in &markup[..2] {
        assert!(!html.contains(m), "the report holds {m}");
    }
    assert_eq!(html.matches("</script>").count(), 2, "only the data's and the page's script end");
    // The names as the page gets them: JSON strings, `<` escaped and `\` doubled.
    for shown in [THREAD_SHOWN, HANDLE_SHOWN, EXECUTABLE_SHOWN] {
        let json = serde_json::to_string(shown).unwrap().replace('<', "\\u003c");
        assert!(html.contains(&json), "the report lacks {json}");
    }
}

#[test]
fn pprof_strings_are_inert_in_go_tool_pprof() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    write_trace(dir, "hostile.ctf", &hostile_trace(0));
    memtrace_ok(dir, &["pprof", "hostile.ctf", "-o", "heap.pb.gz", "--full-names"]);
    let profile = dir.join("heap.pb.gz");
    // `-raw` prints every function, file and mapping of the profile: its whole string table.
    for view in ["-top", "-traces", "-raw"] {
        let out = match Command::new("go")
            .args(["tool", "pprof", view, "-sample_index=alloc_space"])
            .arg(&profile)
            .output()
        {
            Ok(out) => out,
            Err(e) => return skip(&format!("go tool pprof did not run (apt-get install golang-go): {e}")),
        };
        assert!(out.status.success(), "go tool pprof {view}: {}", String::from_utf8_lossy(&out.stderr));
        let text = inert_text(&format!("go tool pprof {view}"), out.stdout);
        // pprof shows the executable's base name.
        assert_shows(&format!("go tool pprof {view}"), &text, &[HANDLE_SHOWN, r"app\x1b]0;PWNED\x07\xff"]);
        if view != "-top" {
            assert_shows(&format!("go tool pprof {view}"), &text, &[SPAN_SHOWN, THREAD_SHOWN, RENDER_NAME]);
        }
    }
}
