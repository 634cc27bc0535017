//! The metrics of a replay, each defined once (DESIGN.md, "Metrics").

use std::fmt::Write as _;

use crate::models::ModelStats;

/// Bytes held from the device and not allocated: `free = reserved − allocated`
/// ("reserved but unallocated" in PyTorch's words).
#[must_use]
pub fn free_bytes(s: &ModelStats) -> u64 {
    s.reserved_bytes.saturating_sub(s.allocated_bytes)
}

/// Fragmentation: `1 − largest free block / free`, over all free blocks (0 when nothing
/// is free) — the BFC/RMM definition `(free − largest) / free`.
#[must_use]
pub fn fragmentation(s: &ModelStats) -> f64 {
    let free = free_bytes(s);
    if free == 0 {
        return 0.0;
    }
    let largest = s.largest_free_bytes.min(free);
    1.0 - largest as f64 / free as f64
}

/// Whether `a` is strictly more fragmented than `b`, compared exactly:
/// `(free_a − largest_a) / free_a > (free_b − largest_b) / free_b` by cross-multiplying
/// (no division). [`fragmentation`] is monotone in that ratio, so the state this picks
/// as the most fragmented gives the largest [`fragmentation`] too.
#[must_use]
pub fn more_fragmented(a: &ModelStats, b: &ModelStats) -> bool {
    let ratio = |s: &ModelStats| {
        let free = free_bytes(s);
        (free - s.largest_free_bytes.min(free), free)
    };
    let ((na, da), (nb, db)) = (ratio(a), ratio(b));
    if da == 0 {
        return false;
    }
    if db == 0 {
        return na > 0;
    }
    u128::from(na) * u128::from(db) > u128::from(nb) * u128::from(da)
}

/// Internal waste: bytes of live blocks beyond what their requests asked for (rounding
/// and unsplit slack): `allocated − requested`.
#[must_use]
pub fn internal_waste_bytes(s: &ModelStats) -> u64 {
    s.allocated_bytes.saturating_sub(s.requested_bytes)
}

/// The metrics timeline: one sample after every op, stored column by column (36 bytes a
/// sample; the op's time is the trace's, `Op::time_us`, not kept again here).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    pub reserved_bytes: Vec<u64>,
    pub allocated_bytes: Vec<u64>,
    pub requested_bytes: Vec<u64>,
    pub largest_free_bytes: Vec<u64>,
    pub free_holes: Vec<u32>,
}

impl Timeline {
    /// An empty timeline with room for `n` samples.
    #[must_use]
    pub fn with_capacity(n: usize) -> Timeline {
        Timeline {
            reserved_bytes: Vec::with_capacity(n),
            allocated_bytes: Vec::with_capacity(n),
            requested_bytes: Vec::with_capacity(n),
            largest_free_bytes: Vec::with_capacity(n),
            free_holes: Vec::with_capacity(n),
        }
    }

    /// Appends one sample.
    pub fn push(&mut self, s: &ModelStats) {
        self.reserved_bytes.push(s.reserved_bytes);
        self.allocated_bytes.push(s.allocated_bytes);
        self.requested_bytes.push(s.requested_bytes);
        self.largest_free_bytes.push(s.largest_free_bytes);
        self.free_holes
            .push(s.free_holes.min(u64::from(u32::MAX)) as u32);
    }

    /// Number of samples.
    #[must_use]
    pub fn len(&self) -> usize {
        self.reserved_bytes.len()
    }

    /// The heap bytes its columns hold (their capacity).
    #[must_use]
    pub fn capacity_bytes(&self) -> usize {
        8 * (self.reserved_bytes.capacity()
            + self.allocated_bytes.capacity()
            + self.requested_bytes.capacity()
            + self.largest_free_bytes.capacity())
            + 4 * self.free_holes.capacity()
    }

    /// Whether there are no samples.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.reserved_bytes.is_empty()
    }

    /// The stats of sample `i` (`segment_ops` not kept per sample).
    #[must_use]
    pub fn stats_at(&self, i: usize) -> ModelStats {
        ModelStats {
            reserved_bytes: self.reserved_bytes[i],
            allocated_bytes: self.allocated_bytes[i],
            requested_bytes: self.requested_bytes[i],
            largest_free_bytes: self.largest_free_bytes[i],
            free_holes: u64::from(self.free_holes[i]),
            segment_ops: 0,
        }
    }

    /// Fragmentation of sample `i`.
    #[must_use]
    pub fn fragmentation_at(&self, i: usize) -> f64 {
        fragmentation(&self.stats_at(i))
    }

    /// The metrics as CSV (`op,time_us,reserved_bytes,…`); `time_us[i]` is sample `i`'s
    /// time (0 past its end: a trace without times).
    #[must_use]
    pub fn to_csv(&self, time_us: &[i64]) -> String {
        let mut s = String::from(
            "op,time_us,reserved_bytes,allocated_bytes,requested_bytes,free_bytes,largest_free_bytes,free_holes,fragmentation\n",
        );
        for i in 0..self.len() {
            let st = self.stats_at(i);
            let _ = writeln!(
                s,
                "{i},{},{},{},{},{},{},{},{:.6}",
                time_us.get(i).copied().unwrap_or(0),
                st.reserved_bytes,
                st.allocated_bytes,
                st.requested_bytes,
                free_bytes(&st),
                st.largest_free_bytes,
                st.free_holes,
                fragmentation(&st)
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exact_comparison_finds_the_float_maximum() {
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut best = ModelStats::default();
        let mut float_max = 0f64;
        for _ in 0..100_000 {
            let reserved = next() % (1 << 40);
            let allocated = next() % (reserved + 1);
            let s = ModelStats {
                reserved_bytes: reserved,
                allocated_bytes: allocated,
                // Sometimes beyond the free bytes (clamped), sometimes equal.
                largest_free_bytes: match next() % 4 {
                    0 => reserved - allocated,
                    1 => reserved,
                    _ => next() % (reserved - allocated + 1),
                },
                ..ModelStats::default()
            };
            float_max = float_max.max(fragmentation(&s));
            if more_fragmented(&s, &best) {
                best = s;
            }
            assert!(!more_fragmented(&s, &s));
        }
        assert!(float_max > 0.99);
        assert_eq!(fragmentation(&best).to_bits(), float_max.to_bits());
    }

    #[test]
    fn fragmentation_is_zero_without_free_memory_and_grows_with_holes() {
        let mut s = ModelStats {
            reserved_bytes: 100,
            allocated_bytes: 100,
            ..ModelStats::default()
        };
        assert!(fragmentation(&s).abs() < f64::EPSILON);
        s.allocated_bytes = 60;
        s.largest_free_bytes = 40;
        assert!(fragmentation(&s).abs() < f64::EPSILON);
        s.largest_free_bytes = 10;
        assert!((fragmentation(&s) - 0.75).abs() < 1e-12);
    }
}
