//! `memtrace diff`: the sites whose estimated bytes changed most between two traces.
//!
//! Sites are matched by their labels (function, file and line), so the two traces may come
//! from different builds or runs of the program.

use std::collections::HashMap;
use std::io::{self, Write};

use memtrace_rs::analysis::{ranked, Analysis};

use super::args::Ranking;
use super::format;

/// Options of `memtrace diff`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Which sites, by what figure.
    #[command(flatten)]
    pub ranking: Ranking,
}

/// One site's figure in both traces.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The site (its frames' labels, innermost first).
    pub site: String,
    /// Estimated bytes in the base trace.
    pub base: f64,
    /// Estimated bytes in the new trace.
    pub new: f64,
}

impl Change {
    /// `new - base`.
    pub fn delta(&self) -> f64 {
        self.new - self.base
    }
}

/// Every site whose figure differs, largest change (in absolute value) first.
pub fn changes(base: &Analysis, new: &Analysis, options: &Options) -> Vec<Change> {
    let measure = options.ranking.measure();
    let mut by_site: HashMap<String, Change> = HashMap::new();
    for (analysis, is_new) in [(base, false), (new, true)] {
        for site in ranked(analysis, options.ranking.sites(), measure) {
            let key = site.key(analysis);
            let bytes = analysis.bytes(site.stats.get(measure).samples);
            let change = by_site.entry(key).or_insert_with_key(|k| Change { site: k.clone(), base: 0.0, new: 0.0 });
            if is_new {
                change.new += bytes;
            } else {
                change.base += bytes;
            }
        }
    }
    let mut changes: Vec<Change> = by_site.into_values().filter(|c| c.delta() != 0.0).collect();
    changes.sort_by(|a, b| b.delta().abs().total_cmp(&a.delta().abs()).then_with(|| a.site.cmp(&b.site)));
    changes
}

/// Print the `options.ranking.top` largest changes from `base` to `new` (traces named by the
/// `names` pair).
pub fn write(
    base: &Analysis,
    new: &Analysis,
    names: (&str, &str),
    options: &Options,
    out: &mut impl Write,
) -> io::Result<()> {
    let measure = options.ranking.measure();
    let total_base = base.bytes(base.totals().get(measure).samples);
    let total_new = new.bytes(new.totals().get(measure).samples);
    let changes = changes(base, new, options);
    writeln!(
        out,
        "Changes in {} (estimated) from {} to {}: total {} -> {} ({}, {} sites changed)",
        options.ranking.describe(),
        names.0,
        names.1,
        format::bytes(total_base),
        format::bytes(total_new),
        format::signed_bytes(total_new - total_base),
        changes.len()
    )?;
    writeln!(out, "{:>12} {:>12} {:>12}  site", "base", "new", "change")?;
    for c in changes.iter().take(options.ranking.top) {
        writeln!(
            out,
            "{:>12} {:>12} {:>12}  {}",
            format::bytes(c.base),
            format::bytes(c.new),
            format::signed_bytes(c.delta()),
            c.site
        )?;
    }
    Ok(())
}
