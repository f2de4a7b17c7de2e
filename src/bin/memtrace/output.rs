//! Where outputs go: a file, or stdout for `-`; never over one of the inputs.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::Failure;

/// An opened output.
pub enum Output {
    /// A created (or truncated) file.
    File(BufWriter<File>),
    /// Standard output, for the path `-`.
    Stdout(BufWriter<io::StdoutLock<'static>>),
}

impl Output {
    /// Open `path` for writing (`-` is stdout), refusing a path that is one of `inputs`
    /// (the same file, whatever the spelling or link): creating it would destroy the input
    /// before it is read.
    pub fn create(path: &Path, inputs: &[&Path]) -> Result<Output, Failure> {
        if path == Path::new("-") {
            return Ok(Output::Stdout(BufWriter::new(io::stdout().lock())));
        }
        if let Ok(out) = std::fs::metadata(path) {
            let same =
                |input: &&&Path| std::fs::metadata(input).is_ok_and(|i| i.dev() == out.dev() && i.ino() == out.ino());
            if let Some(input) = inputs.iter().find(same) {
                let why = format!("is the input {}: refusing to overwrite it", input.display());
                return Err(Failure::refused(path, why));
            }
        }
        Ok(Output::File(BufWriter::new(File::create(path).map_err(|e| Failure::new(path, e))?)))
    }

    /// The name errors of this output are given under.
    pub fn name<'a>(&self, path: &'a Path) -> &'a Path {
        match self {
            Output::File(_) => path,
            Output::Stdout(_) => Path::new("<stdout>"),
        }
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Output::File(f) => f.write(buf),
            Output::Stdout(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Output::File(f) => f.flush(),
            Output::Stdout(s) => s.flush(),
        }
    }
}
