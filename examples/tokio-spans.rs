//! A small server-like tokio program whose allocations are attributed to `tracing` spans and
//! threads by memtrace-rs.
//!
//! ```text
//! MEMTRACE_FILE=spans.ctf cargo run --release --features tracing --example tokio-spans
//! memtrace hotspots spans.ctf --by span               # bytes allocated per span
//! memtrace hotspots spans.ctf --by span,live-end      # what each span left live
//! memtrace report spans.ctf -o spans.html             # filter: inside a call to http_request
//! ```
//!
//! A multi-thread runtime serves two kinds of requests, each in an `http_request` span with
//! its `route`: `GET /api/users` renders a large JSON page and drops it (lots of short-lived
//! bytes); `GET /api/thumbnail` renders a small image and keeps it in a shared cache (fewer
//! bytes, held to the end). A background task in its own `cache_janitor` span trims the cache
//! now and then and logs statistics. It runs for about a second.
//!
//! With a directory as its argument, it also writes there its live profile of what was
//! allocated (`memtrace_rs::profile(ProfileKind::Allocs)`) taken at the end, as pprof
//! (`allocs.pb.gz`) and folded stacks (`allocs.folded`), which name every frame as the command
//! line names the trace's.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use memtrace_rs::{MemtraceAllocator, MemtraceLayer};
use tracing::{info_span, Instrument};
use tracing_subscriber::layer::SubscriberExt;

#[global_allocator]
static GLOBAL: MemtraceAllocator = MemtraceAllocator::system();

/// Thumbnails by image id, kept until the janitor trims the cache.
type Cache = Arc<Mutex<HashMap<u64, Vec<u8>>>>;

/// The most thumbnails the janitor leaves in the cache.
const CACHE_LIMIT: usize = 4000;

/// `GET /api/users?page=N`: a JSON page of users, sent and dropped.
#[inline(never)]
async fn list_users(page: u64) -> usize {
    let mut json = String::from("[");
    for user in page * 100..page * 100 + 100 {
        let _ = write!(json, r#"{{"id":{user},"name":"user-{user:06}","email":"user{user}@example.com"}},"#);
        if user % 25 == 0 {
            tokio::task::yield_now().await;
        }
    }
    json.push(']');
    black_box(json).len()
}

/// `GET /api/thumbnail?id=N`: a small rendered image, cached.
#[inline(never)]
async fn thumbnail(id: u64, cache: Cache) -> usize {
    if let Some(hit) = cache.lock().unwrap().get(&id) {
        return hit.len();
    }
    let image: Vec<u8> = (0..1500).map(|i| (i as u64 * id) as u8).collect();
    tokio::task::yield_now().await;
    let len = image.len();
    cache.lock().unwrap().insert(id, image);
    len
}

/// Trims the cache to [`CACHE_LIMIT`] entries every 50 ms and logs its size.
#[inline(never)]
async fn cache_janitor(cache: Cache) {
    let mut log = Vec::new();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut cache = cache.lock().unwrap();
        if cache.len() > CACHE_LIMIT {
            let mut ids: Vec<u64> = cache.keys().copied().collect();
            ids.sort_unstable();
            for id in &ids[..ids.len() - CACHE_LIMIT] {
                cache.remove(id);
            }
        }
        log.push(format!("cache: {} thumbnails", cache.len()));
    }
}

fn main() {
    let _trace = memtrace_rs::trace_if_requested();
    let subscriber = tracing_subscriber::registry().with(MemtraceLayer::new().with_field("route"));
    tracing::subscriber::set_global_default(subscriber).expect("no other subscriber");

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_time().build().unwrap();
    runtime.block_on(async {
        let cache = Cache::default();
        let janitor = tokio::spawn(cache_janitor(cache.clone()).instrument(info_span!("cache_janitor")));
        let mut served = 0;
        for batch in 0..100u64 {
            let mut requests = Vec::new();
            for i in 0..100 {
                let n = batch * 100 + i;
                requests.push(if n % 4 == 0 {
                    let span = info_span!("http_request", route = "/api/users");
                    tokio::spawn(list_users(n % 50).instrument(span))
                } else {
                    let span = info_span!("http_request", route = "/api/thumbnail");
                    tokio::spawn(thumbnail(n, cache.clone()).instrument(span))
                });
            }
            for request in requests {
                served += request.await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        janitor.abort();
        println!("served {served} bytes; {} thumbnails cached", cache.lock().unwrap().len());
        // Held at the end of the trace, as a server's cache would be.
        std::mem::forget(cache);
    });
    if let Some(dir) = std::env::args_os().nth(1).map(std::path::PathBuf::from) {
        let allocs = memtrace_rs::profile(memtrace_rs::ProfileKind::Allocs).expect("a session is running");
        std::fs::write(dir.join("allocs.pb.gz"), allocs.pprof()).expect("write the pprof profile");
        std::fs::write(dir.join("allocs.folded"), allocs.folded()).expect("write the folded profile");
    }
}
