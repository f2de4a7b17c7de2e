//! Naming new addresses: the symbolizer that the writer's symbols thread runs, from cold (a
//! new symbolizer: object opened, its units parsed as addresses need them), from cold with the
//! addresses announced first (as the writer announces a sample's: looked up after one pass
//! over the symbol table and unit index, not sorted copies of them) and from its cache,
//! against addr2line's context of the whole object, on the same addresses of this benchmark's
//! own binary (a release build with `debug = "line-tables-only"`, Rust's standard library
//! included), in one table.
//!
//! ```text
//! cargo bench --bench symbolize
//! MEMTRACE_BENCH_ROUNDS=31 cargo bench --bench symbolize
//! ```
//!
//! The addresses are a few bytes into every k-th function of the binary's symbol table, so
//! that they fall in many units, as a program's first samples do. addr2line is given the file's
//! bytes already read; the symbolizer opens and maps the file itself in each cold round.

use std::time::{Duration, Instant};

use memtrace_rs::__internals::Symbolizer;
use object::{Object as _, ObjectSection as _, ObjectSymbol as _};

/// Addresses named per round.
const ADDRESSES: usize = 300;

fn main() {
    let rounds: usize = std::env::var("MEMTRACE_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(11);
    let path = std::env::current_exe().unwrap();
    let data = std::fs::read(&path).unwrap();
    let file = object::File::parse(&*data).unwrap();
    let (file_addresses, load_bias) = spread_functions(&file);
    let runtime: Vec<u64> = file_addresses.iter().map(|&a| a.wrapping_add(load_bias)).collect();

    let cold = median(rounds, || {
        let mut symbolizer = Symbolizer::new();
        for &pc in &runtime {
            std::hint::black_box(symbolizer.symbolize_pc(pc));
        }
    });
    // As the writer names a sample's new addresses: announced first, then looked up after one
    // pass over the symbol table and unit index, without sorting them.
    let return_addresses: Vec<u64> = runtime.iter().map(|&pc| pc + 1).collect();
    let cold_batch = median(rounds, || {
        let mut symbolizer = Symbolizer::new();
        symbolizer.expect(&return_addresses);
        for &pc in &runtime {
            std::hint::black_box(symbolizer.symbolize_pc(pc));
        }
    });
    let mut warm_symbolizer = Symbolizer::new();
    for &pc in &runtime {
        warm_symbolizer.symbolize_pc(pc);
    }
    let warm = median(rounds, || {
        for &pc in &runtime {
            std::hint::black_box(warm_symbolizer.symbolize_pc(pc));
        }
    });
    let addr2line = median(rounds, || {
        let endian = if file.is_little_endian() { gimli::RunTimeEndian::Little } else { gimli::RunTimeEndian::Big };
        let sections = gimli::DwarfSections::load(|id| -> Result<&[u8], ()> {
            Ok(file.section_by_name(id.name()).and_then(|s| s.data().ok()).unwrap_or(&[]))
        })
        .unwrap();
        let context = addr2line::Context::from_dwarf(sections.borrow(|d| gimli::EndianSlice::new(d, endian))).unwrap();
        for &probe in &file_addresses {
            if let Ok(mut frames) = context.find_frames(probe).skip_all_loads() {
                while let Ok(Some(frame)) = frames.next() {
                    std::hint::black_box(frame.function.as_ref().map(|f| f.demangle().ok()));
                }
            }
        }
    });

    println!("{ADDRESSES} addresses of {} ({} MB), {rounds} rounds, medians", path.display(), data.len() >> 20);
    println!("{:<52} {:>10} {:>12} {:>10}", "", "round", "per address", "ratio");
    for (name, time) in [
        ("addr2line, context of the whole object (baseline)", addr2line),
        ("symbolizer, cold", cold),
        ("symbolizer, cold, the addresses announced (one pass)", cold_batch),
        ("symbolizer, cached", warm),
    ] {
        println!(
            "{name:<52} {:>7.2} ms {:>9.2} µs {:>9.3}×",
            time.as_secs_f64() * 1e3,
            time.as_secs_f64() * 1e6 / ADDRESSES as f64,
            time.as_secs_f64() / addr2line.as_secs_f64()
        );
    }
}

/// [`ADDRESSES`] addresses a few bytes into functions spread over `file`'s symbol table (file
/// addresses), and what to add to a file address for the running program's.
fn spread_functions(file: &object::File) -> (Vec<u64>, u64) {
    let mut functions: Vec<(u64, u64)> = file
        .symbols()
        .filter(|s| s.kind() == object::SymbolKind::Text && s.is_definition() && s.size() > 8)
        .map(|s| (s.address(), s.size()))
        .collect();
    functions.sort_unstable();
    functions.dedup_by_key(|f| f.0);
    let step = (functions.len() / ADDRESSES).max(1);
    let addresses =
        functions.iter().step_by(step).take(ADDRESSES).map(|&(address, size)| address + size.min(9) / 2).collect();
    let anchor = file.symbols().find(|s| s.name() == Ok("memtrace_bench_anchor")).expect("the anchor's symbol");
    (addresses, (memtrace_bench_anchor as *const () as u64).wrapping_sub(anchor.address()))
}

/// A function whose symbol has this name: its address, against the symbol's, gives the load
/// bias.
#[no_mangle]
extern "C" fn memtrace_bench_anchor() {}

/// The median time of `rounds` runs of `f`.
fn median(rounds: usize, mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort_unstable();
    times[times.len() / 2]
}
