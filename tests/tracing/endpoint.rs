//! The endpoint in a serving child (`live:serve`): under load, slow clients and a long delta
//! delay no other client's profile, the connection limit answers 503, and the child's threads
//! stay bounded throughout; a window's trace over HTTP (curl's, read back, and `memtrace
//! report`'s); control of the session (start, stop, rate, state) and who may have it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use memtrace_rs::trace::{AllocSource, EventKind, Reader};

use super::live_profile::{connect_at_once, get, request, Serving};

/// The endpoint's connection limit (docs/GUIDE.md, "Live heap profiles over HTTP").
const MAX_CONNECTIONS: usize = 64;
/// The issue's bound on how long another client may delay a profile, plus the second the
/// profile itself may take on a loaded machine: a hang guard (the answer takes milliseconds).
const PROFILE_WITHIN: Duration = Duration::from_secs(2);

/// The threads of process `pid` now (`Threads:` of `/proc/PID/status`).
fn threads_of(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Threads:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A serving child for profiles only (in a directory of its own, kept while it runs), and its
/// threads once ready.
fn serving_child() -> (tempfile::TempDir, Serving, usize) {
    let dir = tempfile::tempdir().unwrap();
    let serving = Serving::start(&[], dir.path());
    let threads = threads_of(serving.process.id());
    (dir, serving, threads)
}

/// A client that sends a request's head a byte a second, over and over (a connection the
/// endpoint closes is opened again), until `stop`.
fn slow_client(addr: SocketAddr, stop: Arc<AtomicBool>) {
    let head = b"GET /debug/pprof/heap HTTP/1.1\r\nHost: x\r\n\r\n";
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut stream) = TcpStream::connect(addr) else { continue };
        for byte in head {
            if stop.load(Ordering::Relaxed) || stream.write_all(&[*byte]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

/// `GET /debug/pprof/heap`, timed: it must answer 200 within [`PROFILE_WITHIN`].
fn timed_heap_profile(addr: SocketAddr) {
    let started = Instant::now();
    let (status, body) = get(addr, "/debug/pprof/heap");
    let took = started.elapsed();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(took < PROFILE_WITHIN, "a heap profile took {took:?} beside slow clients and a long delta");
}

/// 50 clients that send a byte a second, and a `?seconds=10` delta and window in flight: heap
/// profiles still answer at once, and the child's threads stay within the connection limit.
#[test]
fn slow_clients_and_long_requests_delay_no_profile() {
    let (_dir, serving, before) = serving_child();
    let (addr, pid) = (serving.addr, serving.process.id());
    let long = std::thread::spawn(move || get(addr, "/debug/pprof/allocs?seconds=10"));
    let window = std::thread::spawn(move || get(addr, "/debug/memtrace/trace?seconds=10"));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..50)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || slow_client(addr, stop))
        })
        .collect();
    // Past the first cut of the slow clients' connections (after a second), they reconnect.
    std::thread::sleep(Duration::from_millis(1500));
    for _ in 0..5 {
        timed_heap_profile(addr);
        let threads = threads_of(pid);
        assert!(threads <= before + MAX_CONNECTIONS + 1, "{threads} threads, {before} before the clients");
        std::thread::sleep(Duration::from_millis(500));
    }
    stop.store(true, Ordering::Relaxed);
    clients.into_iter().for_each(|c| c.join().unwrap());
    for long in [long, window] {
        let (status, body) = long.join().unwrap();
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    }
    serving.finish();
}

/// Connections past the limit are answered 503 at once, the child's threads stay within the
/// limit meanwhile, and the endpoint serves again once they are gone.
#[test]
fn past_the_connection_limit_a_client_gets_503() {
    let (_dir, serving, before) = serving_child();
    let (addr, pid) = (serving.addr, serving.process.id());
    // Idle: each holds a connection's place until the endpoint cuts it, a second after it came.
    let crowd = connect_at_once(addr, 2 * MAX_CONNECTIONS);
    std::thread::sleep(Duration::from_millis(300));
    let threads = threads_of(pid);
    assert!(threads <= before + MAX_CONNECTIONS + 1, "{threads} threads, {before} before the crowd");
    // Every answer is in by now: the refusals at once, the cuts after a second.
    std::thread::sleep(Duration::from_millis(2500));
    let (mut refused, mut cut) = (0, 0);
    for fd in crowd {
        let mut stream = TcpStream::from(fd);
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        refused += answer.starts_with(b"HTTP/1.1 503 ") as usize;
        cut += answer.starts_with(b"HTTP/1.1 400 ") as usize;
    }
    assert!(refused > 0 && cut > 0, "{refused} refused, {cut} cut of {} connections", 2 * MAX_CONNECTIONS);
    timed_heap_profile(addr);
    serving.finish();
}

/// The allocations of `path`'s trace in functions ending in `site`, by whether they are
/// the blocks live at its start (source `Major`) or allocated in it (`External`): their
/// counts, in that order.
fn window_allocations(path: &std::path::Path, site: &str) -> (usize, usize) {
    let mut reader = Reader::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (mut live_at_start, mut allocated) = (0, 0);
    while let Some(event) = reader.next_event().unwrap() {
        let EventKind::Alloc(alloc) = event.kind else { continue };
        let at_site = alloc
            .backtrace
            .iter()
            .any(|&code| event.locations.get(code).unwrap().iter().any(|l| l.defname_str().ends_with(site)));
        match alloc.source {
            _ if !at_site => {}
            AllocSource::Major => live_at_start += 1,
            _ => allocated += 1,
        }
    }
    (live_at_start, allocated)
}

/// The window of a service for profiles only, fetched as docs/GUIDE.md says (`curl -o`): a
/// trace that begins with the blocks live at its start (the live site's, marked `Major`),
/// holds what was allocated in it (the delta site's, run during it), and `memtrace report`
/// opens.
#[test]
fn a_window_of_a_service_for_profiles_only_fetched_with_curl() {
    let (dir, mut serving, _) = serving_child();
    let window = dir.path().join("window.ctf");
    let mut curl = Command::new("curl")
        .args(["-sS", "--max-time", "60", "-o"])
        .arg(&window)
        .arg(serving.url("/debug/memtrace/trace?seconds=3"))
        .spawn()
        .expect("curl");
    std::thread::sleep(Duration::from_millis(1000));
    serving.tell("delta");
    serving.wait_for("live: delta done");
    assert!(curl.wait().unwrap().success());
    let (live_before, allocated_before) = window_allocations(&window, "::site_live_big");
    assert!(
        live_before > 0 && allocated_before == 0,
        "live site: {live_before} live at start, {allocated_before} in it"
    );
    let (live_delta, allocated_delta) = window_allocations(&window, "::site_delta");
    assert!(live_delta == 0 && allocated_delta > 0, "delta site: {live_delta} live at start, {allocated_delta} in it");
    if let Some(memtrace) = option_env!("CARGO_BIN_EXE_memtrace") {
        let report = dir.path().join("report.html");
        let out = Command::new(memtrace).arg("report").arg(&window).arg("-o").arg(&report).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(std::fs::metadata(&report).unwrap().len() > 0);
    }
    // Malformed windows are refused before anything is sent.
    for bad in ["", "?seconds=0", "?seconds=601", "?seconds=2&rate=x", "?seconds=2&rate=0.5"] {
        let (status, body) = get(serving.addr, &format!("/debug/memtrace/trace{bad}"));
        assert!(matches!(status, 400 | 409), "{bad}: {status} {}", String::from_utf8_lossy(&body));
    }
    serving.finish();
}

/// `method path` with `headers` (lines ending in CRLF) and `body`: the status and the body as
/// text.
fn send(addr: SocketAddr, method: &str, path: &str, headers: &str, body: &str) -> (u16, String) {
    let head = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n{headers}\r\n", body.len());
    let (status, body) = request(addr, &format!("{head}{body}"));
    (status, String::from_utf8(body).unwrap())
}

/// The session's state (`GET /debug/memtrace/state`): its JSON.
fn state(addr: SocketAddr) -> String {
    let (status, state) = send(addr, "GET", "/debug/memtrace/state", "", "");
    assert_eq!(status, 200, "{state}");
    state
}

/// Control over HTTP of a child that starts for profiles only with a file configured
/// (`MEMTRACE_FILE_ON_DEMAND`): start the file trace, change the rate (a new file of its
/// series), stop it, with the state saying so at each step and the files read back at their
/// rates; a GET of a control is 405, a browser's request 403, a bad rate 400.
#[test]
fn control_over_http_from_a_child_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.ctf");
    let env = [("MEMTRACE_FILE", path.to_str().unwrap()), ("MEMTRACE_FILE_ON_DEMAND", "1")];
    let serving = Serving::start(&env, dir.path());
    let addr = serving.addr;
    assert!(state(addr).contains(r#""file_open":false"#), "{}", state(addr));
    assert!(!path.exists());
    assert_eq!(get(addr, "/debug/memtrace/start").0, 405);
    assert_eq!(send(addr, "POST", "/debug/pprof/heap", "", "").0, 405);
    assert_eq!(send(addr, "POST", "/debug/memtrace/start", "Origin: http://example.com\r\n", "").0, 403);
    assert!(!path.exists(), "a browser's request started the trace");
    let (status, said) = send(addr, "POST", "/debug/memtrace/start", "", "");
    assert_eq!(status, 200, "{said}");
    assert!(state(addr).contains(r#""file_open":true"#), "{}", state(addr));
    for bad in ["rate=2", "rate=x", "", "rate=0"] {
        let (status, said) = send(addr, "POST", "/debug/memtrace/rate", "", bad);
        assert_eq!(status, 400, "{bad}: {said}");
    }
    let (status, said) = send(addr, "POST", "/debug/memtrace/rate", "", "rate=1e-4");
    assert_eq!(status, 200, "{said}");
    assert!(state(addr).contains(r#""rate":1e-4"#), "{}", state(addr));
    let (status, said) = send(addr, "POST", "/debug/memtrace/stop", "", "");
    assert_eq!(status, 200, "{said}");
    let last = state(addr);
    assert!(last.contains(r#""file_open":false"#), "{last}");
    serving.finish();
    let mut rates: Vec<f64> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ctf"))
        .map(|p| {
            let mut reader = Reader::open(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            while reader.next_event().unwrap_or_else(|e| panic!("{}: {e}", p.display())).is_some() {}
            reader.info().sample_rate
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    assert_eq!(rates, [1e-4, super::live_profile::RATE], "the files' rates; the last state: {last}");
}
