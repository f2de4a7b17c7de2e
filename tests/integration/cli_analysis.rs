//! The streaming analysis against traces whose true answer is worked out by hand (see
//! `util::cli::known_trace`), site selection, and bounded growth on long traces.
use crate::util::cli::*;
use memtrace_rs::analysis::{self as sites, is_allocator_frame, is_root_frame, Grouping, Measure, Options, Trim};

const STACKS: Options = Options { stacks: true, live_at: None };

/// `(label, bytes)` of the ranked sites.
fn ranked(trace: &[u8], options: Options, grouping: Grouping, measure: Measure) -> Vec<(String, f64)> {
    let a = analyse(trace, options);
    sites::ranked(&a, grouping, measure).iter().map(|s| (s.label(&a), a.bytes(s.stats.get(measure).samples))).collect()
}

fn owned(v: &[(&str, f64)]) -> Vec<(String, f64)> {
    v.iter().map(|(s, b)| (s.to_string(), *b)).collect()
}

#[test]
fn totals_live_and_peak_match_the_hand_computed_answer() {
    let a = analyse(&known_trace(), STACKS);
    assert_eq!(a.counts.events, 7);
    assert_eq!(a.counts.allocs(), 4);
    assert_eq!(a.counts.allocs_external, 4);
    assert_eq!(a.counts.collects, 3);
    assert_eq!(a.counts.samples, 11);
    assert_eq!(a.bytes(a.counts.samples), 11.0 * SAMPLE_BYTES);
    assert_eq!(a.live_end, 1);
    assert_eq!(a.bytes(a.live_end), 800.0);
    assert_eq!(a.peak.samples, 8);
    assert_eq!(a.bytes(a.peak.samples), 6400.0);
    assert_eq!(a.peak.time, START + 40);
    assert_eq!(a.duration(), 70);
    assert!(!a.is_truncated());
    let totals = a.totals();
    assert_eq!(totals.allocated.samples, 11);
    assert_eq!(totals.live_peak.samples, 8, "per-stack figures at the peak add up to the peak");
    assert_eq!(totals.live_end.samples, 1);
    // Every allocation has length == nsamples at rate 0.01, so each stands for 100 objects.
    assert!((totals.allocated.objects - 400.0).abs() < 1e-9);
    assert!((totals.live_end.objects - 100.0).abs() < 1e-9);
}

#[test]
fn sites_skip_allocator_frames() {
    let t = known_trace();
    let g = Grouping::default();
    let parse = "app::parse (src/app.rs:40)";
    let load = "app::load (src/app.rs:30)";
    assert_eq!(ranked(&t, STACKS, g, Measure::Allocated), owned(&[(parse, 5600.0), (load, 3200.0)]));
    assert_eq!(ranked(&t, STACKS, g, Measure::LivePeak), owned(&[(parse, 4000.0), (load, 2400.0)]));
    assert_eq!(ranked(&t, STACKS, g, Measure::LiveEnd), owned(&[(load, 800.0)]));
}

#[test]
fn allocator_frames_can_be_kept() {
    let g = Grouping {
        stacks: false,
        trim: Trim { keep_allocator_frames: true, keep_root_frames: false },
        ..Default::default()
    };
    assert_eq!(
        ranked(&known_trace(), STACKS, g, Measure::Allocated),
        owned(&[
            ("__rust_alloc (src/app.rs:60)", 5600.0),
            ("<alloc::string::String as core::clone::Clone>::clone (src/app.rs:70)", 2400.0),
            ("hashbrown::raw::RawTable<T,A>::reserve_rehash (src/app.rs:80)", 800.0),
        ])
    );
}

#[test]
fn whole_stacks_are_trimmed_and_merged() {
    let a = analyse(&known_trace(), STACKS);
    let g = Grouping { stacks: true, ..Default::default() };
    let keys: Vec<(String, u64)> =
        sites::ranked(&a, g, Measure::Allocated).iter().map(|s| (s.key(&a), s.stats.allocated.samples)).collect();
    assert_eq!(
        keys,
        vec![
            ("app::parse (src/app.rs:40) <- app::run (src/app.rs:20) <- main (src/app.rs:10)".to_string(), 7),
            ("app::load (src/app.rs:30) <- app::run (src/app.rs:20) <- main (src/app.rs:10)".to_string(), 4),
        ]
    );
}

#[test]
fn live_at_a_chosen_time() {
    let t = known_trace();
    let parse = "app::parse (src/app.rs:40)";
    let load = "app::load (src/app.rs:30)";
    let at = |us| Options { stacks: true, live_at: Some(us) };
    let g = Grouping::default();
    assert_eq!(ranked(&t, at(35), g, Measure::LiveAt), owned(&[(load, 2400.0)]));
    assert_eq!(ranked(&t, at(40), g, Measure::LiveAt), owned(&[(parse, 4000.0), (load, 2400.0)]));
    assert_eq!(ranked(&t, at(1_000_000), g, Measure::LiveAt), owned(&[(load, 800.0)]));
    assert_eq!(ranked(&t, at(0), g, Measure::LiveAt), vec![]);
}

#[test]
fn without_backtraces_the_totals_are_the_same() {
    let t = known_trace();
    let fast = analyse(&t, Options::default());
    let full = analyse(&t, STACKS);
    assert_eq!((fast.counts, fast.live_end, fast.peak), (full.counts, full.live_end, full.peak));
    assert_eq!(fast.stacks.len(), 1, "all allocations under the empty stack");
    assert_eq!(fast.timeline, full.timeline);
}

#[test]
fn timeline_follows_the_live_estimate() {
    let a = analyse(&known_trace(), Options::default());
    let t = &a.timeline;
    assert_eq!(t.width, 1);
    assert_eq!(t.buckets.len(), 71);
    assert_eq!(t.buckets[40].live_max, 8);
    assert_eq!(t.buckets[45].live_end, 8, "the live figure carries over quiet buckets");
    assert_eq!(t.buckets[70].live_end, 1);
    assert_eq!(t.buckets.iter().map(|b| b.allocated).sum::<u64>(), 11);
    assert_eq!(t.buckets.iter().map(|b| b.live_max).max(), Some(a.peak.samples));
}

#[test]
fn upstream_counts_match_their_stat_files() {
    for name in UPSTREAM {
        let a = upstream(name);
        let stat = std::fs::read_to_string(data(&format!("{name}.stat.txt"))).unwrap();
        let field = |key: &str| -> u64 {
            let line = stat.lines().find(|l| l.starts_with(&format!("{key}: "))).unwrap();
            line[key.len() + 2..].parse().unwrap()
        };
        let c = &a.counts;
        assert_eq!(c.events, field("events"), "{name}");
        assert_eq!(c.allocs(), field("alloc_events"), "{name}");
        assert_eq!(c.allocs_minor, field("alloc_minor"), "{name}");
        assert_eq!(c.allocs_major, field("alloc_major"), "{name}");
        assert_eq!(c.allocs_external, field("alloc_ext"), "{name}");
        assert_eq!(c.promotes, field("promote"), "{name}");
        assert_eq!(c.collects, field("collect"), "{name}");
        assert_eq!(c.samples, field("total_samples"), "{name}");
        assert_eq!(c.words, field("total_length_words"), "{name}");
        assert_eq!(a.location_codes as u64, field("distinct_location_codes"), "{name}");
        assert_eq!(a.distinct_locations as u64, field("distinct_locations"), "{name}");
        assert_eq!(a.duration(), field("last_event_time_us"), "{name}");
        assert!(a.peak.samples >= a.live_end && a.peak.samples <= c.samples, "{name}");
        assert_eq!(a.totals().live_peak.samples, a.peak.samples, "{name}");
    }
}

#[test]
fn allocator_machinery_patterns() {
    for f in [
        "alloc::raw_vec::RawVec<T,A>::grow_one",
        "<alloc::vec::Vec<T> as core::clone::Clone>::clone",
        "<str as alloc::string::ToString>::to_string",
        "std::alloc::System::alloc",
        "__rust_alloc",
        "__rdl_alloc",
        "hashbrown::raw::RawTable<T,A>::reserve_rehash",
        "core::alloc::layout::Layout::array",
        "malloc",
    ] {
        assert!(is_allocator_frame(f, "src/x.rs"), "{f}");
    }
    for f in ["main", "app::parse", "Stdlib__list.map", "my_alloc::helper", "mallocator"] {
        assert!(!is_allocator_frame(f, "src/main.rs"), "{f}");
    }
    // Inlined frames have short names: their source file tells.
    let rustc = "/rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library";
    for file in [
        format!("{rustc}/alloc/src/raw_vec/mod.rs"),
        format!("{rustc}/alloc/src/alloc.rs"),
        format!("{rustc}/core/src/alloc/layout.rs"),
        format!("{rustc}/std/src/alloc.rs"),
        format!("{rustc}/core/src/fmt/mod.rs"),
        format!("{rustc}/core/src/iter/traits/iterator.rs"),
        format!("{rustc}/core/src/option.rs"),
        format!("{rustc}/std/src/collections/hash/map.rs"),
        "/rust/deps/hashbrown-0.16.1/src/map.rs".to_string(),
        "/rust/deps/hashbrown-0.16.1/src/raw/alloc.rs".to_string(),
        "/home/u/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/hashbrown-0.15.2/src/raw/mod.rs".to_string(),
    ] {
        assert!(is_allocator_frame("allocate", &file), "{file}");
    }
    for file in [format!("{rustc}/std/src/rt.rs"), format!("{rustc}/std/src/io/mod.rs"), "src/alloc.rs".to_string()] {
        assert!(!is_allocator_frame("f", &file), "{file}");
    }
}

/// Memory grows with distinct stacks and live objects, not with events: 200k allocations
/// from 16 stacks, each freed 100 allocations later.
#[test]
fn long_traces_keep_bounded_state() {
    let mut t = TraceBuilder::new();
    let mut live = std::collections::VecDeque::new();
    for i in 0..200_000u64 {
        let stack = [6, 5, 100 + i % 16, 2, 1];
        live.push_back(t.alloc(i, 1, &stack));
        if live.len() > 100 {
            let id = live.pop_front().unwrap();
            t.free(i, id);
        }
    }
    let a = analyse(&t.finish(), STACKS);
    assert_eq!(a.counts.events, 200_000 + 199_900);
    assert_eq!(a.stacks.len(), 16);
    assert_eq!(a.live_end, 100);
    assert!(a.timeline.buckets.len() <= 1024);
    assert_eq!(a.peak.samples, 100, "the alloc and the free at one timestamp count together (blocks::PeakFinder)");
}

#[test]
fn root_frame_patterns() {
    let rustc = "/rustc/59807616e1fa2540724bfbac14d7976d7e4a3860/library";
    // Names and files of the frames above `main` and a spawned closure in a release build.
    for (function, file) in [
        ("_start", "<unknown>".to_string()),
        ("__libc_start_call_main", "./csu/../sysdeps/nptl/libc_start_call_main.h".to_string()),
        ("start_thread", "./nptl/pthread_create.c".to_string()),
        ("main", "<unknown>".to_string()),
        ("std::rt::lang_start_internal", format!("{rustc}/std/src/rt.rs")),
        ("call_once<fn(), ()>", format!("{rustc}/core/src/ops/function.rs")),
        ("__rust_begin_short_backtrace<fn(), ()>", format!("{rustc}/std/src/sys/backtrace.rs")),
        ("{closure#1}<app::run::{closure_env#0}, ()>", format!("{rustc}/std/src/thread/lifecycle.rs")),
        ("<std::sys::thread::unix::Thread>::new::thread_start", format!("{rustc}/std/src/sys/thread/unix.rs")),
        ("std::panicking::catch_unwind::do_call::<isize>", String::new()),
        ("__rust_try", "<unknown>".to_string()),
        // Debian's libc has no symbols for its start-up functions.
        ("libc.so.6+0x2724a", "/lib/x86_64-linux-gnu/libc.so.6 build-id 79005c16".to_string()),
        ("libpthread.so.0+0x7fa3", "/lib/x86_64-linux-gnu/libpthread.so.0".to_string()),
        // rayon's worker loop and the splitting of a parallel iterator, with their paths and
        // (inlined, line tables only) without.
        ("rayon_core::registry::WorkerThread::wait_until_cold", String::new()),
        ("<rayon_core::job::StackJob<L,F,R> as rayon_core::job::Job>::execute", String::new()),
        ("rayon::iter::plumbing::bridge_producer_consumer::helper", String::new()),
        (
            "main_loop",
            "/home/u/.cargo/registry/src/index.crates.io-6f17d22bba15001f/rayon-core-1.12.1/src/registry.rs"
                .to_string(),
        ),
        ("helper<T>", "/home/u/.cargo/registry/src/x/rayon-1.10.0/src/iter/plumbing/mod.rs".to_string()),
    ] {
        assert!(is_root_frame(function, &file), "{function} {file}");
    }
    for (function, file) in [
        ("main", "src/main.rs"),
        ("app::run", "src/app.rs"),
        ("Stdlib__list.iter", "list.ml"),
        ("libcrypto.so.3+0x1f00", "/lib/libcrypto.so.3"),
        ("app+0x1234", "/usr/bin/app"),
        ("libc.so.6+0xzz", "<unknown>"),
        // rayon's iterator adaptors run the program's closures: their frames are its calls.
        ("<rayon::iter::map::MapFolder<C,F> as rayon::iter::plumbing::Folder<T>>::consume", "src/iter/map.rs"),
    ] {
        assert!(!is_root_frame(function, file), "{function} {file}");
    }
}

/// A stack of a spawned thread in a release build, innermost first: allocator frames, the
/// program's two frames, then the runtime's.
const THREAD_STACK: [(&str, &str); 7] = [
    ("alloc", "/rustc/x/library/alloc/src/alloc.rs"),
    ("make_message", "src/app.rs"),
    ("{closure#0}", "src/app.rs"),
    ("__rust_begin_short_backtrace<app::{closure_env#0}, ()>", "/rustc/x/library/std/src/sys/backtrace.rs"),
    ("call_once<(), ()>", "/rustc/x/library/core/src/ops/function.rs"),
    ("<std::sys::thread::unix::Thread>::new::thread_start", "/rustc/x/library/std/src/sys/thread/unix.rs"),
    ("start_thread", "./nptl/pthread_create.c"),
];

#[test]
fn root_frames_are_trimmed_from_the_outer_end_unless_kept() {
    let mut b = TraceBuilder::new();
    let stack: Vec<u64> = (0..THREAD_STACK.len() as u64).map(|i| 100 + i).collect();
    b.alloc_with(10, 1, &stack, |code| {
        let (function, file) = THREAD_STACK[(code - 100) as usize];
        location_at(function, file)
    });
    let a = analyse(&b.finish(), STACKS);
    let keys = |trim: Trim| -> Vec<String> {
        let g = Grouping { stacks: true, trim, ..Default::default() };
        sites::ranked(&a, g, Measure::Allocated).iter().map(|s| s.key(&a)).collect()
    };
    assert_eq!(keys(Trim::default()), ["make_message (src/app.rs:1) <- {closure#0} (src/app.rs:1)"]);
    let kept = keys(Trim { keep_allocator_frames: true, keep_root_frames: true });
    assert_eq!(kept[0].matches(" <- ").count(), THREAD_STACK.len() - 1, "{kept:?}");
    // A stack of nothing but runtime frames keeps them.
    let mut b = TraceBuilder::new();
    b.alloc_with(10, 1, &[200, 201], |code| {
        location_at(["std::rt::lang_start_internal", "_start"][(code - 200) as usize], "")
    });
    let a = analyse(&b.finish(), STACKS);
    let g = Grouping { stacks: true, ..Default::default() };
    assert_eq!(sites::ranked(&a, g, Measure::Allocated)[0].frames().count(), 2);
}

/// The main thread of a `#[tokio::main]` program, innermost first: the program's handler and
/// `main`'s async body, tokio's `block_on` tower, the `main` that the macro writes, std's
/// start-up. `body` names the closure the runtime runs: `main`'s own (a hand-off) or another's.
fn tokio_main_stack(body: &'static str) -> [(&'static str, &'static str); 9] {
    [
        ("app::handle", "src/main.rs"),
        (body, "src/main.rs"),
        ("tokio::runtime::park::CachedParkThread::block_on::{{closure}}", "tokio-1.54.1/src/runtime/park.rs"),
        ("tokio::task::coop::with_budget", "tokio-1.54.1/src/task/coop/mod.rs"),
        ("tokio::runtime::runtime::Runtime::block_on", "tokio-1.54.1/src/runtime/runtime.rs"),
        ("app::main", "src/main.rs"),
        ("std::rt::lang_start::{{closure}}", "/rustc/x/library/std/src/rt.rs"),
        ("main", "<unknown>"),
        ("main", "<thread>"),
    ]
}

#[test]
fn a_hand_off_to_a_runtime_is_trimmed_with_the_start_up_frames() {
    let keys = |body: &'static str, trim: Trim| -> Vec<String> {
        let stack = tokio_main_stack(body);
        let mut b = TraceBuilder::new();
        let codes: Vec<u64> = (0..stack.len() as u64).map(|i| 100 + i).collect();
        b.alloc_with(10, 1, &codes, |code| location_at(stack[(code - 100) as usize].0, stack[(code - 100) as usize].1));
        let a = analyse(&b.finish(), STACKS);
        let g = Grouping { stacks: true, trim, ..Default::default() };
        sites::ranked(&a, g, Measure::Allocated).iter().map(|s| s.key(&a)).collect()
    };
    // `main` hands its async body to tokio: the stack starts at the body, under the thread.
    let body = "app::main::{{closure}}";
    let trimmed = "app::handle (src/main.rs:1) <- app::main::{{closure}} (src/main.rs:1) <- thread main";
    assert_eq!(keys(body, Trim::default()), [trimmed]);
    assert_eq!(keys("app::main::{async_block#0}", Trim::default())[0].matches(" <- ").count(), 2);
    // Kept when asked, and with them the whole tower.
    let kept = keys(body, Trim { keep_root_frames: true, ..Trim::default() });
    assert_eq!(kept[0].matches(" <- ").count(), 8, "{kept:?}");
    // Another function's closure run by the runtime is no hand-off of `main`'s: `main` stays.
    let other = keys("app::serve::{{closure}}", Trim::default());
    assert!(other[0].ends_with("<- app::main (src/main.rs:1) <- thread main"), "{other:?}");
}

#[test]
fn one_site_per_function_whatever_its_spelling() {
    // Line-tables-only debug info: the inlined `alloc` has no path, the out-of-line one has,
    // and both sit at the same source line; generic arguments differ between instances.
    let names = [
        ("alloc", "/rustc/x/library/alloc/src/alloc.rs"),
        ("alloc::alloc::alloc", "/rustc/x/library/alloc/src/alloc.rs"),
        ("from_elem<u8>", "src/app.rs"),
        ("from_elem<u32>", "src/app.rs"),
    ];
    let mut b = TraceBuilder::new();
    for (i, code) in [(0u64, 300u64), (1, 301), (2, 302), (3, 303)] {
        b.alloc_with(10 + i, 1, &[code], |c| location_at(names[(c - 300) as usize].0, names[(c - 300) as usize].1));
    }
    let mut a = analyse(&b.finish(), STACKS);
    let g = Grouping {
        stacks: false,
        trim: Trim { keep_allocator_frames: true, keep_root_frames: true },
        ..Default::default()
    };
    assert_eq!(sites::ranked(&a, g, Measure::Allocated).len(), 4);
    a.shorten_names();
    let sites: Vec<(String, u64)> =
        sites::ranked(&a, g, Measure::Allocated).iter().map(|s| (s.label(&a), s.stats.allocated.samples)).collect();
    assert_eq!(
        sites,
        [
            ("alloc::alloc::alloc (/rustc/x/library/alloc/src/alloc.rs:1)".to_string(), 2),
            ("from_elem (src/app.rs:1)".to_string(), 2)
        ]
    );
}

#[test]
fn temporary_allocations_are_those_freed_within_a_millisecond() {
    // In the known trace every freed object lived 20 or 30 µs.
    let t = known_trace();
    let g = Grouping::default();
    let (parse, load) = ("app::parse (src/app.rs:40)", "app::load (src/app.rs:30)");
    assert_eq!(ranked(&t, STACKS, g, Measure::Temporary), owned(&[(parse, 5600.0), (load, 2400.0)]));
    // One object freed after 1 ms is not temporary, one freed after exactly 1 ms is.
    let mut b = TraceBuilder::new();
    let long = b.alloc(10, 2, &PARSE);
    let short = b.alloc(20, 3, &LOAD);
    b.free(1_011, long);
    b.free(1_020, short);
    assert_eq!(ranked(&b.finish(), STACKS, g, Measure::Temporary), owned(&[(load, 2400.0)]));
}

#[test]
fn sizes_are_counted_by_power_of_two() {
    // Lengths 2, 3, 5 and 1 words: 16, 24, 40 and 8 bytes, 100 objects each.
    let a = analyse(&known_trace(), Options::default());
    let by_bucket: Vec<(usize, u64)> =
        a.sizes.iter().enumerate().filter(|(_, t)| t.samples > 0).map(|(i, t)| (i, t.samples)).collect();
    assert_eq!(by_bucket, [(4, 1), (5, 5), (6, 5)]);
    let objects: Vec<f64> = a.sizes.iter().filter(|t| t.samples > 0).map(|t| t.objects).collect();
    assert!(objects.iter().zip([100.0, 200.0, 100.0]).all(|(o, want)| (o - want).abs() < 1e-9), "{objects:?}");
}

/// A class holds its lower power of two, not its upper: a block of exactly 4 KiB is in
/// `[4 KiB, 8 KiB)`, one a word shorter in `[2 KiB, 4 KiB)`, as `sizes` labels them.
#[test]
fn a_power_of_two_starts_its_size_class() {
    let mut t = TraceBuilder::new();
    // Lengths in words: 4088, 4096 and 8184 bytes, each sampled (an estimated 100 allocations).
    for (at, words) in [(10, 511), (20, 512), (30, 1023)] {
        t.alloc(at, words, &LOAD);
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("sizes.ctf"), t.finish()).unwrap();
    let out = memtrace_ok(dir.path(), &["sizes", "sizes.ctf"]);
    let classes: Vec<(&str, &str)> = out
        .lines()
        .skip(2)
        .map(|line| {
            let (class, rest) = line.trim_start().split_once(')').unwrap();
            (class, rest.split_whitespace().next().unwrap())
        })
        .collect();
    assert_eq!(classes, [("[2 KiB, 4 KiB", "100"), ("[4 KiB, 8 KiB", "200")], "{out}");
}
