//! Allocation sites: grouping the stacks of an [`Analysis`] by the frame that allocated.
//!
//! A site is the innermost frame outside the allocator machinery: the standard library's
//! `alloc` crate; `core` (which cannot allocate by itself, so its frames — formatting,
//! iterators, `Option` combinators — only pass requests on); std's allocator and
//! collections; hashbrown; this crate's own allocator; and the unwinder. Frames are trimmed
//! from the inner end only, so a program's closure called from `core` is still a site. With
//! [`Grouping::stacks`] a site is the whole stack with those frames trimmed. OCaml traces
//! never match these patterns, so their site is simply the innermost frame. Used by
//! `hotspots`, `diff`, `flamegraph` and `report`.

use std::collections::HashMap;

use super::analysis::{Analysis, FrameId, Measure, StackStats};

/// Prefixes (after any leading `<`) of function names that belong to allocation machinery.
const ALLOCATOR_PREFIXES: &[&str] = &[
    "alloc::",
    "std::alloc",
    "std::collections::",
    "core::",
    "hashbrown::",
    "memtrace_rs::",
    "backtrace::",
    "_Unwind_",
    "__rust_alloc",
    "__rust_realloc",
    "__rust_alloc_zeroed",
    "__rdl_",
    "__rg_",
];

/// Substrings that mark machinery wherever they appear (trait impls for foreign types,
/// raw vectors of any path).
const ALLOCATOR_INFIXES: &[&str] = &[" as alloc::", " as core::alloc::", " as std::alloc::", "RawVec", "RawTable"];

/// C allocator entry points, matched exactly.
const ALLOCATOR_FUNCTIONS: &[&str] = &["malloc", "calloc", "realloc", "aligned_alloc", "posix_memalign"];

/// Parts of source paths of machinery (see the module documentation). Paths matter because
/// the names of inlined frames carry no module path (`allocate`, `with_capacity_in<u8>`, …).
const ALLOCATOR_FILES: &[&str] = &[
    "/library/alloc/src/",
    "/library/core/src/",
    "/library/std/src/alloc.rs",
    "/library/std/src/sys/alloc/",
    "/library/std/src/collections/",
    "/hashbrown-",
];

/// True when a frame of `function` in source `file` is part of the allocation machinery
/// rather than the program.
pub fn is_allocator_frame(function: &str, file: &str) -> bool {
    let path = function.strip_prefix('<').unwrap_or(function);
    ALLOCATOR_PREFIXES.iter().any(|p| path.starts_with(p))
        || ALLOCATOR_INFIXES.iter().any(|p| function.contains(p))
        || ALLOCATOR_FUNCTIONS.contains(&function)
        || ALLOCATOR_FILES.iter().any(|p| file.contains(p))
}

/// Which sites to list and by what figure (flags shared by `hotspots` and `diff`).
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct Ranking {
    /// Number of sites to show.
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    /// The figure to rank (or compare) by.
    #[arg(long, value_enum, default_value_t = By::Allocated)]
    pub by: By,
    /// How stacks are grouped into sites.
    #[command(flatten)]
    pub grouping: Grouping,
}

/// How stacks are grouped into sites (command-line flags shared by several subcommands).
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct Grouping {
    /// Rank whole stacks instead of single allocation sites.
    #[arg(long)]
    pub stacks: bool,
    /// Whether allocator frames are trimmed.
    #[command(flatten)]
    pub trim: Trim,
}

impl Grouping {
    /// Whole stacks when `stacks`, allocator frames kept when `keep_allocator_frames`.
    pub fn new(stacks: bool, keep_allocator_frames: bool) -> Grouping {
        Grouping { stacks, trim: Trim { keep_allocator_frames } }
    }
}

/// Whether allocator frames are trimmed from the inner end of stacks (the flag shared by
/// [`Grouping`] and `flamegraph`).
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct Trim {
    /// Keep allocator frames (alloc::, RawVec, __rust_alloc, ...) instead of trimming them
    /// from the inner end of each stack: a site (a flame graph's leaf) is then the innermost
    /// frame whatever it is.
    #[arg(long)]
    pub keep_allocator_frames: bool,
}

/// A group of stacks sharing a site.
#[derive(Debug, Clone)]
pub struct Site {
    /// The site's frames, innermost first: one frame, or a whole trimmed stack; empty for
    /// allocations without a backtrace.
    pub frames: Vec<FrameId>,
    /// The summed figures of the site's stacks.
    pub stats: StackStats,
}

impl Site {
    /// The site's name: its innermost frame's label (`(no backtrace)` when it has none).
    pub fn label(&self, analysis: &Analysis) -> String {
        self.frames.first().map_or_else(|| "(no backtrace)".to_string(), |&f| analysis.frames[f].label())
    }

    /// A key that identifies the site across traces: the labels of all its frames.
    pub fn key(&self, analysis: &Analysis) -> String {
        if self.frames.is_empty() {
            return self.label(analysis);
        }
        let labels: Vec<String> = self.frames.iter().map(|&f| analysis.frames[f].label()).collect();
        labels.join(" <- ")
    }
}

/// Group the stacks of `analysis` into sites, ranked by `measure` (largest first; ties by
/// label). Sites whose figure for `measure` is zero are left out.
pub fn ranked(analysis: &Analysis, grouping: Grouping, measure: Measure) -> Vec<Site> {
    let mut by_frames: HashMap<Vec<FrameId>, StackStats> = HashMap::new();
    for stack in &analysis.stacks {
        let mut frames: Vec<FrameId> = analysis.stack_frames(stack).rev().collect();
        if !grouping.trim.keep_allocator_frames {
            // Trim machinery from the inner end, unless the whole stack is machinery.
            if let Some(first) =
                frames.iter().position(|&f| !is_allocator_frame(&analysis.frames[f].function, &analysis.frames[f].file))
            {
                frames.drain(..first);
            }
        }
        if !grouping.stacks {
            frames.truncate(1);
        }
        by_frames.entry(frames).or_default().add(&stack.stats);
    }
    let labels: Vec<String> = analysis.frames.iter().map(|f| f.label()).collect();
    let mut sites: Vec<Site> = by_frames
        .into_iter()
        .map(|(frames, stats)| Site { frames, stats })
        .filter(|s| s.stats.get(measure).samples > 0)
        .collect();
    sites.sort_by(|a, b| {
        let names = |s: &Site| s.frames.iter().map(|&f| labels[f].as_str()).collect::<Vec<_>>();
        b.stats.get(measure).samples.cmp(&a.stats.get(measure).samples).then_with(|| names(a).cmp(&names(b)))
    });
    sites
}

/// The figure sites are ranked by, as chosen on the command line (`--by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum By {
    /// Bytes allocated over the whole trace.
    #[default]
    Allocated,
    /// Bytes still live at the end of the trace.
    LiveEnd,
    /// Bytes live when the total live estimate peaks.
    LivePeak,
}

impl By {
    /// The corresponding measure.
    pub fn measure(self) -> Measure {
        match self {
            By::Allocated => Measure::Allocated,
            By::LiveEnd => Measure::LiveEnd,
            By::LivePeak => Measure::LivePeak,
        }
    }

    /// How the figure is described in headings.
    pub fn describe(self) -> &'static str {
        match self {
            By::Allocated => "bytes allocated",
            By::LiveEnd => "bytes live at the end",
            By::LivePeak => "bytes live at the peak",
        }
    }
}
