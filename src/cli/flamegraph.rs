//! `memtrace flamegraph`: an interactive SVG flame graph (drawn by inferno) or folded stacks.
//!
//! Each stack's width is its estimated bytes for the chosen figure. Allocator frames are
//! trimmed from the leaves unless asked otherwise, as for `hotspots --stacks`.

use std::io::{self, Write};

use super::analysis::{Analysis, Measure, Options as AnalysisOptions};
use super::format;
use super::sites::{self, Grouping};

/// Options of `memtrace flamegraph`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// What the widths show.
    #[command(flatten)]
    pub weight: Weight,
    /// Write folded stacks (`frame;frame;frame bytes` lines) instead of an SVG.
    #[arg(long)]
    pub folded: bool,
    /// Keep allocator frames at the leaves.
    #[arg(long)]
    pub keep_allocator_frames: bool,
}

/// The figure the flame graph shows (at most one flag; bytes allocated by default).
#[derive(Debug, Clone, Copy, Default, clap::Args)]
#[group(multiple = false)]
pub struct Weight {
    /// Bytes allocated over the whole trace (the default).
    #[arg(long)]
    pub allocated: bool,
    /// Bytes still live at the end of the trace.
    #[arg(long)]
    pub live_end: bool,
    /// Bytes live when the total live estimate peaks.
    #[arg(long)]
    pub live_peak: bool,
    /// Bytes live at this many seconds after the trace start.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    pub live_at: Option<f64>,
}

impl Weight {
    /// The measure drawn.
    pub fn measure(&self) -> Measure {
        if self.live_end {
            Measure::LiveEnd
        } else if self.live_peak {
            Measure::LivePeak
        } else if self.live_at.is_some() {
            Measure::LiveAt
        } else {
            Measure::Allocated
        }
    }

    /// What the analysis must collect for this figure.
    pub fn analysis_options(&self) -> AnalysisOptions {
        AnalysisOptions { stacks: true, live_at: self.live_at.map(|s| (s * 1e6).round() as u64) }
    }

    fn describe(&self) -> String {
        match (self.measure(), self.live_at) {
            (Measure::LiveEnd, _) => "Bytes live at the end".to_string(),
            (Measure::LivePeak, _) => "Bytes live at the peak".to_string(),
            (Measure::LiveAt, Some(at)) => format!("Bytes live at {at} s"),
            _ => "Bytes allocated".to_string(),
        }
    }
}

/// A non-negative number of seconds.
fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.trim_end_matches('s').parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a non-negative number of seconds")),
    }
}

/// The folded stacks of `analysis` for `measure`: one `outer;...;inner bytes` line per
/// stack with a non-zero estimate, largest first.
pub fn folded(analysis: &Analysis, measure: Measure, keep_allocator_frames: bool) -> Vec<String> {
    let grouping = Grouping { stacks: true, keep_allocator_frames };
    sites::ranked(analysis, grouping, measure)
        .into_iter()
        .filter_map(|site| {
            let bytes = analysis.bytes(site.stats.get(measure).samples).round() as u64;
            if bytes == 0 {
                return None;
            }
            let mut line = String::new();
            if site.frames.is_empty() {
                line.push_str(&site.label(analysis));
            }
            for (i, &frame) in site.frames.iter().rev().enumerate() {
                if i > 0 {
                    line.push(';');
                }
                // `;` separates frames and a newline ends the line: neither may appear inside.
                line.extend(analysis.frames[frame].label().chars().map(|c| match c {
                    ';' => ',',
                    c if c.is_control() => ' ',
                    c => c,
                }));
            }
            line.push_str(&format!(" {bytes}"));
            Some(line)
        })
        .collect()
}

/// Draw `lines` (folded stacks) as an interactive SVG titled `title`. With no lines, a
/// small SVG saying there is nothing to draw.
pub fn write_svg(title: &str, lines: &[String], out: &mut impl Write) -> io::Result<()> {
    if lines.is_empty() {
        return writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="800" height="40"><text x="10" y="25">{}: nothing to draw</text></svg>"#,
            format::escape_markup(title)
        );
    }
    let mut options = inferno::flamegraph::Options::default();
    options.title = title.to_string();
    options.count_name = "bytes".to_string();
    options.colors = inferno::flamegraph::Palette::Basic(inferno::flamegraph::color::BasicPalette::Mem);
    options.deterministic = true;
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), out)
}

/// The title of the flame graph of `analysis` for `weight`.
pub fn title(analysis: &Analysis, weight: &Weight) -> String {
    format!("{} (estimated): {}", weight.describe(), String::from_utf8_lossy(&analysis.info.executable_name))
}

/// Write the flame graph (or the folded stacks) of `analysis` as `options` ask.
pub fn write(analysis: &Analysis, options: &Options, out: &mut impl Write) -> io::Result<()> {
    let lines = folded(analysis, options.weight.measure(), options.keep_allocator_frames);
    if options.folded {
        for line in &lines {
            writeln!(out, "{line}")?;
        }
        Ok(())
    } else {
        write_svg(&title(analysis, &options.weight), &lines, out)
    }
}
