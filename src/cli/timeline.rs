//! `memtrace timeline`: the estimated live heap and the allocation rate over time, as an
//! SVG chart (with the peak marked) or as CSV. The chart is also the report's heap chart.

use std::fmt::Write as _;
use std::io::{self, Write};

use super::analysis::Analysis;
use super::format;

/// Chart geometry, in SVG user units.
const WIDTH: f64 = 960.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 20.0;
const LIVE_TOP: f64 = 40.0;
const LIVE_HEIGHT: f64 = 260.0;
const RATE_TOP: f64 = 350.0;
const RATE_HEIGHT: f64 = 110.0;
const HEIGHT: f64 = 500.0;

/// One row per timeline bucket, from the trace start on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// Start of the bucket, in seconds after the trace start.
    pub time: f64,
    /// Estimated live bytes at the end of the bucket.
    pub live: f64,
    /// Highest estimated live bytes during the bucket.
    pub live_max: f64,
    /// Estimated bytes allocated per second during the bucket.
    pub alloc_rate: f64,
}

/// The timeline of `analysis` in bytes and seconds.
pub fn points(analysis: &Analysis) -> Vec<Point> {
    let t = &analysis.timeline;
    let width_s = t.width as f64 / 1e6;
    t.buckets
        .iter()
        .enumerate()
        .map(|(i, b)| Point {
            time: i as f64 * width_s,
            live: analysis.bytes(b.live_end),
            live_max: analysis.bytes(b.live_max),
            alloc_rate: analysis.bytes(b.allocated) / width_s,
        })
        .collect()
}

/// Write the timeline as CSV.
pub fn write_csv(analysis: &Analysis, out: &mut impl Write) -> io::Result<()> {
    writeln!(out, "time_s,live_bytes,live_max_bytes,alloc_rate_bytes_per_s")?;
    for p in points(analysis) {
        writeln!(out, "{:.6},{:.0},{:.0},{:.0}", p.time, p.live, p.live_max, p.alloc_rate)?;
    }
    Ok(())
}

/// A round step that cuts `0..max` into about four intervals.
fn tick_step(max: f64) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let rough = max / 4.0;
    let magnitude = 10f64.powf(rough.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * magnitude).find(|s| *s >= rough);
    step.unwrap_or(10.0 * magnitude)
}

/// A panel: its vertical position and value range.
struct Panel {
    top: f64,
    height: f64,
    max: f64,
}

impl Panel {
    fn new(top: f64, height: f64, max: f64) -> Panel {
        let step = tick_step(max);
        Panel { top, height, max: (max / step).ceil().max(1.0) * step }
    }

    fn y(&self, v: f64) -> f64 {
        self.top + self.height * (1.0 - v / self.max)
    }

    /// Horizontal grid lines with value labels, and the panel's title.
    fn axes(&self, svg: &mut String, title: &str, label: impl Fn(f64) -> String) {
        let step = tick_step(self.max);
        let mut v = 0.0;
        while v <= self.max * 1.000_001 {
            let y = self.y(v);
            let _ = write!(
                svg,
                r##"<line x1="{LEFT}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end" font-size="11">{}</text>"##,
                WIDTH - RIGHT,
                LEFT - 6.0,
                y + 4.0,
                format::escape_markup(&label(v))
            );
            v += step;
        }
        let _ = write!(
            svg,
            r#"<text x="{LEFT}" y="{:.1}" font-size="13" font-weight="bold">{}</text>"#,
            self.top - 10.0,
            format::escape_markup(title)
        );
    }
}

/// The chart of `analysis` as a standalone SVG document.
pub fn svg(analysis: &Analysis) -> String {
    let points = points(analysis);
    let t = &analysis.timeline;
    let span = ((t.buckets.len() as u64 * t.width) as f64 / 1e6).max(1e-6);
    let x = |time: f64| LEFT + (WIDTH - LEFT - RIGHT) * time / span;
    let peak_bytes = analysis.bytes(analysis.peak.samples);
    let live = Panel::new(LIVE_TOP, LIVE_HEIGHT, peak_bytes);
    let max_rate = points.iter().map(|p| p.alloc_rate).fold(0.0, f64::max);
    let rate = Panel::new(RATE_TOP, RATE_HEIGHT, max_rate);
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>"#
    );
    live.axes(&mut svg, "Estimated live heap", format::bytes);
    rate.axes(&mut svg, "Allocation rate", |v| format!("{}/s", format::bytes(v)));
    // Live heap: the highest value of each bucket, as a filled step line.
    let mut path = format!("M{:.1},{:.1}", x(0.0), live.y(0.0));
    for (i, p) in points.iter().enumerate() {
        let end = points.get(i + 1).map_or(span, |n| n.time);
        let y = live.y(p.live_max);
        let _ = write!(path, " L{:.1},{y:.1} L{:.1},{y:.1}", x(p.time), x(end));
    }
    let _ = write!(path, " L{:.1},{:.1} Z", x(span), live.y(0.0));
    let _ = write!(svg, r##"<path d="{path}" fill="#8fb8de" stroke="#2a6199" stroke-width="1"/>"##);
    // Allocation rate: bars.
    let bar = (WIDTH - LEFT - RIGHT) / points.len().max(1) as f64;
    for p in &points {
        if p.alloc_rate > 0.0 {
            let y = rate.y(p.alloc_rate);
            let _ = write!(
                svg,
                r##"<rect x="{:.2}" y="{y:.1}" width="{:.2}" height="{:.1}" fill="#e0904a"/>"##,
                x(p.time),
                bar.max(0.5),
                rate.y(0.0) - y
            );
        }
    }
    // Time axis, under each panel.
    let step = tick_step(span);
    let mut s = 0.0;
    while s <= span * 1.000_001 {
        for panel in [&live, &rate] {
            let _ = write!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="11">{}s</text>"#,
                x(s),
                panel.top + panel.height + 14.0,
                trim_float(s)
            );
        }
        s += step;
    }
    // The peak.
    let peak_us = analysis.peak.time.saturating_sub(analysis.info.start_time);
    let peak_s = peak_us as f64 / 1e6;
    let label = format!("peak {} at {}", format::bytes(peak_bytes), format::seconds(peak_us));
    let (px, py) = (x(peak_s), live.y(peak_bytes));
    let anchor = if px > WIDTH / 2.0 { "end" } else { "start" };
    let dx = if px > WIDTH / 2.0 { -8.0 } else { 8.0 };
    let _ = write!(
        svg,
        r##"<circle cx="{px:.1}" cy="{py:.1}" r="4" fill="#c0392b"/><text x="{:.1}" y="{:.1}" text-anchor="{anchor}" font-size="12" fill="#c0392b">{}</text></svg>"##,
        px + dx,
        py + 14.0,
        format::escape_markup(&label)
    );
    svg.push('\n');
    svg
}

/// `0.5`, `2`, `0.25`: a tick value without trailing zeros.
fn trim_float(v: f64) -> String {
    let s = format!("{v:.6}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Write the timeline as CSV when `csv`, else as an SVG chart.
pub fn write(analysis: &Analysis, csv: bool, out: &mut impl Write) -> io::Result<()> {
    if csv {
        write_csv(analysis, out)
    } else {
        out.write_all(svg(analysis).as_bytes())
    }
}
