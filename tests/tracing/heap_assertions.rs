//! `memtrace_rs::testing::measure` (issue 47): exact figures for known allocations, a
//! `HashMap` counted as dhat-rs counts it (a child with dhat as its allocator), leaks, frees on
//! other threads, threads measuring at once, nested scopes, panics, `realloc`, a failing
//! assertion's message, and a tracing session running meanwhile, whose estimates stay within
//! `SIGMAS` standard deviations while the scope's counts stay exact.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::Duration;

use memtrace_rs::testing::{measure, unwound_stats, HeapStats};
use memtrace_rs::trace_if_requested;

use super::{memtrace_messages, output_within, temp_path, Trace, SIGMAS};

mod workload;

/// The figures of `stats`: total bytes and blocks, peak bytes, bytes and blocks live at the end.
fn figures(stats: &HeapStats) -> [u64; 5] {
    [stats.total_bytes, stats.total_blocks, stats.max_bytes, stats.curr_bytes, stats.curr_blocks]
}

#[test]
fn a_vector_with_capacity_is_one_block_of_its_bytes() {
    let (v, stats) = measure(|| Vec::<u8>::with_capacity(1000));
    assert_eq!(figures(&stats), [1000, 1, 1000, 1000, 1]);
    drop(v);
    let ((), stats) = measure(|| drop(black_box(Vec::<u8>::with_capacity(1000))));
    assert_eq!(figures(&stats), [1000, 1, 1000, 0, 0]);
    assert_eq!(stats.untracked_blocks, 0);
}

/// A string pushed to 100 bytes: one allocation, then a `realloc` at each growth, each counted
/// at its new size (dhat's rule), and the peak is the last capacity (a `realloc` frees the old
/// block as it allocates the new one).
#[test]
fn a_string_grown_to_100_bytes_counts_each_growth_step() {
    let ((s, steps, sum), stats) = measure(|| {
        let mut s = String::new();
        let (mut steps, mut sum, mut capacity) = (0, 0, 0);
        for _ in 0..100 {
            s.push('x');
            if s.capacity() != capacity {
                capacity = s.capacity();
                steps += 1;
                sum += capacity as u64;
            }
        }
        (s, steps, sum)
    });
    assert_eq!((steps, sum), (5, 8 + 16 + 32 + 64 + 128), "std's growth steps changed");
    let last = s.capacity() as u64;
    assert_eq!(figures(&stats), [sum, steps, last, last, 1]);
    assert_eq!(s, "x".repeat(100), "the string's bytes through its moves");
}

/// `realloc` as dhat counts it: a new block of the new size; the old one freed if the scope
/// allocated it, else (allocated before the scope) the new block is simply allocated.
#[test]
fn a_realloc_counts_as_dhat_counts_it() {
    let ((), stats) = measure(|| {
        let mut v = Vec::<u8>::with_capacity(100);
        v.reserve_exact(400);
        assert_eq!(v.capacity(), 400);
        black_box(v);
    });
    assert_eq!(figures(&stats), [500, 2, 400, 0, 0]);
    let mut before = Vec::<u8>::with_capacity(100);
    let ((), stats) = measure(|| before.reserve_exact(1000));
    assert_eq!(figures(&stats), [1000, 1, 1000, 1000, 1]);
    drop(before);
}

/// Measured blocks of every size and alignment (those the allocator serves inside a larger
/// block, over-aligned, or large) keep their contents through `realloc` up and down, are
/// zeroed by `alloc_zeroed`, and are freed with the layout they were made with (a wrong one
/// crashes glibc's `free`).
#[test]
fn measured_blocks_keep_their_contents_and_layouts() {
    use std::alloc::{alloc, alloc_zeroed, dealloc, realloc, Layout};
    let check = |p: *mut u8, n: usize, seed: u8| {
        // SAFETY: `p` holds `n` initialised bytes.
        let bytes = unsafe { std::slice::from_raw_parts(p, n) };
        assert!(bytes.iter().enumerate().all(|(i, &b)| b == (i as u8).wrapping_add(seed)), "{n} bytes");
    };
    let fill = |p: *mut u8, n: usize, seed: u8| {
        for i in 0..n {
            // SAFETY: `p` has room for `n` bytes.
            unsafe { p.add(i).write((i as u8).wrapping_add(seed)) };
        }
    };
    let ((), stats) = measure(|| {
        for size in [1, 15, 16, 100, 497, 512, 4000, 65_535, 65_536, 100_000] {
            for align in [1, 8, 16, 64, 512, 4096] {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: every block is nonzero in size, used within its size and freed with
                // its layout.
                unsafe {
                    let zeroed = alloc_zeroed(layout);
                    assert!(!zeroed.is_null() && (zeroed as usize).is_multiple_of(align));
                    assert!(std::slice::from_raw_parts(zeroed, size).iter().all(|&b| b == 0), "{size} zeroed");
                    dealloc(zeroed, layout);
                    let p = alloc(layout);
                    assert!(!p.is_null() && (p as usize).is_multiple_of(align));
                    fill(p, size, 7);
                    let bigger = realloc(p, layout, size * 3);
                    assert!(!bigger.is_null() && (bigger as usize).is_multiple_of(align));
                    check(bigger, size, 7);
                    fill(bigger, size * 3, 9);
                    let smaller = realloc(bigger, Layout::from_size_align(size * 3, align).unwrap(), size.div_ceil(2));
                    assert!(!smaller.is_null() && (smaller as usize).is_multiple_of(align));
                    check(smaller, size.div_ceil(2), 9);
                    dealloc(smaller, Layout::from_size_align(size.div_ceil(2), align).unwrap());
                }
            }
        }
    });
    assert_eq!((stats.curr_blocks, stats.curr_bytes, stats.untracked_blocks), (0, 0, 0), "{stats:?}");
    assert_eq!(stats.total_blocks, 10 * 6 * 4);
}

/// Where dhat-rs's reference program for this crate is built (once per target directory).
fn dhat_reference() -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dhat-reference");
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dhat-reference");
    let _alone = super::cpu_heavy();
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cargo.args(["build", "--quiet", "--offline", "--target-dir"]).arg(&target).current_dir(&fixture);
    assert!(cargo.status().expect("run cargo").success(), "building {}", fixture.display());
    target.join("debug").join("memtrace-dhat-reference")
}

#[test]
fn a_hash_map_of_1000_entries_counts_what_dhat_counts() {
    let (map, stats) = measure(workload::hash_map_of_1000);
    assert_eq!(map.len(), 1000);
    let out = Command::new(dhat_reference()).output().expect("run the dhat reference");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed: Vec<u64> =
        String::from_utf8(out.stdout).unwrap().split_whitespace().map(|n| n.parse().unwrap()).collect();
    let (dhat, peak_in_workload) = printed.split_at(5);
    assert_eq!(peak_in_workload, [1], "dhat's peak was before the workload: its max_bytes says nothing of it");
    assert_eq!(figures(&stats).as_slice(), dhat, "ours (left) and dhat's");
    assert!(stats.total_blocks > 1 && stats.max_bytes > stats.curr_bytes, "the map grew: {stats:?}");
}

const LEAK_LINE: u32 = line!() + 5;
/// Leaks three blocks (and frees one), at one line.
#[inline(never)]
fn leak_three() {
    for size in [100, 200, 300, 400] {
        let block = Vec::<u8>::with_capacity(size);
        if size != 400 {
            std::mem::forget(block);
        }
    }
}

/// A leak of three blocks is found, and the failed assertion's message names the function
/// and line that allocated them.
#[test]
fn a_leak_of_three_blocks_is_found_and_named() {
    let ((), stats) = measure(leak_three);
    assert_eq!(figures(&stats), [1000, 4, 1000, 600, 3]);
    let failure = std::panic::catch_unwind(|| stats.assert_no_leaks()).expect_err("three blocks leaked");
    let message = failure.downcast_ref::<String>().expect("a formatted message");
    let (function, line) = ("heap_assertions::leak_three at ", format!("{}:{LEAK_LINE}\n", file!()));
    let names_the_site = |message: &str| message.lines().any(|l| l.contains(function) && l.contains(line.trim_end()));
    assert!(message.contains("3 blocks (600 bytes) are still live"), "{message}");
    assert!(names_the_site(message), "no {function}{line} in:\n{message}");
    assert!(message.contains(&format!("heap assertion failed at {}:", file!())), "{message}");
    let top = stats.sites().into_iter().next().expect("a site");
    assert_eq!((top.function.ends_with("::leak_three"), top.line, top.bytes), (true, LEAK_LINE, 1000));
    stats.assert_max_bytes(1000);
    let failure = std::panic::catch_unwind(|| stats.assert_max_bytes(999)).expect_err("the peak is 1000");
    let message = failure.downcast_ref::<String>().unwrap();
    assert!(message.contains("the peak of live bytes, 1000, is above the limit of 999"), "{message}");
    assert!(names_the_site(message), "{message}");
}

/// Blocks the scope allocates and another thread frees while it runs count as freed; what a
/// thread the scope spawns allocates counts nowhere (only the calling thread is measured),
/// though its frees of the scope's blocks count.
#[test]
fn frees_on_other_threads_count_and_spawned_threads_are_not_measured() {
    let handed: Mutex<Option<Vec<u8>>> = Mutex::new(None);
    let freed = AtomicBool::new(false);
    std::thread::scope(|s| {
        // A hang guard, many times what the hand-over takes.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let (handed, freed) = (&handed, &freed);
        s.spawn(move || loop {
            if let Some(block) = handed.lock().unwrap().take() {
                drop(block);
                freed.store(true, Ordering::SeqCst);
                return;
            }
            assert!(std::time::Instant::now() < deadline, "the block was never handed over");
            std::thread::yield_now();
        });
        let ((), stats) = measure(|| {
            *handed.lock().unwrap() = Some(vec![1u8; 5000]);
            while !freed.load(Ordering::SeqCst) {
                assert!(std::time::Instant::now() < deadline, "the handed block was never freed");
                std::thread::yield_now();
            }
        });
        assert_eq!(figures(&stats), [5000, 1, 5000, 0, 0]);
    });

    // A scoped thread spawned inside: its own 70 000 bytes are not the scope's; the 5000-byte
    // block it frees is (the scope's other blocks are the spawn's own, a few hundred bytes).
    let ((), stats) = measure(|| {
        let block = vec![1u8; 5000];
        std::thread::scope(|s| {
            s.spawn(move || {
                drop(block);
                black_box(vec![2u8; 70_000]);
            });
        });
    });
    assert!(stats.total_bytes >= 5000 && stats.total_bytes < 70_000, "{stats:?}");
    assert!(stats.max_bytes >= 5000 && stats.curr_bytes < 5000, "the free on the spawned thread: {stats:?}");
}

/// Eight threads measuring at once, each allocating its own sizes while the others do (all
/// inside their scopes at the barrier half-way): each gets its own exact figures.
#[test]
fn eight_threads_measuring_at_once_each_get_their_own_counts() {
    const THREADS: u64 = 8;
    const BLOCKS: u64 = 500;
    let (start, half_way) = (Barrier::new(THREADS as usize), Barrier::new(THREADS as usize));
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (start, half_way) = (&start, &half_way);
            s.spawn(move || {
                let size = |k: u64| 16 * (t + 1) + k;
                let mut kept = Vec::with_capacity(BLOCKS as usize);
                start.wait();
                let ((), stats) = measure(|| {
                    for k in 0..BLOCKS {
                        if k == BLOCKS / 2 {
                            half_way.wait();
                        }
                        let block = vec![t as u8; size(k) as usize];
                        if k % 2 == 0 {
                            kept.push(block);
                        }
                    }
                });
                let total: u64 = (0..BLOCKS).map(size).sum();
                let live: u64 = (0..BLOCKS).filter(|k| k % 2 == 0).map(size).sum();
                // The peak: the blocks kept, with each freed one live beside them in turn (the
                // last freed is the largest, live with all the kept ones but the last).
                let peak = (0..BLOCKS).filter(|k| k % 2 == 1).map(|k| live_before(k, size) + size(k)).max().unwrap();
                assert_eq!(figures(&stats), [total, BLOCKS, peak.max(live), live, BLOCKS / 2], "thread {t}");
                drop(kept);
            });
        }
    });
}

/// The bytes of the even blocks before block `k`.
fn live_before(k: u64, size: impl Fn(u64) -> u64) -> u64 {
    (0..k).filter(|j| j % 2 == 0).map(size).sum()
}

/// A scope nested in another counts in both; a block the inner one leaves live belongs to the
/// outer one from then on (its free there counts).
#[test]
fn nested_scopes_count_in_both() {
    let ((inner, kept), outer) = measure(|| {
        let first = vec![0u8; 100];
        let (kept, inner) = measure(|| (vec![0u8; 200], black_box(vec![0u8; 50]).len()));
        drop(first);
        let (kept, _) = kept;
        let last = vec![0u8; 300];
        drop(kept);
        (inner, last)
    });
    assert_eq!(figures(&inner), [250, 2, 250, 200, 1]);
    assert_eq!(figures(&outer), [650, 4, 500, 300, 1]);
    drop(kept);
}

/// A block a scope leaves live holds no slot of the scopes' table once the scope has ended
/// (there are 255): a thousand scopes that each leak one run one after another, and the leaked
/// blocks' frees, later, count in no scope.
#[test]
fn leaked_blocks_hold_no_scope_slot() {
    let leaked: Vec<Vec<u8>> = (0..1000)
        .map(|_| {
            let (block, stats) = measure(|| vec![0u8; 8]);
            assert_eq!(figures(&stats), [8, 1, 8, 8, 1]);
            block
        })
        .collect();
    let ((), stats) = measure(|| drop(leaked));
    assert_eq!(figures(&stats), [0, 0, 0, 0, 0], "frees of other scopes' blocks");
}

/// A panic inside the scope goes on, with its own payload; the stats are kept. (The unwinding
/// allocates too, the payload and the exception: the figures of the same panic without the
/// leaked block are taken away.)
#[test]
fn a_panic_in_the_scope_propagates_and_keeps_the_stats() {
    let panicked = |leak: usize| {
        let payload = std::panic::catch_unwind(|| {
            measure(|| {
                if leak != 0 {
                    std::mem::forget(vec![0u8; leak]);
                }
                std::panic::resume_unwind(Box::new(42u32));
            })
        })
        .expect_err("the panic propagates");
        assert_eq!(payload.downcast_ref::<u32>(), Some(&42));
        let stats = unwound_stats().expect("the stats of the scope that panicked");
        assert!(unwound_stats().is_none(), "taken once");
        figures(&stats)
    };
    let (with, without) = (panicked(300), panicked(0));
    assert_eq!(std::array::from_fn(|i| with[i] - without[i]), [300, 1, 300, 300, 1], "{with:?} {without:?}");
}

/// The bytes the session child allocates at each of its two sites, in blocks of
/// [`SESSION_BLOCK`].
const SESSION_BYTES: u64 = 8 << 20;
const SESSION_BLOCK: u64 = 1000;
/// The session child's rate: some 1000 samples per site.
const SESSION_RATE: &str = "1e-3";

#[inline(never)]
fn site_measured() {
    for _ in 0..SESSION_BYTES / SESSION_BLOCK {
        black_box(Vec::<u8>::with_capacity(SESSION_BLOCK as usize));
    }
}

#[inline(never)]
fn site_unmeasured() {
    for _ in 0..SESSION_BYTES / SESSION_BLOCK {
        black_box(Vec::<u8>::with_capacity(SESSION_BLOCK as usize));
    }
}

/// The session child: one site measured, one not, both traced; the scope's figures checked
/// here, exact.
pub(super) fn session_child() {
    let guard = trace_if_requested();
    assert!(guard.is_some(), "not tracing");
    let ((), stats) = measure(site_measured);
    let blocks = SESSION_BYTES / SESSION_BLOCK;
    let bytes = blocks * SESSION_BLOCK;
    assert_eq!(figures(&stats), [bytes, blocks, SESSION_BLOCK, 0, 0]);
    site_unmeasured();
    drop(guard);
}

/// A session tracing while a scope is measured: both sites' estimates (the measured one's
/// samples taken by the countdown kept aside) within [`SIGMAS`] standard deviations of the truth, nothing lost, and
/// the scope's counts exact (checked in the child).
#[test]
fn a_session_running_meanwhile_is_not_disturbed() {
    let path = temp_path("heap-assertions-session");
    let file = path.to_str().unwrap().to_owned();
    let env = [("MEMTRACE_FILE", &file[..]), ("MEMTRACE_RATE", SESSION_RATE)];
    let (out, _) = output_within(super::child("heap-assertions:session", &env), "session", Duration::from_secs(120));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(memtrace_messages(&out), Vec::<String>::new(), "something was lost");
    let trace = Trace::read(&path);
    let rate = trace.info.sample_rate;
    let bytes = (SESSION_BYTES / SESSION_BLOCK * SESSION_BLOCK) as f64;
    // A site's samples are about Poisson with mean words × rate: an estimate of `bytes` has a
    // standard deviation of sqrt(bytes × 8 / rate).
    let sigma = (bytes * 8.0 / rate).sqrt();
    for site in ["::site_measured", "::site_unmeasured"] {
        let estimate = trace.estimated_bytes(site);
        assert!((estimate - bytes).abs() <= SIGMAS * sigma, "{site}: estimated {estimate:.0}, truth {bytes}");
    }
    let _ = std::fs::remove_file(&path);
}
