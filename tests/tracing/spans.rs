//! Span and thread attribution: children that trace a tokio program under `MemtraceLayer`,
//! and threads named and unnamed, read back by their `<span>` and `<thread>` frames.

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::ThreadId;

use memtrace_rs::trace::{SPAN_FILE_PREFIX, THREAD_FILE};
use memtrace_rs::{start_tracing, trace_if_requested, MemtraceLayer, TraceConfig};
use tracing::{info_span, Instrument};

use super::{assert_close, memtrace_messages, run, temp_path, Allocation, Trace, SECOND_FILE_VAR, SIGMAS};

// ---------------------------------------------------------------------------------------------
// The children

/// Runs a `spans-*` role.
pub(super) fn child_role(role: &str) {
    use tracing_subscriber::layer::SubscriberExt;
    let layer = MemtraceLayer::new().with_field("kind").with_field("id");
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();
    match role {
        "spans-tokio" => tokio_program(),
        "spans-threads" => threads_program(),
        "spans-writer-start" => writer_start_program(),
        "spans-frame-cap" => frame_cap_program(),
        other => panic!("unknown role {other}"),
    }
}

const WORKERS: usize = 4;
const ROUNDS: usize = 500;
const SMALL_TASKS: usize = 64;
const SMALL_SIZE: usize = 1000;
const LARGE_TASKS: usize = 32;
const LARGE_SIZE: usize = 4000;
const OUTSIDE_COUNT: usize = 2000;
const OUTSIDE_SIZE: usize = 5000;
const LOOKUPS: usize = 2000;
const LOOKUP_SIZE: usize = 8000;

fn tokio_program() {
    let guard = trace_if_requested();
    outside_any_span();
    static WORKER: AtomicUsize = AtomicUsize::new(0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .thread_name_fn(|| format!("worker-{}", WORKER.fetch_add(1, Ordering::Relaxed)))
        .build()
        .unwrap();
    let moved = runtime.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..SMALL_TASKS + LARGE_TASKS {
            let task = if i % 3 == 2 && i / 3 < LARGE_TASKS {
                tokio::spawn(request(LARGE_SIZE, true).instrument(info_span!("request", kind = "large")))
            } else {
                tokio::spawn(request(SMALL_SIZE, false).instrument(info_span!("request", kind = "small")))
            };
            tasks.push(task);
        }
        let mut moved = 0;
        for task in tasks {
            moved += usize::from(task.await.unwrap() > 1);
        }
        moved
    });
    assert!(moved > 0, "no task was polled by two workers");
    drop(runtime);
    for id in 0..LOOKUPS {
        let _span = info_span!("lookup", id).entered();
        black_box(Vec::<u8>::with_capacity(LOOKUP_SIZE));
    }
    drop(guard);
}

#[inline(never)]
fn outside_any_span() {
    for _ in 0..OUTSIDE_COUNT {
        black_box(Vec::<u8>::with_capacity(OUTSIDE_SIZE));
    }
}

/// A request task: `ROUNDS` blocks of `size` bytes (inside a nested `encode` span if `nested`),
/// yielding between them. Returns how many worker threads polled it.
async fn request(size: usize, nested: bool) -> usize {
    let mut seen: [Option<ThreadId>; WORKERS] = [None; WORKERS];
    for _ in 0..ROUNDS {
        let thread = std::thread::current().id();
        if let Some(free) = seen.iter().position(|s| s.is_none_or(|s| s == thread)) {
            seen[free] = Some(thread);
        }
        if nested {
            let _encode = info_span!("encode").entered();
            black_box(Vec::<u8>::with_capacity(size));
        } else {
            black_box(Vec::<u8>::with_capacity(size));
        }
        tokio::task::yield_now().await;
    }
    seen.iter().flatten().count()
}

const NAMED: &str = "a-thread-name-longer-than-the-kernel-keeps";
/// A thread name and a span field value that a terminal would obey, and a NUL, which the
/// format cannot carry in a string.
const HOSTILE_THREAD: &str = "evil\x1b]0;PWNED\x07\u{202e}";
const HOSTILE_KIND: &str = "a\0b\x1b[2J";

/// Sessions at rate 1 (every allocation sampled), each to its own file, while their writer
/// threads start: what a new writer allocates before its code runs must not be sampled (at
/// this rate a start waits for its writer; below 1e-3 it does not, and the sampler skips the
/// starting writer, as its unit tests check).
fn writer_start_program() {
    let prefix = std::env::var_os("MEMTRACE_FILE").unwrap();
    for session in 0..WRITER_START_SESSIONS {
        let mut path = prefix.clone();
        path.push(format!(".{session}"));
        let guard = start_tracing(TraceConfig::new(path).rate(1.0)).unwrap();
        allocate_here();
        guard.finish().unwrap();
    }
}

const WRITER_START_SESSIONS: usize = 20;

/// The frame cap of a `spans-frame-cap` child's session.
const FRAME_CAP: usize = 4;
/// The spans its allocations are inside.
const NESTED_SPANS: usize = 3;

/// Allocations deep in a stack, inside [`NESTED_SPANS`] spans, every one sampled, in a session
/// recording [`FRAME_CAP`] frames.
fn frame_cap_program() {
    #[inline(never)]
    fn deep(depth: usize) -> usize {
        if depth == 0 {
            return black_box(Vec::<u8>::with_capacity(100)).capacity();
        }
        deep(black_box(depth - 1)) + 1
    }
    let path = std::env::var_os("MEMTRACE_FILE").unwrap();
    let guard = start_tracing(TraceConfig::new(path).rate(1.0).frame_cap(FRAME_CAP)).unwrap();
    let _outer = info_span!("outer").entered();
    let _middle = info_span!("middle").entered();
    let _inner = info_span!("inner").entered();
    for _ in 0..100 {
        black_box(deep(20));
    }
    drop((_inner, _middle, _outer));
    guard.finish().unwrap();
}

fn threads_program() {
    // libtest runs the role on a thread of its own, whose kernel name (`child_role`) the
    // threads it starts inherit: take the process's, as a program's main thread has.
    let process = std::fs::read("/proc/self/comm").unwrap();
    let process = std::ffi::CString::new(process.trim_ascii_end()).unwrap();
    // SAFETY: PR_SET_NAME reads a NUL-terminated string.
    unsafe { libc::prctl(libc::PR_SET_NAME, process.as_ptr()) };
    // Its std name, `child_role`, is registered with its first span.
    let _role = info_span!("role").entered();
    let guard = trace_if_requested();
    allocate_here();
    let spawn = |name: Option<&str>, in_span: bool| {
        let builder = std::thread::Builder::new();
        let builder = match name {
            Some(name) => builder.name(name.to_owned()),
            None => builder,
        };
        builder
            .spawn(move || {
                let _span = in_span.then(|| info_span!("job").entered());
                allocate_here();
            })
            .unwrap()
            .join()
            .unwrap();
    };
    spawn(Some(NAMED), true);
    spawn(Some("short-name"), false);
    spawn(None, false);
    spawn(None, true);
    std::thread::Builder::new()
        .name(HOSTILE_THREAD.to_owned())
        .spawn(|| {
            let _span = info_span!("job", kind = HOSTILE_KIND).entered();
            allocate_here();
        })
        .unwrap()
        .join()
        .unwrap();
    drop(guard);
    let second = std::env::var(SECOND_FILE_VAR).unwrap();
    let guard = start_tracing(TraceConfig::new(second).rate(0.01).thread_frames(false)).unwrap();
    allocate_here();
    drop(guard);
}

#[inline(never)]
fn allocate_here() {
    for _ in 0..1000 {
        black_box(Vec::<u8>::with_capacity(1000));
    }
}

// ---------------------------------------------------------------------------------------------
// Reading spans and threads back

/// The pseudo-frames of a sample.
struct Attribution {
    thread: Option<String>,
    /// Span descriptions, outermost first.
    spans: Vec<String>,
}

fn attribution(trace: &Trace, a: &Allocation) -> Attribution {
    let mut thread = None;
    let mut spans = Vec::new();
    for (i, frame) in trace.frames(a).enumerate() {
        let [location] = frame else { continue };
        let file = location.filename_str();
        if file == THREAD_FILE {
            assert_eq!(i, 0, "the thread is not the outermost frame");
            thread = Some(location.defname_str().into_owned());
        } else if let Some(site) = file.strip_prefix(SPAN_FILE_PREFIX) {
            assert_eq!(i, spans.len() + usize::from(thread.is_some()), "a span below a code frame");
            assert!(site.ends_with("tests/tracing/spans.rs"), "{site}");
            spans.push(location.defname_str().into_owned());
        }
    }
    Attribution { thread, spans }
}

impl Trace {
    /// Samples and estimated bytes of the allocations inside the span described `span`.
    fn in_span(&self, span: &str) -> (u64, f64) {
        let samples = self
            .allocs
            .values()
            .filter(|a| attribution(self, a).spans.iter().any(|s| s == span))
            .map(|a| a.nsamples)
            .sum();
        (samples, self.info.bytes_for_samples(samples))
    }
}

fn tokio_trace(name: &str, rate: Option<&str>) -> Trace {
    let path = temp_path(name);
    let mut env = vec![("MEMTRACE_FILE", path.to_str().unwrap())];
    env.extend(rate.map(|r| ("MEMTRACE_RATE", r)));
    let out = run("spans-tokio", &env);
    assert!(out.status.success());
    assert!(memtrace_messages(&out).is_empty(), "{:?}", memtrace_messages(&out));
    let trace = Trace::read(&path);
    let _ = std::fs::remove_file(&path);
    trace
}

const SMALL_BYTES: u64 = (SMALL_TASKS * ROUNDS * SMALL_SIZE) as u64;
const LARGE_BYTES: u64 = (LARGE_TASKS * ROUNDS * LARGE_SIZE) as u64;

#[test]
fn tokio_requests_are_attributed_to_their_spans() {
    let trace = tokio_trace("spans-tokio", Some("1e-3"));
    assert!(trace.warnings.is_empty(), "{:?}", trace.warnings);
    assert_close("request{kind=small}", trace.in_span("request{kind=small}").1, SMALL_BYTES);
    assert_close("request{kind=large}", trace.in_span("request{kind=large}").1, LARGE_BYTES);
    assert_close("encode", trace.in_span("encode").1, LARGE_BYTES);

    let mut small_workers = std::collections::HashSet::new();
    let mut lookups = std::collections::HashSet::new();
    for a in trace.allocs.values() {
        let Attribution { thread, spans } = attribution(&trace, a);
        let thread = thread.expect("no thread frame");
        match spans.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            // Nested spans, outermost first.
            [_, "encode"] => assert_eq!(spans[0], "request{kind=large}"),
            ["request{kind=large}"] => {}
            ["request{kind=small}"] => {
                assert!(thread.starts_with("worker-"), "{thread}");
                small_workers.insert(thread.clone());
            }
            [lookup] if lookup.starts_with("lookup") => {
                lookups.insert(lookup.to_owned());
            }
            [] => {}
            ref other => panic!("unexpected spans {other:?}"),
        }
        if trace.has_function(a, "::outside_any_span") {
            assert!(spans.is_empty(), "{spans:?}");
            // libtest's thread, which runs the role.
            assert_eq!(thread, "child_role");
        }
    }
    assert!(small_workers.len() > 1, "one worker ran every request: {small_workers:?}");
    assert!(trace.at_site("::outside_any_span").count() > 100);
    // A span whose field takes a value per span: within its cap, the rest as `lookup{…}`.
    assert!(lookups.contains("lookup{…}"), "{lookups:?}");
    assert!(lookups.len() <= 64 + 1, "{} lookup descriptions", lookups.len());
    assert!(lookups.iter().any(|l| l.starts_with("lookup{id=")), "{lookups:?}");

    // The span's location is its call site.
    let small = trace.locations.values().flatten().find(|l| l.defname_str() == "request{kind=small}").unwrap();
    let line = include_str!("spans.rs").lines().nth(small.line as usize - 1).unwrap();
    assert!(line.contains(r#"info_span!("request", kind = "small")"#), "{small:?}: {line}");
}

/// At the default rate each span's sample count is within [`SIGMAS`] standard deviations of
/// the number its bytes call for (a Poisson count).
#[test]
fn tokio_span_estimates_at_the_default_rate_are_within_their_interval() {
    let trace = tokio_trace("spans-tokio-default", None);
    for (span, bytes) in [("request{kind=small}", SMALL_BYTES), ("request{kind=large}", LARGE_BYTES)] {
        let expected = bytes as f64 * trace.info.sample_rate / 8.0;
        let (samples, _) = trace.in_span(span);
        let slack = SIGMAS * expected.sqrt() + 1.0;
        assert!(
            (samples as f64 - expected).abs() <= slack,
            "{span}: {samples} samples, expected {expected:.0} ± {slack:.0}"
        );
    }
}

#[test]
fn the_tracer_threads_starts_are_never_sampled() {
    let prefix = temp_path("spans-writer-start");
    let out = run("spans-writer-start", &[("MEMTRACE_FILE", prefix.to_str().unwrap())]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for session in 0..WRITER_START_SESSIONS {
        let path = prefix.with_extension(format!("ctf.{session}"));
        let trace = Trace::read(&path);
        let threads: Vec<(String, &Allocation)> =
            trace.allocs.values().filter_map(|a| Some((attribution(&trace, a).thread?, a))).collect();
        assert!(!threads.is_empty(), "session {session} sampled nothing");
        // Every sample names its thread: none escapes the check below.
        assert_eq!(threads.len(), trace.allocs.len(), "session {session}: samples without a thread");
        // Nor the symbols thread's (`memtrace-symbol`), started at the first sample, while
        // sampling is on. Only the program's thread allocates: any other name (a tracer
        // thread's own, or the one it inherits before it is named) is a tracer's allocation.
        if let Some((thread, alloc)) = threads.iter().find(|(t, _)| t != "child_role") {
            let frames: Vec<String> =
                trace.frames(alloc).flatten().map(|l| format!("{} {}", l.defname_str(), l.filename_str())).collect();
            panic!("session {session}: an allocation on {thread} sampled, at {frames:#?}");
        }
        let _ = std::fs::remove_file(&path);
    }
}

#[test]
fn threads_are_named_and_the_thread_frame_can_be_turned_off() {
    let (path, second) = (temp_path("spans-threads"), temp_path("spans-threads-off"));
    let out = run(
        "spans-threads",
        &[
            ("MEMTRACE_FILE", path.to_str().unwrap()),
            ("MEMTRACE_RATE", "0.01"),
            (SECOND_FILE_VAR, second.to_str().unwrap()),
        ],
    );
    assert!(out.status.success());
    let trace = Trace::read(&path);
    let mut threads: Vec<String> = trace
        .allocs
        .values()
        .filter_map(|a| attribution(&trace, a).thread)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let unnamed: Vec<_> = threads
        .iter()
        .filter(|t| t.strip_prefix("thread-").is_some_and(|id| id.parse::<u32>().is_ok()))
        .cloned()
        .collect();
    assert_eq!(unnamed.len(), 2, "{threads:?}");
    threads.retain(|t| !unnamed.contains(t));
    assert_eq!(threads, ["a-thread-name-longer-than-the-kernel-keeps", "child_role", HOSTILE_THREAD, "short-name"]);
    assert!(trace.allocs.values().all(|a| attribution(&trace, a).thread.is_some()));
    // The trace keeps the text as it was (readers show it inert), but for the NUL, written as
    // the `\x00` readers show for one instead of ending the description.
    let hostile = trace.allocs.values().filter(|a| attribution(&trace, a).thread.as_deref() == Some(HOSTILE_THREAD));
    let spans: std::collections::BTreeSet<String> = hostile.flat_map(|a| attribution(&trace, a).spans).collect();
    assert_eq!(spans, ["job{kind=a\\x00b\x1b[2J}".to_owned()].into(), "{spans:?}");

    let trace = Trace::read(&second);
    assert!(trace.allocs.len() > 100);
    assert!(trace.allocs.values().all(|a| attribution(&trace, a).thread.is_none()));
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&second);
}

/// The frame cap counts frames of code: the pseudo-frames (spans, the thread) come on top.
#[test]
fn the_frame_cap_counts_code_frames_and_pseudo_frames_come_on_top() {
    let path = temp_path("spans-frame-cap");
    let out = run("spans-frame-cap", &[("MEMTRACE_FILE", path.to_str().unwrap())]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let trace = Trace::read(&path);
    let mut most_code_frames = 0;
    for a in trace.allocs.values().filter(|a| attribution(&trace, a).spans.len() == NESTED_SPANS) {
        let pseudo = NESTED_SPANS + 1;
        assert!(a.codes.len() <= FRAME_CAP + pseudo, "{} frames", a.codes.len());
        most_code_frames = most_code_frames.max(a.codes.len() - pseudo);
    }
    assert_eq!(most_code_frames, FRAME_CAP);
    let _ = std::fs::remove_file(&path);
}
