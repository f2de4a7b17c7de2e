//! `memtrace report`: one self-contained HTML page with the info summary, the live-heap
//! chart, the top allocation sites and the flame graph of bytes allocated.
//!
//! Nothing is fetched from the network: the styles are inline, the chart is an SVG image
//! in a `data:` URL, and the flame graph is inferno's SVG inlined with its own script. That
//! script looks for the page's first `<svg>` element, so the flame graph is the only one.

use std::io::{self, Write};

use memtrace_rs::analysis::{ranked, Analysis, Grouping, Measure};

use super::{flamegraph, format, info, timeline};

/// Options of `memtrace report`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Number of sites in the table.
    #[arg(long, default_value_t = 25)]
    pub top: usize,
    /// Only the allocations made inside this `tracing` span of a memtrace-rs trace: a span
    /// name (`http_request`) or a whole description (`http_request{route=/api/users}`).
    #[arg(long, value_name = "SPAN")]
    pub span: Option<String>,
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em;color:#222}\
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em}\
table{border-collapse:collapse}td,th{padding:2px 10px;text-align:left;vertical-align:top}\
table.sites td.n,table.sites th.n{text-align:right;font-variant-numeric:tabular-nums}\
table.sites tr:nth-child(even){background:#f4f4f4}\
table.summary th{font-weight:normal;color:#555}\
td.site{font-family:monospace;word-break:break-all}img.chart{max-width:100%;height:auto}\
div.flamegraph svg{width:100%}";

/// Write the report of `analysis` (the trace called `name`).
pub fn write(analysis: &Analysis, name: &str, options: &Options, out: &mut impl Write) -> io::Result<()> {
    let title = match &options.span {
        Some(span) => format!("memtrace report: {name}, inside span {span}"),
        None => format!("memtrace report: {name}"),
    };
    write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><style>{STYLE}</style></head>\n<body>\n<h1>{}</h1>\n",
        format::escape_markup(&title),
        format::escape_markup(&title)
    )?;
    if analysis.is_truncated() {
        writeln!(out, "<p><strong>The trace is truncated; it was analysed up to the cut.</strong></p>")?;
    }
    writeln!(out, "<h2>Summary</h2>\n<table class=\"summary\">")?;
    for (key, value) in info::summary(analysis, name) {
        writeln!(out, "<tr><th>{key}</th><td>{}</td></tr>", format::escape_markup(&value))?;
    }
    writeln!(out, "</table>")?;
    writeln!(
        out,
        "<h2>Live heap</h2>\n<img class=\"chart\" alt=\"Estimated live heap and allocation rate over time\" \
         src=\"data:image/svg+xml;base64,{}\">",
        base64(timeline::svg(analysis).as_bytes())
    )?;
    write_sites(analysis, options.top, out)?;
    writeln!(out, "<h2>Flame graph of bytes allocated</h2>\n<div class=\"flamegraph\">")?;
    let weight = flamegraph::Weight::default();
    let folded = flamegraph::folded(analysis, Measure::Allocated, false, flamegraph::Root::Thread);
    let mut svg = Vec::new();
    flamegraph::write_svg(&flamegraph::title(analysis, &weight), &folded, &mut svg)?;
    out.write_all(inline_svg(&svg))?;
    writeln!(out, "</div>\n</body></html>")
}

/// The top sites by bytes allocated, with their live figures.
fn write_sites(analysis: &Analysis, top: usize, out: &mut impl Write) -> io::Result<()> {
    let ranked = ranked(analysis, Grouping::default(), Measure::Allocated);
    let total = analysis.bytes(analysis.totals().allocated.samples);
    writeln!(
        out,
        "<h2>Top allocation sites</h2>\n<p>{} of {} sites, by estimated bytes allocated.</p>\n\
         <table class=\"sites\"><tr><th class=\"n\">#</th><th class=\"n\">allocated</th><th class=\"n\">%</th>\
         <th class=\"n\">samples</th><th class=\"n\">live at peak</th><th class=\"n\">live at end</th><th>site</th></tr>",
        ranked.len().min(top),
        ranked.len()
    )?;
    for (rank, site) in ranked.iter().take(top).enumerate() {
        let s = &site.stats;
        let allocated = analysis.bytes(s.allocated.samples);
        writeln!(
            out,
            "<tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"site\">{}</td></tr>",
            rank + 1,
            format::bytes(allocated),
            format::percent(allocated, total),
            s.allocated.samples,
            format::bytes(analysis.bytes(s.live_peak.samples)),
            format::bytes(analysis.bytes(s.live_end.samples)),
            format::escape_markup(&site.label(analysis))
        )?;
    }
    writeln!(out, "</table>")
}

/// An SVG document without its XML declaration and document type, for inlining in HTML.
fn inline_svg(svg: &[u8]) -> &[u8] {
    let start = svg.windows(4).position(|w| w == b"<svg").unwrap_or(0);
    &svg[start..]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc_4648() {
        for (input, want) in [("", ""), ("f", "Zg=="), ("fo", "Zm8="), ("foo", "Zm9v"), ("foobar", "Zm9vYmFy")] {
            assert_eq!(base64(input.as_bytes()), want);
        }
    }

    #[test]
    fn inline_svg_drops_the_prolog() {
        assert_eq!(inline_svg(b"<?xml version=\"1.0\"?><!DOCTYPE svg><svg a=\"1\"/>"), b"<svg a=\"1\"/>");
    }
}
