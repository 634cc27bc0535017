//! Which allocations the program holds after an op, found without walking the ops before
//! it: a layout links each block to the allocation in it, and on a trace of a million ops
//! that walk would cost more than the layout itself.
//!
//! An allocation is held over the ops `[alloc, end)` ([`OpsTable::live_after`]); the
//! held ones after op `at` are the intervals that contain `at`. A max tree over the
//! allocations' ends (in op order) finds them in `O((k + 1) log n)` for `k` of them: a
//! subtree whose latest end is at or before `at` holds none and is skipped whole.

use super::wire::{NO_OP, OpsTable};

/// The allocations of one device as intervals, for stabbing queries.
#[derive(Debug, Clone, Default)]
pub struct LiveIndex {
    /// The alloc ops the program held memory from ([`OpsTable::is_alloc`]), ascending.
    allocs: Vec<u32>,
    /// Max tree over the allocations' ends (`u32::MAX` for never): leaf `i` at
    /// `leaves + i`, node `j`'s children at `2j` and `2j + 1`; padding leaves hold 0.
    max_end: Vec<u32>,
    /// The number of leaves (a power of two, at least the number of allocations).
    leaves: usize,
}

impl LiveIndex {
    /// The index of the allocations of `ops`.
    #[must_use]
    pub fn build(ops: &OpsTable) -> LiveIndex {
        let allocs: Vec<u32> = (0..ops.len())
            .filter(|&k| ops.is_alloc(k))
            .map(|k| k as u32)
            .collect();
        let leaves = allocs.len().next_power_of_two();
        let mut max_end = vec![0; 2 * leaves];
        for (i, &a) in allocs.iter().enumerate() {
            let end = ops.end(a as usize);
            max_end[leaves + i] = if end == NO_OP { u32::MAX } else { end };
        }
        for j in (1..leaves).rev() {
            max_end[j] = max_end[2 * j].max(max_end[2 * j + 1]);
        }
        LiveIndex {
            allocs,
            max_end,
            leaves,
        }
    }

    /// The allocations held after ops `0..=at`, ascending: exactly the `a` for which
    /// `ops.live_after(a, at)`.
    #[must_use]
    pub fn held_after(&self, at: usize) -> Vec<u32> {
        let mut held = Vec::new();
        let Ok(at) = u32::try_from(at) else {
            return held;
        };
        // Only allocations made at or before `at` can be held after it.
        let made = self.allocs.partition_point(|&a| a <= at);
        if made > 0 {
            self.collect(1, 0, self.leaves, made, at, &mut held);
        }
        held
    }

    /// Appends the allocations of node `j` (leaves `lo..hi`) among the first `made` whose
    /// end is after `at`, in order.
    fn collect(&self, j: usize, lo: usize, hi: usize, made: usize, at: u32, held: &mut Vec<u32>) {
        if lo >= made || self.max_end[j] <= at {
            return;
        }
        if hi - lo == 1 {
            held.push(self.allocs[lo]);
            return;
        }
        let mid = lo + (hi - lo) / 2;
        self.collect(2 * j, lo, mid, made, at, held);
        self.collect(2 * j + 1, mid, hi, made, at, held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::wire::op_kind;

    /// An ops table of allocs (`Some(end)`: the op it ends at, `None`: never) and other
    /// ops, as the engine builds it.
    fn table(ops: &[(u8, Option<u32>)]) -> OpsTable {
        OpsTable::with_ends(ops)
    }

    fn brute(ops: &OpsTable, at: usize) -> Vec<u32> {
        (0..ops.len())
            .filter(|&a| ops.live_after(a, at))
            .map(|a| a as u32)
            .collect()
    }

    #[test]
    fn held_allocations_are_those_live_after_the_op_at_every_op() {
        use op_kind::{ALLOC, ALLOC_RECORDED_OOM, COMPLETE_FREE, FREE};
        // Nested, overlapping, never freed, freed at once, a recorded OOM (never held),
        // a deferred free completed later.
        let ops = table(&[
            (ALLOC, Some(5)),
            (ALLOC, None),
            (ALLOC, Some(3)),
            (FREE, None),
            (ALLOC_RECORDED_OOM, None),
            (FREE, None),
            (ALLOC, Some(7)),
            (COMPLETE_FREE, None),
            (ALLOC, Some(9)),
            (FREE, None),
            (ALLOC, Some(10)),
        ]);
        let index = LiveIndex::build(&ops);
        for at in 0..ops.len() + 3 {
            assert_eq!(index.held_after(at), brute(&ops, at), "after op {at}");
        }
        assert_eq!(index.held_after(3), vec![0, 1]);
    }

    #[test]
    fn a_generated_table_answers_as_the_walk_over_every_op() {
        // A seeded table of 3,000 ops with lifetimes from one op to the whole trace.
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let n = 3000u32;
        let ops: Vec<(u8, Option<u32>)> = (0..n)
            .map(|k| match next() % 4 {
                0 => (op_kind::FREE, None),
                1 => (op_kind::ALLOC, None),
                _ => {
                    let len = 1 + (next() % u64::from(n)) as u32 / (1 + (next() % 64) as u32);
                    (op_kind::ALLOC, Some(k + len))
                }
            })
            .collect();
        let ops = table(&ops);
        let index = LiveIndex::build(&ops);
        for at in 0..n as usize {
            assert_eq!(index.held_after(at), brute(&ops, at), "after op {at}");
        }
        assert!(!index.held_after(n as usize / 2).is_empty());
    }

    #[test]
    fn an_empty_table_holds_nothing() {
        let index = LiveIndex::build(&OpsTable::default());
        assert!(index.held_after(0).is_empty());
        assert!(index.held_after(10).is_empty());
    }
}
