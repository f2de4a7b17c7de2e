//! `memtrace flamegraph`: an interactive SVG flame graph (drawn by inferno) or folded stacks.
//!
//! Each stack's width is its estimated bytes for the chosen figure. Allocator frames are
//! trimmed from the leaves and the runtime's start-up frames from the roots unless asked
//! otherwise, as for `hotspots --stacks`. The roots of a memtrace-rs trace's stacks are its
//! thread and span pseudo-frames, which `--root` can leave out.

use std::io::{self, Write};

use memtrace_rs::analysis::{self, inert_bytes, ranked, Analysis, FrameId, FrameKind, Grouping, Measure};

use super::args::Trim;
use super::format;

/// Options of `memtrace flamegraph`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// What the widths show.
    #[command(flatten)]
    pub weight: Weight,
    /// Write folded stacks (`frame;frame;frame bytes` lines) instead of an SVG. (Should the
    /// estimates add up to more than 2^53 bytes, the counts are in a power of two bytes,
    /// which a warning gives.)
    #[arg(long)]
    pub folded: bool,
    /// Which frames are trimmed from the leaves and the roots.
    #[command(flatten)]
    pub trim: Trim,
    /// What the roots are, in memtrace-rs traces: threads, then the spans inside them, then
    /// code (`thread`, as recorded); spans, then code (`span`: thread frames left out); or
    /// code alone (`code`: thread and span frames left out).
    #[arg(long, value_enum, default_value_t = Root::Thread)]
    pub root: Root,
    /// How names are shown.
    #[command(flatten)]
    pub names: super::args::Names,
}

/// What a flame graph's roots are (`--root`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Root {
    /// Threads, then spans, then code.
    #[default]
    Thread,
    /// Spans, then code.
    Span,
    /// Code.
    Code,
}

impl Root {
    /// Whether frames of `kind` are drawn.
    fn draws(self, kind: FrameKind) -> bool {
        match kind {
            FrameKind::Thread => self == Root::Thread,
            FrameKind::Span => self != Root::Code,
            FrameKind::Code => true,
        }
    }
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
    /// Bytes live at this time after the trace start (`1.5s`, `250ms`; a plain number is
    /// seconds).
    #[arg(long, value_name = "TIME", value_parser = parse_seconds)]
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

    /// The time of `--live-at`, in µs after the trace start: when the analysis must record
    /// each stack's live estimate.
    pub fn live_at_us(&self) -> Option<u64> {
        self.live_at.map(|s| (s * 1e6).round() as u64)
    }

    /// Why a flame graph of this figure can be empty.
    pub fn nothing(&self) -> String {
        match (self.measure(), self.live_at) {
            (Measure::LiveEnd, _) => "nothing sampled is live at the end".to_string(),
            (Measure::LivePeak, _) => "nothing sampled is live at the peak".to_string(),
            (Measure::LiveAt, Some(at)) => format!("nothing sampled is live at {at} s"),
            _ => "no allocation was sampled".to_string(),
        }
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

/// A time as the filters take it (`1.5s`, `250ms`, `2min`; a plain number is seconds), in
/// seconds.
fn parse_seconds(s: &str) -> Result<f64, String> {
    memtrace_rs::analysis::filter::parse_time(s).map(|us| us as f64 / 1e6)
}

/// Largest sum of the counts of folded stacks: flame-graph tools (inferno included) add the
/// counts up in 64-bit integers, and an `f64` holds every whole number up to here.
const MAX_TOTAL: f64 = (1u64 << 53) as f64;

/// Most bytes of folded stacks kept in memory (and drawn): deep stacks of long names would
/// otherwise make a line per stack of depth × name length. The stacks from the first that
/// does not fit on (the smallest, since they come largest first) are left out, unread, and
/// [`Folded::left_out`] says how many.
const MAX_FOLDED_BYTES: usize = 256 << 20;

/// Folded stacks and the unit of their counts.
#[derive(Debug, Clone, PartialEq)]
pub struct Folded {
    /// One `outer;...;inner count` line per stack, largest first.
    pub lines: Vec<String>,
    /// Stacks left out because the lines reached [`MAX_FOLDED_BYTES`].
    pub left_out: usize,
    /// The counts are in units of `2^unit_log2` bytes: 0 (bytes) unless the estimates add
    /// up to more than 2^53 bytes (8 PiB), which only absurd estimates do.
    pub unit_log2: u32,
}

impl Folded {
    /// Bytes per count.
    pub fn unit(&self) -> f64 {
        2f64.powi(self.unit_log2 as i32)
    }
}

/// The folded stacks of `analysis` for `measure`: one `outer;...;inner count` line per
/// stack whose count is not zero, largest first. The counts are bytes, or units of a power
/// of two bytes chosen so that they add up to at most 2^53 (see [`Folded::unit_log2`]).
/// Only the frames `root` draws are drawn.
pub fn folded(analysis: &Analysis, measure: Measure, trim: analysis::Trim, root: Root) -> Folded {
    let grouping = Grouping { stacks: true, trim, ..Default::default() };
    let sites = ranked(analysis, grouping, measure);
    let bytes: Vec<f64> = sites.iter().map(|s| analysis.bytes(s.stats.get(measure).samples).min(f64::MAX)).collect();
    let total = bytes.iter().sum::<f64>().min(f64::MAX);
    let mut unit_log2 = 0;
    while total / 2f64.powi(unit_log2 as i32) > MAX_TOTAL {
        unit_log2 += 1;
    }
    let unit = 2f64.powi(unit_log2 as i32);
    // Rounding (or a sum that reached infinity) can still push the total a little past
    // the limit: never let it get near 2^64.
    let mut room = 1u64 << 62;
    let (mut size, mut left_out) = (0usize, 0);
    let labels: Vec<String> = analysis.frames.iter().map(|f| f.label()).collect();
    let draws: Vec<bool> = analysis.frames.iter().map(|f| root.draws(f.kind())).collect();
    let lines = sites
        .iter()
        .zip(bytes)
        .filter_map(|(site, bytes)| {
            let count = ((bytes / unit).round() as u64).min(room);
            if count == 0 {
                return None;
            }
            if left_out > 0 {
                left_out += 1;
                return None;
            }
            // Measured before the frames are collected, so that a stack past the limit
            // costs no memory.
            let length: usize = site.frames().filter(|&f| draws[f]).map(|f| labels[f].len() + 1).sum();
            if size + length > MAX_FOLDED_BYTES {
                left_out += 1;
                return None;
            }
            size += length;
            let mut drawn: Vec<FrameId> = site.frames().filter(|&f| draws[f]).collect();
            drawn.reverse();
            room -= count;
            let mut line = String::new();
            if site.is_empty() {
                line.push_str(&site.label(analysis));
            } else if drawn.is_empty() {
                line.push_str("(no code)");
            }
            for (i, &frame) in drawn.iter().enumerate() {
                if i > 0 {
                    line.push(';');
                }
                // `;` separates frames: it may not appear inside. (Names are inert, so no
                // newline can end the line early.)
                line.extend(labels[frame].chars().map(|c| if c == ';' { ',' } else { c }));
            }
            line.push_str(&format!(" {count}"));
            Some(line)
        })
        .collect();
    Folded { lines, left_out, unit_log2 }
}

/// Draw `folded` as an interactive SVG titled `title`, widths and figures in bytes. With no
/// lines, a small SVG saying there is nothing to draw.
pub fn write_svg(title: &str, folded: &Folded, out: &mut impl Write) -> io::Result<()> {
    if folded.lines.is_empty() {
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
    // A label too long for its frame keeps its start, the function's name, not its end (the
    // line number).
    options.text_truncate_direction = inferno::flamegraph::TextTruncateDirection::Right;
    options.factor = folded.unit();
    inferno::flamegraph::from_lines(&mut options, folded.lines.iter().map(String::as_str), out)
}

/// The title of the flame graph of `analysis` for `weight`.
pub fn title(analysis: &Analysis, weight: &Weight) -> String {
    format!("{} (estimated): {}", weight.describe(), inert_bytes(&analysis.info.executable_name))
}

/// What [`write()`] drew, for the warnings it calls for.
#[derive(Debug, Clone, Copy, Default)]
pub struct Drawn {
    /// The unit of the counts as a power of two bytes (see [`Folded::unit_log2`]).
    pub unit_log2: u32,
    /// Nothing was drawn.
    pub empty: bool,
    /// Stacks left out (see [`Folded::left_out`]).
    pub left_out: usize,
}

/// Write the flame graph (or the folded stacks) of `analysis` as `options` ask.
pub fn write(analysis: &Analysis, options: &Options, out: &mut impl Write) -> io::Result<Drawn> {
    let folded = folded(analysis, options.weight.measure(), options.trim.frames(), options.root);
    if options.folded {
        for line in &folded.lines {
            writeln!(out, "{line}")?;
        }
    } else {
        write_svg(&title(analysis, &options.weight), &folded, out)?;
    }
    Ok(Drawn { unit_log2: folded.unit_log2, empty: folded.lines.is_empty(), left_out: folded.left_out })
}
