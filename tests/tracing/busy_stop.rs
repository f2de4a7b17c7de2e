//! A stop while the program's threads keep every CPU busy: the writer, starved of CPU but
//! making progress, is waited for, and the trace is complete.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use memtrace_rs::trace::Reader;
use memtrace_rs::{start_tracing, TraceConfig};

use super::{memtrace_messages, run_within, temp_path};

/// Allocating threads: many times the CPUs a test machine has, each as busy as it can be.
const THREADS: usize = 96;
/// How long the threads allocate, traced at rate 1, before another thread stops the trace.
const TRACED_FOR: Duration = Duration::from_millis(300);
/// The stop timeout: the 97 threads on two CPUs left the writer without a turn for longer
/// (for more than the default 1 s, at times), and the stop gave up on it (in each of 4 runs)
/// before it waited for a writer starved of CPU. Now waited for up to 60 times that (6 s)
/// without progress: far longer than it goes without a turn.
const STOP_TIMEOUT: Duration = Duration::from_millis(100);
/// How long they go on allocating once the stop began: many stop timeouts, and short, as the
/// other tests run beside this one on the same CPUs.
const STARVING_FOR: Duration = Duration::from_millis(1500);

/// The child: [`THREADS`] threads allocating at rate 1, and the stop, from another thread
/// while they go on allocating for [`STARVING_FOR`]; says on stderr the samples the stop says
/// were written. (Not until the stop ends: the writer of a debug build, on one ninety-seventh
/// of the CPUs, took minutes to drain the full queue.)
pub(super) fn child() {
    let path = std::env::var_os("MEMTRACE_TEST_FILE").expect("MEMTRACE_TEST_FILE");
    let config = TraceConfig::new(path).rate(1.0).stop_timeout(STOP_TIMEOUT);
    let guard = start_tracing(config).expect("tracing started");
    let done = Arc::new(AtomicBool::new(false));
    let started = Arc::new(Barrier::new(THREADS + 1));
    let threads: Vec<_> = (0..THREADS)
        .map(|i| {
            let (done, started) = (Arc::clone(&done), Arc::clone(&started));
            std::thread::spawn(move || {
                started.wait();
                while !done.load(Ordering::Relaxed) {
                    black_box(vec![i as u8; 64 + i]);
                }
            })
        })
        .collect();
    started.wait();
    std::thread::sleep(TRACED_FOR);
    let stop = std::thread::spawn(move || guard.finish());
    std::thread::sleep(STARVING_FOR);
    done.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().unwrap();
    }
    let stats = stop.join().unwrap();
    let stats = stats.expect("the stop waited for the writer");
    eprintln!("samples written: {}", stats.samples_written);
}

#[test]
fn a_stop_waits_for_a_writer_starved_of_cpu() {
    let path = temp_path("starved-stop");
    let (out, took) =
        run_within("busy-stop", &[("MEMTRACE_TEST_FILE", path.to_str().unwrap())], Duration::from_secs(120));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    eprintln!("took {took:?}");
    let messages = memtrace_messages(&out);
    assert!(messages.iter().all(|m| !m.contains("gave up")), "{messages:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let written: u64 =
        stderr.lines().find_map(|l| l.strip_prefix("samples written: ")).expect("the child's count").parse().unwrap();
    // Every sample the stop says was written is in the trace, which its writer closed.
    let mut reader = Reader::open(&path).unwrap();
    let mut allocs = 0;
    while let Some(event) = reader.next_event().unwrap() {
        if matches!(event.kind, memtrace_rs::trace::EventKind::Alloc(_)) {
            allocs += 1;
        }
    }
    assert!(reader.closed_by_writer(), "the trace was not closed");
    assert!(written > 1000, "{written} samples");
    assert!(allocs >= written, "{allocs} allocations in the trace, {written} written");
    let _ = std::fs::remove_file(&path);
}
