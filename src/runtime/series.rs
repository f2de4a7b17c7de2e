//! A file trace's series: the path of each numbered part (`trace.ctf`, `trace.1.ctf`,
//! `trace.2.ctf`, ...), when the part being written is full, and the removal of the oldest parts
//! beyond the number kept. The writer thread opens the parts and writes them; each begins with
//! the blocks live at its start, so that it opens alone (docs/FORMAT.md, "Series and windows").

use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The parts kept when a size limit is set and no number is (`MEMTRACE_FILE_KEEP`).
pub(crate) const DEFAULT_KEEP: usize = 8;

/// The path of part `part` of the series at `base`: `base` itself for part 0, else the
/// number before the extension (`trace.ctf` → `trace.3.ctf`; `trace` → `trace.3`).
pub(crate) fn part_path(base: &Path, part: u32) -> PathBuf {
    if part == 0 {
        return base.to_owned();
    }
    let stem = base.file_stem().unwrap_or_default();
    let mut name = OsString::from(stem);
    name.push(format!(".{part}"));
    if let Some(extension) = base.extension() {
        name.push(".");
        name.push(extension);
    }
    base.with_file_name(name)
}

/// The parts of a series written so far, and its limits.
#[derive(Debug)]
pub(crate) struct Series {
    base: PathBuf,
    /// Bytes from which a part is full, if parts rotate.
    limit: Option<u64>,
    /// Parts kept at most (the oldest are removed).
    keep: usize,
    /// The number of the next part.
    next: u32,
    /// The parts on disk, oldest first.
    kept: VecDeque<PathBuf>,
}

impl Series {
    /// A series at `base` whose part 0 the session opens; `keep` applies only with a `limit`
    /// or when a rate change or a stop starts further parts (default: [`DEFAULT_KEEP`] with a
    /// limit, all without).
    pub(crate) fn new(base: PathBuf, limit: Option<u64>, keep: Option<usize>) -> Series {
        let keep = keep.unwrap_or(if limit.is_some() { DEFAULT_KEEP } else { usize::MAX }).max(1);
        Series { base, limit, keep, next: 0, kept: VecDeque::new() }
    }

    /// The number and path of the next part (a part that cannot be opened is skipped).
    pub(crate) fn next_part(&mut self) -> (u32, PathBuf) {
        let part = self.next;
        self.next += 1;
        (part, part_path(&self.base, part))
    }

    /// Note the part at `path` as opened: the oldest parts beyond the number kept are removed,
    /// counting this one.
    pub(crate) fn opened(&mut self, path: PathBuf) {
        self.kept.push_back(path);
        while self.kept.len() > self.keep {
            if let Some(old) = self.kept.pop_front() {
                // Already gone (removed by hand) is fine.
                let _ = std::fs::remove_file(old);
            }
        }
    }

    /// Whether the part being written, `size` bytes long of which its first `carried` are the
    /// blocks live at its start, is full: at the limit, and at least half the limit past its
    /// carried blocks (a live set larger than the limit does not make every part full at once).
    pub(crate) fn full(&self, size: u64, carried: u64) -> bool {
        self.limit.is_some_and(|limit| size >= limit.max(carried.saturating_add(limit / 2)))
    }

    /// The parts on disk, oldest first.
    pub(crate) fn files(&self) -> impl Iterator<Item = &Path> {
        self.kept.iter().map(PathBuf::as_path)
    }
}

/// The size in bytes given by `value` (`MEMTRACE_FILE_LIMIT`): a whole number, optionally
/// followed by `KiB`, `MiB` or `GiB` (binary units; `K`, `M`, `G` too); at least 1 KiB.
pub(crate) fn parse_size(value: &str) -> Option<u64> {
    let value = value.trim();
    let digits = value.find(|c: char| !c.is_ascii_digit()).unwrap_or(value.len());
    let (number, unit) = value.split_at(digits);
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        _ => return None,
    };
    let bytes = number.parse::<u64>().ok()?.checked_mul(1 << shift)?;
    (bytes >= 1024).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_numbered_before_the_extension() {
        let base = Path::new("/tmp/x/trace.ctf");
        assert_eq!(part_path(base, 0), base);
        assert_eq!(part_path(base, 12), Path::new("/tmp/x/trace.12.ctf"));
        assert_eq!(part_path(Path::new("trace"), 1), Path::new("trace.1"));
        assert_eq!(part_path(Path::new("a.b.ctf"), 2), Path::new("a.b.2.ctf"));
    }

    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(parse_size("64MiB"), Some(64 << 20));
        assert_eq!(parse_size("1 GiB"), Some(1 << 30));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("2K"), Some(2048));
        for bad in ["", "MiB", "1.5MiB", "12 MB", "-1", "100", "99999999999999999999G"] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
    }

    /// Beyond the number kept, the oldest parts are removed from disk as new ones start.
    #[test]
    fn the_oldest_parts_beyond_the_number_kept_are_removed() {
        let dir = std::env::temp_dir().join(format!("memtrace-series-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut series = Series::new(dir.join("t.ctf"), Some(1 << 20), Some(2));
        for _ in 0..4 {
            let (_, path) = series.next_part();
            std::fs::write(&path, b"x").unwrap();
            series.opened(path);
        }
        let mut on_disk: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        on_disk.sort();
        assert_eq!(on_disk, ["t.2.ctf", "t.3.ctf"]);
        assert_eq!(series.files().collect::<Vec<_>>(), [dir.join("t.2.ctf"), dir.join("t.3.ctf")]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_part_is_full_at_the_limit_and_half_of_it_past_its_carried_blocks() {
        let series = Series::new("t.ctf".into(), Some(1000), None);
        assert!(!series.full(999, 0));
        assert!(series.full(1000, 400));
        assert!(!series.full(1000, 600));
        assert!(series.full(1100, 600));
        assert!(!Series::new("t.ctf".into(), None, None).full(u64::MAX, 0));
    }
}
