//! Shared by the `cli_*` tests: paths of the upstream test traces, a builder of small traces
//! with a known answer (written with the crate's `Writer`), running the `memtrace` binary,
//! and golden-file comparison (`UPDATE_GOLDEN=1` rewrites the expected files).

use std::fs::File;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use memtrace_rs::analysis::{Analysis, Options};
use memtrace_rs::trace::Location;
use memtrace_rs::trace::{AllocSource, Info, NewAlloc, ObjectId, Reader, Writer};

/// The upstream traces under `tests/data`, by stem.
pub const UPSTREAM: [&str; 3] = ["ocamlopt", "ocamlopt-v2", "lists_and_sets-v1"];

/// The analysis (with stacks) of an upstream trace, computed once per test binary.
pub fn upstream(name: &str) -> &'static Analysis {
    static CACHE: [OnceLock<Analysis>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let i = UPSTREAM.iter().position(|n| *n == name).expect("an upstream trace");
    CACHE[i]
        .get_or_init(|| Analysis::run(&data(&format!("{name}.ctf")), &Options { stacks: true, live_at: None }).unwrap())
}

/// The `tests/data` directory.
pub fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// Path of a file under `tests/data`.
pub fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

/// Compare `actual` with `tests/golden/<name>`, or rewrite it when `UPDATE_GOLDEN` is set.
pub fn golden(name: &str, actual: &[u8]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1 to create it)", path.display()));
    if expected != actual {
        panic!(
            "{name} differs from its golden file {}\n--- expected\n{}\n--- actual\n{}",
            path.display(),
            String::from_utf8_lossy(&expected),
            String::from_utf8_lossy(actual)
        );
    }
}

/// Trace start time of built traces.
pub const START: u64 = 1_700_000_000_000_000;

/// Info of built traces: rate 0.01 and 64-bit words, so one sample stands for 800 bytes.
pub fn info() -> Info {
    Info {
        sample_rate: 0.01,
        word_size: 64,
        executable_name: b"/usr/bin/test-app".to_vec(),
        host_name: b"testhost".to_vec(),
        runtime_params: b"memtrace-rs test".to_vec(),
        pid: 42,
        initial_domain: 0,
        start_time: START,
        context: Some(b"built by the test".to_vec()),
    }
}

/// Bytes one sample stands for in built traces.
pub const SAMPLE_BYTES: f64 = 800.0;

/// Location codes of built traces and the function each names.
pub const FUNCTIONS: [(u64, &str); 8] = [
    (1, "main"),
    (2, "app::run"),
    (3, "app::load"),
    (4, "app::parse"),
    (5, "alloc::raw_vec::RawVec<T,A>::grow_one"),
    (6, "__rust_alloc"),
    (7, "<alloc::string::String as core::clone::Clone>::clone"),
    (8, "hashbrown::raw::RawTable<T,A>::reserve_rehash"),
];

/// The location list of a code of [`FUNCTIONS`].
pub fn locations(code: u64) -> Arc<[Location]> {
    let name = FUNCTIONS.iter().find(|(c, _)| *c == code).map_or("unknown", |(_, n)| n);
    Arc::from(vec![Location {
        filename: b"src/app.rs".to_vec().into(),
        line: code as u32 * 10,
        start_char: 5,
        end_char: 20,
        defname: name.as_bytes().to_vec().into(),
    }])
}

/// A one-frame location list: `function` at line 1 of `file`.
pub fn location_at(function: &str, file: &str) -> Arc<[Location]> {
    location_on_line(function, file, 1)
}

/// A one-frame location list: `function` at `line` of `file`.
pub fn location_on_line(function: &str, file: &str, line: u32) -> Arc<[Location]> {
    Arc::from(vec![Location {
        filename: file.as_bytes().into(),
        line,
        start_char: 0,
        end_char: 0,
        defname: function.as_bytes().into(),
    }])
}

/// Builds a trace event by event.
pub struct TraceBuilder {
    writer: Writer<Vec<u8>>,
}

impl TraceBuilder {
    pub fn new() -> TraceBuilder {
        TraceBuilder { writer: Writer::new(Vec::new(), &info()).unwrap() }
    }

    /// An allocation at `at` µs after the start, with `stack` innermost first.
    pub fn alloc(&mut self, at: u64, nsamples: u64, stack: &[u64]) -> ObjectId {
        self.alloc_with(at, nsamples, stack, locations)
    }

    /// An allocation at `at` µs after the start, with `stack` innermost first and its
    /// codes' locations given by `locations`.
    pub fn alloc_with(
        &mut self,
        at: u64,
        nsamples: u64,
        stack: &[u64],
        locations: impl FnMut(u64) -> Arc<[Location]>,
    ) -> ObjectId {
        let alloc = NewAlloc { length: nsamples, nsamples, source: AllocSource::External, callstack: stack, drop: 0 };
        self.writer.put_alloc(0, START + at, &alloc, locations).unwrap()
    }

    /// A free at `at` µs after the start.
    pub fn free(&mut self, at: u64, id: ObjectId) {
        self.writer.put_collect(0, START + at, id).unwrap();
    }

    pub fn finish(self) -> Vec<u8> {
        self.writer.close().unwrap()
    }
}

/// Analyse a trace held in memory.
pub fn analyse(trace: &[u8], options: Options) -> Analysis {
    Analysis::from_reader(Reader::new(Cursor::new(trace)).unwrap(), &options, |_| {}).unwrap()
}

/// Stacks of the known-answer trace (innermost first).
pub const PARSE: [u64; 5] = [6, 5, 4, 2, 1];
pub const LOAD: [u64; 4] = [7, 3, 2, 1];
pub const REHASH: [u64; 4] = [8, 3, 2, 1];

/// The known-answer trace; see `cli_analysis.rs` for the expected figures.
///
/// | t (µs) | event               | live samples (parse, load) | total |
/// |--------|---------------------|----------------------------|-------|
/// | 10     | a = alloc 2 @ parse | 2, 0                       | 2     |
/// | 20     | b = alloc 3 @ load  | 2, 3                       | 5     |
/// | 30     | free a              | 0, 3                       | 3     |
/// | 40     | c = alloc 5 @ parse | 5, 3                       | 8 (peak) |
/// | 50     | free b              | 5, 0                       | 5     |
/// | 60     | free c              | 0, 0                       | 0     |
/// | 70     | d = alloc 1 @ rehash| rehash 1                   | 1     |
pub fn known_trace() -> Vec<u8> {
    let mut t = TraceBuilder::new();
    let a = t.alloc(10, 2, &PARSE);
    let b = t.alloc(20, 3, &LOAD);
    t.free(30, a);
    let c = t.alloc(40, 5, &PARSE);
    t.free(50, b);
    t.free(60, c);
    t.alloc(70, 1, &REHASH);
    t.finish()
}

/// A second version of the known-answer program for `diff`: `parse` allocates more, `load`
/// stops allocating, `run` allocates directly.
pub fn known_trace_new() -> Vec<u8> {
    let mut t = TraceBuilder::new();
    let a = t.alloc(10, 9, &PARSE);
    t.alloc(20, 1, &REHASH);
    t.alloc(30, 4, &[2, 1]);
    t.free(40, a);
    t.finish()
}

/// How long one run of the binary may take before it counts as hung (generous: the test
/// machine may be busy, and the binary is a debug build).
const TIMEOUT: Duration = Duration::from_secs(60);

/// What one run of the binary did.
pub struct Run {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Run `memtrace args` in the directory `cwd`, killing it (and failing) if it takes longer
/// than [`TIMEOUT`]. Output goes to files, so a full pipe cannot stall the child.
pub fn memtrace(cwd: &Path, args: &[&str]) -> Run {
    let outputs = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (outputs.path().join("stdout"), outputs.path().join("stderr"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_memtrace"))
        .args(args)
        .current_dir(cwd)
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
        std::thread::sleep(Duration::from_millis(5));
    };
    let read = |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap()).into_owned();
    Run { status, stdout: read(&out_path), stderr: read(&err_path) }
}

/// The stdout of `memtrace args` run in `cwd`, which must succeed.
pub fn memtrace_ok(cwd: &Path, args: &[&str]) -> String {
    let run = memtrace(cwd, args);
    assert!(run.status.success(), "memtrace {args:?}: {:?}\n{}", run.status, run.stderr);
    run.stdout
}

/// Write `trace` to `dir/name`; returns its path.
pub fn write_trace(dir: &Path, name: &str, trace: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, trace).unwrap();
    path
}

/// `go tool pprof -top` of the profile at `profile` with `args`: its rows as `(flat, name)`,
/// or `None` when `go` is not installed.
pub fn pprof_top(profile: &Path, args: &[&str]) -> Option<Vec<(String, String)>> {
    let out = std::process::Command::new("go").args(["tool", "pprof", "-top"]).args(args).arg(profile).output().ok()?;
    assert!(out.status.success(), "go tool pprof: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let rows = text.lines().skip_while(|l| !l.trim_start().starts_with("flat")).skip(1);
    // "      flat  flat%   sum%        cum   cum%  name", the name possibly with spaces.
    Some(
        rows.map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            (fields[0].to_string(), fields[5..].join(" "))
        })
        .collect(),
    )
}

/// The JSON document a report page at `html` embeds (`report/data.rs`).
pub fn report_data(html: &Path) -> serde_json::Value {
    let html = std::fs::read_to_string(html).unwrap();
    let json = &html[html.find("id=\"report-data\"").unwrap()..];
    let json = &json[json.find('>').unwrap() + 1..json.find("</script>").unwrap()];
    serde_json::from_str(json).unwrap()
}
