//! Whole processes, traced and untraced: wall time, CPU time and peak RSS of each program run
//! both ways, interleaved, with the medians and their ratios in one table.
//!
//! ```text
//! cargo bench --bench processes                    # 7 rounds
//! MEMTRACE_BENCH_ROUNDS=15 cargo bench --bench processes
//! benches/thirdparty/build-jaq.sh                  # then the table has jaq's rows too
//! ```
//!
//! The programs: this crate's sample app (release build, which the harness builds), a short run
//! (this harness itself, started as a child that traces, allocates a few hundred blocks and
//! exits: the fixed cost of tracing), and, when `benches/thirdparty/build-jaq.sh` has built
//! them, jaq (a jq clone from crates.io, with memtrace-rs as its global allocator) built with
//! `debug = "line-tables-only"` and with `debug = 1` over the system allocator, and over
//! mimalloc as jaq ships, run short (`jaq -n 1`) and filtering a generated 13.7 MB JSON file.
//! When `build-jaq.sh` has also built `idle-thread.so` (a library whose constructor starts a
//! thread that sleeps), each round of the filter runs a third time, untraced with it
//! preloaded, and two more rows follow the filter's: that run against the untraced one (what
//! a second thread alone costs a single-threaded program: glibc's `malloc` locks its arena and
//! uses atomic operations once one exists; over mimalloc, which has no such mode, it should be
//! about 1) and the traced run against it (what tracing costs beyond that floor). No run of
//! the harness inherits its own `LD_PRELOAD`.
//! `MEMTRACE_BENCH_THIRDPARTY` names another directory of jaq builds (say, built against an
//! earlier version of this crate), and arguments select programs by name
//! (`cargo bench --bench processes -- jaq`).
//! Traced runs use the default rate (`MEMTRACE_RATE` unset; `MEMTRACE_BENCH_RATE` sets
//! another, `MEMTRACE_BENCH_RATE=1e-9 cargo bench --bench processes -- jaq` for the cost every
//! call pays) and write to a temporary file.
//! The sample app's traced run also reads its trace back at exit (a few milliseconds).
//!
//! Figures from `wait4`'s resource usage of each child: user + system CPU, and the peak
//! resident set (`ru_maxrss`). On a machine shared with other work, read the ratios, not the
//! times. Besides the ratio of the medians, each row gives the median and quartiles of the
//! rounds' own ratios (each traced run against the untraced run of its round): the speed of
//! a virtual machine drifts by several percent from one run to the next, and the quartiles
//! show how far. In brackets, the 95 % bootstrap interval of that median: where it spans a
//! target (1.03× for the filter), more rounds are needed to tell.
//!
//! A short program samples nothing in some of its traced runs, whose stop has no frames to
//! name: `jaq -n 1` at the default rate takes a sample in about half of them. Its traced runs
//! are also counted apart by whether their trace holds a sample, in rows of their own against
//! the untraced runs' median.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use memtrace_rs::MemtraceAllocator;

#[global_allocator]
static GLOBAL: MemtraceAllocator = MemtraceAllocator::system();

/// The sampling rate of the traced runs, when not the default.
const RATE_VAR: &str = "MEMTRACE_BENCH_RATE";
/// Set in the harness's own child: run the short program instead.
const SHORT_RUN_VAR: &str = "MEMTRACE_BENCH_SHORT_RUN";

/// One run's figures.
#[derive(Clone, Copy)]
struct Run {
    wall: Duration,
    cpu: Duration,
    max_rss_kib: u64,
}

/// A traced run's figures, with whether its trace holds a sample.
struct TracedRun {
    run: Run,
    sampled: bool,
}

/// A program to measure.
struct Program {
    name: String,
    command: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// A library that starts an idle thread, preloaded into a third run of each round.
    idle_thread: Option<PathBuf>,
}

fn main() {
    if std::env::var_os(SHORT_RUN_VAR).is_some() {
        short_run();
        return;
    }
    // `cargo bench` passes `--bench`; any other argument filters programs by name.
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let rounds: usize = std::env::var("MEMTRACE_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(7);
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let scratch = std::env::temp_dir().join(format!("memtrace-bench-processes-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let mut programs = vec![
        Program {
            name: "short run (this harness, a few hundred blocks)".into(),
            command: std::env::current_exe().unwrap(),
            args: vec![],
            env: vec![(SHORT_RUN_VAR.into(), "1".into())],
            idle_thread: None,
        },
        Program {
            name: "sample app (release)".into(),
            command: build_sample_app(repo),
            args: vec![],
            env: vec![],
            idle_thread: None,
        },
    ];
    let thirdparty = std::env::var_os("MEMTRACE_BENCH_THIRDPARTY")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target/thirdparty"));
    let input = scratch.join("input.json");
    let idle_thread = Some(thirdparty.join("idle-thread.so")).filter(|so| so.exists());
    for (build, label) in [
        ("jaq-line-tables-only", "debug = \"line-tables-only\""),
        ("jaq-debug-1", "debug = 1"),
        ("jaq-mimalloc", "over mimalloc (as jaq ships), line tables"),
    ] {
        let jaq = thirdparty.join(build).join("release/jaq");
        if !jaq.exists() {
            eprintln!("{} missing: run benches/thirdparty/build-jaq.sh for jaq's rows", jaq.display());
            continue;
        }
        if !input.exists() {
            write_json(&input);
        }
        programs.push(Program {
            name: format!("jaq -n 1 (a short run), {label}"),
            command: jaq.clone(),
            args: vec!["-n".into(), "1".into()],
            env: vec![],
            idle_thread: None,
        });
        programs.push(Program {
            name: format!("jaq 2.3.0, {label}, {:.0} MB binary", size_mb(&jaq)),
            command: jaq,
            args: vec![JAQ_FILTER.into(), input.display().to_string()],
            env: vec![],
            idle_thread: idle_thread.clone(),
        });
    }
    programs.retain(|p| filter.is_empty() || filter.iter().any(|f| p.name.contains(f.as_str())));

    println!(
        "| program | rounds | untraced wall / CPU / peak RSS | traced wall / CPU / peak RSS | ratio wall / CPU / RSS \
         | rounds' wall ratios: median (quartiles) [95 % interval] | added wall / CPU / RSS |"
    );
    println!("|---|---|---|---|---|---|---|");
    for program in &programs {
        let trace = scratch.join("trace.ctf");
        let (mut off, mut on, mut idle) = (Vec::new(), Vec::new(), Vec::new());
        // Interleaved, after one warm-up of each (page cache, the sample app's first run).
        for round in 0..=rounds {
            let plain = measure(program, None, None);
            let traced = measure(program, Some(&trace), None);
            let sampled = sampled(&trace);
            let with_idle_thread = program.idle_thread.as_deref().map(|so| measure(program, None, Some(so)));
            if round > 0 {
                off.push(plain);
                on.push(TracedRun { run: traced, sampled });
                idle.extend(with_idle_thread);
            }
        }
        let all: Vec<(Run, Run)> = off.iter().copied().zip(on.iter().map(|t| t.run)).collect();
        print_row(&program.name, &all);
        if !idle.is_empty() {
            // What a second thread costs before it does anything, and tracing beyond that.
            let floor: Vec<(Run, Run)> = off.iter().copied().zip(idle.iter().copied()).collect();
            print_row(&format!("{}: untraced with an idle thread (in the traced column)", program.name), &floor);
            let beyond: Vec<(Run, Run)> = idle.iter().copied().zip(on.iter().map(|t| t.run)).collect();
            print_row(&format!("{}: traced against untraced with an idle thread", program.name), &beyond);
        }
        // A program whose traced runs sometimes sample nothing (a short one): those runs apart.
        if on.iter().any(|t| t.sampled) && on.iter().any(|t| !t.sampled) {
            // Against the median of every untraced run, not only those of the same rounds.
            let untraced = median(&off);
            for (sampled, label) in [(true, "with a sample"), (false, "without a sample")] {
                let pairs: Vec<(Run, Run)> =
                    off.iter().zip(&on).filter(|(_, t)| t.sampled == sampled).map(|(&a, t)| (a, t.run)).collect();
                print_split_row(&format!("{}, traced runs {label}", program.name), &pairs, untraced);
            }
        }
        let _ = std::fs::remove_file(&trace);
    }
    let _ = std::fs::remove_dir_all(&scratch);
}

/// Whether the trace at `path` holds an allocation.
fn sampled(path: &Path) -> bool {
    let Ok(mut reader) = memtrace_rs::trace::Reader::open(path) else { return false };
    while let Ok(Some(event)) = reader.next_event() {
        if matches!(event.kind, memtrace_rs::trace::EventKind::Alloc(_)) {
            return true;
        }
    }
    false
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The row of a program's (untraced, traced) pairs, one a round.
fn print_row(name: &str, pairs: &[(Run, Run)]) {
    let untraced = median(&pairs.iter().map(|p| p.0).collect::<Vec<_>>());
    let ratios: Vec<f64> = pairs.iter().map(|(a, b)| b.wall.as_secs_f64() / a.wall.as_secs_f64()).collect();
    let (q1, mid, q3) = quartiles(ratios.clone());
    let (low, high) = median_interval(&ratios);
    let ratios = format!("{mid:.3} ({q1:.3}–{q3:.3}) [{low:.3}–{high:.3}]");
    print_figures(name, &pairs.len().to_string(), untraced, pairs, &ratios);
}

/// The row of some of a program's traced runs (those with a sample, or those without), against
/// the median `untraced` run of all the rounds.
fn print_split_row(name: &str, pairs: &[(Run, Run)], untraced: Run) {
    print_figures(name, &format!("{} of the rounds", pairs.len()), untraced, pairs, "");
}

/// One row of the table: the medians of `untraced` and of the traced runs of `pairs`, their
/// ratios and differences, and `ratios`, what is said of the rounds' own ratios.
fn print_figures(name: &str, rounds: &str, untraced: Run, pairs: &[(Run, Run)], ratios: &str) {
    let (a, b) = (untraced, median(&pairs.iter().map(|p| p.1).collect::<Vec<_>>()));
    println!(
        "| {name} | {rounds} | {:.1} ms / {:.1} ms / {:.1} MiB | {:.1} ms / {:.1} ms / {:.1} MiB | {:.3} / {:.3} / {:.2} \
         | {ratios} | {:+.1} ms / {:+.1} ms / {:+.1} MiB |",
        ms(a.wall),
        ms(a.cpu),
        mib(a.max_rss_kib),
        ms(b.wall),
        ms(b.cpu),
        mib(b.max_rss_kib),
        b.wall.as_secs_f64() / a.wall.as_secs_f64(),
        b.cpu.as_secs_f64() / a.cpu.as_secs_f64().max(1e-9),
        b.max_rss_kib as f64 / a.max_rss_kib as f64,
        ms(b.wall) - ms(a.wall),
        ms(b.cpu) - ms(a.cpu),
        mib(b.max_rss_kib) - mib(a.max_rss_kib),
    );
}

/// The first quartile, median and third quartile of `values`.
fn quartiles(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let at = |q: usize| values[(values.len() - 1) * q / 4];
    (at(1), at(2), at(3))
}

/// The 95 % bootstrap interval of the median of `values` ([`quartiles`]'), from 2 000
/// resamples drawn by a xorshift generator of fixed seed: the same rounds give the same interval.
fn median_interval(values: &[f64]) -> (f64, f64) {
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let mut draw = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % values.len() as u64) as usize
    };
    let mut medians: Vec<f64> = (0..2000)
        .map(|_| {
            let sample: Vec<f64> = (0..values.len()).map(|_| values[draw()]).collect();
            quartiles(sample).1
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    (medians[50], medians[1949])
}

/// The short program: start tracing if asked, allocate a few hundred blocks, exit.
fn short_run() {
    let _trace = memtrace_rs::trace_if_requested();
    let blocks: Vec<Vec<u8>> = (0..300).map(|i| vec![0u8; 16 + i]).collect();
    std::hint::black_box(blocks);
}

/// Medians of each figure on its own.
fn median(runs: &[Run]) -> Run {
    let mid = |mut v: Vec<u128>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    Run {
        wall: Duration::from_nanos(mid(runs.iter().map(|r| r.wall.as_nanos()).collect()) as u64),
        cpu: Duration::from_nanos(mid(runs.iter().map(|r| r.cpu.as_nanos()).collect()) as u64),
        max_rss_kib: mid(runs.iter().map(|r| r.max_rss_kib as u128).collect()) as u64,
    }
}

/// Run `program` once, traced into `trace` or untraced, with `preload` preloaded if given, and
/// wait for it with `wait4`.
fn measure(program: &Program, trace: Option<&Path>, preload: Option<&Path>) -> Run {
    let mut command = Command::new(&program.command);
    command.args(&program.args).stdout(Stdio::null());
    for var in ["MEMTRACE_FILE", "MEMTRACE", "MEMTRACE_RATE", "LD_PRELOAD"] {
        command.env_remove(var);
    }
    command.envs(program.env.iter().map(|(k, v)| (k, v)));
    if let Some(preload) = preload {
        command.env("LD_PRELOAD", preload);
    }
    if let Some(trace) = trace {
        let _ = std::fs::remove_file(trace);
        command.env("MEMTRACE_FILE", trace);
        if let Some(rate) = std::env::var_os(RATE_VAR) {
            command.env("MEMTRACE_RATE", rate);
        }
    }
    let start = Instant::now();
    // Reaped by `wait4` below, which also gives its resource usage.
    #[allow(clippy::zombie_processes)]
    let child = command.spawn().unwrap_or_else(|e| panic!("{}: {e}", program.command.display()));
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; `wait4` fills it in for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waiting for our own child, with valid pointers to the status and usage.
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    let wall = start.elapsed();
    assert_eq!(pid, child.id() as libc::pid_t);
    let status = std::process::ExitStatus::from_raw(status);
    assert!(status.success(), "{} failed: {status}", program.name);
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Run { wall, cpu: time(usage.ru_utime) + time(usage.ru_stime), max_rss_kib: usage.ru_maxrss as u64 }
}

/// The sample app, built in release mode (by cargo, into this repository's target directory).
fn build_sample_app(repo: &Path) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--quiet", "--release", "--features", "analysis", "--example", "sample-app"])
        .current_dir(repo)
        .status()
        .expect("run cargo");
    assert!(status.success(), "building the sample app");
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| repo.join("target"));
    target.join("release/examples/sample-app")
}

/// A jq filter that rebuilds every record (allocation-dense: strings, arrays and objects).
const JAQ_FILTER: &str =
    "[.[] | {id, name: (.name + \"!\"), tags: [.tags[] | ascii_upcase], total: (.values | add)}] | length";

/// A JSON array of 100 000 records with strings, arrays and numbers (13.7 MB).
fn write_json(path: &Path) {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    write!(out, "[").unwrap();
    for i in 0..100_000u64 {
        let sep = if i == 0 { "" } else { "," };
        let values: Vec<String> = (0..(i % 24)).map(|v| format!("{}.5", v * 3 + i % 7)).collect();
        write!(
            out,
            "{sep}{{\"id\":{i},\"name\":\"record-{i:08}\",\"tags\":[\"alpha\",\"beta{}\",\"gamma\"],\"values\":[{}]}}",
            i % 13,
            values.join(",")
        )
        .unwrap();
    }
    write!(out, "]").unwrap();
}

fn size_mb(path: &Path) -> f64 {
    std::fs::metadata(path).map_or(0.0, |m| m.len() as f64 / 1e6)
}
