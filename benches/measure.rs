//! What a measured scope (`memtrace_rs::testing::measure`) costs per allocation:
//! `cargo bench --bench measure`.
//!
//! One thread allocates and frees blocks of 16 to 271 bytes, keeping 512 of them live (a
//! ring), with `MemtraceAllocator` as the global allocator and no session: outside any scope
//! (the untraced cost), then inside one. Several rounds of each, interleaved; the best of each
//! is kept. Prints nanoseconds per allocation and free, and their ratio.

use std::hint::black_box;
use std::time::{Duration, Instant};

use memtrace_rs::MemtraceAllocator;

#[global_allocator]
static GLOBAL: MemtraceAllocator = MemtraceAllocator::system();

/// Allocations (each freed) per round.
const OPS: usize = 2_000_000;
const LIVE: usize = 512;
const ROUNDS: usize = 5;

/// Allocate and free [`OPS`] blocks, keeping [`LIVE`] live.
fn churn(ring: &mut [Vec<u8>]) {
    for i in 0..OPS {
        ring[i % LIVE] = black_box(Vec::with_capacity(16 + i % 256));
    }
}

fn time(f: impl FnOnce()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

fn main() {
    let mut ring: Vec<Vec<u8>> = (0..LIVE).map(|_| Vec::new()).collect();
    churn(&mut ring);
    let (mut untraced, mut measured) = (Duration::MAX, Duration::MAX);
    for _ in 0..ROUNDS {
        untraced = untraced.min(time(|| churn(&mut ring)));
        measured = measured.min(time(|| {
            let ((), stats) = memtrace_rs::testing::measure(|| churn(&mut ring));
            assert_eq!(stats.total_blocks, OPS as u64);
        }));
    }
    let per_op = |d: Duration| d.as_nanos() as f64 / OPS as f64;
    println!(
        "alloc + free, best of {ROUNDS} rounds of {OPS}: untraced {:.1} ns, measured {:.1} ns ({:.1}x)",
        per_op(untraced),
        per_op(measured),
        per_op(measured) / per_op(untraced)
    );
}
