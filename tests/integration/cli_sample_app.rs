//! The whole loop on a trace the sample app writes: the `memtrace` command line must find
//! the same allocation sites, with the same estimates, as the sample app's own summary
//! (written with the bare reader), and count the blocks the app reports.
use crate::skip::skip;
use std::path::PathBuf;
use std::process::Command;

/// The sample app, built by `cargo test` next to the test binaries.
fn sample_app() -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    deps.parent().unwrap().join("examples").join("sample-app")
}

fn run(command: &mut Command) -> String {
    let out = command.output().unwrap();
    assert!(out.status.success(), "{command:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The number right after `label` in `text`.
fn number_after(text: &str, label: &str) -> u64 {
    let rest = &text[text.find(label).unwrap_or_else(|| panic!("no {label:?} in:\n{text}")) + label.len()..];
    rest.trim_start().split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

#[test]
fn the_cli_agrees_with_the_sample_apps_own_summary() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.ctf");
    let app = run(Command::new(sample_app()).env("MEMTRACE_FILE", &trace).env("MEMTRACE_RATE", "1e-4"));

    // The app's summary: "N sampled blocks (...), M freed; ...", then one line per site:
    // "  X MiB  name  (file:line)".
    let counts = app.lines().find(|l| l.contains("sampled blocks")).unwrap_or_else(|| panic!("{app}"));
    assert!(counts.contains(" freed; "), "frees are freed, not collected: {counts}");
    let sampled = number_after(counts, "");
    let freed = number_after(counts, "), ");
    let app_sites: Vec<String> = app
        .lines()
        .skip_while(|l| !l.starts_with("top allocation sites"))
        .skip(1)
        .map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            // name and line: "sample_app::pipeline::make_message", "(sample-app/sample-app.rs:111)",
            // compared by the file's name, as the command line's below
            let file_line = fields[3].trim_start_matches('(').trim_end_matches(')');
            format!("{} {}", fields[2], file_line.rsplit('/').next().unwrap())
        })
        .collect();
    assert!(app_sites.len() >= 4, "{app}");
    assert!(is_make_message(&app_sites[0]), "{app}");

    let memtrace = env!("CARGO_BIN_EXE_memtrace");
    let info = run(Command::new(memtrace).arg("info").arg(&trace));
    assert_eq!(number_after(&info, "Sampled blocks:"), sampled, "{info}\n{app}");
    assert_eq!(number_after(&info, "Frees:"), freed, "{info}\n{app}");
    assert!(info.contains("sample-app") && info.contains("Truncated:          no"), "{info}");

    // The same top three sites. Two sites with equal estimates may come in either order,
    // so they are compared as sets; make_message (about 90 % of the bytes) comes first.
    let hotspots = run(Command::new(memtrace).args(["hotspots", "--top", "3"]).arg(&trace));
    let cli_sites: Vec<String> = hotspots
        .lines()
        .skip(2)
        .map(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            let file_line = fields[fields.len() - 1].trim_end_matches(')');
            let file_line = file_line.rsplit('/').next().unwrap();
            format!("{} {}", fields[fields.len() - 2], file_line)
        })
        .collect();
    assert!(cli_sites.first().is_some_and(|s| is_make_message(s)), "{hotspots}");
    let (mut cli_top, mut app_top) = (cli_sites.clone(), app_sites[..3].to_vec());
    cli_top.sort();
    app_top.sort();
    assert_eq!(cli_top, app_top, "{hotspots}\n{app}");
    assert!(hotspots.contains("sample-app.rs:111"), "{hotspots}");

    // pprof of the same trace: the program's function on top, no allocator frame with bytes
    // of its own (when `go` is installed).
    run(Command::new(memtrace).arg("pprof").arg(&trace).arg("-o").arg(dir.path().join("heap.pb.gz")));
    let profile = dir.path().join("heap.pb.gz");
    let Some(rows) = crate::util::cli::pprof_top(&profile, &["-sample_index=alloc_space"]) else {
        skip("go is not installed, for the pprof read-back (apt-get install golang-go)");
        return;
    };
    let flat: Vec<&str> = rows.iter().filter(|(flat, _)| flat != "0").map(|(_, name)| name.as_str()).collect();
    assert!(flat.first().is_some_and(|n| n.ends_with("make_message")), "{rows:?}");
    for name in &flat {
        assert!(!memtrace_rs::analysis::is_allocator_frame(name, ""), "allocator frame {name} in {rows:?}");
    }
}

/// Whether a "name file:line" site is `make_message`'s: by path, or by the bare name that
/// line-tables-only debug info gives inlined functions in optimised builds.
fn is_make_message(site: &str) -> bool {
    site.starts_with("sample_app::pipeline::make_message sample-app.rs:")
        || site.starts_with("make_message sample-app.rs:")
}
