//! The largest free block in O(1), for the stats every event reports.

use std::collections::{BinaryHeap, HashMap};
use std::hash::BuildHasherDefault;

use super::hasher::AddrHasher;

/// The largest free block in O(1): a max-heap of free sizes with a count per size; sizes
/// whose count drops to zero are popped once they reach the top, so the top is always live.
#[derive(Debug, Clone, Default)]
pub(super) struct LargestFree {
    heap: BinaryHeap<u64>,
    pub(super) counts: HashMap<u64, u32, BuildHasherDefault<AddrHasher>>,
}

impl LargestFree {
    pub(super) fn insert(&mut self, size: u64) {
        let c = self.counts.entry(size).or_insert(0);
        if *c == 0 {
            self.heap.push(size);
        }
        *c += 1;
    }

    pub(super) fn remove(&mut self, size: u64) {
        // One hash lookup; the top can only go stale when the last block of its size goes.
        let std::collections::hash_map::Entry::Occupied(mut e) = self.counts.entry(size) else {
            return;
        };
        *e.get_mut() -= 1;
        if *e.get() > 0 {
            return;
        }
        e.remove();
        if self.heap.peek() == Some(&size) {
            while let Some(&top) = self.heap.peek() {
                if self.counts.contains_key(&top) {
                    break;
                }
                self.heap.pop();
            }
        }
        // Stale sizes below the top accumulate; rebuild when they dominate.
        if self.heap.len() > 2 * self.counts.len() + 64 {
            let mut sizes: Vec<u64> = self.counts.keys().copied().collect();
            sizes.sort_unstable();
            self.heap = BinaryHeap::from(sizes);
        }
    }

    pub(super) fn largest(&self) -> u64 {
        self.heap.peek().copied().unwrap_or(0)
    }
}
