//! What a live profile request costs: the time of a `GET /debug/pprof/heap` of the built-in
//! endpoint (the writer's snapshot, pprof encoding, gzip), the profile's size, and the memory a
//! request takes (the bytes allocated while it is answered, and how far the process's heap
//! rises above where it was, counted by an allocator under `MemtraceAllocator`), with 10k and
//! 100k live sampled blocks over 1,000 distinct stacks, in a session for profiles only.
//!
//! `cargo bench --bench live_profile` (one run: it prints its figures, no statistics).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use memtrace_rs::{MemtraceAllocator, TraceConfig};

#[global_allocator]
static GLOBAL: MemtraceAllocator<Counting> = MemtraceAllocator::new(Counting);

/// The system allocator, counting the bytes it allocates, those in use and their highest.
struct Counting;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);
static IN_USE: AtomicUsize = AtomicUsize::new(0);
static HIGHEST: AtomicUsize = AtomicUsize::new(0);

impl Counting {
    fn grew(by: usize) {
        ALLOCATED.fetch_add(by, Relaxed);
        let in_use = IN_USE.fetch_add(by, Relaxed) + by;
        HIGHEST.fetch_max(in_use, Relaxed);
    }

    fn shrank(by: usize) {
        IN_USE.fetch_sub(by, Relaxed);
    }
}

// SAFETY: each method is the system allocator's, with counting on the side.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller promised.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            Counting::grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller promised.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            Counting::grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as the caller promised.
        unsafe { System.dealloc(ptr, layout) };
        Counting::shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as the caller promised.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            Counting::shrank(layout.size());
            Counting::grew(new_size);
        }
        p
    }
}

/// Distinct stacks: three nested recursions of 0..10 calls each.
const DEPTHS: usize = 10;

#[inline(never)]
fn recurse(depth: usize, then: &mut dyn FnMut()) {
    if depth == 0 {
        then();
    } else {
        recurse(depth - 1, then);
    }
    black_box(depth);
}

/// Blocks of one word, each an allocation (sampled once at rate 1).
#[allow(clippy::vec_box)]
type Blocks = Vec<Box<u64>>;

#[inline(never)]
fn site(blocks: &mut Blocks, n: usize) {
    blocks.extend((0..n).map(|i| Box::new(i as u64)));
}

/// `n` live blocks of one word, sampled at rate 1 (one sample each), over 1,000 stacks.
fn live_blocks(n: usize) -> Blocks {
    let per_stack = n / (DEPTHS * DEPTHS * DEPTHS);
    let mut blocks = Vec::with_capacity(n);
    for a in 0..DEPTHS {
        for b in 0..DEPTHS {
            for c in 0..DEPTHS {
                recurse(a, &mut || recurse(b, &mut || recurse(c, &mut || site(&mut blocks, per_stack))));
            }
            // The writer keeps up: nothing dropped.
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    blocks
}

/// A `GET` of `path` from the endpoint at `addr`: the body's length.
fn get(addr: SocketAddr, path: &str) -> usize {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    assert!(response.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&response));
    response.len() - response.windows(4).position(|w| w == b"\r\n\r\n").unwrap() - 4
}

fn main() {
    // A free port for the endpoint. Requests go through it: its thread is the tracer's, so
    // that encoding is not sampled (at rate 1, this thread's allocations would be).
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let config = TraceConfig::profile_only().rate(1.0).http(addr);
    let session = memtrace_rs::start_tracing(config).expect("profiling starts");
    let mut kept = Vec::new();
    for live in [10_000, 100_000] {
        kept.push(live_blocks(live - kept.iter().map(Vec::len).sum::<usize>()));
        get(addr, "/debug/pprof/heap");
        let rounds = 20;
        let (mut time, mut allocated, mut rise, mut size) = (Duration::ZERO, 0, 0, 0);
        for _ in 0..rounds {
            let in_use = IN_USE.load(Relaxed);
            HIGHEST.store(in_use, Relaxed);
            let allocated_before = ALLOCATED.load(Relaxed);
            let started = Instant::now();
            size = get(addr, "/debug/pprof/heap");
            time += started.elapsed();
            allocated += ALLOCATED.load(Relaxed) - allocated_before;
            rise = rise.max(HIGHEST.load(Relaxed).saturating_sub(in_use));
        }
        println!(
            "{live} live samples over 1000 stacks: {:?} per request (snapshot, pprof, gzip, HTTP), profile {} KiB, \
             {} KiB allocated per request, heap {} KiB higher at most during one",
            time / rounds,
            size / 1024,
            allocated / rounds as usize / 1024,
            rise / 1024
        );
    }
    let stats = session.finish().unwrap();
    println!("samples {}, dropped {}", stats.samples_written, stats.samples_dropped());
    black_box(kept);
}
