//! `memtrace info`: the trace's metadata and its headline figures, one per line.

use std::io::{self, Write};

use super::format;
use memtrace_rs::analysis::{inert_bytes, Analysis, Origin};

/// One `name: value` line of the summary.
pub(crate) type Line = (&'static str, String);

/// The summary as `(name, value)` pairs. `name` is
/// the trace's name as shown to the user. Rust traces are described in their own words
/// (sampled blocks and frees); OCaml traces keep OCaml's (minor and major allocations,
/// promotions, collections, domains).
fn summary(analysis: &Analysis, name: &str) -> Vec<Line> {
    let info = &analysis.info;
    let c = &analysis.counts;
    let text = |b: &[u8]| inert_bytes(b).into_owned();
    let peak_offset = analysis.peak.time.saturating_sub(info.start_time);
    let mut lines = vec![
        ("File", name.to_string()),
        ("Executable", text(&info.executable_name)),
        ("Host", text(&info.host_name)),
        ("PID", info.pid.to_string()),
        ("Start time", format::utc(info.start_time)),
        ("Sample rate", format!("{:e}", info.sample_rate)),
        ("Word size", format!("{} bits", info.word_size)),
        ("Runtime params", text(&info.runtime_params)),
        ("Context", info.context.as_deref().map_or_else(|| "(none)".to_string(), text)),
        ("Duration", format::seconds(analysis.duration())),
        ("Events", c.events.to_string()),
    ];
    match analysis.origin() {
        Origin::Rust => lines.extend([
            ("Sampled blocks", c.allocs().to_string()),
            ("Frees", format!("{} (of sampled blocks)", c.collects)),
            ("Samples", c.samples.to_string()),
        ]),
        Origin::OCaml => lines.extend([
            (
                "Allocations",
                format!(
                    "{} ({} minor, {} major, {} external)",
                    c.allocs(),
                    c.allocs_minor,
                    c.allocs_major,
                    c.allocs_external
                ),
            ),
            ("Promotions", c.promotes.to_string()),
            ("Collections", c.collects.to_string()),
            ("Domains", analysis.domains.to_string()),
            ("Samples", c.samples.to_string()),
            ("Sampled words", c.words.to_string()),
        ]),
    }
    if c.live_at_start > 0 {
        // A window's, or a later file of a series: not in the allocated figures.
        let blocks = format!("{} sampled blocks, allocated before the trace began", c.live_at_start);
        lines.push(("Live at start", blocks));
    }
    lines.extend([
        ("Allocated (est.)", estimate(analysis, c.samples)),
        ("Live at end (est.)", estimate(analysis, analysis.live_end)),
        (
            "Peak live (est.)",
            format!("{} at {}", estimate(analysis, analysis.peak.samples), format::seconds(peak_offset)),
        ),
        ("Location codes", analysis.location_codes.to_string()),
        ("Distinct locations", analysis.distinct_locations.to_string()),
        ("Truncated", if analysis.is_truncated() { "yes (analysed up to the cut)" } else { "no" }.to_string()),
    ]);
    if analysis.origin() == Origin::Rust {
        lines.push(("Closed by writer", closed(analysis, name)));
        lines.push(("Samples lost", lost(analysis)));
    }
    lines
}

/// Whether the trace's writer closed it, and if not, why not as far as can be told.
fn closed(analysis: &Analysis, name: &str) -> String {
    if analysis.closed_by_writer {
        "yes".to_string()
    } else if memtrace_rs::trace::writer_holds_lock(std::path::Path::new(name)) {
        "no: still being written (its writer holds the file's lock); figures stop at what it has flushed".to_string()
    } else {
        "no: its writer stopped without closing it (the program was killed?), or it comes from a writer that does \
         not mark traces"
            .to_string()
    }
}

/// The samples the tracer lost, their share of the allocated estimate, and their causes.
fn lost(analysis: &Analysis) -> String {
    let samples = analysis.lost_samples();
    if samples == 0 {
        return "none".to_string();
    }
    let causes: Vec<String> = analysis.lost.iter().map(|l| format!("{} {}", l.cause, l.samples)).collect();
    format!(
        "{samples} samples, {:.1} % of the allocated estimate ({}), counted in allocated figures, in no live figure: {}",
        analysis.lost_share() * 100.0,
        format::estimate(&analysis.estimate(samples)),
        causes.join(", ")
    )
}

/// `1.5 MiB ±2.1% (1572864 bytes, 42 samples)`.
fn estimate(analysis: &Analysis, samples: u64) -> String {
    let e = analysis.estimate(samples);
    format!("{} ({} bytes, {} samples)", format::estimate(&e), format::whole(e.bytes), samples)
}

/// Print the summary of `analysis` for the trace called `name`.
pub fn write(analysis: &Analysis, name: &str, out: &mut impl Write) -> io::Result<()> {
    for (key, value) in summary(analysis, name) {
        writeln!(out, "{:<20}{value}", format!("{key}:"))?;
    }
    Ok(())
}
