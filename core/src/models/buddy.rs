//! `buddy`: a binary buddy allocator over heaps taken from the device (peers.md §B.8).
//!
//! Facts it rests on: blocks are powers of two from a minimum leaf size; a block is split
//! by halving; a freed block merges with its buddy — the block at `offset XOR size` in the
//! same heap — whenever the buddy is free and whole, repeatedly. Internal waste is up to
//! +100 % of a request (about +50 % for uniform sizes).
//!
//! Rules of the model (the parts a buddy allocator leaves open, fixed here): a request is
//! rounded up to a power of two, at least `min_block` bytes. The smallest free block that
//! holds it is taken, the lowest address among equals, and halved down to the needed size
//! (the lower half is kept, upper halves become free). When no free block is big enough a
//! new heap of `heap_size_mb` is taken from the device — or of the request's size when that
//! is bigger; if the device refuses, heaps that are entirely free are returned and the
//! request is tried once more. Heaps are otherwise cached until `empty_cache`, which
//! returns every entirely free heap. Streams and private pools make no difference.
//!
//! Config keys: `min_block` (bytes, a power of two from 256; default 512),
//! `heap_size_mb` (a power of two ≥ 2; default 256).

use super::AllocatorKind;
use super::common::{self, Arena, FreeKey};
use super::common::{ArenaPolicy, Block, Refusal};
use super::{AllocRequest, ModelEvent};
use crate::device::Device;
use crate::models::common::policy::arena_accessors;
use crate::units::format_size;

/// The options a config string sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuddyConfig {
    pub min_block_bytes: u64,
    pub heap_bytes: u64,
}

impl BuddyConfig {
    const DEFAULT: BuddyConfig = BuddyConfig {
        min_block_bytes: 512,
        heap_bytes: 256 << 20,
    };

    /// Parses `key:value,…` on top of the defaults.
    pub fn parse(conf: &str) -> Result<BuddyConfig, common::ConfigError> {
        let kv = common::parse_config(AllocatorKind::Buddy, conf, &["min_block", "heap_size_mb"])?;
        let mut c = BuddyConfig::DEFAULT;
        for (k, v) in kv {
            if k == "min_block" {
                c.min_block_bytes = common::parse_pow2(AllocatorKind::Buddy, k, v, 256, 1 << 30)?;
            } else {
                c.heap_bytes = common::parse_pow2(AllocatorKind::Buddy, k, v, 2, 1 << 20)? << 20;
            }
        }
        if c.min_block_bytes > c.heap_bytes {
            return Err(common::ConfigError::Inconsistent {
                model: AllocatorKind::Buddy,
                reason: "min_block exceeds the heap size",
            });
        }
        Ok(c)
    }

    /// The options that differ from the defaults.
    #[must_use]
    pub fn canonical(&self) -> String {
        let d = BuddyConfig::DEFAULT;
        common::join_options([
            common::changed("min_block", self.min_block_bytes, d.min_block_bytes),
            common::changed("heap_size_mb", self.heap_bytes >> 20, d.heap_bytes >> 20),
        ])
    }
}

/// The buddy allocator of one device.
#[derive(Debug, Clone)]
pub struct BuddyModel {
    cfg: BuddyConfig,
    arena: Arena,
}

fn key(b: &common::Block) -> common::FreeKey {
    FreeKey::new(0, b.size, b.addr)
}

impl BuddyModel {
    /// A model with this configuration.
    #[must_use]
    pub fn new(cfg: BuddyConfig) -> BuddyModel {
        BuddyModel {
            cfg,
            arena: Arena::new(),
        }
    }

    /// The block size a request of `size` bytes needs.
    #[must_use]
    pub fn block_size(&self, size: u64) -> u64 {
        size.max(self.cfg.min_block_bytes).next_power_of_two()
    }

    /// Takes the smallest free block of at least `need` bytes and halves it down to `need`.
    fn take(&mut self, need: u64) -> Option<u32> {
        let (_, i) = self.arena.first_free_from(FreeKey::new(0, need, 0))?;
        self.arena.remove_free(i);
        while self.arena.b(i).size > need {
            let half = self.arena.b(i).size / 2;
            let t = self.arena.split(i, half);
            let k = key(self.arena.b(t));
            self.arena.insert_free(t, k);
        }
        Some(i)
    }

    /// Returns every entirely free heap to the device.
    fn release_free_heaps(&mut self, dev: &mut dyn Device, out: &mut Vec<ModelEvent>) -> bool {
        self.arena.release_free_segments(dev, out, |_| true)
    }

    fn new_heap(
        &mut self,
        dev: &mut dyn Device,
        need: u64,
        stream: u64,
        out: &mut Vec<ModelEvent>,
    ) -> bool {
        let size = self.cfg.heap_bytes.max(need);
        let Ok(addr) = self.arena.dev_malloc(dev, size, stream, out) else {
            return false;
        };
        let b = self.arena.add_free_segment(addr, size, stream, 0);
        let k = key(self.arena.b(b));
        self.arena.insert_free(b, k);
        true
    }
}

impl ArenaPolicy for BuddyModel {
    const KIND: AllocatorKind = AllocatorKind::Buddy;

    arena_accessors!(cfg);

    #[inline]
    fn find(
        &mut self,
        dev: &mut dyn Device,
        req: &AllocRequest,
        out: &mut Vec<ModelEvent>,
    ) -> Result<u32, Refusal> {
        let need = self.block_size(req.size_bytes);
        let stream = req.stream;
        let mut found = self.take(need);
        if found.is_none()
            && (self.new_heap(dev, need, stream, out)
                || (self.release_free_heaps(dev, out) && self.new_heap(dev, need, stream, out)))
        {
            found = self.take(need);
        }
        found.ok_or_else(|| {
            let heap = self.cfg.heap_bytes.max(need);
            Refusal::new(
                need,
                heap,
                format!(
                    "no free block of {} and the device refused a new {} heap ({} free)",
                    format_size(need),
                    format_size(heap),
                    format_size(dev.free_bytes())
                ),
            )
        })
    }

    /// Frees block `i` (not indexed), merging it with its buddy while the buddy is free.
    fn put_back(&mut self, _dev: &mut dyn Device, i: u32, _out: &mut Vec<ModelEvent>) {
        let base = self.arena.seg(self.arena.b(i).seg).base;
        let mut cur = i;
        loop {
            let (addr, size) = (self.arena.b(cur).addr, self.arena.b(cur).size);
            if size == self.arena.seg(self.arena.b(cur).seg).size {
                break;
            }
            let off = addr - base;
            if (off ^ size) > off {
                let n = self.arena.b(cur).next;
                if n == common::NIL || !self.arena.b(n).indexed || self.arena.b(n).size != size {
                    break;
                }
                self.arena.remove_free(n);
                self.arena.absorb_next(cur);
            } else {
                let p = self.arena.b(cur).prev;
                if p == common::NIL || !self.arena.b(p).indexed || self.arena.b(p).size != size {
                    break;
                }
                self.arena.remove_free(p);
                self.arena.absorb_next(p);
                cur = p;
            }
        }
        let k = key(self.arena.b(cur));
        self.arena.insert_free(cur, k);
    }

    fn release_cached(&mut self, dev: &mut dyn Device, out: &mut Vec<ModelEvent>) {
        self.release_free_heaps(dev, out);
    }

    fn adjacent_free_ok(&self, a: &Block, b: &Block) -> bool {
        // Two free neighbours are fine unless they are buddies (then they should be one).
        let base = self.arena.seg(a.seg).base;
        !(a.size == b.size && ((a.addr - base) ^ a.size) == b.addr - base)
    }

    fn check_policy(&self) -> Result<(), String> {
        let arena = &self.arena;
        for (s, seg) in arena.segments() {
            if !seg.size.is_power_of_two() {
                return Err(format!("heap {:#x} is not a power of two", seg.base));
            }
            for b in arena.seg_blocks(s) {
                let blk = arena.b(b);
                let off = blk.addr - seg.base;
                if !blk.size.is_power_of_two()
                    || blk.size < self.cfg.min_block_bytes
                    || !off.is_multiple_of(blk.size)
                {
                    return Err(format!(
                        "block at {:#x} ({} bytes) is not an aligned power of two",
                        blk.addr, blk.size
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::common::testing::Run;
    use crate::models::{Allocator, LayoutBlockState};

    const MIB: u64 = 1 << 20;

    impl Run<BuddyModel> {
        fn with(conf: &str, cap: Option<u64>) -> Self {
            Run::new(BuddyModel::new(BuddyConfig::parse(conf).unwrap()), cap)
        }

        /// The blocks, each as its size and whether it is free.
        fn free_map(&self) -> Vec<(u64, bool)> {
            self.blocks()
                .into_iter()
                .map(|(size, state)| (size, state == LayoutBlockState::Free))
                .collect()
        }
    }

    #[test]
    fn halving_then_merging_restores_the_heap() {
        let mut r = Run::with("heap_size_mb:2", None);
        let a = r.alloc(100 * 1024).unwrap(); // 128 KiB block: 2 MiB halved four times
        let k = 1024;
        assert_eq!(
            r.free_map(),
            vec![
                (128 * k, false),
                (128 * k, true),
                (256 * k, true),
                (512 * k, true),
                (MIB, true)
            ]
        );
        let b = r.alloc(128 * k).unwrap(); // its buddy
        assert_eq!(b, a + 128 * k);
        assert_eq!(r.m.stats().allocated_bytes, 256 * k);
        assert_eq!(r.m.stats().requested_bytes, 228 * k);
        r.free(a);
        // a's buddy b is live: no merge.
        assert_eq!(r.m.stats().free_holes, 4);
        r.free(b);
        // Now a+b merge, then with 256 KiB, 512 KiB and 1 MiB: one free heap again.
        assert_eq!(r.free_map(), vec![(2 * MIB, true)]);
    }

    #[test]
    fn free_neighbours_that_are_not_buddies_stay_apart() {
        let mut r = Run::with("heap_size_mb:2,min_block:262144", None);
        let q: Vec<u64> = (0..4).map(|_| r.alloc(256 * 1024).unwrap()).collect();
        let base = q[0];
        assert_eq!(q, (0..4).map(|i| base + i * 256 * 1024).collect::<Vec<_>>());
        r.free(q[1]);
        r.free(q[2]);
        // q1 and q2 touch but are not buddies (q1's buddy is q0, q2's is q3).
        assert_eq!(r.m.stats().free_holes, 3);
        assert_eq!(r.m.stats().largest_free_bytes, MIB);
        r.free(q[0]);
        assert_eq!(r.m.stats().largest_free_bytes, MIB);
        r.free(q[3]);
        assert_eq!(r.free_map(), vec![(2 * MIB, true)]);
    }

    #[test]
    fn big_requests_get_their_own_heap_and_free_heaps_are_released_on_failure() {
        let mut r = Run::with("heap_size_mb:2", Some(8 * MIB));
        let a = r.alloc(3 * MIB).unwrap();
        assert_eq!(r.m.stats().reserved_bytes, 4 * MIB);
        assert_eq!(r.m.stats().allocated_bytes, 4 * MIB);
        r.free(a);
        // 4 MiB cached; a 8 MiB request fits only once the free heap is returned.
        r.alloc(5 * MIB).unwrap();
        assert_eq!(r.m.stats().reserved_bytes, 8 * MIB);
        assert!(r.alloc(1).is_err());
    }
}
