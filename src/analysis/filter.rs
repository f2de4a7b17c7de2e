//! The one filter model of the command line and the report page: which sampled blocks
//! count. memtrace_viewer's clauses — allocated between two times; live at a time, at the
//! peak or at the end; collected in a range or never; size and lifetime bounds; inside or
//! not inside a call to a function; and hidden functions, which choose no block but are
//! left out of every stack ([`Filter::hide_frames`]) — and inside a `tracing` span, the
//! clause that `memtrace report --span` sets for its whole page. `hotspots` applies it with
//! [`restrict`] and [`Filter::hide_frames`]; the report
//! page's script (`src/bin/memtrace/report/report.js`, `applyFilter`) implements the same clauses line for
//! line, and the report's browser test checks that both give the same figures.
//!
//! Units: times are µs since the trace start; sizes are a block's bytes
//! (`words × word_size / 8`); every range is half-open, `[lo, hi)`. A block never freed
//! has an infinite lifetime: it passes every lower bound on lifetimes and no upper bound.

use std::fmt;
use std::io::Read;

use super::blocks::{self, Block};
use super::pass::{estimated_objects, Analysis, Frame, StackStats, Tally};
use super::stacks::{NodeId, StackTrie, ROOT};
use crate::format::trace::Reader;
use crate::Result;

/// When a block must be live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveAt {
    /// At this time.
    Time(u64),
    /// At the peak of the total live estimate (see [`super::blocks`]).
    Peak,
    /// At the end of the trace: never freed.
    End,
}

/// When a block must have been freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collected {
    /// Freed in `[lo, hi)`.
    Between(u64, u64),
    /// Never freed.
    Never,
}

/// The filter: every clause that is set must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Allocated in `[lo, hi)`.
    pub allocated_between: Option<(u64, u64)>,
    /// Live at a time.
    pub live: Option<LiveAt>,
    /// Freed in a range, or never.
    pub collected: Option<Collected>,
    /// Size in bytes at least this.
    pub size_at_least: Option<u64>,
    /// Size in bytes under this.
    pub size_under: Option<u64>,
    /// Lifetime at least this.
    pub lifetime_at_least: Option<u64>,
    /// Lifetime under this.
    pub lifetime_under: Option<u64>,
    /// Some frame's function contains each of these substrings.
    pub inside: Vec<String>,
    /// No frame's function contains any of these substrings.
    pub not_inside: Vec<String>,
    /// Frames whose function contains any of these substrings are left out of the stacks
    /// (what they allocated counts for their nearest caller not left out).
    pub hide: Vec<String>,
    /// Some frame is the span of this name or whole description ([`Frame::is_span`]).
    pub span: Option<String>,
}

impl Filter {
    /// True when no clause is set.
    pub fn is_empty(&self) -> bool {
        *self == Filter::default()
    }

    /// True when a clause that chooses blocks is set: all but `hide`.
    pub fn selects(&self) -> bool {
        *self != Filter { hide: self.hide.clone(), ..Filter::default() }
    }

    /// Leave the frames of the functions that `hide` names out of every stack of
    /// `analysis` (after [`restrict`], whose function clauses see every frame, as the
    /// page's do). The page's rule: a stack's site is then its innermost frame that is
    /// neither hidden nor allocator machinery.
    pub fn hide_frames(&self, analysis: &mut Analysis) {
        if self.hide.is_empty() {
            return;
        }
        let hidden: Vec<bool> =
            analysis.frames.iter().map(|f| self.hide.iter().any(|h| f.function.contains(h.as_str()))).collect();
        for frames in analysis.code_frames.values_mut() {
            frames.retain(|&f| !hidden[f]);
        }
    }

    /// Whether `block` passes the clauses on times and sizes, in a trace whose peak is at
    /// `peak_us` and whose words have `word_bytes` bytes.
    pub fn matches_block(&self, block: &Block, peak_us: u64, word_bytes: u64) -> bool {
        let in_range = |x: u64, (lo, hi): (u64, u64)| lo <= x && x < hi;
        if self.allocated_between.is_some_and(|r| !in_range(block.alloc_us, r)) {
            return false;
        }
        let live = match self.live {
            None => true,
            Some(LiveAt::Time(t)) => block.live_at(t),
            Some(LiveAt::Peak) => block.live_at(peak_us),
            Some(LiveAt::End) => block.free_us.is_none(),
        };
        let collected = match (self.collected, block.free_us) {
            (None, _) => true,
            (Some(Collected::Never), free) => free.is_none(),
            (Some(Collected::Between(..)), None) => false,
            (Some(Collected::Between(lo, hi)), Some(f)) => in_range(f, (lo, hi)),
        };
        let bytes = block.words.saturating_mul(word_bytes);
        let size = self.size_at_least.is_none_or(|lo| bytes >= lo) && self.size_under.is_none_or(|hi| bytes < hi);
        let life = block.lifetime();
        let lifetime = self.lifetime_at_least.is_none_or(|lo| life.is_none_or(|l| l >= lo))
            && self.lifetime_under.is_none_or(|hi| life.is_some_and(|l| l < hi));
        live && collected && size && lifetime
    }

    /// Per node of `trie`: whether its stack passes the clauses on frames: some frame's
    /// function contains each `inside` substring (case-sensitive), none contains a
    /// `not_inside` one, and some frame is the `span`. `frames(code)` gives the frames of a
    /// location code. Each clause costs one pass over the nodes, a parent before its
    /// children (whatever the depth of the stacks): the page's `stackMask` rule, which tests
    /// each frame once where this tests a node's own frames (and the report's rule for
    /// `--span`, which keeps only the blocks of such stacks).
    pub fn passing_stacks<'a, I: Iterator<Item = &'a Frame>>(
        &self,
        trie: &StackTrie,
        frames: impl Fn(u64) -> I,
    ) -> Vec<bool> {
        let mut passes = vec![true; trie.len()];
        // Per node: whether a frame of its stack is one the clause looks for.
        let mut within = vec![false; trie.len()];
        let inside = self.inside.iter().map(|s| (Sought::Function(s), true));
        let not_inside = self.not_inside.iter().map(|s| (Sought::Function(s), false));
        let span = self.span.iter().map(|s| (Sought::Span(s), true));
        for (sought, wanted) in inside.chain(not_inside).chain(span) {
            for node in 0..trie.len() {
                let id = node as NodeId;
                within[node] =
                    id != ROOT && (within[trie.parent(id) as usize] || frames(trie.item(id)).any(|f| sought.is(f)));
                passes[node] &= within[node] == wanted;
            }
        }
        passes
    }
}

/// The frame a clause of [`Filter::passing_stacks`] looks for.
enum Sought<'s> {
    /// A function whose name contains this.
    Function(&'s str),
    /// The span of this name or description.
    Span(&'s str),
}

impl Sought<'_> {
    fn is(&self, frame: &Frame) -> bool {
        match self {
            Sought::Function(substring) => frame.function.contains(substring),
            Sought::Span(span) => frame.is_span(span),
        }
    }
}

/// The filter as `hotspots` flags (times in the units [`parse_time`] reads).
impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut flags = Vec::new();
        if let Some((lo, hi)) = self.allocated_between {
            flags.push(format!("--allocated-between {}:{}", time(lo), time(hi)));
        }
        match self.live {
            Some(LiveAt::Time(t)) => flags.push(format!("--live-at {}", time(t))),
            Some(LiveAt::Peak) => flags.push("--live-at peak".into()),
            Some(LiveAt::End) => flags.push("--live-at end".into()),
            None => {}
        }
        match self.collected {
            Some(Collected::Between(lo, hi)) => flags.push(format!("--collected-between {}:{}", time(lo), time(hi))),
            Some(Collected::Never) => flags.push("--never-collected".into()),
            None => {}
        }
        let bounds = [
            ("--size-at-least", self.size_at_least.map(|b| format!("{b}B"))),
            ("--size-under", self.size_under.map(|b| format!("{b}B"))),
            ("--lifetime-at-least", self.lifetime_at_least.map(time)),
            ("--lifetime-under", self.lifetime_under.map(time)),
        ];
        flags.extend(bounds.into_iter().filter_map(|(flag, v)| v.map(|v| format!("{flag} {v}"))));
        flags.extend(self.span.iter().map(|s| format!("--span {}", quoted(s))));
        flags.extend(self.inside.iter().map(|s| format!("--inside {}", quoted(s))));
        flags.extend(self.not_inside.iter().map(|s| format!("--not-inside {}", quoted(s))));
        flags.extend(self.hide.iter().map(|s| format!("--hide {}", quoted(s))));
        f.write_str(&flags.join(" "))
    }
}

/// `s` as one word of a POSIX shell: in single quotes, a `'` in it as `'\''`. (The report
/// page's `quoted` is the same rule.)
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `us` with the largest unit that keeps it whole (`1500us`, `150ms`, `2s`).
fn time(us: u64) -> String {
    if us != 0 && us.is_multiple_of(1_000_000) {
        format!("{}s", us / 1_000_000)
    } else if us != 0 && us.is_multiple_of(1000) {
        format!("{}ms", us / 1000)
    } else {
        format!("{us}us")
    }
}

/// `analysis` (of the trace `reader` reads) with each stack's figures replaced by those of
/// its blocks that pass `filter`: `allocs` and `allocated` count the matching blocks, and
/// the live figures are zero. The peak is the analysis's, which is the blocks' own
/// (both use [`blocks::PeakFinder`]). `progress` is called as [`blocks::stream`] says.
pub fn restrict<R: Read>(
    analysis: &Analysis,
    mut reader: Reader<R>,
    filter: &Filter,
    progress: impl FnMut(u64),
) -> Result<Analysis> {
    // The stream's trie nodes are the analysis's: both intern the same allocations.
    let mut stack_of_node = vec![usize::MAX; analysis.trie.len()];
    for (i, s) in analysis.stacks.iter().enumerate() {
        stack_of_node[s.node as usize] = i;
    }
    let passes =
        filter.passing_stacks(&analysis.trie, |code| analysis.frames_of(code).iter().map(|&f| &analysis.frames[f]));
    let peak_us = analysis.peak.time.saturating_sub(analysis.info.start_time);
    let word_bytes = u64::from(analysis.info.word_size) / 8;
    let rate = analysis.info.sample_rate;
    let mut stats = vec![StackStats::default(); analysis.stacks.len()];
    blocks::stream(
        &mut reader,
        |block| {
            let node = block.stack as usize;
            // A block live at the start was not allocated in the trace.
            if passes[node] && !block.carried && filter.matches_block(block, peak_us, word_bytes) {
                let objects = estimated_objects(block.nsamples, block.words, rate);
                let allocated = Tally { samples: block.nsamples, objects };
                stats[stack_of_node[node]].add(&StackStats { allocs: 1, allocated, ..StackStats::default() });
            }
        },
        progress,
    )?;
    let mut restricted = analysis.clone();
    for (stack, stats) in restricted.stacks.iter_mut().zip(stats) {
        stack.stats = stats;
    }
    Ok(restricted)
}

/// Parse a time: a number with a unit (`250us`, `1.5ms`, `2s`, `1min`), or a plain number of
/// seconds (as `flamegraph --live-at` takes).
pub fn parse_time(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let units = [("us", 1.0), ("µs", 1.0), ("ms", 1e3), ("min", 6e7), ("s", 1e6)];
    let (number, scale) =
        units.iter().find_map(|&(unit, scale)| t.strip_suffix(unit).map(|n| (n, scale))).unwrap_or((t, 1e6));
    match number.trim().parse::<f64>() {
        Ok(v) if v >= 0.0 && v.is_finite() => Ok((v * scale).round() as u64),
        _ => Err(format!("not a time: {s:?} (say 250us, 1.5ms, 2s or 1min)")),
    }
}

/// Parse `LO:HI`, two times.
pub fn parse_range(s: &str) -> std::result::Result<(u64, u64), String> {
    let (lo, hi) = s.split_once(':').ok_or_else(|| format!("not a range: {s:?} (say 150ms:450ms)"))?;
    let (lo, hi) = (parse_time(lo)?, parse_time(hi)?);
    if lo > hi {
        return Err(format!("not a range: {s:?} ends before it starts (say LO:HI, LO no later than HI)"));
    }
    Ok((lo, hi))
}

/// Parse a size: bytes, or a number with a unit (`B`, `KiB`/`K`, `MiB`/`M`, `GiB`/`G`).
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let units = [
        ("KiB", 1u64 << 10),
        ("MiB", 1 << 20),
        ("GiB", 1 << 30),
        ("TiB", 1 << 40),
        ("K", 1 << 10),
        ("M", 1 << 20),
        ("G", 1 << 30),
        ("T", 1 << 40),
    ];
    let (number, scale) = units
        .iter()
        .find_map(|&(unit, scale)| t.strip_suffix(unit).map(|n| (n, scale)))
        .unwrap_or((t.strip_suffix('B').unwrap_or(t), 1));
    match number.trim().parse::<f64>() {
        Ok(v) if v >= 0.0 && v.is_finite() => Ok((v * scale as f64).round() as u64),
        _ => Err(format!("not a size: {s:?} (say 4096, 4KiB or 1.5MiB)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(alloc_us: u64, free_us: Option<u64>, words: u64) -> Block {
        Block { alloc_us, free_us, words, nsamples: 1, stack: 0, carried: false }
    }

    #[test]
    fn clauses_are_half_open() {
        let peak = |f: &Filter, b: &Block| f.matches_block(b, 100, 8);
        let live = Filter { live: Some(LiveAt::Peak), ..Filter::default() };
        assert!(peak(&live, &block(100, None, 1)));
        assert!(!peak(&live, &block(50, Some(100), 1)));
        assert!(peak(&live, &block(50, Some(101), 1)));
        let between = Filter { allocated_between: Some((10, 20)), ..Filter::default() };
        assert!(peak(&between, &block(10, None, 1)) && !peak(&between, &block(20, None, 1)));
        let under = Filter { lifetime_under: Some(10), ..Filter::default() };
        assert!(peak(&under, &block(0, Some(9), 1)));
        assert!(!peak(&under, &block(0, Some(10), 1)));
        assert!(!peak(&under, &block(0, None, 1)), "never freed: an infinite lifetime");
        let at_least = Filter { lifetime_at_least: Some(10), ..Filter::default() };
        assert!(peak(&at_least, &block(0, None, 1)) && !peak(&at_least, &block(0, Some(9), 1)));
        let size = Filter { size_at_least: Some(16), size_under: Some(24), ..Filter::default() };
        assert!(peak(&size, &block(0, None, 2)) && !peak(&size, &block(0, None, 3)));
        let never = Filter { collected: Some(Collected::Never), ..Filter::default() };
        assert!(peak(&never, &block(0, None, 1)) && !peak(&never, &block(0, Some(5), 1)));
        let freed = Filter { collected: Some(Collected::Between(5, 6)), ..Filter::default() };
        assert!(peak(&freed, &block(0, Some(5), 1)) && !peak(&freed, &block(0, Some(6), 1)));
    }

    #[test]
    fn function_clauses_match_substrings_anywhere_on_the_stack() {
        // Codes 1 `main`, 2 `app::run` (inlined into `app::start`), 3 `app::cache::insert`,
        // 4 `main` again, called from `app::run`.
        let frame = |function: &str| Frame { function: function.into(), file: "src/app.rs".into(), line: 1 };
        let (main, start, run, insert) =
            (frame("main"), frame("app::start"), frame("app::run"), frame("app::cache::insert"));
        let span = Frame { function: "request{id=7}".into(), file: "<span>src/app.rs".into(), line: 3 };
        let functions = |code: u64| match code {
            1 | 4 => vec![&main],
            2 => vec![&start, &run],
            5 => vec![&span],
            _ => vec![&insert],
        };
        let mut trie = StackTrie::default();
        let main = trie.child(ROOT, 1);
        let run = trie.child(main, 2);
        let cache = trie.child(run, 3);
        let main_again = trie.child(run, 4);
        let only_run = trie.child(ROOT, 2);
        let passing = |f: &Filter| {
            let passes = f.passing_stacks(&trie, |code| functions(code).into_iter());
            [ROOT, main, run, cache, main_again, only_run].map(|n| passes[n as usize])
        };
        let f = Filter { inside: vec!["run".into()], not_inside: vec!["cache".into()], ..Filter::default() };
        assert_eq!(passing(&f), [false, false, true, false, true, true]);
        let both = Filter { inside: vec!["main".into(), "start".into()], ..Filter::default() };
        assert_eq!(passing(&both), [false, false, true, true, true, false]);
        let not = Filter { not_inside: vec!["main".into()], ..Filter::default() };
        assert_eq!(passing(&not), [true, false, false, false, false, true]);
        assert_eq!(passing(&Filter::default()), [true; 6]);
        // Inside a span: by its name or its whole description, never by a part of either.
        let in_span = trie.child(ROOT, 5);
        let run_in_span = trie.child(in_span, 2);
        for (span, want) in [("request", true), ("request{id=7}", true), ("req", false), ("run", false)] {
            let f = Filter { span: Some(span.into()), ..Filter::default() };
            let passes = f.passing_stacks(&trie, |code| functions(code).into_iter());
            let nodes = [ROOT, main, run, cache, main_again, only_run].map(|n| passes[n as usize]);
            assert_eq!(
                (nodes, passes[in_span as usize], passes[run_in_span as usize]),
                ([false; 6], want, want),
                "{span}"
            );
        }
    }

    #[test]
    fn parsing_and_printing_agree() {
        assert_eq!(parse_time("1.5ms"), Ok(1500));
        assert_eq!(parse_time("250us"), Ok(250));
        assert_eq!(parse_time("2"), Ok(2_000_000));
        assert_eq!(parse_time("1min"), Ok(60_000_000));
        assert!(parse_time("soon").is_err() && parse_time("-1s").is_err());
        assert_eq!(parse_range("150ms:450ms"), Ok((150_000, 450_000)));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("1.5M"), Ok(1_572_864));
        assert_eq!(parse_size("100B"), Ok(100));
        assert_eq!(parse_size("100"), Ok(100));
        let f = Filter {
            allocated_between: Some((150_000, 450_000)),
            live: Some(LiveAt::Peak),
            lifetime_under: Some(500_000),
            size_at_least: Some(4096),
            ..Filter::default()
        };
        assert_eq!(
            f.to_string(),
            "--allocated-between 150ms:450ms --live-at peak --size-at-least 4096B --lifetime-under 500ms"
        );
        let hide = Filter { hide: vec!["build_index".into()], ..Filter::default() };
        assert_eq!(hide.to_string(), "--hide 'build_index'");
        let quoting = Filter { span: Some("q{s='a'}".into()), ..Filter::default() };
        assert_eq!(quoting.to_string(), r"--span 'q{s='\''a'\''}'");
        assert!(!hide.is_empty() && !hide.selects() && f.selects());
    }
}
