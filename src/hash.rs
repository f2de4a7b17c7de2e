//! The hasher of the crate's internal maps.
//!
//! Their keys are addresses, location codes, object ids and slices of codes: not chosen by
//! an adversary who could profit from collisions, and hashed on hot paths (the writer thread,
//! the reader's location table, the CLI's per-event aggregation), so SipHash's cost buys
//! nothing. One folded 64 × 64 → 128-bit multiply per word (as in foldhash) spreads aligned
//! addresses over the low bits that hashbrown uses for bucket positions.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` with [`FastHasher`].
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// A fast, non-cryptographic hasher for integer-like keys.
#[derive(Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            let mut w = [0u8; 8];
            w.copy_from_slice(word);
            self.write_u64(u64::from_le_bytes(w));
        }
        for &b in words.remainder() {
            self.write_u64(u64::from(b));
        }
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        let product = u128::from(self.0 ^ v ^ 0x243f_6a88_85a3_08d3) * 0xf135_7aea_2e62_a9c5;
        self.0 = product as u64 ^ (product >> 64) as u64;
    }

    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_addresses_spread_over_low_bits() {
        let mut low_bits = std::collections::BTreeSet::new();
        for i in 0..1024u64 {
            let mut h = FastHasher::default();
            h.write_u64(0x7f00_0000_0000 + i * 64);
            low_bits.insert(h.finish() & 0xFF);
        }
        assert!(low_bits.len() > 200, "only {} distinct low bytes", low_bits.len());
    }
}
