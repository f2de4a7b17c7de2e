//! `memtrace hotspots`: allocation sites (or whole stacks) ranked by estimated bytes.

use std::io::{self, Write};

use memtrace_rs::analysis::{ranked, Analysis};

use super::args::Ranking;
use super::format;

/// Options of `memtrace hotspots`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Which sites, by what figure.
    #[command(flatten)]
    pub ranking: Ranking,
    /// With --stacks, the most frames shown per stack.
    #[arg(long, default_value_t = 16)]
    pub frames: usize,
}

/// Print the `options.ranking.top` sites of `analysis` (the trace called `name`).
pub fn write(analysis: &Analysis, name: &str, options: &Options, out: &mut impl Write) -> io::Result<()> {
    let measure = options.ranking.measure();
    let ranked = ranked(analysis, options.ranking.sites(), measure);
    let total = analysis.totals().get(measure);
    let total_bytes = analysis.bytes(total.samples);
    let what = options.ranking.what();
    writeln!(
        out,
        "Top {} of {} {what} of {name} by {} (estimated): total {} in {} samples",
        ranked.len().min(options.ranking.top),
        ranked.len(),
        options.ranking.describe(),
        format::bytes(total_bytes),
        total.samples
    )?;
    writeln!(out, "{:>12} {:>8} {:>9}  site", "bytes", "%", "samples")?;
    for site in ranked.iter().take(options.ranking.top) {
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
        if options.ranking.grouping.stacks {
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
