//! `memtrace report`: one self-contained, interactive HTML page for a trace, or with
//! `--diff` for two (new − base, frames matched as `memtrace diff` matches them:
//! [`memtrace_rs::analysis::frame_identity`]).
//!
//! The page does what memtrace_viewer does, with no server: a filter bar with the clauses
//! of [`memtrace_rs::analysis::filter`] (every view follows it), the live-heap chart (drag to
//! select a time range), per-site live heap, flame and icicle graphs, top-down and
//! bottom-up tables, the sites table with 95 % intervals, a lifetime histogram and points
//! of interest. It opens on what is live at the peak, and keeps the view (every control not at
//! its default) in the URL's fragment, so that a link opens the same view. The sampled blocks
//! are embedded compactly ([`data`]) and every view is computed from them in the browser by
//! `report/report.js`.
//!
//! Nothing is fetched: the styles and script are inline, and the data is one JSON
//! `<script>` element. The page is vanilla JS (the charts and the flame graph are small
//! SVG drawings of our own): a chart or flame-graph library would add 40–250 KB and its
//! own ids and events for less control over the filter's test hooks, and the browser's
//! `DecompressionStream` inflates the data, so no inflate code is bundled either.

mod data;

use std::io::{self, Write};
use std::path::PathBuf;

pub use data::TraceData;

use memtrace_rs::analysis::{inert, Frame, FrameKind, FrameTable};

use super::args::Trim;
use super::format;

/// Options of `memtrace report`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Compare with this baseline trace: the page shows FILE − BASE.
    #[arg(long, value_name = "BASE")]
    pub diff: Option<PathBuf>,
    /// Most sampled blocks embedded per trace; beyond it samples are thinned (kept with the
    /// probability that fits, as if the trace had a lower rate), and the page says so.
    #[arg(long, default_value_t = 500_000)]
    pub limit: usize,
    /// Most rows each table shows before it asks for a search.
    #[arg(long, default_value_t = 100)]
    pub top: usize,
    /// Which frames the page trims at first (it has a checkbox for each).
    #[command(flatten)]
    pub trim: Trim,
    /// Only the allocations made inside this `tracing` span of a memtrace-rs trace: a span
    /// name (`http_request`) or a whole description (`http_request{route=/api/users}`), as
    /// shown (control characters as `\x1b`) or raw. Every view follows them but the peak
    /// mark, which stays the whole trace's.
    #[arg(long, value_name = "NAME|DESCRIPTION")]
    pub span: Option<String>,
    /// How names are shown.
    #[command(flatten)]
    pub names: super::args::Names,
}

const HTML: &str = include_str!("report/report.html");
const CSS: &str = include_str!("report/report.css");
const JS: &str = include_str!("report/report.js");

/// Write the page of `traces` (one, or base and new), whose frames are in `frames`.
pub fn write(frames: &FrameTable, traces: &[TraceData], options: &Options, out: &mut impl Write) -> io::Result<()> {
    let title = match traces {
        [base, new] => format!("memtrace diff: {} → {}", base.name, new.name),
        _ => format!("memtrace report: {}", traces.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ")),
    };
    let title = match &options.span {
        Some(span) => format!("{title}, inside span {span}"),
        None => title,
    };
    // The title holds trace file names and the `--span` argument as given: inert too.
    let page = HTML.replace("{{TITLE}}", &format::escape_markup(&inert(&title)));
    // The markers come from our template, not from the data, so splitting on them is safe.
    let (before_css, rest) = page.split_once("{{CSS}}").expect("the template has {{CSS}}");
    let (before_data, rest) = rest.split_once("{{DATA}}").expect("the template has {{DATA}}");
    let (before_js, after_js) = rest.split_once("{{JS}}").expect("the template has {{JS}}");
    out.write_all(before_css.as_bytes())?;
    out.write_all(CSS.as_bytes())?;
    out.write_all(before_data.as_bytes())?;
    data::write_json(frames, traces, options, out)?;
    out.write_all(before_js.as_bytes())?;
    out.write_all(JS.as_bytes())?;
    out.write_all(after_js.as_bytes())
}

/// Standard base64 with padding.
fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> shift & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Why `--span SPAN` selects nothing in a trace whose frames are `frames`: no span is called so,
/// and which spans there are (or that the trace has none, as a trace not written by
/// memtrace-rs with its tracing layer).
pub fn no_such_span(span: &str, frames: &[Frame]) -> String {
    let mut names: Vec<&str> =
        frames.iter().filter(|f| f.kind() == FrameKind::Span).map(|f| f.function.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    if names.is_empty() {
        return format!("--span {span}: the trace has no spans (they come from memtrace-rs's tracing layer)");
    }
    let shown = names.iter().take(20).map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ");
    let more = if names.len() > 20 { format!(" and {} more", names.len() - 20) } else { String::new() };
    format!("--span {span}: no span has this name or description; the trace's spans are {shown}{more}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_assets_cannot_end_their_elements_early() {
        assert!(!JS.contains("</script") && !CSS.contains("</style"));
    }

    #[test]
    fn base64_matches_rfc_4648() {
        for (input, want) in [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foobar", "Zm9vYmFy")] {
            assert_eq!(base64(input.as_bytes()), want);
        }
    }
}
