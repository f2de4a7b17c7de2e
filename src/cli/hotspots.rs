//! `memtrace hotspots`: allocation sites (or whole stacks) ranked by estimated bytes.

use std::io::{self, Write};

use super::analysis::Analysis;
use super::format;
use super::sites::{self, By, Grouping};

/// Options of `memtrace hotspots`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Number of sites to show.
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    /// The figure to rank by.
    #[arg(long, value_enum, default_value_t = By::Allocated)]
    pub by: By,
    /// How stacks are grouped into sites.
    #[command(flatten)]
    pub grouping: Grouping,
    /// With --stacks, the most frames shown per stack.
    #[arg(long, default_value_t = 16)]
    pub frames: usize,
}

/// Print the `options.top` sites of `analysis` (the trace called `name`).
pub fn write(analysis: &Analysis, name: &str, options: &Options, out: &mut impl Write) -> io::Result<()> {
    let measure = options.by.measure();
    let ranked = sites::ranked(analysis, options.grouping, measure);
    let total = analysis.totals().get(measure);
    let total_bytes = analysis.bytes(total.samples);
    let what = if options.grouping.stacks { "stacks" } else { "sites" };
    writeln!(
        out,
        "Top {} of {} {what} of {name} by {} (estimated): total {} in {} samples",
        ranked.len().min(options.top),
        ranked.len(),
        options.by.describe(),
        format::bytes(total_bytes),
        total.samples
    )?;
    writeln!(out, "{:>12} {:>8} {:>9}  site", "bytes", "%", "samples")?;
    for site in ranked.iter().take(options.top) {
        let tally = site.stats.get(measure);
        let bytes = analysis.bytes(tally.samples);
        writeln!(
            out,
            "{:>12} {:>8} {:>9}  {}",
            format::bytes(bytes),
            format::percent(bytes, total_bytes),
            tally.samples,
            site.label(analysis)
        )?;
        if options.grouping.stacks {
            let callers = site.frames.iter().skip(1);
            for &frame in callers.clone().take(options.frames.saturating_sub(1)) {
                writeln!(out, "{:35}{}", "", analysis.frames[frame].label())?;
            }
            let hidden = callers.len().saturating_sub(options.frames.saturating_sub(1));
            if hidden > 0 {
                writeln!(out, "{:35}... {hidden} more frames", "")?;
            }
        }
    }
    Ok(())
}
