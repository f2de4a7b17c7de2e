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
    /// Text or JSON.
    #[command(flatten)]
    pub format: super::json::FormatArgs,
}

/// Print the `options.ranking.top` sites of `analysis` (the trace called `name`): for each
/// its estimated bytes with their 95 % uncertainty (marked `*` when they rest on fewer than
/// 10 samples), share, samples and estimated count of allocations (or of live blocks).
pub fn write(analysis: &Analysis, name: &str, options: &Options, out: &mut impl Write) -> io::Result<()> {
    let measure = options.ranking.by.measure();
    let ranked = ranked(analysis, options.ranking.grouping.sites(), measure);
    let total = analysis.estimate(analysis.totals().get(measure).samples);
    let what = if options.ranking.grouping.stacks { "stacks" } else { "sites" };
    writeln!(
        out,
        "Top {} of {} {what} of {name} by {} (estimated): total {} in {} samples",
        ranked.len().min(options.ranking.top),
        ranked.len(),
        options.ranking.by.describe(),
        format::estimate(&total),
        total.samples
    )?;
    writeln!(out, "{:>12} {:>7} {:>8} {:>9} {:>10}  site", "bytes", "±95%", "%", "samples", "count")?;
    if ranked.is_empty() {
        writeln!(out, "(none: no sampled allocation counts towards {})", options.ranking.by.describe())?;
    }
    let mut rough = false;
    for site in ranked.iter().take(options.ranking.top) {
        let tally = site.stats.get(measure);
        let e = analysis.estimate(tally.samples);
        rough |= e.is_rough();
        writeln!(
            out,
            "{:>12} {:>7} {:>8} {:>9} {:>10}  {}",
            format::bytes(e.bytes),
            format::uncertainty(&e),
            format::percent(e.bytes, total.bytes),
            tally.samples,
            format::whole(tally.objects),
            site.label(analysis)
        )?;
        if options.ranking.grouping.stacks {
            let callers = site.frames.iter().skip(1);
            for &frame in callers.clone().take(options.frames.saturating_sub(1)) {
                writeln!(out, "{:54}{}", "", analysis.frames[frame].label())?;
            }
            let hidden = callers.len().saturating_sub(options.frames.saturating_sub(1));
            if hidden > 0 {
                writeln!(out, "{:54}... {hidden} more frames", "")?;
            }
        }
    }
    if rough {
        writeln!(out, "{}", format::ROUGH_NOTE)?;
    }
    Ok(())
}
