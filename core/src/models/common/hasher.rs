//! The address hasher: fast, deterministic, for lookups only (nothing iterates its maps).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A fast, deterministic hasher for addresses (lookups only: nothing iterates the map).
#[derive(Default, Clone, Copy)]
pub struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing: addresses are multiples of 256, so mix the high bits down.
        let h = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 29);
    }
}

/// An address map hashed by [`AddrHasher`] (nothing may depend on its order).
pub type AddrMap<V = u32> = HashMap<u64, V, BuildHasherDefault<AddrHasher>>;
