//! Garbage collection (§5.4, `garbage_collection_threshold` under a memory limit): when a
//! malloc finds no free block and reserved memory is above the threshold, the default
//! large pool's unsplit free blocks at least as old as their average age are released, in
//! rounds, until the excess is reclaimed.

use super::{DEFAULT_LARGE, PyTorchModel};
use crate::device::Device;
use crate::models::ModelEvent;

impl PyTorchModel {
    /// `garbage_collect_cached_blocks` (§5.4).
    pub(super) fn garbage_collect(&mut self, dev: &mut dyn Device, out: &mut Vec<ModelEvent>) {
        let Some(limit) = self.limit_bytes else {
            return;
        };
        let threshold = (self.cfg.garbage_collection_threshold * limit as f64) as u64;
        if self.reserved_bytes <= threshold {
            return;
        }
        let target = self.reserved_bytes - threshold;
        let (count_now, mut total_age, mut count) = self.gc_ages();
        if count == 0 {
            return;
        }
        let mut reclaimed = 0u64;
        let mut freed = true;
        while reclaimed < target && freed && count > 0 {
            let avg = total_age / count as f64;
            freed = false;
            let all: Vec<u32> = self.pools[DEFAULT_LARGE as usize].blocks.values();
            for i in all {
                if !self.is_split(i) && !self.is_expandable(i) {
                    let age = (count_now - self.b(i).gc_base) as f64;
                    if age >= avg {
                        freed = true;
                        reclaimed += self.b(i).size;
                        total_age -= age;
                        count -= 1;
                        self.release_block(dev, i, out);
                    }
                }
            }
        }
    }

    /// The default large pool's age count now, and the total age and number of its unsplit
    /// free blocks: what a collection's first round averages.
    fn gc_ages(&self) -> (u64, f64, u64) {
        let pool = &self.pools[DEFAULT_LARGE as usize];
        let count_now = pool.get_free_blocks_call_count;
        let mut total_age = 0.0f64;
        let mut count = 0u64;
        for i in pool.blocks.values() {
            if !self.is_split(i) {
                total_age += (count_now - self.b(i).gc_base) as f64;
                count += 1;
            }
        }
        (count_now, total_age, count)
    }

    /// Whether a collection run now, with reserved memory above its threshold, would
    /// release a block: its first round does (a block at least as old as the average),
    /// or no round does. Changes nothing (`core::prefix`: a threshold whose collection
    /// releases nothing decides as no threshold).
    #[must_use]
    pub fn peek_collects(&self) -> bool {
        let (count_now, total_age, count) = self.gc_ages();
        if count == 0 {
            return false;
        }
        let avg = total_age / count as f64;
        self.pools[DEFAULT_LARGE as usize]
            .blocks
            .values()
            .into_iter()
            .any(|i| {
                !self.is_split(i)
                    && !self.is_expandable(i)
                    && (count_now - self.b(i).gc_base) as f64 >= avg
            })
    }
}
