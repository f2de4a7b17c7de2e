//! Flags shared by several subcommands: which sites to rank, by what figure, and whether
//! allocator frames are trimmed.

use memtrace_rs::analysis::{FrameKind, Grouping as SiteGrouping, Measure};

/// Which sites to list and by what figure (flags shared by `hotspots` and `diff`).
#[derive(Debug, Clone, clap::Args)]
pub struct Ranking {
    /// Number of sites to show.
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    /// The figure to rank (or compare) by, and with `span` or `thread` the spans or threads
    /// of memtrace-rs traces instead of code sites; comma-separated (`span,live-end`).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "allocated")]
    pub by: Vec<By>,
    /// How stacks are grouped into sites.
    #[command(flatten)]
    pub grouping: Grouping,
}

impl Ranking {
    /// The figure ranked by (the last one given).
    pub fn measure(&self) -> Measure {
        self.by.iter().rev().find_map(|b| b.measure()).unwrap_or(Measure::Allocated)
    }

    /// How the figure is described in headings.
    pub fn describe(&self) -> &'static str {
        match self.measure() {
            Measure::LiveEnd => "bytes live at the end",
            Measure::LivePeak => "bytes live at the peak",
            _ => "bytes allocated",
        }
    }

    /// What is ranked: code sites, spans or threads (the last one given).
    pub fn kind(&self) -> FrameKind {
        let kind = |b: &By| match b {
            By::Span => Some(FrameKind::Span),
            By::Thread => Some(FrameKind::Thread),
            _ => None,
        };
        self.by.iter().rev().find_map(kind).unwrap_or_default()
    }

    /// The analysis's grouping.
    pub fn sites(&self) -> SiteGrouping {
        SiteGrouping { kind: self.kind(), ..self.grouping.sites() }
    }

    /// What the ranked things are called.
    pub fn what(&self) -> &'static str {
        match (self.kind(), self.grouping.stacks) {
            (FrameKind::Code, false) => "sites",
            (FrameKind::Code, true) => "stacks",
            (FrameKind::Span, false) => "spans",
            (FrameKind::Span, true) => "span stacks",
            (FrameKind::Thread, _) => "threads",
        }
    }
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
        SiteGrouping {
            stacks: self.stacks,
            keep_allocator_frames: self.trim.keep_allocator_frames,
            ..Default::default()
        }
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

/// The figure sites are ranked by, or what is ranked (`--by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum By {
    /// Bytes allocated over the whole trace.
    #[default]
    Allocated,
    /// Bytes still live at the end of the trace.
    LiveEnd,
    /// Bytes live when the total live estimate peaks.
    LivePeak,
    /// Rank the innermost `tracing` span of each allocation (all its spans with --stacks).
    Span,
    /// Rank the thread of each allocation.
    Thread,
}

impl By {
    /// The corresponding measure, if a figure.
    fn measure(self) -> Option<Measure> {
        match self {
            By::Allocated => Some(Measure::Allocated),
            By::LiveEnd => Some(Measure::LiveEnd),
            By::LivePeak => Some(Measure::LivePeak),
            By::Span | By::Thread => None,
        }
    }
}
