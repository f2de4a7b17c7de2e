//! `memtrace hotspots`: allocation sites (or whole stacks) ranked by estimated bytes.

use std::io::{self, Write};

use memtrace_rs::analysis::filter::{self, Collected, Filter, LiveAt};
use memtrace_rs::analysis::{inert, ranked, Analysis, FrameKind, Site};

use super::args::{Names, Ranking};
use super::format;

/// Options of `memtrace hotspots`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Which sites, by what figure.
    #[command(flatten)]
    pub ranking: Ranking,
    /// Text or JSON.
    #[command(flatten)]
    pub format: super::json::FormatArgs,
    /// Which allocations count (the report page's filter).
    #[command(flatten)]
    pub filter: FilterArgs,
    /// How names are shown.
    #[command(flatten)]
    pub names: Names,
}

/// The filter flags: the clauses of the report page's filter bar
/// ([`memtrace_rs::analysis::filter`]). Times are like `250us`, `1.5ms`, `2s` (a plain
/// number is seconds); sizes like `4096`, `4KiB`. Ranges are half-open, `LO:HI`. With any
/// of them, sites are ranked by the bytes of the allocations that pass every clause.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct FilterArgs {
    /// Only allocations made in LO:HI.
    #[arg(long, value_name = "LO:HI", value_parser = filter::parse_range)]
    pub allocated_between: Option<(u64, u64)>,
    /// Only allocations live at `peak` (of the total live estimate), at the `end`, or at a time.
    #[arg(long, value_name = "peak|end|TIME", value_parser = parse_live_at)]
    pub live_at: Option<LiveAt>,
    /// Only allocations freed in LO:HI.
    #[arg(long, value_name = "LO:HI", value_parser = filter::parse_range, conflicts_with = "never_collected")]
    pub collected_between: Option<(u64, u64)>,
    /// Only allocations never freed.
    #[arg(long)]
    pub never_collected: bool,
    /// Only allocations that lived at least this long (never freed counts as forever).
    #[arg(long, value_name = "TIME", value_parser = filter::parse_time)]
    pub lifetime_at_least: Option<u64>,
    /// Only allocations freed within this time of their allocation.
    #[arg(long, value_name = "TIME", value_parser = filter::parse_time)]
    pub lifetime_under: Option<u64>,
    /// Only allocations of at least this size.
    #[arg(long, value_name = "SIZE", value_parser = filter::parse_size)]
    pub size_at_least: Option<u64>,
    /// Only allocations smaller than this.
    #[arg(long, value_name = "SIZE", value_parser = filter::parse_size)]
    pub size_under: Option<u64>,
    /// Only allocations inside a call to a function whose name contains this (repeatable: all must hold).
    #[arg(long, value_name = "SUBSTRING")]
    pub inside: Vec<String>,
    /// Only allocations not inside a call to a function whose name contains this (repeatable).
    #[arg(long, value_name = "SUBSTRING")]
    pub not_inside: Vec<String>,
    /// Leave the frames of functions whose name contains this out of the stacks: their
    /// allocations count for the nearest caller not hidden (repeatable).
    #[arg(long, value_name = "SUBSTRING")]
    pub hide: Vec<String>,
    /// Only allocations made inside this `tracing` span of a memtrace-rs trace: a span name
    /// (`http_request`) or a whole description (`http_request{route=/api/users}`), as shown
    /// or raw; what `report --span` shows.
    #[arg(long, value_name = "NAME|DESCRIPTION")]
    pub span: Option<String>,
}

impl FilterArgs {
    /// The filter these flags set.
    pub fn filter(&self) -> Filter {
        let collected = match (self.collected_between, self.never_collected) {
            (Some((lo, hi)), _) => Some(Collected::Between(lo, hi)),
            (None, true) => Some(Collected::Never),
            (None, false) => None,
        };
        Filter {
            allocated_between: self.allocated_between,
            live: self.live_at,
            collected,
            size_at_least: self.size_at_least,
            size_under: self.size_under,
            lifetime_at_least: self.lifetime_at_least,
            lifetime_under: self.lifetime_under,
            inside: names(&self.inside),
            not_inside: names(&self.not_inside),
            hide: names(&self.hide),
            span: self.span.as_deref().map(|span| inert(span).into_owned()),
        }
    }
}

/// Names as the frames hold them, [`inert`]: a name is matched whether given as shown or
/// with the raw characters it shows escaped.
fn names(given: &[String]) -> Vec<String> {
    given.iter().map(|name| inert(name).into_owned()).collect()
}

fn parse_live_at(s: &str) -> Result<LiveAt, String> {
    match s {
        "peak" => Ok(LiveAt::Peak),
        "end" => Ok(LiveAt::End),
        t => filter::parse_time(t).map(LiveAt::Time),
    }
}

/// Print the `options.ranking.top` sites of `analysis` (the trace called `name`): for each
/// its estimated bytes with their 95 % uncertainty (marked `*` when they rest on fewer than
/// 10 samples), share, samples and estimated count of allocations (or of live blocks).
/// With a filter that [selects](Filter::selects) blocks, `analysis` must be
/// [`filter::restrict`]ed to it (and `--by` is `allocated`: the filter's `--live-at` says
/// which live figure); with `--hide`, its frames [hidden](Filter::hide_frames).
pub fn write(analysis: &Analysis, name: &str, options: &Options, out: &mut impl Write) -> io::Result<()> {
    let measure = options.ranking.by.measure();
    let filter = options.filter.filter();
    let ranked = ranked(analysis, options.ranking.sites(), measure);
    let total = analysis.estimate(analysis.totals().get(measure).samples);
    let what = options.ranking.what();
    let by = match (filter.selects(), filter.is_empty()) {
        (true, _) => format!("bytes allocated, {filter}"),
        (false, true) => options.ranking.by.describe().to_string(),
        (false, false) => format!("{}, {filter}", options.ranking.by.describe()),
    };
    write!(
        out,
        "Top {} of {} {what} of {name} by {by} (estimated): total {} in {} sample{}",
        ranked.len().min(options.ranking.top),
        ranked.len(),
        format::estimate(&total),
        total.samples,
        if total.samples == 1 { "" } else { "s" }
    )?;
    if filter.selects() {
        writeln!(out, ", {} sampled allocations", analysis.totals().allocs)?;
    } else {
        writeln!(out)?;
    }
    let column = match options.ranking.by.kind {
        FrameKind::Code => "site",
        FrameKind::Span => "span",
        FrameKind::Thread => "thread",
    };
    writeln!(out, "{:>12} {:>7} {:>8} {:>9} {:>10}  {column}", "bytes", "±95%", "%", "samples", "count")?;
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
            let callers = site.frames().skip(1);
            for frame in callers.clone().take(options.ranking.frames.saturating_sub(1)) {
                writeln!(out, "{:54}{}", "", analysis.frames[frame].label())?;
            }
            let hidden = callers.count().saturating_sub(options.ranking.frames.saturating_sub(1));
            if hidden > 0 {
                writeln!(out, "{:54}... {hidden} more frames", "")?;
            }
        }
    }
    if rough {
        writeln!(out, "{}", format::ROUGH_NOTE)?;
    }
    let kind = options.ranking.by.kind;
    if kind != FrameKind::Code && ranked.iter().all(Site::is_empty) && !ranked.is_empty() {
        let (what, how) = match kind {
            FrameKind::Span => ("spans", "memtrace-rs's tracing layer (MemtraceLayer) records them"),
            _ => ("threads", "memtrace-rs records them"),
        };
        writeln!(out, "note: the trace has no {what}: {how}; traces of other programs (OCaml's) have none")?;
    }
    Ok(())
}
