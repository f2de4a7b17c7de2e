//! The symbolizer's memory on a program with thousands of sites: this test binary's own code,
//! symbolized at thousands of addresses, with the allocations of this thread counted.

use memtrace_rs::__internals::{Symbolizer, SymbolizerOptions};

use crate::util::counting_alloc;

/// The start and end of this program's executable mapping.
fn own_code() -> (u64, u64) {
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let line = maps
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("r-xp") && l.ends_with(exe.to_str().unwrap()))
        .expect("the program's code mapping");
    let (start, end) = line.split_whitespace().next().unwrap().split_once('-').unwrap();
    (u64::from_str_radix(start, 16).unwrap(), u64::from_str_radix(end, 16).unwrap())
}

/// Symbolizing 5 000 addresses spread over the whole program keeps the symbolizer's estimate of
/// its parsed state (beyond the base state of the object in use, which any address needs) under
/// the budget, and what it really allocates within twice that, with the largest base state it
/// held (the estimate of parsed units is approximate), while naming them. The budget, 1 MiB, is
/// less than naming them all takes (about 2.3 MB), so that it is enforced: parsed state is
/// dropped on the way.
#[test]
fn the_symbolizer_stays_within_its_budget() {
    const BUDGET: usize = 1 << 20;
    let (start, end) = own_code();
    let base = counting_alloc::live_bytes();
    counting_alloc::reset_peak();
    let mut symbolizer = Symbolizer::with_options(SymbolizerOptions { memory_budget: BUDGET, ..Default::default() });
    let mut named = 0;
    let mut worst_estimate = 0;
    let mut largest_base = 0;
    const ADDRESSES: u64 = 5_000;
    for i in 0..ADDRESSES {
        let address = start + (end - start) / ADDRESSES * i + 1;
        if symbolizer.symbolize(address).is_some_and(|frames| frames.iter().any(|f| f.function.is_some())) {
            named += 1;
        }
        let stats = symbolizer.stats();
        worst_estimate = worst_estimate.max(stats.estimated_bytes - stats.base_bytes);
        largest_base = largest_base.max(stats.base_bytes);
    }
    let peak = counting_alloc::peak_since(base);
    let stats = symbolizer.stats();
    eprintln!(
        "named {named}; estimate at worst {worst_estimate}, base at most {largest_base}, real peak {peak}; {stats:?}"
    );
    assert!(named > 4_000, "{named} of {ADDRESSES} addresses named");
    assert!(stats.evictions > 0, "the budget was never reached: {stats:?}");
    assert!(worst_estimate <= BUDGET, "estimate {worst_estimate} over the budget {BUDGET}: {stats:?}");
    // The base state at its largest: the peak may have held one that was dropped since (the
    // last address's object replaced it, or an eviction took it).
    let bound = 2 * (BUDGET + largest_base) as i64;
    assert!(peak <= bound, "peak {peak} bytes for a budget of {BUDGET}: {stats:?}");
}
