//! The `memtrace` command line: argument parsing here, one module per subcommand.

pub mod copy;
pub mod dump;

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Analyse memtrace traces (from this crate's allocator or from OCaml's memtrace).
#[derive(Debug, Parser)]
#[command(name = "memtrace", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
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
}

/// Run the command line with the process's arguments; returns the exit status.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if let crate::ErrorKind::Io(io) = e.kind() {
                if io.kind() == io::ErrorKind::BrokenPipe {
                    return ExitCode::SUCCESS;
                }
            }
            eprintln!("memtrace: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> crate::Result<()> {
    match cli.command {
        Command::Dump { file } => {
            let stdout = io::stdout();
            let mut out = io::BufWriter::with_capacity(1 << 16, stdout.lock());
            dump::run(&file, &mut out, &mut io::stderr())?;
            out.flush()?;
        }
        Command::Copy { input, output } => copy::run(&input, &output)?,
    }
    Ok(())
}
