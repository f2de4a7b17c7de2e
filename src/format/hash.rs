//! The hash maps and sets of the crate's internal tables: foldhash's fast hasher.
//!
//! Their keys are addresses, location codes, object ids, slices of codes and the names that
//! a program's own debug info gives its functions: not chosen by an adversary who could
//! profit from collisions, and hashed on hot paths (the writer thread, the symbolizer, the
//! reader's location table, the analysis's per-event aggregation), so SipHash's cost buys
//! nothing.

/// A `HashMap` with foldhash's fast hasher.
pub(crate) type FastMap<K, V> = foldhash::HashMap<K, V>;

/// A `HashSet` with foldhash's fast hasher.
pub(crate) type FastSet<T> = foldhash::HashSet<T>;
