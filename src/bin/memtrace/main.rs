//! The `memtrace` command line: argument parsing, file handling and error reporting here,
//! one module per subcommand, and the modules they share ([`args`] for shared flags,
//! [`format`](mod@format) for text, [`progress`] for the progress bar), all over
//! `memtrace_rs::analysis`.

mod args;
mod copy;
mod diff;
mod flamegraph;
mod format;
mod hotspots;
mod info;
mod json;
mod output;
mod pprof;
mod profile_proto;
mod progress;
mod report;
mod sizes;
mod timeline;

use std::cell::Cell;
use std::fmt;
use std::io::{self, BufReader, BufWriter, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::rc::Rc;

use clap::{CommandFactory, Parser, Subcommand};

use memtrace_rs::analysis::{filter, series, Analysis, Frame, FrameTable, Options as AnalysisOptions, Origin};
use memtrace_rs::trace::{Reader, Warning};
use output::Output;
use progress::Progress;

/// Analyse memtrace traces (from this crate's allocator or from OCaml's memtrace).
///
/// Byte figures are estimates: each sample of an allocation stands for
/// word_size / 8 / sample_rate bytes.
#[derive(Debug, Parser)]
#[command(name = "memtrace", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the trace's metadata, event counts and estimated allocated, live and peak bytes.
    Info {
        /// The trace file.
        file: PathBuf,
        #[command(flatten)]
        format: json::FormatArgs,
    },
    /// Show a histogram of allocation sizes (powers of two) with estimated counts and bytes.
    Sizes {
        /// The trace file.
        file: PathBuf,
    },
    /// Print every event, exactly as upstream's `dump_trace` does.
    Dump {
        /// The trace file.
        file: PathBuf,
    },
    /// Re-encode a trace through this crate's writer.
    Copy {
        /// The trace to read.
        input: PathBuf,
        /// Where to write the copy; `-` for stdout.
        output: PathBuf,
    },
    /// Rank allocation sites (or whole stacks) by estimated bytes.
    Hotspots {
        /// The trace file.
        file: PathBuf,
        #[command(flatten)]
        options: hotspots::Options,
    },
    /// Draw a flame graph (SVG) of estimated bytes, or write folded stacks.
    Flamegraph {
        /// The trace file.
        file: PathBuf,
        /// Where to write the SVG (or the folded stacks); `-` for stdout.
        #[arg(short, long)]
        output: PathBuf,
        #[command(flatten)]
        options: flamegraph::Options,
    },
    /// Write a gzipped pprof heap profile (alloc_objects, alloc_space, inuse_objects, inuse_space;
    /// in use at the peak unless --inuse-at says otherwise).
    Pprof {
        /// The trace file.
        file: PathBuf,
        /// Where to write the profile (conventionally *.pb.gz); `-` for stdout.
        #[arg(short, long)]
        output: PathBuf,
        /// When the inuse_* sample types (pprof's default view) count what is live: at the peak
        /// of the live estimate (the default: a finished program has often freed everything by
        /// its end), at the end, or at a time after the start (`1.5s`, `250ms`).
        #[arg(long, value_name = "peak|end|TIME", default_value = "peak", value_parser = pprof::parse_inuse_at)]
        inuse_at: pprof::InuseAt,
        /// Which frames are trimmed from the stacks.
        #[command(flatten)]
        trim: args::Trim,
        /// How names are shown.
        #[command(flatten)]
        names: args::Names,
    },
    /// Chart the estimated live heap and allocation rate over time (SVG, or CSV for *.csv).
    Timeline {
        /// The trace file.
        file: PathBuf,
        /// Where to write the chart: *.csv for CSV, anything else (or `-`, stdout) for SVG.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Show the sites whose estimated bytes changed most between two traces.
    Diff {
        /// The baseline trace.
        base: PathBuf,
        /// The trace to compare with it.
        new: PathBuf,
        #[command(flatten)]
        options: diff::Options,
    },
    /// Write a self-contained interactive HTML report (with --diff BASE: of FILE − BASE).
    Report {
        /// The trace file (with --diff, the new one).
        file: PathBuf,
        /// Where to write the HTML page; `-` for stdout.
        #[arg(short, long)]
        output: PathBuf,
        #[command(flatten)]
        options: report::Options,
    },
}

/// A failed command: what went wrong, and the file it concerns.
#[derive(Debug)]
struct Failure {
    path: PathBuf,
    error: Problem,
}

/// What went wrong.
#[derive(Debug)]
enum Problem {
    /// Reading or writing failed.
    Error(memtrace_rs::Error),
    /// The request cannot be met (an output that is the input, a time outside the trace).
    Refused(String),
}

impl Failure {
    fn new(path: &Path, error: impl Into<memtrace_rs::Error>) -> Failure {
        Failure { path: path.to_path_buf(), error: Problem::Error(error.into()) }
    }

    fn refused(path: &Path, why: String) -> Failure {
        Failure { path: path.to_path_buf(), error: Problem::Refused(why) }
    }

    fn is_broken_pipe(&self) -> bool {
        matches!(&self.error, Problem::Error(e)
            if matches!(e.kind(), memtrace_rs::ErrorKind::Io(e) if e.kind() == io::ErrorKind::BrokenPipe))
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.error {
            Problem::Error(e) => write!(f, "{}: {e}", self.path.display()),
            Problem::Refused(why) => write!(f, "{}: {why}", self.path.display()),
        }
    }
}

impl std::error::Error for Failure {}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) if e.is_broken_pipe() => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("memtrace: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The exit status of `diff --fail-above` when the limit is exceeded (1 is for errors, 2
/// for bad arguments).
const REGRESSION: u8 = 3;

fn run(cli: Cli) -> Result<ExitCode, Failure> {
    let mut status = ExitCode::SUCCESS;
    match cli.command {
        Command::Info { file, format } => {
            let analysis = analyse(&file, None, args::Names::default())?;
            let name = file.display().to_string();
            to_stdout(|out| {
                if format.is_json() {
                    json::info(&analysis, &name, out)
                } else {
                    info::write(&analysis, &name, out)
                }
            })
        }
        Command::Sizes { file } => {
            let analysis = analyse(&file, None, args::Names::default())?;
            to_stdout(|out| sizes::write(&analysis, &file.display().to_string(), out))
        }
        Command::Dump { file } => {
            let (stdout, failed) = Watched::new(io::stdout().lock());
            let mut out = io::BufWriter::with_capacity(1 << 16, stdout);
            memtrace_rs::analysis::dump(&file, &mut out, &mut io::stderr()).and_then(|()| Ok(out.flush()?)).map_err(
                |e| {
                    let path = if failed.get() { Path::new("<stdout>") } else { file.as_path() };
                    Failure::new(path, e)
                },
            )
        }
        Command::Copy { input, output } => {
            let dropped = copy::run(&input, &output)?;
            if dropped > 0 {
                eprintln!(
                    "memtrace: warning: {}: dropped {dropped} promote or collect events of objects whose allocation \
                     is not in the trace",
                    input.display()
                );
            }
            Ok(())
        }
        Command::Hotspots { file, options } => {
            let mut analysis = analyse(&file, None, options.names)?;
            let filter = options.filter.filter();
            if let Some(filter::LiveAt::Time(at)) = filter.live {
                refuse_past_the_end(&file, "--live-at", at, &analysis)?;
            }
            if let Some(span) = &filter.span {
                refuse_unknown_span(&file, span, &analysis.frames)?;
            }
            if filter.selects() {
                if options.ranking.by.figure != args::Figure::Allocated {
                    let why = "--by cannot be combined with filter flags: say --live-at peak or --live-at end";
                    Cli::command().error(clap::error::ErrorKind::ArgumentConflict, why).exit();
                }
                analysis =
                    with_progress(&file, |reader, progress| filter::restrict(&analysis, reader, &filter, progress))?;
            }
            filter.hide_frames(&mut analysis);
            let name = file.display().to_string();
            to_stdout(|out| {
                if options.format.is_json() {
                    json::hotspots(&analysis, &name, &options, out)
                } else {
                    hotspots::write(&analysis, &name, &options, out)
                }
            })
        }
        Command::Flamegraph { file, output, options } => {
            let analysis = analyse(&file, options.weight.live_at_us(), options.names)?;
            if let Some(at) = options.weight.live_at {
                refuse_past_the_end(&file, "--live-at", (at * 1e6).ceil() as u64, &analysis)?;
            }
            let mut drawn = flamegraph::Drawn::default();
            to_file(&output, &[&file], |out| {
                drawn = flamegraph::write(&analysis, &options, out)?;
                Ok(())
            })?;
            let name = file.display();
            if drawn.left_out > 0 {
                eprintln!(
                    "memtrace: warning: {name}: {} of the smallest stacks are left out: the stacks drawn fill \
                     the limit of 256 MiB of folded text",
                    drawn.left_out
                );
            } else if drawn.empty {
                eprintln!("memtrace: warning: {name}: nothing to draw: {}", options.weight.nothing());
            }
            if options.folded && drawn.unit_log2 > 0 {
                eprintln!(
                    "memtrace: warning: {}: the estimates add up to more than 2^53 bytes: the folded counts are in \
                     units of 2^{} bytes",
                    output.display(),
                    drawn.unit_log2
                );
            }
            Ok(())
        }
        Command::Pprof { file, output, inuse_at, trim, names } => {
            if output.as_os_str() == "-" && io::stdout().is_terminal() {
                let why = "the profile is gzip, not for a terminal: say -o FILE or send stdout to a file or pipe";
                Cli::command().error(clap::error::ErrorKind::InvalidValue, why).exit();
            }
            let live_at = match inuse_at {
                pprof::InuseAt::Time(us) => Some(us),
                _ => None,
            };
            let analysis = analyse(&file, live_at, names)?;
            if let pprof::InuseAt::Time(us) = inuse_at {
                refuse_past_the_end(&file, "--inuse-at", us, &analysis)?;
            }
            let mut left_out = 0;
            to_file(&output, &[&file], |out| {
                left_out = pprof::write(&analysis, trim.frames(), inuse_at, out)?;
                Ok(())
            })?;
            if left_out > 0 {
                eprintln!(
                    "memtrace: warning: {}: {left_out} stacks are left out: the samples hold the limit of {} \
                     locations in all",
                    file.display(),
                    pprof::MAX_LOCATION_IDS
                );
            }
            Ok(())
        }
        Command::Timeline { file, output } => {
            let analysis = analyse(&file, None, args::Names::default())?;
            let csv = output.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv"));
            to_file(&output, &[&file], |out| timeline::write(&analysis, csv, out))
        }
        Command::Diff { base, new, options } => {
            let (a, b) = (analyse(&base, None, options.names)?, analyse(&new, None, options.names)?);
            let names = (base.display().to_string(), new.display().to_string());
            let names = (names.0.as_str(), names.1.as_str());
            to_stdout(|out| {
                if options.format.is_json() {
                    json::diff(&a, &b, names, &options, out)
                } else {
                    diff::write(&a, &b, names, &options, out)
                }
            })?;
            if let Some(limit) = options.fail_above {
                let total = diff::total(&a, &b, &options);
                if diff::exceeds(&total, limit) {
                    let unit = if options.per_second { "/s" } else { "" };
                    let allowed = match limit {
                        diff::Limit::Bytes(bytes) => format!("{}{unit}", format::bytes(bytes)),
                        diff::Limit::Percent(p) => {
                            format!("{p}% of the base, {}{unit}", format::bytes(total.base.value * p / 100.0))
                        }
                    };
                    eprintln!(
                        "memtrace: {}: {} grew by {}{unit} (±{}{unit}) from {}, more than the limit of {allowed}, \
                         beyond the sampling noise",
                        new.display(),
                        options.ranking.by.describe(),
                        format::bytes(total.delta()),
                        format::bytes(total.margin()),
                        base.display()
                    );
                    status = ExitCode::from(REGRESSION);
                }
            }
            Ok(())
        }
        Command::Report { file, output, options } => {
            let mut frames = FrameTable::default();
            let mut traces = Vec::new();
            let inputs: Vec<&Path> = options.diff.iter().chain([&file]).map(PathBuf::as_path).collect();
            for &path in &inputs {
                let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into());
                let trace = with_progress(path, |reader, progress| {
                    report::TraceData::load(
                        reader,
                        &name,
                        &mut frames,
                        options.limit,
                        options.span.as_deref(),
                        progress,
                    )
                })?;
                for warning in &trace.warnings {
                    eprintln!("memtrace: warning: {}: {}", path.display(), describe(warning));
                }
                warn_if_being_written(path, trace.is_rust() && !trace.closed_by_writer);
                warn_if_samples_lost(path, trace.lost_samples, trace.all_samples);
                traces.push(trace);
            }
            if let Some(span) = options.span.as_deref() {
                // Taken as shown (trace text is shown inert) or raw, and never echoed raw.
                refuse_unknown_span(&file, &memtrace_rs::analysis::inert(span), &frames.frames)?;
            }
            // The names the other subcommands show (Analysis::shorten_names).
            if !options.names.full_names && traces.iter().all(report::TraceData::is_rust) {
                let remap = frames.shorten_names();
                traces.iter_mut().for_each(|t| t.remap_frames(&remap));
            }
            // A diff's frames are matched as `memtrace diff` matches them.
            if traces.len() == 2 {
                let remap = frames.match_by_identity();
                traces.iter_mut().for_each(|t| t.remap_frames(&remap));
            }
            to_file(&output, &inputs, |out| report::write(&frames, &traces, &options, out))
        }
    }?;
    Ok(status)
}

/// Analyse the trace at `path`, with each stack's live estimate at `live_at` (µs after the
/// start) if given, with a progress bar on a terminal, printing the reader's warnings to
/// stderr; names shortened unless `names` says they are shown in full.
fn analyse(path: &Path, live_at: Option<u64>, names: args::Names) -> Result<Analysis, Failure> {
    // Every view decodes the backtraces: they tell the records of lost samples, which every
    // view warns of.
    let options = AnalysisOptions { stacks: true, live_at };
    let mut analysis = with_progress(path, |reader, progress| Analysis::from_reader(reader, &options, progress))?;
    if !names.full_names {
        analysis.shorten_names();
    }
    for warning in &analysis.warnings {
        eprintln!("memtrace: warning: {}: {}", path.display(), describe(warning));
    }
    warn_if_samples_lost(path, analysis.lost_samples(), analysis.counts.samples);
    warn_if_being_written(path, analysis.origin() == Origin::Rust && !analysis.closed_by_writer);
    Ok(analysis)
}

/// Refuse a time (`option`, `at` µs from the start) after the last event of `analysis`, the
/// trace at `file`: a mistake, not the end.
fn refuse_past_the_end(file: &Path, option: &str, at: u64, analysis: &Analysis) -> Result<(), Failure> {
    let end = analysis.duration();
    if at > end {
        let why =
            format!("{option} {} is after the trace's last event, at {}", format::seconds(at), format::seconds(end));
        return Err(Failure::refused(file, why));
    }
    Ok(())
}

/// Refuse `--span SPAN` (made inert) when none of `frames`, those of the trace at `file`, is
/// that span: an empty page or ranking would look like a span that allocated nothing.
fn refuse_unknown_span(file: &Path, span: &str, frames: &[Frame]) -> Result<(), Failure> {
    if frames.iter().any(|f| f.is_span(span)) {
        return Ok(());
    }
    Err(Failure::refused(file, report::no_such_span(span, frames)))
}

/// Warn that the trace at `path` is still being written, if it is `unclosed` and its writer
/// holds the file's lock.
fn warn_if_being_written(path: &Path, unclosed: bool) {
    if unclosed && memtrace_rs::trace::writer_holds_lock(path) {
        eprintln!(
            "memtrace: warning: {}: the trace is still being written (its writer holds the file's lock): figures stop \
             at what it has flushed",
            path.display()
        );
    }
}

/// Warn that the tracer lost `lost` of the trace's `all` samples at `path` (their records are
/// sites of their own, `<samples lost: CAUSE>`), if it lost any.
fn warn_if_samples_lost(path: &Path, lost: u64, all: u64) {
    if lost > 0 {
        eprintln!(
            "memtrace: warning: {}: the tracer lost {lost} samples ({:.1} % of the allocated estimate), shown at \
             their own sites <samples lost: CAUSE>: allocated figures count them, live figures leave them out",
            path.display(),
            lost as f64 * 100.0 / all.max(1) as f64
        );
    }
}

/// Run `pass` on a reader of the trace at `path`, with a progress bar on a terminal: of the
/// series of files whose first file is at `path` if there is one (`trace.ctf`, `trace.1.ctf`,
/// ...: `analysis::series`), read as one trace.
fn with_progress<T>(
    path: &Path,
    pass: impl FnOnce(Reader<Box<dyn Read>>, &mut dyn FnMut(u64)) -> memtrace_rs::Result<T>,
) -> Result<T, Failure> {
    let read = || -> memtrace_rs::Result<T> {
        let files = series::files(path);
        let mut size = 0;
        for file in &files {
            size += std::fs::metadata(file)?.len();
        }
        let input: Box<dyn Read> = match &files[..] {
            [first, .., last] => {
                say_once_series(path, files.len(), first, last);
                Box::new(BufReader::with_capacity(1 << 16, series::Joined::open(&files)?))
            }
            _ => Box::new(BufReader::with_capacity(1 << 16, std::fs::File::open(path)?)),
        };
        let label = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let mut progress = Progress::new(size, &label);
        let result = pass(Reader::new(input)?, &mut |bytes| progress.update(bytes));
        progress.finish();
        result
    };
    read().map_err(|e| Failure::new(path, e))
}

/// Say on stderr, once per run, that `path` is read as a series of `files` files.
fn say_once_series(path: &Path, files: usize, first: &Path, last: &Path) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        let name =
            |p: &Path| p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned());
        eprintln!(
            "memtrace: {}: read with the rest of its series, {files} files from {} to {}",
            path.display(),
            name(first),
            name(last)
        );
    }
}

/// A warning with its position, as shown on stderr.
fn describe(warning: &Warning) -> String {
    match warning {
        Warning::TruncatedPacket { offset } => {
            format!("at byte {offset}: {warning}: the trace is cut there and was analysed up to the cut")
        }
        Warning::WrongPid { offset, .. } => format!("at byte {offset}: {warning}"),
    }
}

/// A writer that notes when a write to it failed, so that an error can be blamed on the
/// output rather than on the input being read at the same time.
struct Watched<W> {
    inner: W,
    failed: Rc<Cell<bool>>,
}

impl<W: Write> Watched<W> {
    /// `inner`, watched, and the flag set when a write or flush of it fails.
    fn new(inner: W) -> (Watched<W>, Rc<Cell<bool>>) {
        let failed = Rc::new(Cell::new(false));
        (Watched { inner, failed: Rc::clone(&failed) }, failed)
    }

    fn watch<T>(&self, result: io::Result<T>) -> io::Result<T> {
        // An interrupted write is retried, so it is no failure.
        if matches!(&result, Err(e) if e.kind() != io::ErrorKind::Interrupted) {
            self.failed.set(true);
        }
        result
    }
}

impl<W: Write> Write for Watched<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let result = self.inner.write(buf);
        self.watch(result)
    }

    fn flush(&mut self) -> io::Result<()> {
        let result = self.inner.flush();
        self.watch(result)
    }
}

/// Run `write` on a buffered stdout.
fn to_stdout(write: impl FnOnce(&mut BufWriter<io::StdoutLock<'static>>) -> io::Result<()>) -> Result<(), Failure> {
    let mut out = BufWriter::new(io::stdout().lock());
    write(&mut out).and_then(|()| out.flush()).map_err(|e| Failure::new(Path::new("<stdout>"), e))
}

/// Open the output at `path` (`-` for stdout, never one of `inputs`) and run `write` on it.
fn to_file(path: &Path, inputs: &[&Path], write: impl FnOnce(&mut Output) -> io::Result<()>) -> Result<(), Failure> {
    let mut out = Output::create(path, inputs)?;
    write(&mut out).and_then(|()| out.flush()).map_err(|e| Failure::new(out.name(path), e))
}
