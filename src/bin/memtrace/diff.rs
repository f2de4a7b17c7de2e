//! `memtrace diff`: the sites whose estimated bytes changed between two traces, those
//! beyond the sampling noise first, and an optional regression gate for CI.
//!
//! Sites are matched frame by frame by what each frame is ([`frame_identity`]: its file, line and
//! function, however the build's debug info spelt it; a thread named after its id as any such
//! thread, shown as `thread thread-*`), so the two traces may come from different builds or
//! runs of the program. The sample counts of both sides are Poisson, so the change of
//! `n_new × b_new − n_base × b_base` bytes (`b` the bytes per sample of each trace) has a
//! standard deviation of about `√(n_new × b_new² + n_base × b_base²)`.
//!
//! A diff judges every site at once, so each row's margin allows for how many rows there
//! are: Holm's step-down procedure keeps the chance that two runs of one program flag any
//! row at all within 5 % ([`FAMILY_ERROR`]). Holm rather than Benjamini–Hochberg because the
//! question a diff of two runs answers is "did anything change?": Holm bounds the chance of
//! one false row whatever the other rows do (Benjamini–Hochberg bounds the expected share of
//! false rows among those flagged, which lets a real change elsewhere carry false ones), and
//! it never flags less than Bonferroni's bound would. The total is one figure, judged on its
//! own 95 % margin (`--fail-above`).
//!
//! The sites of both traces are matched in one trie of labels ([`Names`]), so a whole
//! stack (`--stacks`) costs a node per distinct frame, however deep it is.

use std::collections::HashMap;
use std::io::{self, Write};
use std::sync::Arc;

use memtrace_rs::analysis::stacks::{FrameTrie, NodeId, ROOT};
use memtrace_rs::analysis::{frame_identity, matched_frame, ranked, Analysis, Site, Z};

use super::args::Ranking;
use super::format;

/// Options of `memtrace diff`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Which sites, by what figure.
    #[command(flatten)]
    pub ranking: Ranking,
    /// Compare bytes per second of each trace's duration instead of bytes, for traces of
    /// runs of different lengths.
    #[arg(long)]
    pub per_second: bool,
    /// Exit with status 3 when the total grows by more than LIMIT beyond the sampling noise
    /// (the lower end of the growth's 95% interval is above LIMIT): bytes (`1048576`, `512KiB`,
    /// `10MiB`, `1GiB`) or a percentage of the base total (`5%`). For CI memory-regression
    /// gates.
    #[arg(long, value_name = "LIMIT", value_parser = parse_limit)]
    pub fail_above: Option<Limit>,
    /// Text or JSON.
    #[command(flatten)]
    pub format: super::json::FormatArgs,
    /// How names are shown.
    #[command(flatten)]
    pub names: super::args::Names,
}

/// A limit on growth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limit {
    /// Bytes (or bytes per second with `--per-second`).
    Bytes(f64),
    /// Percent of the base total.
    Percent(f64),
}

/// `LIMIT` of `--fail-above`.
fn parse_limit(s: &str) -> Result<Limit, String> {
    let bad = || format!("`{s}` is not a number of bytes (1048576, 512KiB, 10MiB) or a percentage (5%)");
    let t = s.trim();
    if let Some(p) = t.strip_suffix('%') {
        return p.trim().parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0).map(Limit::Percent).ok_or_else(bad);
    }
    memtrace_rs::analysis::filter::parse_size(t).map(|bytes| Limit::Bytes(bytes as f64)).map_err(|_| bad())
}

/// A figure of one site (or of the total) in one trace.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Side {
    /// Samples.
    pub samples: u64,
    /// Estimated bytes (per second with `--per-second`).
    pub value: f64,
    /// The estimate's variance.
    pub variance: f64,
}

impl Side {
    /// The figure of `samples` samples in `analysis`, per second when `per_second`.
    fn new(analysis: &Analysis, samples: u64, per_second: bool) -> Side {
        let seconds = analysis.duration() as f64 / 1e6;
        let scale = analysis.bytes(1) / if per_second && seconds > 0.0 { seconds } else { 1.0 };
        Side { samples, value: samples as f64 * scale, variance: samples as f64 * scale * scale }
    }

    fn add(&mut self, other: Side) {
        self.samples = self.samples.saturating_add(other.samples);
        self.value += other.value;
        self.variance += other.variance;
    }
}

/// The frames of the sites of both traces, as a trie of frame ids: a frame is matched by its
/// [`frame_identity`] and shown with the label it has where it is first seen (the base).
#[derive(Debug, Default)]
pub struct Names {
    labels: Vec<String>,
    ids: HashMap<String, usize>,
    trie: FrameTrie,
}

impl Names {
    /// The id of the frame of identity `identity`, labelled `label` if it is new.
    fn id(&mut self, identity: String, label: impl FnOnce() -> String) -> usize {
        let next = self.labels.len();
        *self.ids.entry(identity).or_insert_with(|| {
            self.labels.push(label());
            next
        })
    }

    /// The id of each frame of `analysis`.
    fn of_frames(&mut self, analysis: &Analysis) -> Vec<usize> {
        analysis.frames.iter().map(|f| self.id(frame_identity(f), || matched_frame(f).label())).collect()
    }

    /// The node of `site`, of one ranking of `analysis` whose frames have the label ids
    /// `labels`: `site_nodes[n]` for node `n` of the sites' trie, filled in as needed. The
    /// empty site has its label (`(no backtrace)`) as its one frame.
    fn node(
        &mut self,
        analysis: &Analysis,
        labels: &[usize],
        site: &Site,
        site_nodes: &mut Vec<Option<NodeId>>,
    ) -> NodeId {
        if site.is_empty() {
            let label = site.label(analysis);
            let id = self.id(label.clone(), || label);
            return self.trie.child(ROOT, id);
        }
        let sites = site.trie();
        site_nodes.resize(sites.len(), None);
        site_nodes[ROOT as usize] = Some(ROOT);
        // The site's unmatched nodes, innermost first, then matched from the outermost.
        let mut chain = Vec::new();
        let mut node = site.node();
        while site_nodes[node as usize].is_none() {
            chain.push(node);
            node = sites.parent(node);
        }
        let mut matched = site_nodes[node as usize].unwrap_or(ROOT);
        for &n in chain.iter().rev() {
            matched = self.trie.child(matched, labels[sites.item(n)]);
            site_nodes[n as usize] = Some(matched);
        }
        matched
    }
}

/// The labels of a site's frames, innermost first.
#[derive(Debug, Clone, Default)]
pub struct Frames {
    node: NodeId,
    names: Arc<Names>,
}

impl Frames {
    /// The labels, innermost first.
    pub fn iter(&self) -> impl Iterator<Item = &str> + Clone + '_ {
        self.names.trie.up(self.node).map(|id| self.names.labels[id].as_str())
    }

    /// The number of frames.
    pub fn len(&self) -> usize {
        self.iter().count()
    }
}

impl PartialEq for Frames {
    fn eq(&self, other: &Frames) -> bool {
        self.iter().eq(other.iter())
    }
}

/// The chance that a diff of two runs of one program flags any of its rows.
pub const FAMILY_ERROR: f64 = 0.05;

/// One site's figure in both traces.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The site's frames' labels.
    pub frames: Frames,
    /// The figure in the base trace.
    pub base: Side,
    /// The figure in the new trace.
    pub new: Side,
    /// The margin in standard deviations: [`Z`] for a figure judged on its own (the total),
    /// a site's Holm threshold among all the sites (see [`holm`]).
    z: f64,
}

impl Change {
    /// The change of a figure judged on its own, at 95 %.
    fn alone(frames: Frames, base: Side, new: Side) -> Change {
        Change { frames, base, new, z: Z }
    }

    /// `new - base`.
    pub fn delta(&self) -> f64 {
        self.new.value - self.base.value
    }

    /// The change's standard deviation.
    fn deviation(&self) -> f64 {
        (self.base.variance + self.new.variance).sqrt()
    }

    /// The margin of the change: a change within it may be sampling noise. For a site, it
    /// allows for the other sites judged with it.
    pub fn margin(&self) -> f64 {
        self.z * self.deviation()
    }

    /// Whether the change is larger than its margin.
    pub fn beyond_noise(&self) -> bool {
        self.delta().abs() > self.margin()
    }
}

/// Give each of `changes` its margin by Holm's step-down procedure over `sites` sites (those
/// whose figure did not change are among them, and never flagged): the site with the
/// largest change for its deviation is judged at the two-sided level `FAMILY_ERROR / sites`,
/// the next at `FAMILY_ERROR / (sites - 1)`, and so on, until one is within its margin; that
/// one and all after it keep its margin, within which they all are.
fn holm(changes: &mut [Change], sites: usize) {
    let ratio = |c: &Change| c.delta().abs() / c.deviation();
    let mut order: Vec<usize> = (0..changes.len()).collect();
    order.sort_by(|&a, &b| ratio(&changes[b]).total_cmp(&ratio(&changes[a])));
    let mut stopped: Option<f64> = None;
    for (step, &i) in order.iter().enumerate() {
        let z = stopped.unwrap_or_else(|| normal_quantile_above(FAMILY_ERROR / 2.0 / (sites - step).max(1) as f64));
        changes[i].z = z;
        if stopped.is_none() && !changes[i].beyond_noise() {
            stopped = Some(z);
        }
    }
}

/// The `z` that a standard normal variable exceeds with probability `tail` (0 < `tail` <
/// 0.5), by bisection of `erfc`.
fn normal_quantile_above(tail: f64) -> f64 {
    let (mut low, mut high) = (0.0, 40.0);
    for _ in 0..100 {
        let mid = (low + high) / 2.0;
        if erfc(mid / std::f64::consts::SQRT_2) / 2.0 > tail {
            low = mid;
        } else {
            high = mid;
        }
    }
    (low + high) / 2.0
}

/// The complementary error function, within 1.2e-7 of its value relative (the Chebyshev
/// fit of Numerical Recipes' `erfcc`; std has no `erfc` on stable Rust).
fn erfc(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.5 * x.abs());
    let poly = [
        -1.265_512_23,
        1.000_023_68,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_203_98,
        1.488_515_87,
        -0.822_152_23,
        0.170_872_77,
    ];
    let sum = poly.iter().rev().fold(0.0, |acc, c| acc * t + c);
    let y = t * (-x * x + sum).exp();
    if x >= 0.0 {
        y
    } else {
        2.0 - y
    }
}

/// Every site whose figure differs: those beyond the noise first, each group by the size
/// of the change.
pub fn changes(base: &Analysis, new: &Analysis, options: &Options) -> Vec<Change> {
    let measure = options.ranking.by.measure();
    let mut names = Names::default();
    let mut by_site: HashMap<NodeId, (Side, Side)> = HashMap::new();
    for (analysis, is_new) in [(base, false), (new, true)] {
        let (mut site_nodes, labels) = (Vec::new(), names.of_frames(analysis));
        for site in ranked(analysis, options.ranking.sites(), measure) {
            let side = Side::new(analysis, site.stats.get(measure).samples, options.per_second);
            let sides = by_site.entry(names.node(analysis, &labels, &site, &mut site_nodes)).or_default();
            if is_new {
                sides.1.add(side);
            } else {
                sides.0.add(side);
            }
        }
    }
    let names = Arc::new(names);
    let sites = by_site.len();
    let mut changes: Vec<Change> = by_site
        .into_iter()
        .map(|(node, (base, new))| Change::alone(Frames { node, names: Arc::clone(&names) }, base, new))
        .filter(|c| c.delta() != 0.0)
        .collect();
    let order = names.trie.label_order(&names.labels, changes.len());
    // In the labels' order first: Holm's ranks of sites with equal changes (a stable sort)
    // then never depend on the map's order, which differs from run to run.
    changes.sort_by(|a, b| order.cmp(a.frames.node, b.frames.node));
    holm(&mut changes, sites);
    changes.sort_by(|a, b| {
        b.beyond_noise()
            .cmp(&a.beyond_noise())
            .then_with(|| b.delta().abs().total_cmp(&a.delta().abs()))
            .then_with(|| order.cmp(a.frames.node, b.frames.node))
    });
    drop(order);
    changes
}

/// The totals of both traces as one change.
pub fn total(base: &Analysis, new: &Analysis, options: &Options) -> Change {
    let measure = options.ranking.by.measure();
    let side = |a: &Analysis| Side::new(a, a.totals().get(measure).samples, options.per_second);
    Change::alone(Frames::default(), side(base), side(new))
}

/// Whether `total` grew by more than `limit` beyond the noise.
pub fn exceeds(total: &Change, limit: Limit) -> bool {
    let limit = match limit {
        Limit::Bytes(b) => b,
        Limit::Percent(p) => total.base.value * p / 100.0,
    };
    total.delta() - total.margin() > limit
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
    let unit = if options.per_second { "/s" } else { "" };
    let figure = |v: f64| format!("{}{unit}", format::bytes(v));
    let signed = |v: f64| format!("{}{unit}", format::signed_bytes(v));
    let total = total(base, new, options);
    let changes = changes(base, new, options);
    let beyond = changes.iter().filter(|c| c.beyond_noise()).count();
    writeln!(
        out,
        "Changes in {}{} (estimated) from {} to {}: total {} -> {} ({} ±{}); {} sites changed, {beyond} beyond \
         the sampling noise (margins over all the sites: two runs of one program flag any at most {}% of the time)",
        options.ranking.by.describe(),
        if options.per_second { " per second" } else { "" },
        names.0,
        names.1,
        figure(total.base.value),
        figure(total.new.value),
        signed(total.delta()),
        figure(total.margin()),
        changes.len(),
        FAMILY_ERROR * 100.0
    )?;
    writeln!(out, "{:>12} {:>12} {:>12} {:>12}  site", "base", "new", "change", "±margin")?;
    for c in changes.iter().take(options.ranking.top) {
        let depth = c.frames.len();
        let shown = options.ranking.frames.max(1).min(depth);
        let mut site = c.frames.iter().take(shown).collect::<Vec<_>>().join(" <- ");
        if shown < depth {
            site += &format!(" <- ... {} more frames", depth - shown);
        }
        let noise = if c.beyond_noise() { "" } else { "  (within noise)" };
        writeln!(
            out,
            "{:>12} {:>12} {:>12} {:>12}  {site}{noise}",
            figure(c.base.value),
            figure(c.new.value),
            signed(c.delta()),
            format!("±{}", figure(c.margin()))
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_in_bytes_and_percent() {
        assert_eq!(parse_limit("5%"), Ok(Limit::Percent(5.0)));
        assert_eq!(parse_limit("1048576"), Ok(Limit::Bytes(1048576.0)));
        assert_eq!(parse_limit("512KiB"), Ok(Limit::Bytes(512.0 * 1024.0)));
        assert_eq!(parse_limit("10 MiB"), Ok(Limit::Bytes(10.0 * 1024.0 * 1024.0)));
        assert_eq!(parse_limit("100B"), Ok(Limit::Bytes(100.0)));
        for bad in ["", "x", "-1", "5%%", "1e999", "NaN"] {
            assert!(parse_limit(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn noise_is_the_poisson_margin_of_both_sides() {
        let side = |n: u64| Side { samples: n, value: n as f64 * 10.0, variance: n as f64 * 100.0 };
        let c = Change::alone(Frames::default(), side(100), side(125));
        assert!((c.margin() - Z * 150.0).abs() < 1e-9);
        assert!(!c.beyond_noise(), "25 samples more on 100 is 1.67 standard deviations");
        let c = Change::alone(Frames::default(), side(100), side(150));
        assert!(c.beyond_noise());
        assert!(exceeds(&c, Limit::Percent(10.0)) && !exceeds(&c, Limit::Percent(30.0)));
    }

    #[test]
    fn normal_quantiles() {
        // Z, and the two-sided 5 % level over 20 and 10 000 rows (Bonferroni's first steps).
        for (tail, z) in [(0.025, Z), (0.05 / 40.0, 3.023_341_4), (0.05 / 20_000.0, 4.564_787_6)] {
            assert!((normal_quantile_above(tail) - z).abs() < 1e-5, "{tail}: {}", normal_quantile_above(tail));
        }
    }

    #[test]
    fn holm_steps_down_from_the_largest_change() {
        let side = |n: u64| Side { samples: n, value: n as f64, variance: n as f64 };
        let change = |base: u64, new: u64| Change::alone(Frames::default(), side(base), side(new));
        // Changes of 10, 2.18 and 2.01 deviations over 3 sites: the first is beyond the first
        // step's margin (two-sided 5 %/3: 2.39), the second within the second step's (5 %/2:
        // 2.24), and the third, though beyond a lone 95 % margin (1.96), is not judged.
        let mut changes = vec![change(1000, 1092), change(100, 300), change(1000, 1100)];
        holm(&mut changes, 3);
        let flagged: Vec<bool> = changes.iter().map(Change::beyond_noise).collect();
        assert_eq!(flagged, [false, true, false]);
        assert!((changes[1].z - normal_quantile_above(0.05 / 6.0)).abs() < 1e-12);
        assert!((changes[2].z - normal_quantile_above(0.05 / 4.0)).abs() < 1e-12);
        // The rows from the first within its margin on keep that margin.
        assert_eq!(changes[0].z, changes[2].z);
        assert!(changes[0].delta() > Z * changes[0].deviation());
    }
}
