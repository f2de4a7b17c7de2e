//! Heap profiles served by a service's own axum router, as services do with jemalloc_pprof:
//! one handler for `/debug/pprof/{heap,allocs,peak}` that hands the request's path and query
//! to `memtrace_rs::http_response` (`?seconds=N` for a delta, `?format=folded` for a flame
//! graph's folded stacks).
//!
//! ```text
//! cargo run --example axum-profiles -- 127.0.0.1:6060
//! go tool pprof -top http://127.0.0.1:6060/debug/pprof/heap
//! ```
//!
//! `cargo test --example axum-profiles` serves the profiles of a known allocation and reads
//! them back with `go tool pprof`.

use std::net::SocketAddr;

use axum::http::{header, StatusCode, Uri};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use memtrace_rs::{MemtraceAllocator, TraceConfig};

#[global_allocator]
static GLOBAL: MemtraceAllocator = MemtraceAllocator::system();

/// The handler: the profile the path and query ask for. Taking a delta waits its seconds, and
/// encoding a profile takes milliseconds: both off the async workers.
async fn pprof(uri: Uri) -> impl IntoResponse {
    let target = uri.path_and_query().map_or_else(|| uri.path().to_owned(), |p| p.as_str().to_owned());
    let response = tokio::task::spawn_blocking(move || memtrace_rs::http_response(&target))
        .await
        .expect("taking a profile does not panic");
    let status = StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, response.content_type)], response.body)
}

/// The service's router, with the profiles beside its own routes.
fn router() -> Router {
    Router::new().route("/", get(|| async { "hello\n" })).route("/debug/pprof/{profile}", get(pprof))
}

/// Serve `router()` at `addr` on a new runtime, calling `bound` with the address listened on.
fn serve(addr: SocketAddr, bound: impl FnOnce(SocketAddr)) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        bound(listener.local_addr()?);
        axum::serve(listener, router()).await
    })
}

/// Something to see in the profile: a cache of 32 MB that the service keeps. (A loop, not a
/// `collect()` that an optimised build may call as its last act, leaving no frame of this
/// function.)
#[inline(never)]
fn fill_cache() -> Vec<Vec<u8>> {
    let mut cache = Vec::with_capacity(320);
    for _ in 0..320 {
        cache.push(vec![1u8; 100_000]);
    }
    cache
}

fn main() -> std::io::Result<()> {
    let addr: SocketAddr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:6060".into()).parse().expect("IP:PORT");
    // Profiles only: no trace file (or `memtrace_rs::trace_if_requested()`, to let the
    // environment choose).
    let _session = memtrace_rs::start_tracing(TraceConfig::profile_only()).expect("profiling starts");
    let cache = fill_cache();
    serve(addr, |bound| println!("profiles at http://{bound}/debug/pprof/heap"))?;
    drop(cache);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The handler serves the profile `go tool pprof` reads: the cache, within 4 sigma of its
    /// 32 MB.
    #[test]
    fn the_handler_serves_the_heap_profile() {
        if std::process::Command::new("go").arg("version").output().is_err() {
            eprintln!("go not found: skipped");
            return;
        }
        const RATE: f64 = 1e-3;
        let _session = memtrace_rs::start_tracing(TraceConfig::profile_only().rate(RATE)).unwrap();
        let cache = fill_cache();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || serve("127.0.0.1:0".parse().unwrap(), |bound| tx.send(bound).unwrap()));
        let addr = rx.recv().unwrap();
        let tmp = std::env::temp_dir().join(format!("axum-profiles-{}", std::process::id()));
        let out = std::process::Command::new("go")
            .args(["tool", "pprof", "-top", "-unit=B", "-sample_index=inuse_space"])
            .arg(format!("http://{addr}/debug/pprof/heap"))
            .env("PPROF_TMPDIR", &tmp)
            .env("HOME", &tmp)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&tmp);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        // `flat flat% sum% cum cum% name`: the cumulative bytes of `fill_cache`.
        let cum = text
            .lines()
            .find(|l| l.ends_with("::fill_cache"))
            .and_then(|l| l.split_whitespace().nth(3)?.strip_suffix('B')?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no fill_cache in\n{text}"));
        let truth = (320 * 100_000 + 320 * 24) as f64;
        let tolerance = 4.0 * (truth * RATE / 8.0).sqrt() * 8.0 / RATE;
        assert!((cum - truth).abs() <= tolerance, "estimated {cum}, truth {truth} ± {tolerance}");
        let folded = plain_get(addr, "/debug/pprof/heap?format=folded");
        assert!(folded.contains("fill_cache"), "{folded}");
        drop(cache);
    }

    /// A `GET` of `path` with a bare connection: the body.
    fn plain_get(addr: SocketAddr, path: &str) -> String {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).unwrap();
        let response = String::from_utf8_lossy(&response).into_owned();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        response
    }
}
