//! `memtrace timeline`: the estimated live heap and the allocation rate over time, as an
//! SVG chart (with the peak marked) or as CSV. The chart is also the report's heap chart.

use std::fmt::Write as _;
use std::io::{self, Write};

use super::format;
use memtrace_rs::analysis::Analysis;

/// Chart geometry, in SVG user units.
const WIDTH: f64 = 960.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 20.0;
const LIVE_TOP: f64 = 40.0;
const LIVE_HEIGHT: f64 = 260.0;
const RATE_TOP: f64 = 350.0;
const RATE_HEIGHT: f64 = 110.0;
const HEIGHT: f64 = 500.0;
/// Most intervals between tick marks on an axis (there are about four).
const MAX_TICKS: usize = 10;

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
        let (live, live_max, rate) = (format::whole(p.live), format::whole(p.live_max), format::whole(p.alloc_rate));
        writeln!(out, "{:.6},{live},{live_max},{rate}", p.time)?;
    }
    Ok(())
}

/// `v` as a value that can be drawn: NaN and negative values are 0, infinity the largest
/// finite value.
fn drawable(v: f64) -> f64 {
    if v.is_nan() || v <= 0.0 {
        0.0
    } else {
        v.min(f64::MAX)
    }
}

/// A round step that cuts `0..max` into about four intervals: always positive and finite
/// (1 when `max` is not a positive finite number, `max` itself when no round step fits).
fn tick_step(max: f64) -> f64 {
    if !(max > 0.0 && max.is_finite()) {
        return 1.0;
    }
    let rough = max / 4.0;
    let magnitude = 10f64.powf(rough.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * magnitude).find(|s| *s >= rough);
    let step = step.unwrap_or(10.0 * magnitude);
    // Subnormal or huge `max`: the magnitude underflows to 0 or the step overflows.
    if step > 0.0 && step.is_finite() {
        step
    } else {
        max
    }
}

/// The tick values `0, step, 2 × step, …` up to `max`: at most `MAX_TICKS + 1` of them,
/// all finite, whatever `max` and `step` are.
fn ticks(max: f64, step: f64) -> impl Iterator<Item = f64> {
    (0..=MAX_TICKS).map(move |i| i as f64 * step).take_while(move |&v| v.is_finite() && v / 1.000_001 <= max)
}

/// A panel: its vertical position and value range.
struct Panel {
    top: f64,
    height: f64,
    /// The top of the value range: positive and finite.
    max: f64,
}

impl Panel {
    fn new(top: f64, height: f64, max: f64) -> Panel {
        let max = drawable(max);
        let step = tick_step(max);
        let rounded = (max / step).ceil().max(1.0) * step;
        // Rounding up can overflow a huge maximum: keep it unrounded then.
        let max = if rounded.is_finite() { rounded } else { max };
        Panel { top, height, max }
    }

    fn y(&self, v: f64) -> f64 {
        self.top + self.height * (1.0 - drawable(v) / self.max)
    }

    /// Horizontal grid lines with value labels, and the panel's title.
    fn axes(&self, svg: &mut String, title: &str, label: impl Fn(f64) -> String) {
        for v in ticks(self.max, tick_step(self.max)) {
            let y = self.y(v);
            let _ = write!(
                svg,
                r##"<line x1="{LEFT}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end" font-size="11">{}</text>"##,
                WIDTH - RIGHT,
                LEFT - 6.0,
                y + 4.0,
                format::escape_markup(&label(v))
            );
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
    // In floating point: 1024 buckets of the widest width overflow a u64 of µs.
    let span = (t.buckets.len() as f64 * t.width as f64 / 1e6).max(1e-6);
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
    for s in ticks(span, tick_step(span)) {
        for panel in [&live, &rate] {
            let _ = write!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="11">{}s</text>"#,
                x(s),
                panel.top + panel.height + 14.0,
                trim_float(s)
            );
        }
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

/// `0.5`, `2`, `0.25`: a tick value without trailing zeros (scientific notation from
/// 10^15 s on, which no real trace reaches).
fn trim_float(v: f64) -> String {
    if v >= 1e15 {
        return format!("{v:e}");
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_bounded_for_any_maximum() {
        for max in [
            0.0,
            -1.0,
            5e-324,
            1e-300,
            0.3,
            1.0,
            1e6,
            9.2e18 * 8.0 / 1e-9,
            1e300,
            f64::MAX,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ] {
            let panel = Panel::new(0.0, 100.0, max);
            assert!(panel.max > 0.0 && panel.max.is_finite(), "{max}: {}", panel.max);
            let step = tick_step(panel.max);
            assert!(step > 0.0 && step.is_finite(), "{max}: {step}");
            let ticks: Vec<f64> = ticks(panel.max, step).collect();
            assert!(!ticks.is_empty() && ticks.len() <= MAX_TICKS + 1, "{max}: {ticks:?}");
            assert!(ticks.iter().all(|v| v.is_finite() && panel.y(*v).is_finite()), "{max}: {ticks:?}");
            assert!(panel.y(max).is_finite(), "{max}");
        }
        assert_eq!(ticks(Panel::new(0.0, 1.0, 7.0).max, 2.0).collect::<Vec<_>>(), [0.0, 2.0, 4.0, 6.0, 8.0]);
    }
}
