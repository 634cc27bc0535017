//! `graph_pools_freeable`: the private pools no graph or `MemPool` uses any more, in the
//! order `release_cached_blocks` visits them. PyTorch keeps them in a
//! `ska::flat_hash_map<MempoolId_t, PrivatePool*, MempoolIdHash>` (`c10/util/flat_hash_map.h`:
//! Robin Hood probing, Fibonacci hashing, load factor 0.5, no wrap-around), whose iteration
//! order is the order of its slots — so when several freed pools hold cached segments, their
//! `segment_free`s come in slot order, not in id order. This is that table, slot for slot.

use crate::models::PoolId;

/// 2^64 / φ, the multiplier of `fibonacci_hash_policy`.
const FIBONACCI: u64 = 11_400_714_819_323_198_485;
/// `detailv3::min_lookups`.
const MIN_LOOKUPS: i8 = 4;
/// `MempoolIdHash`: the first half of the id if set, else the second.
fn hash(id: PoolId) -> u64 {
    if id.0 != 0 { id.0 } else { id.1 }
}

/// The slots of a `sherwood_v3_table` keyed by pool id.
#[derive(Debug, Clone, Default)]
pub(super) struct FreeablePools {
    /// `num_slots + max_lookups - 1` entries (the table's special end entry left out):
    /// the key and its distance from its desired slot, or None where empty. Empty while
    /// the table is the never-grown default one.
    slots: Vec<Option<(PoolId, i8)>>,
    /// `num_slots_minus_one + 1`, a power of two; 0 for the default table.
    num_slots: u64,
    /// `64 - log2(num_slots)`.
    shift: u32,
    max_lookups: i8,
    len: u64,
}

impl FreeablePools {
    /// Whether `id` is in the table.
    pub(super) fn contains(&self, id: PoolId) -> bool {
        self.find(id).is_some()
    }

    /// The pools in iteration order.
    pub(super) fn in_order(&self) -> Vec<PoolId> {
        self.slots.iter().flatten().map(|&(id, _)| id).collect()
    }

    fn desired(&self, id: PoolId) -> usize {
        (FIBONACCI.wrapping_mul(hash(id)) >> self.shift) as usize
    }

    fn find(&self, id: PoolId) -> Option<usize> {
        if self.num_slots == 0 {
            return None;
        }
        let mut at = self.desired(id);
        let mut distance = 0;
        while let Some(Some((k, d))) = self.slots.get(at) {
            if *d < distance {
                return None;
            }
            if *k == id {
                return Some(at);
            }
            at += 1;
            distance += 1;
        }
        None
    }

    /// `emplace`: a Robin Hood insert; grows (doubling) at half load or when a probe
    /// reaches `max_lookups`.
    pub(super) fn insert(&mut self, id: PoolId) {
        if self.num_slots == 0 {
            self.grow();
        }
        let mut at = self.desired(id);
        let mut distance: i8 = 0;
        while let Some(Some((k, d))) = self.slots.get(at) {
            if *d < distance {
                break;
            }
            if *k == id {
                return;
            }
            at += 1;
            distance += 1;
        }
        if distance == self.max_lookups || (self.len + 1) * 2 > self.num_slots {
            self.grow();
            return self.insert(id);
        }
        let placed = at;
        let mut carried = (id, distance);
        loop {
            match self.slots[at] {
                None => {
                    self.slots[at] = Some(carried);
                    self.len += 1;
                    return;
                }
                Some((k, d)) if d < carried.1 => {
                    self.slots[at] = Some(carried);
                    carried = (k, d + 1);
                }
                Some(_) => {
                    carried.1 += 1;
                    if carried.1 == self.max_lookups {
                        // As `emplace_new_key` does: the displaced key takes the new key's
                        // slot back, the table grows and the new key is inserted again.
                        let displaced = carried.0;
                        if let Some((k, _)) = &mut self.slots[placed] {
                            *k = displaced;
                        }
                        self.grow();
                        return self.insert(id);
                    }
                }
            }
            at += 1;
        }
    }

    /// `erase`: removes `id` and shifts the run after it back by one slot.
    pub(super) fn remove(&mut self, id: PoolId) {
        let Some(mut at) = self.find(id) else {
            return;
        };
        self.slots[at] = None;
        self.len -= 1;
        while let Some(Some((k, d))) = self.slots.get(at + 1).copied()
            && d > 0
        {
            self.slots[at] = Some((k, d - 1));
            self.slots[at + 1] = None;
            at += 1;
        }
    }

    /// `grow` → `rehash(max(4, 2 × bucket_count))`: the keys are inserted again in slot
    /// order.
    fn grow(&mut self) {
        let num_slots = (2 * self.num_slots)
            .max(4)
            .max(self.len * 2)
            .next_power_of_two();
        let old = std::mem::take(&mut self.slots);
        self.num_slots = num_slots;
        self.shift = 64 - num_slots.ilog2();
        self.max_lookups = MIN_LOOKUPS.max(num_slots.ilog2() as i8);
        self.slots = vec![None; (num_slots as usize) + self.max_lookups as usize - 1];
        self.len = 0;
        for (id, _) in old.into_iter().flatten() {
            self.insert(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(n: u64) -> PoolId {
        PoolId(0, n)
    }

    #[test]
    fn two_graph_pools_come_out_in_slot_order_not_id_order() {
        // In a 4-slot table (shift 62): φ·1 lands in slot 2, φ·2 in slot 0.
        let mut t = FreeablePools::default();
        t.insert(graph(1));
        t.insert(graph(2));
        assert_eq!(t.in_order(), vec![graph(2), graph(1)]);
        assert!(t.contains(graph(1)) && t.contains(graph(2)) && !t.contains(graph(3)));
    }

    #[test]
    fn a_third_pool_grows_the_table_to_eight_slots() {
        // 3 keys > 4 × 0.5: 8 slots (shift 61): 1 → 4, 2 → 1, 3 → 6.
        let mut t = FreeablePools::default();
        for n in 1..=3 {
            t.insert(graph(n));
        }
        assert_eq!(t.in_order(), vec![graph(2), graph(1), graph(3)]);
        t.remove(graph(2));
        assert_eq!(t.in_order(), vec![graph(1), graph(3)]);
        // Removal never shrinks the table: 4 → slot 3 of the 8.
        t.insert(graph(4));
        assert_eq!(t.in_order(), vec![graph(4), graph(1), graph(3)]);
    }

    #[test]
    fn colliding_keys_probe_forward_and_close_up_on_removal() {
        // MemPool ids hash by their first half: (5, 0) and (0, 5) collide.
        let mut t = FreeablePools::default();
        t.insert(PoolId(5, 0));
        t.insert(PoolId(0, 5));
        assert_eq!(t.in_order(), vec![PoolId(5, 0), PoolId(0, 5)]);
        t.remove(PoolId(5, 0));
        assert_eq!(t.in_order(), vec![PoolId(0, 5)]);
        assert_eq!(t.find(PoolId(0, 5)), Some(t.desired(PoolId(0, 5))));
    }
}
