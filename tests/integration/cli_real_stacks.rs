//! Whole stacks of traces written by real programs (the sample app: a main thread and a pool
//! of workers; the tokio example: a multi-thread runtime with spans), read back in every
//! output that shows them: no stack holds a start-up frame (the standard library's, tokio's
//! scheduler and `block_on`, the C library's, named or by object and offset) or a raw address,
//! and the outermost frame under the thread's is the program's own. The stacks of two runs of one
//! program match, whatever the load addresses and thread ids.

use crate::skip::skip;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use memtrace_rs::analysis::UNNAMED_THREADS;

use crate::util::cli::{memtrace_ok, report_data};

/// An example built by `cargo test` next to the test binaries.
fn example(name: &str) -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    deps.parent().unwrap().join("examples").join(name)
}

/// Run `program` traced at `rate` into `trace`.
pub fn trace_run(program: &str, rate: &str, trace: &Path) {
    let out = Command::new(example(program))
        .env("MEMTRACE_FILE", trace)
        .env("MEMTRACE_RATE", rate)
        .output()
        .expect("run the example");
    assert!(out.status.success(), "{program}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Parts of the names of the frames that start a program, a thread or a task, which no
/// trimmed stack may hold (raw addresses and the C library by object and offset included).
const START_UP: [&str; 16] = [
    "lang_start",
    "__rust_begin_short_backtrace",
    "catch_unwind",
    "__rust_try",
    "thread_start",
    "spawn_unchecked::{",
    "__libc_start",
    "start_thread",
    "clone3",
    "_start",
    "libc.so",
    "0x7f",
    "tokio::runtime::scheduler::multi_thread::worker::run",
    "tokio::runtime::task::harness",
    // The tower of `#[tokio::main]`'s `block_on`, between `main` and its async body.
    "tokio::runtime::runtime::Runtime::block_on",
    "tokio::runtime::park::CachedParkThread::block_on",
];

fn assert_no_start_up_frame(what: &str, frame: &str) {
    assert!(!START_UP.iter().any(|s| frame.contains(s)), "{what}: a start-up frame: {frame}");
}

/// The stacks of `hotspots --stacks` as labels (`function (file:line)`, `thread name`), each
/// innermost first.
fn hotspots_stacks(trace: &Path) -> Vec<Vec<String>> {
    let args = ["hotspots", "--stacks", "--top", "10000", "--frames", "10000", "--format", "json", &p(trace)];
    let doc: serde_json::Value = serde_json::from_str(&memtrace_ok(Path::new("."), &args)).unwrap();
    let label = |f: &serde_json::Value| match (f["function"].as_str().unwrap(), f["file"].as_str().unwrap()) {
        (name, "<thread>") => format!("thread {name}"),
        (name, file) if file.starts_with("<span>") => format!("span {name}"),
        (name, file) => format!("{name} ({file})"),
    };
    doc["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["frames"].as_array().unwrap().iter().map(label).collect())
        .collect()
}

fn p(path: &Path) -> String {
    path.to_str().unwrap().to_string()
}

/// Every output's stacks of `trace`, whose program's own functions start with `program`:
/// hotspots, folded flame graph, pprof as `go tool pprof -traces` reads it.
fn check_stacks(trace: &Path, program: &str) {
    let stacks = hotspots_stacks(trace);
    assert!(stacks.len() > 3, "{stacks:?}");
    for stack in &stacks {
        for frame in stack {
            assert_no_start_up_frame("hotspots --stacks", frame);
        }
    }
    // The stacks of most bytes: their outermost code frame (under span and thread frames) is
    // the program's own.
    for stack in stacks.iter().take(3) {
        let outermost = stack.iter().rev().find(|f| !f.starts_with("thread ") && !f.starts_with("span ")).unwrap();
        assert!(outermost.starts_with(program), "{outermost} in {stack:?}");
        assert!(stack.last().unwrap().starts_with("thread "), "{stack:?}");
    }
    let folded = memtrace_ok(Path::new("."), &["flamegraph", "--folded", &p(trace), "-o", "-"]);
    for line in folded.lines() {
        let (stack, _) = line.rsplit_once(' ').unwrap();
        for frame in stack.split(';') {
            assert_no_start_up_frame("flamegraph --folded", frame);
        }
    }
    let profile = trace.with_extension("pb.gz");
    memtrace_ok(Path::new("."), &["pprof", &p(trace), "-o", &p(&profile)]);
    let Ok(out) = Command::new("go").args(["tool", "pprof", "-traces"]).arg(&profile).output() else {
        skip("go is not installed (apt-get install golang-go)");
        return;
    };
    let traces = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success() && traces.contains(program), "{traces}");
    for line in traces.lines() {
        assert_no_start_up_frame("go tool pprof -traces", line);
    }
}

#[test]
fn stacks_of_a_thread_pool_hold_no_start_up_frame_and_two_runs_match() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.ctf"), dir.path().join("b.ctf"));
    trace_run("sample-app", "1e-4", &a);
    trace_run("sample-app", "1e-4", &b);
    check_stacks(&a, "sample_app::");
    // The app's pipeline runs for a set time, so its bytes differ from run to run; but every
    // stack is matched: none is only in one run, beyond the noise, as a stack with a raw
    // address or a thread id in it would be.
    let diff = memtrace_ok(Path::new("."), &["diff", "--stacks", "--top", "10000", "--frames", "100", &p(&a), &p(&b)]);
    let rows: Vec<&str> = diff.lines().skip(2).collect();
    assert!(rows.len() >= 4, "{diff}");
    for row in rows {
        let (base, new) = (row[..12].trim(), row[13..25].trim());
        assert!(row.ends_with("(within noise)") || (base != "0 B" && new != "0 B"), "unmatched:\n{row}\n{diff}");
    }
    assert_unnamed_threads_are_one(&a, &b, &diff);
}

/// The app's unnamed threads (`thread-<tid>`: a pipeline, its producer and its consumer) are
/// one thread, `thread-*`, in the diffs of two runs `a` and `b`: in `diff_stacks` (`diff
/// --stacks` of them), and on the page of `report --diff`, whose two traces then have the same
/// outermost frames (a tower per thread, not one per thread and run).
fn assert_unnamed_threads_are_one(a: &Path, b: &Path, diff_stacks: &str) {
    let tid = |label: &str| label.strip_prefix("thread-").is_some_and(|id| id.bytes().all(|c| c.is_ascii_digit()));
    assert!(diff_stacks.contains(&format!("<- thread {UNNAMED_THREADS}")), "{diff_stacks}");
    let ids = diff_stacks
        .match_indices("thread thread-")
        .filter(|(at, m)| diff_stacks[at + m.len()..].starts_with(|c: char| c.is_ascii_digit()));
    assert_eq!(ids.count(), 0, "{diff_stacks}");
    let html = a.with_extension("html");
    memtrace_ok(Path::new("."), &["report", "--diff", &p(a), &p(b), "-o", &p(&html)]);
    let doc = report_data(&html);
    let frames = &doc["frames"];
    let name = |f: &serde_json::Value| {
        frames["strings"][frames["fn"][f.as_u64().unwrap() as usize].as_u64().unwrap() as usize].as_str().unwrap()
    };
    let outermost = |trace: &serde_json::Value| -> std::collections::BTreeSet<String> {
        let nodes = &trace["nodes"];
        let parents = nodes["parent"].as_array().unwrap();
        let outer =
            parents.iter().zip(nodes["frame"].as_array().unwrap()).filter(|(parent, _)| parent.as_i64() == Some(0));
        outer.map(|(_, frame)| name(frame).to_string()).collect()
    };
    let (base, new) = (outermost(&doc["traces"][0]), outermost(&doc["traces"][1]));
    assert!(base.contains(UNNAMED_THREADS) && base.contains("main"), "{base:?}");
    assert!(!base.iter().chain(&new).any(|f| tid(f)), "{base:?} {new:?}");
    assert_eq!(base, new, "the runs' outermost frames");
}

#[test]
fn stacks_of_tokio_workers_hold_no_start_up_frame() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("tokio.ctf");
    trace_run("tokio-spans", "1e-3", &trace);
    check_stacks(&trace, "tokio_spans::");
}

/// A stack's frames as a profile names them (`thread name`, `span description (file:line)`,
/// functions), root first, joined by `;` as a folded stack's.
fn folded_stack<'a>(root_first: impl Iterator<Item = &'a str>) -> String {
    root_first.map(|name| name.replace(';', ",")).collect::<Vec<_>>().join(";")
}

/// The stacks of `hotspots --stacks` of `trace`, with their bytes, each as [`folded_stack`].
fn hotspots_folded(trace: &Path) -> Vec<(String, f64)> {
    let args = ["hotspots", "--stacks", "--top", "10000", "--frames", "10000", "--format", "json", &p(trace)];
    let doc: serde_json::Value = serde_json::from_str(&memtrace_ok(Path::new("."), &args)).unwrap();
    let name = |f: &serde_json::Value| {
        let (function, file) = (f["function"].as_str().unwrap(), f["file"].as_str().unwrap());
        match file.strip_prefix("<span>") {
            _ if file == "<thread>" => format!("thread {function}"),
            Some(site) => format!("span {function} ({site}:{})", f["line"]),
            None => function.to_string(),
        }
    };
    let sites = doc["sites"].as_array().unwrap().iter();
    sites
        .map(|s| {
            let names: Vec<String> = s["frames"].as_array().unwrap().iter().map(name).collect();
            (folded_stack(names.iter().rev().map(String::as_str)), s["estimate"]["bytes"].as_f64().unwrap())
        })
        .collect()
}

/// The stacks of the pprof profile at `profile` as `go tool pprof -traces` shows them, each as
/// [`folded_stack`]; `None` without go.
fn pprof_traces(profile: &Path) -> Option<BTreeSet<String>> {
    let out = Command::new("go").args(["tool", "pprof", "-traces"]).arg(profile).output().ok()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    // Each sample: `-----------+---…`, then its value and its leaf, then a caller a line.
    let mut stacks = BTreeSet::new();
    for trace in text.split("-----------+").skip(1) {
        let mut leaf_first: Vec<&str> = Vec::new();
        for line in trace.lines().skip(1).filter(|l| !l.trim().is_empty()) {
            let name = if leaf_first.is_empty() { line.trim_start().split_once(' ').unwrap().1 } else { line };
            // An inlined function is marked so; folded stacks have no such mark.
            leaf_first.push(name.trim().trim_end_matches(" (inline)"));
        }
        if !leaf_first.is_empty() {
            stacks.insert(folded_stack(leaf_first.into_iter().rev()));
        }
    }
    Some(stacks)
}

/// The tokio example's stacks read the same in every output: `memtrace hotspots --stacks` and
/// `go tool pprof -traces` of `memtrace pprof` of its trace, and its live allocs profile taken at
/// its end, folded and as pprof (a stack sampled after it is only in the trace; the stacks of
/// nine tenths of the bytes are in both). `go tool pprof -top` of both profiles shows the two
/// request handlers (async bodies) as two functions.
#[test]
fn a_programs_stacks_have_the_same_names_in_every_output() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("tokio.ctf");
    let out = Command::new(example("tokio-spans"))
        .arg(dir.path())
        .env("MEMTRACE_FILE", &trace)
        .env("MEMTRACE_RATE", "1e-3")
        .output()
        .expect("run the example");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let folded_text = std::fs::read_to_string(dir.path().join("allocs.folded")).unwrap();
    let live: BTreeSet<String> = folded_text.lines().map(|l| l.rsplit_once(' ').unwrap().0.to_string()).collect();
    let hotspots = hotspots_folded(&trace);
    let in_trace: BTreeSet<String> = hotspots.iter().map(|(s, _)| s.clone()).collect();
    assert!(live.iter().any(|s| s.starts_with("thread tokio-rt-worker;span http_request{")), "{folded_text}");
    for stack in &live {
        assert!(in_trace.contains(stack), "live, not in hotspots --stacks: {stack}\nthere: {in_trace:#?}");
    }
    let total: f64 = hotspots.iter().map(|(_, b)| b).sum();
    let shared: f64 = hotspots.iter().filter(|(s, _)| live.contains(s)).map(|(_, b)| b).sum();
    assert!(shared >= 0.9 * total, "{shared} of {total} bytes on stacks of the live profile:\n{folded_text}");
    let profile = trace.with_extension("pb.gz");
    memtrace_ok(Path::new("."), &["pprof", &p(&trace), "-o", &p(&profile)]);
    let Some(cli_traces) = pprof_traces(&profile) else {
        skip("go is not installed (apt-get install golang-go)");
        return;
    };
    assert_eq!(cli_traces, in_trace, "memtrace pprof (go tool pprof -traces), hotspots --stacks");
    let live_profile = dir.path().join("allocs.pb.gz");
    assert_eq!(pprof_traces(&live_profile).unwrap(), live, "the live pprof, the live folded stacks");
    for profile in [&profile, &live_profile] {
        let rows = crate::util::cli::pprof_top(profile, &["-sample_index=alloc_space"]).unwrap();
        for handler in ["tokio_spans::list_users::", "tokio_spans::thumbnail::"] {
            let named: Vec<&str> =
                rows.iter().map(|(_, name)| name.as_str()).filter(|n| n.starts_with(handler)).collect();
            assert_eq!(named.len(), 1, "{handler} in {}: {rows:?}", profile.display());
        }
    }
    // The profile's header names the tool as the command line's messages do.
    let top = Command::new("go").args(["tool", "pprof", "-top"]).arg(&live_profile).output().unwrap();
    let top = String::from_utf8_lossy(&top.stdout);
    assert!(top.lines().any(|l| l.starts_with("memtrace: estimated from sampled allocations")), "{top}");
}
