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
mod pprof;
mod profile_proto;
mod progress;
mod report;
mod timeline;

use std::cell::Cell;
use std::fmt;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::rc::Rc;

use clap::{Parser, Subcommand};

use memtrace_rs::analysis::{Analysis, Options as AnalysisOptions};
use memtrace_rs::trace::{Reader, Warning};
use progress::Progress;

/// Analyse memtrace traces (from this crate's allocator or from OCaml's memtrace).
///
/// Byte figures are estimates: each sample of an allocation stands for
/// word_size / 8 / sample_rate bytes.
#[derive(Debug, Parser)]
#[command(name = "memtrace", version, about)]
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
        /// Where to write the copy.
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
        /// Where to write the SVG (or the folded stacks).
        #[arg(short, long)]
        output: PathBuf,
        #[command(flatten)]
        options: flamegraph::Options,
    },
    /// Write a gzipped pprof heap profile (alloc_objects, alloc_space, inuse_objects, inuse_space).
    Pprof {
        /// The trace file.
        file: PathBuf,
        /// Where to write the profile (conventionally *.pb.gz).
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Chart the estimated live heap and allocation rate over time (SVG, or CSV for *.csv).
    Timeline {
        /// The trace file.
        file: PathBuf,
        /// Where to write the chart: *.csv for CSV, anything else for SVG.
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
    /// Write a self-contained HTML report: summary, live-heap chart, top sites, flame graph.
    Report {
        /// The trace file.
        file: PathBuf,
        /// Where to write the HTML page.
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
    error: memtrace_rs::Error,
}

impl Failure {
    fn new(path: &Path, error: impl Into<memtrace_rs::Error>) -> Failure {
        Failure { path: path.to_path_buf(), error: error.into() }
    }

    fn is_broken_pipe(&self) -> bool {
        matches!(self.error.kind(), memtrace_rs::ErrorKind::Io(e) if e.kind() == io::ErrorKind::BrokenPipe)
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.error)
    }
}

impl std::error::Error for Failure {}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_broken_pipe() => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("memtrace: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Info { file } => {
            let analysis = analyse(&file, AnalysisOptions::default())?;
            to_stdout(|out| info::write(&analysis, &file.display().to_string(), out))
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
            let analysis = analyse(&file, AnalysisOptions { stacks: true, ..Default::default() })?;
            to_stdout(|out| hotspots::write(&analysis, &file.display().to_string(), &options, out))
        }
        Command::Flamegraph { file, output, options } => {
            let analysis = analyse(&file, options.weight.analysis_options())?;
            let mut unit_log2 = 0;
            to_file(&output, |out| {
                unit_log2 = flamegraph::write(&analysis, &options, out)?;
                Ok(())
            })?;
            if options.folded && unit_log2 > 0 {
                eprintln!(
                    "memtrace: warning: {}: the estimates add up to more than 2^53 bytes: the folded counts are in \
                     units of 2^{unit_log2} bytes",
                    output.display()
                );
            }
            Ok(())
        }
        Command::Pprof { file, output } => {
            let analysis = analyse(&file, AnalysisOptions { stacks: true, ..Default::default() })?;
            to_file(&output, |out| pprof::write(&analysis, out))
        }
        Command::Timeline { file, output } => {
            let analysis = analyse(&file, AnalysisOptions::default())?;
            let csv = output.extension().is_some_and(|e| e.eq_ignore_ascii_case("csv"));
            to_file(&output, |out| timeline::write(&analysis, csv, out))
        }
        Command::Diff { base, new, options } => {
            let stacks = AnalysisOptions { stacks: true, ..Default::default() };
            let (a, b) = (analyse(&base, stacks.clone())?, analyse(&new, stacks)?);
            let names = (base.display().to_string(), new.display().to_string());
            to_stdout(|out| diff::write(&a, &b, (&names.0, &names.1), &options, out))
        }
        Command::Report { file, output, options } => {
            let inside_span = options.span.clone();
            let analysis = analyse(&file, AnalysisOptions { stacks: true, inside_span, ..Default::default() })?;
            to_file(&output, |out| report::write(&analysis, &file.display().to_string(), &options, out))
        }
    }
}

/// Analyse the trace at `path` with a progress bar on a terminal, printing the reader's
/// warnings to stderr.
fn analyse(path: &Path, options: AnalysisOptions) -> Result<Analysis, Failure> {
    let read = || -> memtrace_rs::Result<Analysis> {
        let size = std::fs::metadata(path)?.len();
        let label = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let mut progress = Progress::new(size, &label);
        let analysis = Analysis::from_reader(Reader::open(path)?, &options, |bytes| progress.update(bytes));
        progress.finish();
        analysis
    };
    let analysis = read().map_err(|e| Failure::new(path, e))?;
    for warning in &analysis.warnings {
        eprintln!("memtrace: warning: {}: {}", path.display(), describe(warning));
    }
    Ok(analysis)
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

/// Create the file at `path` and run `write` on it, buffered.
fn to_file(path: &Path, write: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>) -> Result<(), Failure> {
    let mut out = BufWriter::new(File::create(path).map_err(|e| Failure::new(path, e))?);
    write(&mut out).and_then(|()| out.flush()).map_err(|e| Failure::new(path, e))
}
