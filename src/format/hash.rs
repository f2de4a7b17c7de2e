//! The hash map of the crate's internal tables: foldhash's fast hasher.
//!
//! Their keys are addresses, location codes, object ids and slices of codes: not chosen by
//! an adversary who could profit from collisions, and hashed on hot paths (the writer thread,
//! the reader's location table, the analysis's per-event aggregation), so SipHash's cost buys
//! nothing.

/// A `HashMap` with foldhash's fast hasher.
pub(crate) type FastMap<K, V> = foldhash::HashMap<K, V>;
