//! The `memtrace` command-line tool; see `memtrace --help`.

fn main() -> std::process::ExitCode {
    memtrace_rs::cli::main()
}
