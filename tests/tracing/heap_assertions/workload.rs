//! Code whose allocations `heap_assertions` measures and compares with what dhat-rs counts of
//! the same source, run by `tests/fixtures/dhat-reference` with dhat as the global allocator.

use std::collections::HashMap;

/// A map of 1000 entries, grown one insertion at a time (each growth a new table and the old
/// one freed).
#[inline(never)]
pub fn hash_map_of_1000() -> HashMap<u64, u64> {
    let mut map = HashMap::new();
    for i in 0..1000 {
        map.insert(i, i * i);
    }
    map
}
