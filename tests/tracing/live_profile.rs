//! Live heap profiles: a child with known live, freed and peak sites (and threads that keep
//! allocating) serves its profiles over HTTP, and `go tool pprof` reads them; the estimates
//! must be within `SIGMAS` (6) standard deviations of the truth, with the thread's and (with the `tracing` feature) the
//! span's frames at the root. Also sessions for profiles only (from the environment
//! and from code), the framework helper, bad requests to the endpoint, and a child of far more
//! distinct stacks than the profile keeps.

use crate::skip::skip;
use std::collections::HashMap;
use std::hint::black_box;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memtrace_rs::{ProfileKind, TraceConfig};

use super::{child, Trace, SIGMAS};

/// The sampling rate of these children: about one sample per 8 KB. The live sites' blocks are
/// large (sampled blocks of less than 64 KiB come from a pool of bounded size classes), and the
/// busy threads allocate a few MB/s: nothing is dropped, which would bias the estimates.
pub(super) const RATE: f64 = 1e-3;

const LIVE_COUNT: usize = 200;
const LIVE_SIZE: usize = 100_000;
#[inline(never)]
fn site_live_big() -> Vec<Vec<u8>> {
    (0..LIVE_COUNT).map(|_| black_box(Vec::with_capacity(LIVE_SIZE))).collect()
}
/// Its truth.
const LIVE_BYTES: f64 = held_blocks_bytes(LIVE_COUNT, LIVE_SIZE);

/// The truth of a site that returns `count` blocks of `size` bytes: the blocks, and the vector
/// that holds their vectors.
const fn held_blocks_bytes(count: usize, size: usize) -> f64 {
    (count * size + count * std::mem::size_of::<Vec<u8>>()) as f64
}

const THREAD_COUNT: usize = 80;
const THREAD_SIZE: usize = 100_000;
#[inline(never)]
fn site_kept_by_thread() -> Vec<Vec<u8>> {
    (0..THREAD_COUNT).map(|_| black_box(Vec::with_capacity(THREAD_SIZE))).collect()
}
const THREAD_BYTES: f64 = held_blocks_bytes(THREAD_COUNT, THREAD_SIZE);
/// The name of the thread that allocates at `site_kept_by_thread`: its thread frame.
const KEEPER: &str = "live-keeper";
/// The span it allocates in (with the `tracing` feature): its span frame.
#[cfg(feature = "tracing")]
const KEEPING_SPAN: &str = "keeping";

/// `site_kept_by_thread`, in a span when spans are recorded.
fn kept_by_thread() -> Vec<Vec<u8>> {
    #[cfg(feature = "tracing")]
    let _span = tracing::info_span!("keeping").entered();
    site_kept_by_thread()
}

/// Record spans (with the `tracing` feature).
fn record_spans() {
    #[cfg(feature = "tracing")]
    {
        use tracing_subscriber::layer::SubscriberExt;
        let layer = memtrace_rs::MemtraceLayer::new();
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();
    }
}

const CHURNED_COUNT: usize = 100_000;
const CHURNED_SIZE: usize = 1_000;
#[inline(never)]
fn site_churned() {
    for _ in 0..CHURNED_COUNT {
        black_box(Vec::<u8>::with_capacity(CHURNED_SIZE));
    }
}
const CHURNED_BYTES: f64 = (CHURNED_COUNT * CHURNED_SIZE) as f64;

const PEAK_COUNT: usize = 400;
const PEAK_SIZE: usize = 100_000;
#[inline(never)]
fn site_peak() -> Vec<Vec<u8>> {
    (0..PEAK_COUNT).map(|_| black_box(Vec::with_capacity(PEAK_SIZE))).collect()
}
const PEAK_BYTES: f64 = held_blocks_bytes(PEAK_COUNT, PEAK_SIZE);

const DELTA_COUNT: usize = 30_000;
const DELTA_SIZE: usize = 1_000;
#[inline(never)]
fn site_delta() {
    for _ in 0..DELTA_COUNT {
        black_box(Vec::<u8>::with_capacity(DELTA_SIZE));
    }
}
const DELTA_BYTES: f64 = (DELTA_COUNT * DELTA_SIZE) as f64;

/// Small blocks allocated and freed by the threads that keep allocating.
#[inline(never)]
fn site_busy(round: usize) {
    black_box(vec![0u8; 64 + round % 4096]);
}

/// The known program: the live, thread-kept, churned and peak sites, with two threads that keep
/// allocating until it ends. The live blocks, and a stop for the busy threads.
fn known_program() -> (Vec<Vec<Vec<u8>>>, impl FnOnce()) {
    let stop = Arc::new(AtomicBool::new(false));
    let busy: Vec<_> = (0..2)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut round = 0;
                while !stop.load(Ordering::Relaxed) {
                    site_busy(round);
                    round += 1;
                    if round % 16 == 0 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            })
        })
        .collect();
    let live = site_live_big();
    let kept = std::thread::Builder::new().name(KEEPER.into()).spawn(kept_by_thread).unwrap().join().unwrap();
    site_churned();
    drop(black_box(site_peak()));
    let stop_busy = move || {
        stop.store(true, Ordering::Relaxed);
        busy.into_iter().for_each(|t| t.join().unwrap());
    };
    (vec![live, kept], stop_busy)
}

/// The child of the endpoint's tests: the known program, traced as the environment says; then
/// `ready` on stderr, and `delta` on stdin runs `site_delta`, until stdin closes.
pub(super) fn serving_child() {
    record_spans();
    let guard = memtrace_rs::trace_if_requested();
    assert!(guard.is_some());
    assert!(std::env::var_os("MEMTRACE_HTTP").is_none(), "variable not cleared");
    let (live, stop_busy) = known_program();
    eprintln!("live: ready");
    for line in std::io::stdin().lock().lines() {
        if line.unwrap() == "delta" {
            site_delta();
            eprintln!("live: delta done");
        }
    }
    stop_busy();
    drop(guard);
    drop(live);
}

/// The child of the in-process test: a session for profiles only started from code; it writes
/// its profiles to `MEMTRACE_TEST_DIR` (heap.pb.gz, allocs.pb.gz, delta.pb.gz, peak.pb.gz,
/// heap.folded, response.pb.gz).
pub(super) fn api_child() {
    let dir = PathBuf::from(std::env::var_os("MEMTRACE_TEST_DIR").unwrap());
    assert!(matches!(memtrace_rs::profile(ProfileKind::Heap), Err(memtrace_rs::ProfileError::NotRunning)));
    record_spans();
    let guard = memtrace_rs::start_tracing(TraceConfig::profile_only().rate(RATE)).unwrap();
    let (live, stop_busy) = known_program();
    let write = |name: &str, bytes: &[u8]| std::fs::write(dir.join(name), bytes).unwrap();
    write("heap.pb.gz", &memtrace_rs::profile(ProfileKind::Heap).unwrap().pprof());
    write("allocs.pb.gz", &memtrace_rs::profile(ProfileKind::Allocs).unwrap().pprof());
    write("peak.pb.gz", &memtrace_rs::profile(ProfileKind::Peak).unwrap().pprof());
    write("heap.folded", memtrace_rs::profile(ProfileKind::Heap).unwrap().folded().as_bytes());
    let during = std::thread::spawn(|| {
        std::thread::sleep(Duration::from_millis(300));
        site_delta();
    });
    write("delta.pb.gz", &memtrace_rs::profile_delta(ProfileKind::Allocs, Duration::from_secs(2)).unwrap().pprof());
    during.join().unwrap();
    let response = memtrace_rs::http_response("/debug/pprof/heap");
    assert_eq!((response.status, response.content_type), (200, "application/octet-stream"));
    write("response.pb.gz", &response.body);
    assert_eq!(memtrace_rs::http_response("/debug/pprof/nothing").status, 404);
    assert_eq!(memtrace_rs::http_response("/debug/pprof/heap?seconds=100000").status, 400);
    stop_busy();
    let stats = guard.finish().unwrap();
    // Dropped samples would bias the estimates.
    assert!(stats.samples_written > 0 && stats.samples_dropped() == 0, "{stats:?}");
    drop(live);
    assert!(matches!(memtrace_rs::profile(ProfileKind::Heap), Err(memtrace_rs::ProfileError::NotRunning)));
}

/// Distinct stacks the child of many stacks samples, far beyond the live profile's budget of
/// 8 192 stacks with nothing live (docs/GUIDE.md): spans of 64 values at three nested call
/// sites, as a service's spans of tenants, routes and requests.
#[cfg(feature = "tracing")]
const VARIED_STACKS: usize = 40_000;
/// The blocks of `site_varied`: sampled twice on average at [`RATE`], most of them at least once.
#[cfg(feature = "tracing")]
const VARIED_SIZE: usize = 16_000;
#[cfg(feature = "tracing")]
#[inline(never)]
fn site_varied() {
    black_box(Vec::<u8>::with_capacity(VARIED_SIZE));
}
/// Its truth, and all the child allocates while traced but a few small blocks.
#[cfg(feature = "tracing")]
const VARIED_BYTES: f64 = (VARIED_STACKS * VARIED_SIZE) as f64;

/// The child of many stacks: `site_varied` in a distinct stack of spans each time, traced as
/// the environment says; then `live: ready` on stderr, until stdin closes. Its spans are made
/// before tracing starts, so that it allocates nothing else meanwhile.
#[cfg(feature = "tracing")]
pub(super) fn varied_child() {
    use tracing_subscriber::layer::SubscriberExt;
    let layer = memtrace_rs::MemtraceLayer::new().with_field("id");
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();
    let tenants: Vec<_> = (0..64).map(|id| tracing::info_span!("tenant", id)).collect();
    let routes: Vec<_> = (0..64).map(|id| tracing::info_span!("route", id)).collect();
    let requests: Vec<_> = (0..64).map(|id| tracing::info_span!("request", id)).collect();
    let guard = memtrace_rs::trace_if_requested();
    assert!(guard.is_some());
    for i in 0..VARIED_STACKS {
        let _tenant = tenants[i / 4096].enter();
        let _route = routes[i / 64 % 64].enter();
        let _request = requests[i % 64].enter();
        site_varied();
        if i % 1000 == 999 {
            // The writer keeps up.
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    eprintln!("live: ready");
    std::io::stdin().lock().lines().for_each(drop);
    drop(guard);
}

/// The child of the fork test: serving at `MEMTRACE_HTTP`, it forks a child that outlives
/// its session; once the session stopped, the port is free.
pub(super) fn fork_child() {
    let addr: SocketAddr = std::env::var("MEMTRACE_HTTP").unwrap().parse().unwrap();
    let guard = memtrace_rs::trace_if_requested();
    assert!(guard.is_some());
    // SAFETY: the forked child only sleeps and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        std::thread::sleep(Duration::from_secs(2));
        // SAFETY: ends the forked child at once, as it is.
        unsafe { libc::_exit(0) };
    }
    drop(guard);
    let rebound = std::net::TcpListener::bind(addr);
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    rebound.unwrap_or_else(|e| panic!("{addr} still taken after the stop: {e}"));
}

// ---------------------------------------------------------------------------------------------
// Parent side

/// A serving child: its process, its stdin, its stderr lines, the endpoint's address.
pub(super) struct Serving {
    pub(super) process: Child,
    stderr: Receiver<String>,
    pub(super) addr: SocketAddr,
    /// Everything it said on stderr so far.
    said: Vec<String>,
}

impl Serving {
    /// Start the serving child with `env` (and `MEMTRACE_HTTP`, a free loopback port) in `dir`,
    /// and wait until it is ready.
    pub(super) fn start(env: &[(&str, &str)], dir: &Path) -> Serving {
        Serving::start_as("live:serve", env, dir)
    }

    /// [`Serving::start`] of a child in `role`, which says `live: ready` when it is.
    fn start_as(role: &str, env: &[(&str, &str)], dir: &Path) -> Serving {
        let mut cmd: Command = child(role, env);
        cmd.env("MEMTRACE_HTTP", "127.0.0.1:0").env("MEMTRACE_RATE", RATE.to_string()).current_dir(dir);
        let mut process = cmd.stdin(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let (tx, stderr) = std::sync::mpsc::channel();
        let lines = BufReader::new(process.stderr.take().unwrap());
        std::thread::spawn(move || lines.lines().map_while(Result::ok).try_for_each(|l| tx.send(l)));
        let mut serving = Serving { process, stderr, addr: "0.0.0.0:0".parse().unwrap(), said: Vec::new() };
        let address = serving.wait_for("memtrace: serving heap profiles at http://");
        let address = address.split("http://").nth(1).unwrap().split('/').next().unwrap();
        serving.addr = address.parse().unwrap();
        serving.wait_for("live: ready");
        serving
    }

    /// Wait (at most a minute) for a line of stderr that starts with `prefix`.
    pub(super) fn wait_for(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr.recv_timeout(left) {
                Ok(line) => {
                    self.said.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Err(_) => {
                    let _ = self.process.kill();
                    panic!("no {prefix:?} from the child; it said {:#?}", self.said);
                }
            }
        }
    }

    pub(super) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub(super) fn tell(&mut self, line: &str) {
        writeln!(self.process.stdin.as_mut().unwrap(), "{line}").unwrap();
    }

    /// Close its stdin and wait (a minute at most) for it to end well; what it said.
    pub(super) fn finish(mut self) -> Vec<String> {
        drop(self.process.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = self.process.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.process.kill();
                panic!("the child did not end; it said {:#?}", self.said);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.said.extend(self.stderr.try_iter());
        assert!(status.success(), "{status}; it said {:#?}", self.said);
        self.said
    }
}

/// The output of `go tool pprof` with `args`, which must succeed (in a home of its own).
fn go_pprof(args: &[&str]) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .env("PPROF_TMPDIR", tmp.path())
        .env("HOME", tmp.path())
        .output()
        .expect("go tool pprof");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    text
}

/// `go tool pprof -top` of `source` (a URL or file) by `sample_index` (with `extra` flags):
/// each function's cumulative value in bytes.
fn pprof_top(source: &str, sample_index: &str, extra: &[&str]) -> HashMap<String, f64> {
    let index = format!("-sample_index={sample_index}");
    let mut args = vec!["-top", "-unit=B", "-nodecount=1000", &index];
    args.extend_from_slice(extra);
    args.push(source);
    let text = go_pprof(&args);
    eprintln!("--- go tool pprof {sample_index} {extra:?} {source}:\n{text}");
    let mut cum = HashMap::new();
    for line in text.lines() {
        // `flat flat% sum% cum cum% name`
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 6 || !fields[4].ends_with('%') {
            continue;
        }
        if let Some(bytes) = fields[3].strip_suffix('B').and_then(|b| b.parse::<f64>().ok()) {
            cum.insert(fields[5..].join(" "), bytes);
        }
    }
    cum
}

/// The cumulative bytes of the function whose name ends with `::name` (or is `name`), 0 when
/// absent.
fn bytes_of(top: &HashMap<String, f64>, name: &str) -> f64 {
    top.iter().filter(|(f, _)| f.ends_with(&format!("::{name}")) || *f == name).map(|(_, &b)| b).sum()
}

/// Require `estimate` to be within [`SIGMAS`] standard deviations of `truth` bytes: the sampled points of `truth`
/// bytes are a Poisson count of mean `truth × rate / 8`.
fn assert_within_sigmas(what: &str, estimate: f64, truth: f64) {
    let samples = truth * RATE / 8.0;
    let tolerance = SIGMAS * samples.sqrt() * 8.0 / RATE;
    assert!((estimate - truth).abs() <= tolerance, "{what}: estimated {estimate}, truth {truth} ± {tolerance}");
}

/// The heap, allocs and peak profiles of the known program (from `heap`, `allocs`, `peak`,
/// URLs or files) match the truth; the churned and peak blocks, freed, are not live; the
/// thread-kept blocks are under the thread's frame.
fn check_known_profiles(heap: &str, allocs: &str, peak: &str) {
    let inuse = pprof_top(heap, "inuse_space", &[]);
    assert_within_sigmas("live site", bytes_of(&inuse, "site_live_big"), LIVE_BYTES);
    assert_within_sigmas("thread's site", bytes_of(&inuse, "site_kept_by_thread"), THREAD_BYTES);
    // Threads and spans are named as the command line names them.
    let thread = format!("thread {KEEPER}");
    assert!(bytes_of(&inuse, &thread) >= bytes_of(&inuse, "site_kept_by_thread"), "no thread frame: {inuse:?}");
    #[cfg(feature = "tracing")]
    {
        let span = format!("span {KEEPING_SPAN} (");
        let spans: f64 = inuse.iter().filter(|(f, _)| f.starts_with(&span)).map(|(_, &b)| b).sum();
        assert!(spans >= bytes_of(&inuse, "site_kept_by_thread"), "no span frame: {inuse:?}");
    }
    assert_eq!(bytes_of(&inuse, "site_churned"), 0.0);
    assert_eq!(bytes_of(&inuse, "site_peak"), 0.0);
    // No allocator frame is a function of the profile (trimmed as the CLI does).
    assert!(!inuse.keys().any(|f| f.contains("__rust_alloc") || f.contains("RawVec")), "{inuse:?}");
    let allocated = pprof_top(allocs, "alloc_space", &[]);
    assert_within_sigmas("churned site", bytes_of(&allocated, "site_churned"), CHURNED_BYTES);
    assert_within_sigmas("peak site, allocated", bytes_of(&allocated, "site_peak"), PEAK_BYTES);
    assert_within_sigmas("live site, allocated", bytes_of(&allocated, "site_live_big"), LIVE_BYTES);
    let at_peak = pprof_top(peak, "inuse_space", &[]);
    assert_within_sigmas("peak site at the peak", bytes_of(&at_peak, "site_peak"), PEAK_BYTES);
    assert_within_sigmas("live site at the peak", bytes_of(&at_peak, "site_live_big"), LIVE_BYTES);
}

/// A delta over a time when `site_delta` ran shows it and not what was allocated before.
fn check_delta(delta: &HashMap<String, f64>) {
    assert_within_sigmas("delta site", bytes_of(delta, "site_delta"), DELTA_BYTES);
    assert_eq!(bytes_of(delta, "site_churned"), 0.0);
    assert_eq!(bytes_of(delta, "site_live_big"), 0.0);
}

fn go_available() -> bool {
    Command::new("go").arg("version").output().is_ok_and(|o| o.status.success())
}

/// `GET path` of the endpoint at `addr` with a plain connection: the status and body.
pub(super) fn get(addr: SocketAddr, path: &str) -> (u16, Vec<u8>) {
    request(addr, &format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n"))
}

/// Send `request` (head and body) to the endpoint at `addr` on a plain connection: the
/// status and body of the answer.
pub(super) fn request(addr: SocketAddr, request: &str) -> (u16, Vec<u8>) {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let end = response.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head");
    let head = String::from_utf8_lossy(&response[..end]).into_owned();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, response[end + 4..].to_vec())
}

#[test]
fn live_profiles_over_http_match_the_truth() {
    if !go_available() {
        skip("go is not installed (apt-get install golang-go)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.ctf");
    let mut serving = Serving::start(&[("MEMTRACE_FILE", trace.to_str().unwrap())], dir.path());
    check_known_profiles(
        &serving.url("/debug/pprof/heap"),
        &serving.url("/debug/pprof/allocs"),
        &serving.url("/debug/pprof/peak"),
    );
    // Folded stacks, root first, by inuse_space.
    let (status, folded) = get(serving.addr, "/debug/pprof/heap?format=folded");
    assert_eq!(status, 200);
    let folded = String::from_utf8(folded).unwrap();
    let live: f64 = folded
        .lines()
        .filter(|l| l.contains("site_live_big"))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
        .sum();
    assert_within_sigmas("live site, folded", live, LIVE_BYTES);
    let thread = format!("thread {KEEPER};");
    assert!(folded.lines().any(|l| l.starts_with(&thread) && l.contains("site_kept_by_thread")), "{folded}");
    #[cfg(feature = "tracing")]
    assert!(folded.lines().any(|l| l.starts_with(&format!("{thread}span {KEEPING_SPAN} ("))), "{folded}");
    // A delta: `go tool pprof -seconds 3` asks for `allocs?seconds=3`; `site_delta` runs in it.
    let addr = serving.url("/debug/pprof/allocs");
    let fetch = std::thread::spawn(move || pprof_top(&addr, "alloc_space", &["-seconds=3"]));
    std::thread::sleep(Duration::from_millis(700));
    serving.tell("delta");
    serving.wait_for("live: delta done");
    check_delta(&fetch.join().unwrap());
    let said = serving.finish();
    // Dropped samples would bias the estimates.
    assert!(!said.iter().any(|l| l.contains("dropped")), "{said:?}");
    // The trace is whole beside the profiles.
    let trace = Trace::read(&trace);
    assert!(trace.at_site("::site_live_big").count() > 0);
    assert!(trace.at_site("::site_delta").count() > 0);
}

/// `go tool pprof -raw` of `source` (a URL or file): its samples' values, and its functions.
fn pprof_raw(source: &str) -> (Vec<Vec<i64>>, Vec<String>) {
    let text = go_pprof(&["-raw", source]);
    let samples = text.split_once("\nSamples:\n").expect("samples").1;
    let (samples, locations) = samples.split_once("\nLocations\n").expect("locations");
    // `values: location ids`, after a line of the sample types; labels on lines of their own.
    let values = samples
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter_map(|(values, _)| values.split_whitespace().map(|v| v.parse().ok()).collect::<Option<Vec<i64>>>())
        .filter(|values| !values.is_empty())
        .collect();
    // `id: address M=mapping function file:line s=start`, inlined functions on lines of their own.
    let functions = locations.lines().map(|l| l.trim().to_owned()).collect();
    (values, functions)
}

/// A service whose spans carry per-request values samples far more distinct stacks than the
/// live profile keeps: the allocs profile still holds what was allocated in all (within 4
/// sigma of the truth), with the stacks beyond the budget folded into a pseudo-stack that says
/// so, and no more samples than the budget and a few.
#[cfg(feature = "tracing")]
#[test]
fn many_distinct_stacks_are_folded_and_totals_kept() {
    /// The budget of stacks with nothing live (`live_profile::IDLE_STACKS`, documented).
    const BUDGET: usize = 8192;
    if !go_available() {
        skip("go is not installed (apt-get install golang-go)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let serving = Serving::start_as("live:varied", &[], dir.path());
    // The writer may be seconds behind the child's samples (a debug build, a busy machine):
    // caught up once two profiles a while apart are the same (the child allocates nothing).
    let mut last = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, folded) = get(serving.addr, "/debug/pprof/allocs?format=folded");
        assert_eq!(status, 200);
        if folded == last || Instant::now() > deadline {
            break;
        }
        last = folded;
        std::thread::sleep(Duration::from_millis(300));
    }
    let (samples, functions) = pprof_raw(&serving.url("/debug/pprof/allocs"));
    serving.finish();
    let allocated: i64 = samples.iter().map(|values| values[1]).sum();
    assert_within_sigmas("all allocated", allocated as f64, VARIED_BYTES);
    assert!((BUDGET..BUDGET + 100).contains(&samples.len()), "{} samples", samples.len());
    let folded = functions.iter().find_map(|f| {
        let (_, rest) = f.split_once("<stacks folded: allocated totals of ")?;
        rest.split_once(" stacks no longer live> <memtrace>")?.0.parse::<usize>().ok()
    });
    let folded = folded.unwrap_or_else(|| panic!("no folded stacks: {functions:?}"));
    // Of the 40 000 stacks, some 86 % are sampled.
    assert!(folded > VARIED_STACKS / 2, "{folded} stacks folded");
}

#[test]
fn a_session_for_profiles_only_from_the_environment_writes_no_file() {
    if !go_available() {
        skip("go is not installed (apt-get install golang-go)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let serving = Serving::start(&[], dir.path());
    let inuse = pprof_top(&serving.url("/debug/pprof/heap"), "inuse_space", &[]);
    assert_within_sigmas("live site", bytes_of(&inuse, "site_live_big"), LIVE_BYTES);
    let said = serving.finish();
    assert_eq!(said.iter().filter(|l| l.starts_with("memtrace: ")).count(), 1, "{said:?}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn profiles_from_code_in_a_session_for_profiles_only() {
    if !go_available() {
        skip("go is not installed (apt-get install golang-go)");
        return;
    }
    let (cwd, out) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut cmd = child("live:api", &[("MEMTRACE_TEST_DIR", out.path().to_str().unwrap())]);
    cmd.current_dir(cwd.path());
    let (output, _) = super::output_within(cmd, "live:api", Duration::from_secs(120));
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let file = |name: &str| out.path().join(name).to_str().unwrap().to_owned();
    check_known_profiles(&file("heap.pb.gz"), &file("allocs.pb.gz"), &file("peak.pb.gz"));
    check_delta(&pprof_top(&file("delta.pb.gz"), "alloc_space", &[]));
    let response = pprof_top(&file("response.pb.gz"), "inuse_space", &[]);
    assert_within_sigmas("live site, framework helper", bytes_of(&response, "site_live_big"), LIVE_BYTES);
    // Files and lines: the allocation's line in `site_live_big` is in this file.
    let by_line = pprof_top(&file("heap.pb.gz"), "inuse_space", &["-lines"]);
    assert!(
        by_line.keys().any(|l| l.contains("site_live_big") && l.contains("tests/tracing/live_profile.rs:")),
        "{by_line:?}"
    );
    let folded = std::fs::read_to_string(file("heap.folded")).unwrap();
    assert!(folded.lines().any(|l| l.contains("site_live_big")), "{folded}");
    let left: Vec<_> = std::fs::read_dir(cwd.path()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

/// Garbage, a request that never ends, a thousand connections at once, and requests for
/// nothing cost the child a closed connection each: it keeps serving, and runs on, and its
/// trace is whole.
#[test]
fn bad_requests_cost_the_program_nothing_but_a_closed_connection() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.ctf");
    let serving = Serving::start(&[("MEMTRACE_FILE", trace.to_str().unwrap())], dir.path());
    let addr = serving.addr;
    // Garbage, with and without the end of a head.
    for garbage in [&b"\x00\xff garbage\r\n\r\n"[..], &[0xAB; 100_000][..], b"GET /debug/pprof/heap SMTP/1\r\n\r\n"] {
        let mut stream = TcpStream::connect(addr).unwrap();
        let _ = stream.write_all(garbage);
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        assert!(answer.is_empty() || answer.starts_with(b"HTTP/1.1 400"), "{}", String::from_utf8_lossy(&answer));
    }
    // A request that never ends: closed within a few seconds.
    let mut endless = TcpStream::connect(addr).unwrap();
    endless.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let started = Instant::now();
    endless.write_all(b"GET /debug/pprof/heap HTTP/1.1\r\nX-Slow: ").unwrap();
    let mut answer = Vec::new();
    let _ = endless.read_to_end(&mut answer);
    assert!(started.elapsed() < Duration::from_secs(5), "an endless request held for {:?}", started.elapsed());
    // A thousand connections at once, idle, then gone.
    raise_open_files_limit();
    let crowd = connect_at_once(addr, 1000);
    std::thread::sleep(Duration::from_millis(500));
    drop(crowd);
    // Requests for nothing, and methods other than GET.
    assert_eq!(get(addr, "/nothing").0, 404);
    assert_eq!(get(addr, "/debug/pprof/heap?seconds=-1").0, 400);
    assert_eq!(get(addr, "/debug/pprof/peak?seconds=1").0, 400);
    let mut post = TcpStream::connect(addr).unwrap();
    post.write_all(b"POST /debug/pprof/heap HTTP/1.1\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = post.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
    // Still serving, soon.
    let started = Instant::now();
    let (status, body) = get(addr, "/debug/pprof/heap");
    assert_eq!(status, 200);
    assert_eq!(body[..2], [0x1f, 0x8b], "gzip");
    assert!(started.elapsed() < Duration::from_secs(10), "served after {:?}", started.elapsed());
    serving.finish();
    let trace = Trace::read(&trace);
    assert!(trace.at_site("::site_live_big").count() > 0);
    assert!(trace.at_site("::site_peak").count() > 0);
}

/// A non-loopback address without opting in: no endpoint, one message, the trace as usual.
#[test]
fn a_non_loopback_address_needs_opting_in() {
    let path = super::temp_path("live-non-loopback");
    let env = [("MEMTRACE_FILE", path.to_str().unwrap()), ("MEMTRACE_HTTP", "0.0.0.0:0")];
    let out = super::run("known", &env);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    super::assert_one_message(&out, "not a loopback address");
    let trace = Trace::read(&path);
    assert!(trace.at_site("::site_kept").count() > 0);
    let _ = std::fs::remove_file(&path);
}

/// Start `n` connections to `addr` at once, without waiting for them (those past the
/// endpoint's backlog never complete).
pub(super) fn connect_at_once(addr: SocketAddr, n: usize) -> Vec<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(v4) = addr else { panic!("{addr} is not IPv4") };
    let to = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: v4.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(*v4.ip()).to_be() },
        sin_zero: [0; 8],
    };
    (0..n)
        .map(|_| {
            // SAFETY: a new socket, connected to a valid address of the given length.
            unsafe {
                let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0);
                assert!(fd >= 0, "{}", std::io::Error::last_os_error());
                let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
                libc::connect(fd, (&to as *const libc::sockaddr_in).cast(), len);
                std::os::fd::OwnedFd::from_raw_fd(fd)
            }
        })
        .collect()
}

/// Up to the hard limit: a thousand connections need as many descriptors.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `limit` is a valid rlimit to fill in, then to set.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max.min(4096);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// A forked child does not keep its parent's endpoint's port: once the parent's session
/// stops, the port is free while the child lives on.
#[test]
fn a_forked_child_does_not_keep_the_port() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let path = super::temp_path("live-fork");
    let addr = format!("127.0.0.1:{port}");
    let env = [("MEMTRACE_FILE", path.to_str().unwrap()), ("MEMTRACE_HTTP", &addr)];
    let (out, _) = super::run_within("live:fork", &env, Duration::from_secs(60));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_file(&path);
}
