//! Control of a running session, end to end: a window's trace of a service for profiles only,
//! which begins with its 200 MB live; a file trace rotated at 1 MiB over some 10 MiB, each
//! file readable alone and the last ones kept; a rate change from 1e-5 to 1e-3 and back, whose
//! files of the series keep every estimate unbiased; a file trace started and stopped in a
//! running session.
//!
//! Each child does its part and exits; the parent reads its traces back with this crate's
//! reader (`Trace::read`, which checks every event). Estimates are checked at 5 sigma, not 4:
//! each test makes several checks, and the team's bound is 1e-6 false failures per run (4 sigma
//! two-sided is 6e-5 a check, 5 sigma 6e-7).

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use memtrace_rs::{
    session_state, set_rate, start_file_trace, start_tracing, stop_file_trace, trace_window, ControlError, TraceConfig,
};

use super::{assert_one_message, memtrace_messages, output_within, temp_path, Trace};

/// Where a child writes its traces.
const DIR_VAR: &str = "MEMTRACE_TEST_DIR";

/// Blocks kept live, and blocks allocated and freed at once.
const KEPT_BLOCK: usize = 64 << 10;
const CHURN_BLOCK: usize = 4 << 10;

/// Keep `bytes` live in blocks of [`KEPT_BLOCK`], at the site of the caller (inlined).
#[inline(always)]
fn keep(bytes: usize) -> Vec<Vec<u8>> {
    (0..bytes / KEPT_BLOCK).map(|_| black_box(Vec::with_capacity(KEPT_BLOCK))).collect()
}

/// Allocate and free `bytes` in blocks of [`CHURN_BLOCK`], at the site of the caller (inlined).
#[inline(always)]
fn churn(bytes: usize) {
    for _ in 0..bytes / CHURN_BLOCK {
        black_box(Vec::<u8>::with_capacity(CHURN_BLOCK));
    }
}

/// Whether `estimate` bytes is within 5 sigma of `truth`, sigma² being the sum of
/// `8 × bytes / rate` over the parts `(bytes, rate)` of the truth sampled at each rate (a
/// site's samples are about Poisson, see `estimates`).
fn within_5_sigma(estimate: f64, truth: f64, parts: &[(f64, f64)]) -> bool {
    let sigma = parts.iter().map(|(bytes, rate)| 8.0 * bytes / rate).sum::<f64>().sqrt();
    (estimate - truth).abs() <= 5.0 * sigma
}

/// The bytes of `trace`'s allocations at `site`: those it began with (`carried`) or those
/// made while it ran, all or only those live at its end.
fn bytes_at(trace: &Trace, site: &str, carried: bool, live_only: bool) -> f64 {
    trace
        .at_site(site)
        .filter(|(id, a)| a.carried == carried && !(live_only && trace.collected.contains(id)))
        .map(|(_, a)| trace.info.bytes_for_samples(a.nsamples))
        .sum()
}

/// The bytes live at `trace`'s end at `site`, carried or not.
fn live_at_end(trace: &Trace, site: &str) -> f64 {
    bytes_at(trace, site, true, true) + bytes_at(trace, site, false, true)
}

fn params(trace: &Trace) -> String {
    String::from_utf8_lossy(&trace.info.runtime_params).into_owned()
}

/// Wait (a hang guard of a minute) until `done` says so.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(60), "{what}: not after a minute");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Run the child `role` with its traces in a new directory, within five minutes: the directory.
fn run_child(role: &str) -> PathBuf {
    let (dir, out) = run_child_with(role, &[]);
    assert_eq!(memtrace_messages(&out), Vec::<String>::new(), "{role}: something was lost");
    dir
}

/// [`run_child`] with the variables `env` besides (`{dir}` in a value is the directory), which
/// may say something: the directory and the child's output.
fn run_child_with(role: &str, env: &[(&str, &str)]) -> (PathBuf, std::process::Output) {
    let dir = temp_path(role.trim_start_matches("control:")).with_extension("d");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let values: Vec<String> = env.iter().map(|(_, v)| v.replace("{dir}", dir.to_str().unwrap())).collect();
    let mut vars = vec![(DIR_VAR, dir.to_str().unwrap())];
    vars.extend(env.iter().zip(&values).map(|((k, _), v)| (*k, v.as_str())));
    let (out, _) = output_within(super::child(role, &vars), role, Duration::from_secs(300));
    assert!(out.status.success(), "{role}: {}", String::from_utf8_lossy(&out.stderr));
    (dir, out)
}

pub(super) fn child(role: &str) {
    let dir = PathBuf::from(std::env::var_os(DIR_VAR).unwrap());
    match role {
        "control:window" => window_child(&dir),
        "control:rotate" => rotate_child(&dir),
        "control:rate" => rate_child(&dir),
        "control:file" => file_child(&dir),
        "control:env" => env_child(&dir),
        other => panic!("unknown role {other}"),
    }
}

// ---------------------------------------------------------------------------------------------
// A window of a service for profiles only

const WINDOW_RATE: f64 = 1e-4;
/// Live before the window; half of it freed during the window.
const LIVE_AT_START: usize = 200 << 20;
/// Allocated during the window, and freed; and kept.
const WINDOW_CHURN: usize = 100 << 20;
const WINDOW_KEPT: usize = 20 << 20;

#[inline(never)]
fn site_live_before_window() -> Vec<Vec<u8>> {
    keep(LIVE_AT_START)
}

#[inline(never)]
fn site_churn_in_window() {
    churn(WINDOW_CHURN)
}

#[inline(never)]
fn site_kept_in_window() -> Vec<Vec<u8>> {
    keep(WINDOW_KEPT)
}

fn window_child(dir: &Path) {
    let _guard = start_tracing(TraceConfig::profile_only().rate(WINDOW_RATE)).unwrap();
    let mut live = site_live_before_window();
    let above = trace_window(std::io::sink(), Duration::from_secs(1), Some(WINDOW_RATE * 2.0));
    assert!(matches!(above, Err(ControlError::RateAboveSession { .. })), "{above:?}");
    let out = std::fs::File::create(dir.join("window.ctf")).unwrap();
    let window = std::thread::spawn(move || trace_window(out, Duration::from_secs(2), None));
    // The same window at a tenth of the rate: the samples thinned to it.
    let low = std::fs::File::create(dir.join("window-low.ctf")).unwrap();
    let low = std::thread::spawn(move || trace_window(low, Duration::from_secs(2), Some(WINDOW_RATE / 10.0)));
    wait_for("the windows' start", || session_state().is_some_and(|s| s.windows() == 2));
    site_churn_in_window();
    let kept = site_kept_in_window();
    drop(live.split_off(live.len() / 2));
    // The window's allocations are all in it (they take far less than its 2 s).
    assert_eq!(session_state().unwrap().windows(), 2, "a window ended before its allocations were made");
    let stats = window.join().unwrap().unwrap();
    low.join().unwrap().unwrap();
    assert!(stats.live_at_start > 0 && stats.samples > 0 && stats.frees > 0, "{stats:?}");
    // Nothing on disk but the window: the session is for profiles only.
    assert!(session_state().unwrap().files().is_empty());
    std::mem::forget((live, kept));
}

/// A window of 2 s of a service for profiles only with 200 MB live: it begins with those blocks
/// (the frees of half of them during the window included), and holds what was allocated
/// during it, at its own site, and nothing else of the service's.
#[test]
fn a_window_of_a_service_for_profiles_only_begins_with_its_live_heap() {
    let dir = run_child("control:window");
    let trace = Trace::read(&dir.join("window.ctf"));
    assert!(trace.info.begins_with_live_blocks() && params(&trace).ends_with(",window"), "{}", params(&trace));
    let rate = trace.info.sample_rate;
    assert_eq!(rate, WINDOW_RATE);
    let (start, churned, kept) = ("::site_live_before_window", "::site_churn_in_window", "::site_kept_in_window");
    let live_at_start = bytes_at(&trace, start, true, false);
    let truth = LIVE_AT_START as f64;
    assert!(within_5_sigma(live_at_start, truth, &[(truth, rate)]), "live at the start {live_at_start:.0}");
    let half = truth / 2.0;
    let still_live = bytes_at(&trace, start, true, true);
    assert!(within_5_sigma(still_live, half, &[(half, rate)]), "live at the end {still_live:.0}");
    assert_eq!(bytes_at(&trace, start, false, false), 0.0, "the live blocks are not allocations of the window");
    let low = Trace::read(&dir.join("window-low.ctf"));
    assert_eq!(low.info.sample_rate, WINDOW_RATE / 10.0);
    let low_start = bytes_at(&low, start, true, false);
    assert!(within_5_sigma(low_start, truth, &[(truth, WINDOW_RATE / 10.0)]), "at a tenth of the rate {low_start:.0}");
    for (site, truth, live) in [(churned, WINDOW_CHURN, 0.0), (kept, WINDOW_KEPT, WINDOW_KEPT as f64)] {
        let truth = truth as f64;
        let allocated = bytes_at(&trace, site, false, false);
        assert!(within_5_sigma(allocated, truth, &[(truth, rate)]), "{site}: allocated {allocated:.0}");
        assert_eq!(bytes_at(&trace, site, true, false), 0.0, "{site}: allocated during the window, not before");
        let at_end = bytes_at(&trace, site, false, true);
        assert!(within_5_sigma(at_end, live, &[(live, rate)]), "{site}: live at the end {at_end:.0}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Rotation

const ROTATE_RATE: f64 = 1e-2;
const ROTATE_LIMIT: u64 = 1 << 20;
const ROTATE_KEEP: usize = 3;
/// The parts written: some 10 MiB in all.
const ROTATE_PARTS: usize = 10;
const ROTATE_KEPT: usize = 16 << 20;

#[inline(never)]
fn site_kept_across_parts() -> Vec<Vec<u8>> {
    keep(ROTATE_KEPT)
}

#[inline(never)]
fn site_churn_across_parts() {
    churn(4 << 20)
}

fn rotate_child(dir: &Path) {
    let config =
        TraceConfig::new(dir.join("trace.ctf")).rate(ROTATE_RATE).file_limit(ROTATE_LIMIT).keep_files(ROTATE_KEEP);
    let guard = start_tracing(config).unwrap();
    let kept = site_kept_across_parts();
    let part = |path: &Path| path.file_stem().and_then(|s| s.to_str()?.rsplit('.').next()?.parse::<usize>().ok());
    wait_for("ten parts", || {
        site_churn_across_parts();
        let state = session_state().unwrap();
        assert!(state.files().len() <= ROTATE_KEEP, "{:?}", state.files());
        state.files().last().and_then(|last| part(last)).is_some_and(|n| n >= ROTATE_PARTS)
    });
    let stats = guard.finish().unwrap();
    assert_eq!(stats.samples_dropped() + stats.frees_lost, 0, "{stats:?}");
    std::mem::forget(kept);
}

/// A file trace limited to 1 MiB over some 10 MiB: the last 3 files are kept, numbered in turn,
/// each about the limit, each readable alone, and each holds the 16 MB kept from the start to
/// the end (the later ones as blocks they begin with).
#[test]
fn a_rotated_trace_keeps_its_last_files_each_readable_alone() {
    let dir = run_child("control:rotate");
    let mut names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort_by_key(|name| name.split('.').nth(1).and_then(|n| n.parse::<usize>().ok()));
    assert_eq!(names.len(), ROTATE_KEEP, "{names:?}");
    let first: usize = names[0].split('.').nth(1).unwrap().parse().unwrap();
    assert!(first >= ROTATE_PARTS - ROTATE_KEEP, "{names:?}");
    for (i, name) in names.iter().enumerate() {
        assert_eq!(*name, format!("trace.{}.ctf", first + i));
        let path = dir.join(name);
        let trace = Trace::read(&path);
        assert!(trace.info.begins_with_live_blocks(), "{name}: {}", params(&trace));
        assert!(params(&trace).ends_with(&format!(",part={}", first + i)), "{name}: {}", params(&trace));
        let size = std::fs::metadata(&path).unwrap().len();
        if i + 1 < names.len() {
            assert!((ROTATE_LIMIT..ROTATE_LIMIT * 3 / 2).contains(&size), "{name}: {size} bytes");
        }
        let truth = ROTATE_KEPT as f64;
        let live = live_at_end(&trace, "::site_kept_across_parts");
        assert!(within_5_sigma(live, truth, &[(truth, ROTATE_RATE)]), "{name}: live at the end {live:.0}");
        assert!(bytes_at(&trace, "::site_kept_across_parts", true, true) > 0.0, "{name}: begins with the kept blocks");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// A rate change

const LOW_RATE: f64 = 1e-5;
const HIGH_RATE: f64 = 1e-3;
/// Kept from before the change; kept from while the rate is high.
const KEPT_LOW: usize = 100 << 20;
const KEPT_HIGH: usize = 20 << 20;
/// Allocated and freed before, during and after the high rate.
const CHURN_LOW: usize = 400 << 20;
const CHURN_HIGH: usize = 40 << 20;

#[inline(never)]
fn site_kept_before_the_change() -> Vec<Vec<u8>> {
    keep(KEPT_LOW)
}

#[inline(never)]
fn site_kept_at_the_high_rate() -> Vec<Vec<u8>> {
    keep(KEPT_HIGH)
}

#[inline(never)]
fn site_churn_at_every_rate(bytes: usize) {
    churn(bytes)
}

fn rate_child(dir: &Path) {
    let guard = start_tracing(TraceConfig::new(dir.join("trace.ctf")).rate(LOW_RATE)).unwrap();
    let low = site_kept_before_the_change();
    site_churn_at_every_rate(CHURN_LOW);
    set_rate(HIGH_RATE).unwrap();
    let parts = |n| move || session_state().is_some_and(|s| s.files().len() == n);
    wait_for("the second part", parts(2));
    assert_eq!(session_state().unwrap().rate(), HIGH_RATE);
    let high = site_kept_at_the_high_rate();
    site_churn_at_every_rate(CHURN_HIGH);
    set_rate(LOW_RATE).unwrap();
    wait_for("the third part", parts(3));
    site_churn_at_every_rate(CHURN_LOW);
    let stats = guard.finish().unwrap();
    assert_eq!(stats.samples_dropped() + stats.frees_lost, 0, "{stats:?}");
    std::mem::forget((low, high));
}

/// A rate change from 1e-5 to 1e-3 and back: three files at their rates; what each allocated,
/// and their total, within 5 sigma of the truth (sigma from the mixed rates), and the blocks
/// live across the changes carried with their own rate's weight.
#[test]
fn a_rate_change_keeps_every_estimate_unbiased() {
    let dir = run_child("control:rate");
    let traces: Vec<Trace> =
        ["trace.ctf", "trace.1.ctf", "trace.2.ctf"].iter().map(|n| Trace::read(&dir.join(n))).collect();
    let rates: Vec<f64> = traces.iter().map(|t| t.info.sample_rate).collect();
    assert_eq!(rates, [LOW_RATE, HIGH_RATE, LOW_RATE]);
    assert!(!std::fs::exists(dir.join("trace.3.ctf")).unwrap());
    let churn_site = "::site_churn_at_every_rate";
    let churned: Vec<f64> = traces.iter().map(|t| bytes_at(t, churn_site, false, false)).collect();
    let parts = [(CHURN_LOW as f64, LOW_RATE), (CHURN_HIGH as f64, HIGH_RATE), (CHURN_LOW as f64, LOW_RATE)];
    for (file, (&estimate, &(truth, rate))) in churned.iter().zip(&parts).enumerate() {
        assert!(within_5_sigma(estimate, truth, &[(truth, rate)]), "file {file}: allocated {estimate:.0} of {truth}");
    }
    let total: f64 = churned.iter().sum();
    let truth = (2 * CHURN_LOW + CHURN_HIGH) as f64;
    assert!(within_5_sigma(total, truth, &parts), "allocated in all {total:.0} of {truth}");
    // The blocks kept before the change, carried at 1e-3 and back, each with its own weight.
    let (low, high) = ((KEPT_LOW as f64, LOW_RATE), (KEPT_HIGH as f64, HIGH_RATE));
    for (file, trace) in traces.iter().enumerate() {
        let live = live_at_end(trace, "::site_kept_before_the_change");
        assert!(within_5_sigma(live, low.0, &[low]), "file {file}: kept before the change, live {live:.0}");
    }
    // The blocks kept at 1e-3, live at the end of the second file, carried into the third at 1e-5.
    let live = live_at_end(&traces[1], "::site_kept_at_the_high_rate");
    assert!(within_5_sigma(live, high.0, &[high]), "kept at 1e-3, live {live:.0}");
    let live = live_at_end(&traces[2], "::site_kept_at_the_high_rate");
    assert!(within_5_sigma(live, high.0, &[(high.0, LOW_RATE)]), "kept at 1e-3, live at 1e-5 {live:.0}");
    assert_eq!(bytes_at(&traces[2], "::site_kept_at_the_high_rate", false, false), 0.0);
    std::fs::remove_dir_all(dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// A file trace started and stopped in a running session

const FILE_RATE: f64 = 1e-3;
const FILE_KEPT: usize = 8 << 20;
const FILE_CHURN: usize = 8 << 20;

#[inline(never)]
fn site_kept_before_the_file() -> Vec<Vec<u8>> {
    keep(FILE_KEPT)
}

#[inline(never)]
fn site_churn_while_the_file_runs() {
    churn(FILE_CHURN)
}

#[inline(never)]
fn site_churn_without_a_file() {
    churn(FILE_CHURN)
}

fn file_child(dir: &Path) {
    let base = dir.join("trace.ctf");
    let guard = start_tracing(TraceConfig::new(&base).rate(FILE_RATE).file_at_start(false)).unwrap();
    assert!(!base.exists(), "no file before it is started");
    assert!(matches!(stop_file_trace(), Err(ControlError::File(_))));
    let kept = site_kept_before_the_file();
    assert_eq!(start_file_trace().unwrap(), base);
    assert!(matches!(start_file_trace(), Err(ControlError::File(_))), "one file at a time");
    site_churn_while_the_file_runs();
    assert_eq!(stop_file_trace().unwrap(), base);
    let state = session_state().unwrap();
    assert!(!state.file_open() && state.files() == [base.clone()], "{}", state.to_json());
    site_churn_without_a_file();
    assert_eq!(start_file_trace().unwrap(), dir.join("trace.1.ctf"));
    guard.finish().unwrap();
    // A session for profiles only has no file to start.
    let _guard = start_tracing(TraceConfig::profile_only()).unwrap();
    assert!(matches!(start_file_trace(), Err(ControlError::File(_))));
    std::mem::forget(kept);
}

/// A session started without its file: the file started later begins with the blocks live
/// then, holds what was allocated until it was stopped and nothing after; started again, it
/// goes on in the series' next file.
#[test]
fn a_file_trace_starts_and_stops_in_a_running_session() {
    let dir = run_child("control:file");
    let (first, second) = (Trace::read(&dir.join("trace.ctf")), Trace::read(&dir.join("trace.1.ctf")));
    let kept = FILE_KEPT as f64;
    let parts = [(kept, FILE_RATE)];
    for (name, trace) in [("trace.ctf", &first), ("trace.1.ctf", &second)] {
        assert!(trace.info.begins_with_live_blocks(), "{name}: {}", params(trace));
        let live = bytes_at(trace, "::site_kept_before_the_file", true, true);
        assert!(within_5_sigma(live, kept, &parts), "{name}: kept, live {live:.0}");
        assert_eq!(bytes_at(trace, "::site_kept_before_the_file", false, false), 0.0, "{name}");
        assert_eq!(bytes_at(trace, "::site_churn_without_a_file", false, false), 0.0, "{name}");
    }
    let churned = bytes_at(&first, "::site_churn_while_the_file_runs", false, false);
    let truth = FILE_CHURN as f64;
    assert!(within_5_sigma(churned, truth, &[(truth, FILE_RATE)]), "allocated while the file ran {churned:.0}");
    std::fs::remove_dir_all(dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// The variables

fn env_child(dir: &Path) {
    let guard = memtrace_rs::trace_if_requested();
    let Some(guard) = guard else { return };
    let base = dir.join("trace.ctf");
    assert!(!base.exists(), "MEMTRACE_FILE_ON_DEMAND: no file before it is started");
    assert_eq!(start_file_trace().unwrap(), base);
    wait_for("four parts", || {
        site_churn_across_parts();
        let files = session_state().unwrap().files().to_vec();
        assert!(files.len() <= 2, "{files:?}");
        files.last().is_some_and(|last| last.ends_with("trace.3.ctf"))
    });
    guard.finish().unwrap();
}

/// `MEMTRACE_FILE_ON_DEMAND`, `MEMTRACE_FILE_LIMIT` and `MEMTRACE_FILE_KEEP` from the
/// environment: the file waits for `start_file_trace`, then rotates at 64 KiB and keeps 2 files;
/// a limit that is no size is one line on stderr, and no tracing.
#[test]
fn the_file_variables_are_read_from_the_environment() {
    let env = [
        ("MEMTRACE_FILE", "{dir}/trace.ctf"),
        ("MEMTRACE_FILE_ON_DEMAND", "1"),
        ("MEMTRACE_FILE_LIMIT", "64KiB"),
        ("MEMTRACE_FILE_KEEP", "2"),
        ("MEMTRACE_RATE", "1e-2"),
    ];
    let (dir, out) = run_child_with("control:env", &env);
    assert_eq!(memtrace_messages(&out), Vec::<String>::new());
    let mut names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["trace.2.ctf", "trace.3.ctf"]);
    for name in names {
        let trace = Trace::read(&dir.join(&name));
        assert!(trace.info.begins_with_live_blocks(), "{name}");
    }
    std::fs::remove_dir_all(dir).unwrap();
    let (dir, out) =
        run_child_with("control:env", &[("MEMTRACE_FILE", "{dir}/trace.ctf"), ("MEMTRACE_FILE_LIMIT", "12MB")]);
    assert_one_message(&out, "MEMTRACE_FILE_LIMIT must be a size such as 64MiB (at least 1KiB), got \"12MB\"");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "no trace");
    std::fs::remove_dir_all(dir).unwrap();
}
