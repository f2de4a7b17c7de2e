//! `memtrace sizes`: a histogram of allocation sizes, by powers of two.

use std::io::{self, Write};

use memtrace_rs::analysis::Analysis;

use super::format;

/// The sizes of entry `i` of `Analysis::sizes`, half-open as the classes are: `[4 KiB, 8 KiB)`
/// holds a block of exactly 4 KiB, which the class below does not.
fn size_class(i: usize) -> String {
    match i {
        0 => "0 B".to_string(),
        _ => {
            format!("[{}, {})", format::round_bytes(2f64.powi(i as i32 - 1)), format::round_bytes(2f64.powi(i as i32)))
        }
    }
}

/// Print one line per power-of-two size class that was sampled: its range, the estimated
/// number of allocations and bytes (with their uncertainty) and a bar of the bytes.
pub fn write(analysis: &Analysis, name: &str, out: &mut impl Write) -> io::Result<()> {
    let total = analysis.estimate(analysis.counts.samples);
    writeln!(
        out,
        "Allocation sizes of {name} (estimated, sizes rounded up to whole words): {} in {} samples",
        format::estimate(&total),
        total.samples
    )?;
    writeln!(out, "{:>21} {:>12} {:>12} {:>7} {:>8}", "size", "allocations", "bytes", "±95%", "%")?;
    let largest = analysis.sizes.iter().map(|t| t.samples).max().unwrap_or(0).max(1);
    let mut rough = false;
    for (i, tally) in analysis.sizes.iter().enumerate().filter(|(_, t)| t.samples > 0) {
        let e = analysis.estimate(tally.samples);
        rough |= e.is_rough();
        let range = size_class(i);
        let bar = "#".repeat((40 * u128::from(tally.samples) / u128::from(largest)) as usize);
        writeln!(
            out,
            "{range:>21} {:>12} {:>12} {:>7} {:>8}  {bar}",
            format::whole(tally.objects),
            format::bytes(e.bytes),
            format::uncertainty(&e),
            format::percent(e.bytes, total.bytes)
        )?;
    }
    if rough {
        writeln!(out, "{}", format::ROUGH_NOTE)?;
    }
    Ok(())
}
