//! The free index's key: three model-chosen parts packed into one integer.

/// A key of the free index: three parts packed into one `u128` (24, 48 and 56 bits), so the
/// index compares one integer. Each model chooses their meaning (e.g. (bin, size, address)
/// for BFC, (stream, size, address) for RMM's per-stream lists, (class, insertion order)
/// for TLSF's LIFO lists); the index is ordered by (a, b, c).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct FreeKey {
    // The packed u128 as two words (high first): 8-byte alignment keeps index entries small.
    hi: u64,
    lo: u64,
}

impl FreeKey {
    /// Largest first part.
    pub const A_MAX: u64 = (1 << 24) - 1;
    /// Largest second part.
    pub const B_MAX: u64 = (1 << 48) - 1;
    /// Largest third part.
    pub const C_MAX: u64 = (1 << 56) - 1;

    /// Packs (a, b, c); each part is clamped to its width (callers keep them in range:
    /// classes and bins are small, sizes below 256 TiB, addresses below 2^56).
    #[must_use]
    pub fn new(a: u64, b: u64, c: u64) -> FreeKey {
        debug_assert!(
            a <= Self::A_MAX && b <= Self::B_MAX && c <= Self::C_MAX,
            "free key ({a}, {b}, {c}) out of range"
        );
        let k = (u128::from(a.min(Self::A_MAX)) << 104)
            | (u128::from(b.min(Self::B_MAX)) << 56)
            | u128::from(c.min(Self::C_MAX));
        FreeKey {
            hi: (k >> 64) as u64,
            lo: k as u64,
        }
    }

    fn packed(self) -> u128 {
        (u128::from(self.hi) << 64) | u128::from(self.lo)
    }

    /// The first part.
    #[must_use]
    pub fn a(self) -> u64 {
        (self.packed() >> 104) as u64
    }

    /// The second part.
    #[must_use]
    pub fn b(self) -> u64 {
        ((self.packed() >> 56) as u64) & Self::B_MAX
    }

    /// The third part.
    #[must_use]
    pub fn c(self) -> u64 {
        (self.packed() as u64) & Self::C_MAX
    }
}
/// The streams of a model in the order they first asked for memory: a stream's free list
/// is named by its rank here (the first part of its [`FreeKey`]s), so lists are ordered by
/// first appearance, as RMM's per-stream maps are walked.
#[derive(Debug, Clone, Default)]
pub struct StreamLists {
    streams: Vec<u64>,
}

impl StreamLists {
    /// The list of `stream`: its rank, a new list at the end for a stream not seen before.
    pub fn list_of(&mut self, stream: u64) -> u64 {
        let i = self
            .streams
            .iter()
            .position(|&s| s == stream)
            .unwrap_or_else(|| {
                self.streams.push(stream);
                self.streams.len() - 1
            });
        i as u64
    }
}
