//! Flags shared by several subcommands: which sites to rank (code sites, spans or threads),
//! by what figure, whether allocator frames are trimmed, and whether names are shortened.

use clap::ValueEnum;
use memtrace_rs::analysis::{self, FrameKind, Measure};

/// Which sites to list and by what figure (flags shared by `hotspots` and `diff`).
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct Ranking {
    /// Number of sites to show.
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    /// The figure to rank (or compare) by: allocated, live-end, live-peak or temporary; with
    /// `span` or `thread` (alone or comma-separated with a figure: `span,live-end`), the
    /// spans or threads of memtrace-rs traces are ranked instead of code sites.
    #[arg(long, value_name = "FIGURE|span|thread", value_parser = parse_by, default_value = "allocated")]
    pub by: By,
    /// How stacks are grouped into sites.
    #[command(flatten)]
    pub grouping: Grouping,
    /// With --stacks, the most frames shown per stack.
    #[arg(long, default_value_t = 16)]
    pub frames: usize,
}

impl Ranking {
    /// The analysis's grouping.
    pub fn sites(self) -> analysis::Grouping {
        analysis::Grouping { kind: self.by.kind, ..self.grouping.sites() }
    }

    /// What the ranked things are called.
    pub fn what(self) -> &'static str {
        match (self.by.kind, self.grouping.stacks) {
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
    pub fn sites(self) -> analysis::Grouping {
        analysis::Grouping { stacks: self.stacks, trim: self.trim.frames(), ..Default::default() }
    }
}

/// Which frames are trimmed from the ends of stacks (the flags of every subcommand that
/// groups or draws stacks).
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct Trim {
    /// Keep allocator frames (alloc::, RawVec, __rust_alloc, ...) instead of trimming them
    /// from the inner end of each stack: a site (a flame graph's leaf) is then the innermost
    /// frame whatever it is.
    #[arg(long)]
    pub keep_allocator_frames: bool,
    /// Keep the frames that start the program and its threads (_start, main,
    /// std::rt::lang_start, thread-spawn closures, ...) instead of trimming them from the
    /// outer end of each stack.
    #[arg(long)]
    pub keep_root_frames: bool,
}

impl Trim {
    /// The analysis's trimming.
    pub fn frames(self) -> analysis::Trim {
        analysis::Trim { keep_allocator_frames: self.keep_allocator_frames, keep_root_frames: self.keep_root_frames }
    }
}

/// How function names are shown: the flag of the subcommands that show them (`hotspots`,
/// `flamegraph`, `pprof`, `diff`, `report`), and of no other.
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct Names {
    /// Show Rust function names in full, with their generic arguments, however long
    /// (by default generic arguments are elided and names cut at 240 bytes).
    #[arg(long)]
    pub full_names: bool,
}

/// What `--by` ranks: which figure, of code sites, spans or threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct By {
    /// The figure (bytes allocated unless one is given).
    pub figure: Figure,
    /// What is ranked (code sites unless `span` or `thread` is given).
    pub kind: FrameKind,
}

impl By {
    /// The corresponding measure.
    pub fn measure(self) -> Measure {
        self.figure.measure()
    }

    /// How the figure is described in headings.
    pub fn describe(self) -> &'static str {
        self.figure.describe()
    }
}

/// `--by`: a figure, `span` or `thread`, or a comma-separated pair of a figure and one of them.
fn parse_by(s: &str) -> Result<By, String> {
    let mut by = By::default();
    let (mut figures, mut kinds) = (0, 0);
    for part in s.split(',') {
        match part.trim() {
            "span" => (by.kind, kinds) = (FrameKind::Span, kinds + 1),
            "thread" => (by.kind, kinds) = (FrameKind::Thread, kinds + 1),
            figure => {
                by.figure = Figure::from_str(figure, false).map_err(|_| {
                    let names: Vec<String> = Figure::value_variants()
                        .iter()
                        .filter_map(|f| f.to_possible_value())
                        .map(|v| v.get_name().to_owned())
                        .collect();
                    format!("`{figure}` is none of {}, span, thread", names.join(", "))
                })?;
                figures += 1;
            }
        }
    }
    if figures > 1 || kinds > 1 {
        return Err("give at most one figure and one of span or thread".to_owned());
    }
    Ok(by)
}

/// The figure sites are ranked by (`--by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Figure {
    /// Bytes allocated over the whole trace.
    #[default]
    Allocated,
    /// Bytes still live at the end of the trace.
    LiveEnd,
    /// Bytes live when the total live estimate peaks.
    LivePeak,
    /// Bytes freed within a millisecond of their allocation: short-lived, temporary
    /// allocations (by the lifetimes the trace records).
    Temporary,
}

impl Figure {
    /// The corresponding measure.
    pub fn measure(self) -> Measure {
        match self {
            Figure::Allocated => Measure::Allocated,
            Figure::LiveEnd => Measure::LiveEnd,
            Figure::LivePeak => Measure::LivePeak,
            Figure::Temporary => Measure::Temporary,
        }
    }

    /// How the figure is described in headings.
    pub fn describe(self) -> &'static str {
        match self {
            Figure::Allocated => "bytes allocated",
            Figure::LiveEnd => "bytes live at the end",
            Figure::LivePeak => "bytes live at the peak",
            Figure::Temporary => "bytes freed within 1 ms",
        }
    }
}
