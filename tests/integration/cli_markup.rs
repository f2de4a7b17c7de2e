//! The SVG outputs are well-formed XML, the folded stacks are as expected, and the HTML
//! report is self-contained (no http(s) resource; `report_browser` renders it).
use crate::skip::skip;
use std::path::Path;

use crate::util::cli::*;

/// Parse `xml` completely, checking tag nesting and attribute syntax; returns the root
/// element's name.
pub(crate) fn assert_well_formed(xml: &[u8]) -> String {
    use quick_xml::events::Event;
    let mut reader = quick_xml::Reader::from_reader(xml);
    reader.config_mut().check_end_names = true;
    let mut buf = Vec::new();
    let (mut depth, mut root) = (0usize, None);
    loop {
        let event = reader.read_event_into(&mut buf);
        let position = reader.buffer_position();
        match event {
            Ok(Event::Start(ref e)) | Ok(Event::Empty(ref e)) => {
                for attr in e.attributes().with_checks(true) {
                    attr.unwrap_or_else(|err| panic!("bad attribute at {position}: {err}"));
                }
                root.get_or_insert_with(|| String::from_utf8_lossy(e.name().as_ref()).into_owned());
                if matches!(event, Ok(Event::Start(_))) {
                    depth += 1;
                }
            }
            Ok(Event::End(_)) => depth -= 1,
            Ok(Event::Eof) => break,
            Ok(_) => {}
            Err(e) => panic!("malformed XML at {position}: {e}"),
        }
        buf.clear();
    }
    assert_eq!(depth, 0, "unclosed elements");
    root.expect("a root element")
}

/// The output `memtrace SUBCOMMAND trace -o out ARGS…` writes, run in `dir`.
fn output(dir: &Path, subcommand: &str, trace: &str, out: &str, args: &[&str]) -> Vec<u8> {
    let mut all = vec![subcommand, trace, "-o", out];
    all.extend(args);
    memtrace_ok(dir, &all);
    std::fs::read(dir.join(out)).unwrap()
}

/// The folded stacks of `trace` (in `dir`) with the flame-graph flags `args`.
fn folded(dir: &Path, trace: &str, args: &[&str]) -> Vec<String> {
    let mut all = vec!["--folded"];
    all.extend(args);
    let text = String::from_utf8(output(dir, "flamegraph", trace, "folded.txt", &all)).unwrap();
    text.lines().map(str::to_string).collect()
}

#[test]
fn folded_stacks_of_the_known_trace() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    write_trace(dir, "known.ctf", &known_trace());
    assert_eq!(
        folded(dir, "known.ctf", &[]),
        [
            "main (src/app.rs:10);app::run (src/app.rs:20);app::parse (src/app.rs:40) 5600",
            "main (src/app.rs:10);app::run (src/app.rs:20);app::load (src/app.rs:30) 3200",
        ]
    );
    assert_eq!(
        folded(dir, "known.ctf", &["--live-end"]),
        ["main (src/app.rs:10);app::run (src/app.rs:20);app::load (src/app.rs:30) 800"]
    );
    assert_eq!(folded(dir, "known.ctf", &["--live-at", "0.000045"]).len(), 2);
    assert_eq!(
        folded(dir, "known.ctf", &["--live-end", "--keep-allocator-frames"]),
        ["main (src/app.rs:10);app::run (src/app.rs:20);app::load (src/app.rs:30);hashbrown::raw::RawTable::reserve_rehash (src/app.rs:80) 800"]
    );
    assert_eq!(
        folded(dir, "known.ctf", &["--live-end", "--keep-allocator-frames", "--full-names"]),
        ["main (src/app.rs:10);app::run (src/app.rs:20);app::load (src/app.rs:30);hashbrown::raw::RawTable<T,A>::reserve_rehash (src/app.rs:80) 800"]
    );
}

#[test]
fn svgs_are_well_formed() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    write_trace(dir, "known.ctf", &known_trace());
    write_trace(dir, "empty.ctf", &TraceBuilder::new().finish());
    let ocamlopt = data("ocamlopt.ctf");
    for trace in ["known.ctf", "empty.ctf", ocamlopt.to_str().unwrap()] {
        for weight in [&[][..], &["--live-end"], &["--live-peak"]] {
            assert_eq!(assert_well_formed(&output(dir, "flamegraph", trace, "flame.svg", weight)), "svg");
        }
        assert_eq!(assert_well_formed(&output(dir, "timeline", trace, "chart.svg", &[])), "svg");
    }
    let svg = String::from_utf8(output(dir, "flamegraph", "known.ctf", "flame.svg", &[])).unwrap();
    assert!(svg.contains("app::parse (src/app.rs:40)") && svg.contains("bytes"));
    let chart = String::from_utf8(output(dir, "timeline", "known.ctf", "chart.svg", &[])).unwrap();
    assert!(chart.contains("peak 6.2 KiB at 40 µs"), "the peak is marked");
}

/// A label too long for its frame is cut at its end: it starts with the function's name. The
/// SVG's script writes the labels as it loads: Chromium runs it (`--dump-dom`).
#[test]
fn flame_graph_labels_keep_their_start() {
    let dir = tempfile::tempdir().unwrap();
    let long = "app::reader::a_function_with_a_name_long_enough_to_be_cut";
    let mut t = TraceBuilder::new();
    t.alloc_with(10, 90, &[4, 1], locations);
    t.alloc_with(20, 30, &[7, 1], |code| if code == 7 { location_at(long, "src/reader.rs") } else { locations(code) });
    write_trace(dir.path(), "long.ctf", &t.finish());
    output(dir.path(), "flamegraph", "long.ctf", "flame.svg", &[]);
    let url = format!("file://{}", dir.path().join("flame.svg").display());
    let dumped = std::process::Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", &url])
        .output();
    let Ok(dumped) = dumped else {
        return skip("no chromium (apt-get install chromium)");
    };
    let dom = String::from_utf8_lossy(&dumped.stdout);
    let labels: Vec<&str> = dom.split("<text ").filter_map(|t| t.split_once('>')?.1.split('<').next()).collect();
    let cut: Vec<&str> = labels.iter().copied().filter(|l| l.ends_with("..") && l.len() > 2).collect();
    assert!(!cut.is_empty(), "no label was cut: {labels:?}");
    for label in cut {
        assert!(label.starts_with("app::") || long.starts_with(label.trim_end_matches('.')), "{label} of {labels:?}");
    }
    assert!(labels.iter().any(|l| l.starts_with("app::reader::a_fun")), "{labels:?}");
}

#[test]
fn timeline_csv() {
    let dir = tempfile::tempdir().unwrap();
    write_trace(dir.path(), "known.ctf", &known_trace());
    let csv = String::from_utf8(output(dir.path(), "timeline", "known.ctf", "chart.csv", &[])).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "time_s,live_bytes,live_max_bytes,alloc_rate_bytes_per_s");
    assert_eq!(lines.len(), 1 + 71);
    assert_eq!(lines[1 + 40], "0.000040,6400,6400,4000000000", "5 samples of 800 bytes in 1 µs");
    assert_eq!(lines[1 + 70], "0.000070,800,800,800000000");
}

/// Every `http://` or `https://` in `html` outside XML namespace declarations, comments
/// and scripts, with some context. (Scripts are checked separately for ways to load.)
fn resource_urls(html: &str) -> Vec<String> {
    let inside =
        |before: &str, open: &str, close: &str| before.rfind(open).is_some_and(|o| !before[o..].contains(close));
    let mut found = Vec::new();
    for (i, _) in html.match_indices("http") {
        let rest = &html[i..];
        if !(rest.starts_with("http://") || rest.starts_with("https://")) {
            continue;
        }
        let before = &html[..i];
        let namespace = ["xmlns=\"", "xmlns:xlink=\"", "xmlns:fg=\""].iter().any(|p| before.ends_with(p));
        if !namespace && !inside(before, "<!--", "-->") && !inside(before, "<script", "</script>") {
            found.push(html[i.saturating_sub(40)..(i + 60).min(html.len())].to_string());
        }
    }
    found
}

/// The text of every `<script>` element of `html`.
fn scripts(html: &str) -> Vec<&str> {
    html.split("<script").skip(1).map(|s| s.split("</script>").next().unwrap_or(s)).collect()
}

/// The report of the trace `file` in `dir`, as `memtrace report` writes it.
fn report_html(dir: &Path, file: &str) -> String {
    String::from_utf8(output(dir, "report", file, "report.html", &["--top", "25"])).unwrap()
}

#[test]
fn report_is_self_contained() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    write_trace(dir, "known.ctf", &known_trace());
    let lists = data("lists_and_sets-v1.ctf");
    for name in ["known.ctf", lists.to_str().unwrap()] {
        let html = report_html(dir, name);
        assert_eq!(resource_urls(&html), Vec::<String>::new(), "{name}");
        for script in scripts(&html) {
            assert!(!script.starts_with(" src") && !script.contains(" src="), "{name}: external script");
            for loader in ["fetch(", "XMLHttpRequest", "import(", "importScripts", "WebSocket", ".src ="] {
                assert!(!script.contains(loader), "{name}: script uses {loader}");
            }
        }
        let lower = html.to_ascii_lowercase();
        for banned in ["@import", "<link", "<script src", "<iframe", "url(http", "src=\"//", "href=\"//"] {
            assert!(!lower.contains(banned), "{name}: {banned}");
        }
        for id in ["timeline", "filters", "flamegraph", "sites", "report-data"] {
            assert!(html.contains(&format!("id=\"{id}\"")), "{name}: #{id}");
        }
        assert_eq!(scripts(&html).len(), 2, "{name}: the data and the page's script");
    }
    let html = report_html(dir, "known.ctf");
    assert!(html.contains("\"app::parse\""), "the frame table names the functions");
}
