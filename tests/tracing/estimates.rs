//! The estimates on heaps the size of real services: live heaps of 256 MiB and 1 GiB in blocks
//! of every size class that once capped what could be seen, at the default rate and at 1e-4,
//! each site's live and allocated estimates within `SIGMAS` (6) standard deviations of the truth and no sample lost;
//! and a writer forced to fall behind, whose lost samples the trace records so that the total
//! stays unbiased.

use std::hint::black_box;
use std::time::Duration;

use memtrace_rs::trace_if_requested;

use super::{memtrace_messages, output_within, temp_path, Trace, SIGMAS};

/// The variables of a grid child: the bytes to keep live, and the blocks to keep them in.
const HEAP_VAR: &str = "MEMTRACE_TEST_HEAP";
const BLOCKS_VAR: &str = "MEMTRACE_TEST_BLOCKS";
/// The bytes the churn case allocates and frees besides its live heap.
const CHURN_BYTES: usize = 4 << 30;
/// The blocks of the churn case (and of the mix's larger part).
const CHURN_BLOCK: usize = 32 << 10;
/// The mix: 70 % of the heap in 32 KiB blocks, 30 % in 100-byte blocks.
const MIX_SMALL: usize = 100;

/// Keep `bytes` live in blocks of `size` (the last one smaller if need be), at this site; the
/// blocks are held in a vector allocated elsewhere.
#[inline(never)]
fn site_live(held: &mut Vec<Box<[u8]>>, bytes: usize, size: usize) {
    let mut left = bytes;
    while left > 0 {
        let n = size.min(left);
        // Written once a page, as a program would: the memory is really used.
        let mut block = Vec::<u8>::with_capacity(n);
        // SAFETY: `n` bytes of capacity; every byte is written before the vector reads it.
        unsafe {
            block.as_mut_ptr().write_bytes(1, n);
            block.set_len(n);
        }
        held.push(black_box(block.into_boxed_slice()));
        left -= n;
    }
}

/// The small blocks of the mix, at a site of their own.
#[inline(never)]
fn site_live_small(held: &mut Vec<Box<[u8]>>, bytes: usize) {
    site_live(held, bytes, MIX_SMALL)
}

/// Allocate and free `bytes` in blocks of [`CHURN_BLOCK`].
#[inline(never)]
fn site_churn(bytes: usize) {
    for _ in 0..bytes / CHURN_BLOCK {
        let block = Vec::<u8>::with_capacity(CHURN_BLOCK);
        black_box(&block);
    }
}

/// The grid's child: keeps its heap live to the end of the trace (the stop), then exits
/// without freeing it.
pub(super) fn child() {
    let heap: usize = std::env::var(HEAP_VAR).unwrap().parse().unwrap();
    let blocks = std::env::var(BLOCKS_VAR).unwrap();
    let guard = trace_if_requested();
    assert!(guard.is_some(), "not tracing");
    let mut held = Vec::with_capacity(heap / MIX_SMALL.min(64) + 16);
    match blocks.as_str() {
        "mix" => {
            site_live(&mut held, heap / 10 * 7, CHURN_BLOCK);
            site_live_small(&mut held, heap / 10 * 3);
        }
        "churn" => {
            site_live(&mut held, heap, CHURN_BLOCK);
            site_churn(CHURN_BYTES);
        }
        size => site_live(&mut held, heap, size.parse().unwrap()),
    }
    drop(guard);
    std::mem::forget(held);
}

/// What a site of a grid case should show: its function, its bytes allocated and live at the
/// end.
struct Truth {
    site: &'static str,
    allocated: usize,
    live: usize,
}

/// The sites of a grid case, and what each allocated and keeps.
fn truths(heap: usize, blocks: &str) -> Vec<Truth> {
    match blocks {
        "mix" => vec![
            Truth { site: "::site_live", allocated: heap / 10 * 7, live: heap / 10 * 7 },
            Truth { site: "::site_live_small", allocated: heap / 10 * 3, live: heap / 10 * 3 },
        ],
        "churn" => vec![
            Truth { site: "::site_live", allocated: heap, live: heap },
            Truth { site: "::site_churn", allocated: CHURN_BYTES, live: 0 },
        ],
        _ => vec![Truth { site: "::site_live", allocated: heap, live: heap }],
    }
}

/// Whether `estimate` bytes is within [`SIGMAS`] standard deviations of `truth` at `rate`: a site's
/// samples are the sample points among its words, about Poisson with mean `words × rate`, so
/// an estimate of `truth` bytes has a standard deviation of `sqrt(truth × 8 / rate)` bytes.
fn within_sigmas(estimate: f64, truth: usize, rate: f64) -> bool {
    let sigma = (truth as f64 * 8.0 / rate).sqrt();
    (estimate - truth as f64).abs() <= SIGMAS * sigma.max(8.0 / rate)
}

/// One case of the grid: the child keeps `heap` bytes in `blocks` at `rate`; every site's
/// figures are checked against the truth, and nothing may be lost.
fn check_case(rate: &str, heap: usize, blocks: &str) {
    let path = temp_path(&format!("estimates-{rate}-{heap}-{blocks}"));
    let (heap_text, file) = (heap.to_string(), path.to_str().unwrap().to_owned());
    let env = [("MEMTRACE_FILE", &file[..]), ("MEMTRACE_RATE", rate), (HEAP_VAR, &heap_text), (BLOCKS_VAR, blocks)];
    let (out, _) = output_within(super::child("estimates:grid", &env), "estimates:grid", Duration::from_secs(300));
    assert!(out.status.success(), "{rate} {heap} {blocks}: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(memtrace_messages(&out), Vec::<String>::new(), "{rate} {heap} {blocks}: something was lost");
    let trace = Trace::read(&path);
    let rate: f64 = trace.info.sample_rate;
    let lost = trace.allocs.values().filter(|a| trace.frames(a).flatten().any(|l| l.filename_str() == "<memtrace>"));
    assert_eq!(lost.count(), 0, "{rate} {heap} {blocks}: the trace records lost samples");
    for truth in truths(heap, blocks) {
        // The sites nest (the mix's small site calls the other), so a sample counts for the
        // outermost of them only.
        let own = |a: &super::Allocation| {
            let outermost_site =
                trace.frames(a).flatten().find(|l| l.defname_str().contains("::site_")).map(|l| l.defname_str());
            outermost_site.is_some_and(|name| name.ends_with(truth.site))
        };
        let samples = |live_only: bool| -> f64 {
            trace
                .allocs
                .iter()
                .filter(|(id, a)| own(a) && !(live_only && trace.collected.contains(id)))
                .map(|(_, a)| trace.info.bytes_for_samples(a.nsamples))
                .sum()
        };
        let (allocated, live) = (samples(false), samples(true));
        let what = format!("rate {rate}, {heap} bytes in {blocks}, {}", truth.site);
        assert!(
            within_sigmas(allocated, truth.allocated, rate),
            "{what}: allocated {allocated:.0}, truth {}",
            truth.allocated
        );
        assert!(within_sigmas(live, truth.live, rate), "{what}: live at the end {live:.0}, truth {}", truth.live);
    }
    let _ = std::fs::remove_file(&path);
}

/// The block sizes of the grid: the size classes that once capped what a trace could see.
const BLOCK_SIZES: [&str; 9] = ["64", "1024", "4096", "16384", "32768", "50000", "65536", "262144", "mix"];

/// Held by a grid while it runs: the grids of both rates would otherwise run at once.
static ONE_GRID_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The grid at one rate, two children at a time (one per core), each its own process: at most
/// two heaps of 1 GiB (and their blocks' headers, some 2.5 GB in all) at once.
fn check_grid(rate: &'static str) {
    let _one = ONE_GRID_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut cases: Vec<(usize, &str)> = Vec::new();
    for heap in [256 << 20, 1 << 30] {
        cases.extend(BLOCK_SIZES.iter().map(|&blocks| (heap, blocks)));
    }
    cases.push((1 << 30, "churn"));
    for pair in cases.chunks(2) {
        std::thread::scope(|s| {
            for &(heap, blocks) in pair {
                s.spawn(move || check_case(rate, heap, blocks));
            }
        });
    }
}

#[test]
fn estimates_hold_on_large_heaps_at_the_default_rate() {
    check_grid("1e-5");
}

#[test]
fn estimates_hold_on_large_heaps_at_1e_4() {
    check_grid("1e-4");
}

/// The bytes the writer-behind child allocates (and frees) at its one site.
const BEHIND_BYTES: usize = 200 << 20;
/// The blocks it allocates them in.
const BEHIND_BLOCK: usize = 1024;

#[inline(never)]
fn site_behind() {
    for _ in 0..BEHIND_BYTES / BEHIND_BLOCK {
        black_box(Vec::<u8>::with_capacity(BEHIND_BLOCK));
    }
}

/// The writer-behind child: its writer sleeps between doorbells (a debug hook), so the queue
/// fills and samples are lost until the stop.
#[cfg(debug_assertions)]
pub(super) fn child_behind() {
    memtrace_rs::__internals::writer_waits_for_its_doorbell();
    let guard = trace_if_requested();
    assert!(guard.is_some(), "not tracing");
    site_behind();
    drop(guard);
}

/// A writer that falls far behind loses samples, and says so in the trace: `memtrace info`
/// reports them, by cause, and the allocated total, lost samples included, stays within `SIGMAS`
/// of the bytes allocated.
#[test]
#[cfg(all(debug_assertions, feature = "cli"))]
fn samples_lost_with_the_writer_behind_are_recorded_and_keep_the_total() {
    let path = temp_path("estimates-writer-behind");
    let env = [("MEMTRACE_FILE", path.to_str().unwrap()), ("MEMTRACE_RATE", "1e-2")];
    let (out, _) = output_within(super::child("estimates:behind", &env), "estimates:behind", Duration::from_secs(120));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        memtrace_messages(&out).iter().any(|m| m.contains("samples") && m.contains("the trace records them as lost")),
        "the child did not report lost samples"
    );
    let info = std::process::Command::new(env!("CARGO_BIN_EXE_memtrace"))
        .args(["info", "--format", "json"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(info.status.success(), "{}", String::from_utf8_lossy(&info.stderr));
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    let lost = &info["samples_lost"];
    let lost_samples = lost["samples"].as_u64().unwrap();
    assert!(lost_samples > 10_000, "{lost}");
    assert_eq!(lost["by_cause"][0]["cause"], "<samples lost: writer behind>", "{lost}");
    // Their share of all the trace's samples (how large it is depends on how far behind the
    // writer fell, which depends on the machine's load).
    let all_samples = info["allocated"]["samples"].as_f64().unwrap();
    let share = lost["share"].as_f64().unwrap();
    assert!(share > 0.0 && (share - lost_samples as f64 / all_samples).abs() < 1e-9, "{lost}, of {all_samples}");
    assert_eq!(info["closed_by_writer"], true);
    // Every view warns.
    let report = path.with_extension("html");
    for args in [
        &["hotspots"][..],
        &["timeline", "-o", "-"],
        &["pprof", "-o", report.to_str().unwrap()],
        &["report", "-o", report.to_str().unwrap()],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_memtrace"))
            .args(&args[..1])
            .arg(&path)
            .args(&args[1..])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && stderr.contains("the tracer lost"), "{args:?}: {stderr}");
    }
    let _ = std::fs::remove_file(&report);
    // The whole program's allocations: the site's, and the few of the test harness's child.
    let total = info["allocated"]["bytes"].as_f64().unwrap();
    assert!(
        within_sigmas(total, BEHIND_BYTES, 1e-2) || (total > BEHIND_BYTES as f64 && total < BEHIND_BYTES as f64 * 1.01),
        "allocated {total:.0}, truth {BEHIND_BYTES}"
    );
    let _ = std::fs::remove_file(&path);
}

/// Blocks the late-frees child keeps, then frees: enough that their frees overflow the queue
/// (128 Ki messages at rate 1, half of them the samples'), few enough for the late frees'
/// slots to take the rest (without them, frees are lost: checked).
const LATE_FREED_BLOCKS: usize = 150_000;

#[inline(never)]
#[allow(clippy::vec_box)] // Each box is a sampled block of its own.
fn site_freed_late() -> Vec<Box<[u8; 64]>> {
    (0..LATE_FREED_BLOCKS).map(|_| black_box(Box::new([0u8; 64]))).collect()
}

/// The late-frees child: with its writer asleep between doorbells (a debug hook), it keeps more
/// sampled blocks than the queue has room for frees, then frees them all.
#[cfg(debug_assertions)]
pub(super) fn child_frees_behind() {
    memtrace_rs::__internals::writer_waits_for_its_doorbell();
    let guard = trace_if_requested();
    assert!(guard.is_some(), "not tracing");
    let kept = site_freed_late();
    drop(kept);
    drop(guard);
}

/// Frees that find the queue full with the writer far behind are not lost: every sampled block
/// the trace holds is freed in it.
#[test]
#[cfg(debug_assertions)]
fn frees_with_the_writer_behind_are_not_lost() {
    let path = temp_path("estimates-frees-behind");
    let env = [("MEMTRACE_FILE", path.to_str().unwrap()), ("MEMTRACE_RATE", "1")];
    let (out, _) =
        output_within(super::child("estimates:frees-behind", &env), "estimates:frees-behind", Duration::from_secs(120));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let messages = memtrace_messages(&out);
    assert!(!messages.iter().any(|m| m.contains("frees of sampled blocks were lost")), "{messages:?}");
    let trace = Trace::read(&path);
    let sampled: Vec<_> = trace.at_site("::site_freed_late").collect();
    // More than the queue's half (64 Ki messages at rate 1) that frees may use, the other
    // holding the samples' own messages.
    assert!(sampled.len() > 65_536, "{} samples", sampled.len());
    let alive = sampled.iter().filter(|(id, _)| !trace.collected.contains(id)).count();
    assert_eq!(alive, 0, "sampled blocks left alive in the trace");
    let _ = std::fs::remove_file(&path);
}
