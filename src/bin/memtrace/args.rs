//! Flags shared by several subcommands: which sites to rank, by what figure, and whether
//! allocator frames are trimmed.

use memtrace_rs::analysis::{Grouping as SiteGrouping, Measure};

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

/// How stacks are grouped into sites.
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
    /// The analysis's grouping.
    pub fn sites(self) -> SiteGrouping {
        SiteGrouping { stacks: self.stacks, keep_allocator_frames: self.trim.keep_allocator_frames }
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

/// The figure sites are ranked by (`--by`).
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
