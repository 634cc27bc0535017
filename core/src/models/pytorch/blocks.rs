//! Blocks and segments: the slots they live in, the free index of each pool (mapped free
//! blocks by (stream, size, address); unmapped ranges by (stream, address)), merging (§6:
//! only free, mapped — or both unmapped — neighbours of one segment merge), splitting a
//! found block (`should_split` and `alloc_found_block`, §5.9), freeing a block back to its
//! pool, and the largest free block.

use super::free_index::FreePos;
use super::{
    Block, MIN_BLOCK_BYTES, NIL, OldEntry, PyTorchModel, SMALL_SIZE_BYTES, Segment, SegmentIndex,
};
use crate::models::ModelEvent;
use crate::snapshot::Action;

impl PyTorchModel {
    pub(super) fn new_block(&mut self, b: Block) -> u32 {
        if let Some(i) = self.free_slots.pop() {
            self.blocks[i as usize] = b;
            i
        } else {
            self.blocks.push(b);
            (self.blocks.len() - 1) as u32
        }
    }

    pub(super) fn delete_block(&mut self, i: u32) {
        self.free_slots.push(i);
    }

    pub(super) fn new_segment(&mut self, s: Segment) -> u32 {
        self.any_expandable |= s.expandable;
        let (base, size) = (s.base, s.size);
        let i = if let Some(i) = self.free_segment_slots.pop() {
            self.segments[i as usize] = s;
            i
        } else {
            self.segments.push(s);
            (self.segments.len() - 1) as u32
        };
        self.seg_index.insert(base, size, i);
        i
    }

    /// Segment `seg` is released: no longer live, its slot free for the next one.
    pub(super) fn retire_segment(&mut self, seg: u32) {
        let s = &mut self.segments[seg as usize];
        s.live = false;
        let base = s.base;
        self.free_segment_slots.push(seg);
        self.seg_index.remove(base, seg);
    }

    pub(super) fn b(&self, i: u32) -> &Block {
        &self.blocks[i as usize]
    }

    pub(super) fn bm(&mut self, i: u32) -> &mut Block {
        &mut self.blocks[i as usize]
    }

    pub(super) fn is_split(&self, i: u32) -> bool {
        let b = self.b(i);
        b.prev != NIL || b.next != NIL
    }

    pub(super) fn is_expandable(&self, i: u32) -> bool {
        self.segments[self.b(i).seg as usize].expandable
    }

    pub(super) fn insert_free(&mut self, i: u32) {
        let (pool, stream, size, addr) = {
            let b = self.b(i);
            (b.pool, b.stream, b.size, b.addr)
        };
        let count = self.pools[pool as usize].get_free_blocks_call_count;
        self.bm(i).gc_base = count;
        self.pools[pool as usize]
            .blocks
            .insert(stream, size, addr, i);
        self.free_holes += 1;
        if let Some(l) = self.largest_free_cache.get() {
            self.largest_free_cache.set(Some(l.max(size)));
        }
    }

    pub(super) fn remove_free(&mut self, i: u32) {
        let b = self.b(i);
        let (stream, size, addr) = (b.stream, b.size, b.addr);
        let pool = b.pool as usize;
        if self.pools[pool].blocks.remove(stream, size, addr) {
            self.removed_free(size);
        }
    }

    /// `remove_free` of block `i`, whose entry `get_free_block` has just found at `at`.
    pub(super) fn remove_free_at(&mut self, i: u32, at: FreePos) {
        let b = self.b(i);
        let (size, pool) = (b.size, b.pool as usize);
        self.pools[pool].blocks.remove_at(at);
        self.removed_free(size);
    }

    /// The counters' side of taking a free block of `size` out of its pool.
    pub(super) fn removed_free(&mut self, size: u64) {
        self.free_holes -= 1;
        if self.largest_free_cache.get().is_some_and(|l| l <= size) {
            self.largest_free_cache.set(None);
        }
    }

    /// `remove_free` of the entry `old` (of size `old_size`) followed by `insert_free(i)`,
    /// as one move inside the pool's index where the order allows (`i` is the block that
    /// entry stood for, split or merged since; same pool and stream).
    pub(super) fn reindex_free(&mut self, i: u32, old_size: u64, old: OldEntry) {
        let (pool, stream, size, addr) = {
            let b = self.b(i);
            (b.pool, b.stream, b.size, b.addr)
        };
        self.removed_free(old_size);
        let p = &mut self.pools[pool as usize];
        let count = p.get_free_blocks_call_count;
        let moved = match old {
            OldEntry::Addr(old_addr) => {
                p.blocks
                    .reposition(stream, (old_size, old_addr), (size, addr), i)
            }
            OldEntry::At(at) => p.blocks.reposition_at(at, (size, addr), i),
        };
        debug_assert!(moved, "free block of {old_size} bytes not indexed");
        self.bm(i).gc_base = count;
        self.free_holes += 1;
        if let Some(l) = self.largest_free_cache.get() {
            self.largest_free_cache.set(Some(l.max(size)));
        }
    }

    pub(super) fn insert_unmapped(&mut self, i: u32) {
        let b = self.b(i);
        let key = (b.stream, b.addr);
        let pool = b.pool as usize;
        self.pools[pool].unmapped.insert(key, i);
    }

    pub(super) fn remove_unmapped(&mut self, i: u32) {
        let b = self.b(i);
        let key = (b.stream, b.addr);
        let pool = b.pool as usize;
        self.pools[pool].unmapped.remove(&key);
    }

    pub(super) fn free_mergeable(&self, i: u32) -> bool {
        i != NIL && {
            let b = self.b(i);
            !b.allocated && !b.pending
        }
    }

    /// `try_merge_blocks(dst, src)`: absorbs the free neighbour `src` into `dst`.
    pub(super) fn try_merge(&mut self, dst: u32, src: u32) -> u64 {
        self.try_merge_reusing(dst, src, None)
    }

    /// `try_merge_blocks(dst, src)`. With `reuse` holding `None`, a mapped `src`'s index
    /// entry is left in place (counted as removed) and named in `reuse`, for the caller to
    /// move to the merged block with [`Self::reindex_free`].
    pub(super) fn try_merge_reusing(
        &mut self,
        dst: u32,
        src: u32,
        reuse: Option<&mut Option<(u64, u64)>>,
    ) -> u64 {
        if src == NIL || !self.free_mergeable(src) || self.b(dst).mapped != self.b(src).mapped {
            return 0;
        }
        if self.b(src).mapped {
            match reuse {
                Some(slot @ None) => {
                    let b = self.b(src);
                    *slot = Some((b.size, b.addr));
                }
                _ => self.remove_free(src),
            }
        } else {
            self.remove_unmapped(src);
        }
        let s = self.b(src).clone();
        if self.b(dst).prev == src {
            let d = self.bm(dst);
            d.addr = s.addr;
            d.prev = s.prev;
            if s.prev != NIL {
                self.bm(s.prev).next = dst;
            }
        } else {
            self.bm(dst).next = s.next;
            if s.next != NIL {
                self.bm(s.next).prev = dst;
            }
        }
        self.bm(dst).size += s.size;
        self.delete_block(src);
        s.size
    }

    pub(super) fn should_split(&self, i: u32, size: u64) -> bool {
        let b = self.b(i);
        let remaining = b.size - size;
        if self.pools[b.pool as usize].small || self.cfg.expandable_segments {
            remaining >= MIN_BLOCK_BYTES
        } else {
            size < self.cfg.max_split_size_bytes && remaining > SMALL_SIZE_BYTES
        }
    }

    /// `alloc_found_block`: carves the request from the low end of the block. `indexed`:
    /// the block is still in its pool's free index, where `get_free_block` found it.
    pub(super) fn alloc_found_block(
        &mut self,
        i: u32,
        orig: u64,
        size: u64,
        split: bool,
        indexed: Option<FreePos>,
    ) -> u32 {
        if let (Some(at), false) = (indexed, split) {
            self.remove_free_at(i, at);
        }
        let blk = if split {
            let r = self.b(i).clone();
            let nb = self.new_block(Block {
                addr: r.addr,
                size,
                requested: orig,
                stream: r.stream,
                pool: r.pool,
                seg: r.seg,
                prev: r.prev,
                next: i,
                allocated: true,
                pending: false,
                mapped: true,
                gc_base: 0,
            });
            if r.prev != NIL {
                self.bm(r.prev).next = nb;
            }
            {
                let rem = self.bm(i);
                rem.prev = nb;
                rem.addr += size;
                rem.size -= size;
            }
            match indexed {
                Some(at) => self.reindex_free(i, r.size, OldEntry::At(at)),
                None => self.insert_free(i),
            }
            nb
        } else {
            let b = self.bm(i);
            b.allocated = true;
            b.requested = orig;
            i
        };
        let (addr, bsize) = (self.b(blk).addr, self.b(blk).size);
        self.allocated_bytes += bsize;
        self.requested_bytes += orig;
        self.active.insert(addr, blk);
        blk
    }

    /// `free_block`: back to the pool, merged with free neighbours (the caller has taken
    /// it out of `active`).
    pub(super) fn free_block(&mut self, i: u32, out: &mut Vec<ModelEvent>) {
        let (addr, req, stream) = {
            let b = self.b(i);
            (b.addr, b.requested, b.stream)
        };
        out.push(ModelEvent {
            action: Action::FreeCompleted,
            addr,
            size: req,
            stream,
        });
        self.requested_bytes -= req;
        {
            let b = self.bm(i);
            b.pending = false;
            b.allocated = false;
        }
        self.merge_free(i);
    }

    /// Merges the mapped free block `i` with its free neighbours and puts it into its
    /// pool: a merged neighbour's index entry is moved to the result rather than removed
    /// and a new one inserted.
    pub(super) fn merge_free(&mut self, i: u32) {
        let mut reuse = None;
        let prev = self.b(i).prev;
        self.try_merge_reusing(i, prev, Some(&mut reuse));
        let next = self.b(i).next;
        self.try_merge_reusing(i, next, Some(&mut reuse));
        match reuse {
            Some((size, addr)) => self.reindex_free(i, size, OldEntry::Addr(addr)),
            None => self.insert_free(i),
        }
    }

    /// Free bytes and holes of one pool on one stream, and its largest free block.
    pub(super) fn pool_stream_free(&self, pool: u32, stream: u64) -> (u64, u64, u64) {
        let mut bytes = 0;
        let mut holes = 0;
        let mut largest = 0;
        for (size, _, _) in self.pools[pool as usize].blocks.at_least(stream, 0) {
            bytes += size;
            holes += 1;
            largest = largest.max(size);
        }
        (bytes, holes, largest)
    }

    /// The largest free block of any pool (cached until a block of that size leaves).
    #[inline]
    pub(super) fn largest_free(&self) -> u64 {
        if let Some(l) = self.largest_free_cache.get() {
            return l;
        }
        let l = self.compute_largest_free();
        self.largest_free_cache.set(Some(l));
        l
    }

    pub(super) fn compute_largest_free(&self) -> u64 {
        self.pools
            .iter()
            .map(|p| p.blocks.largest())
            .max()
            .unwrap_or(0)
    }
}

impl SegmentIndex {
    /// A live segment `slot` of `size` bytes at `base`; the index is given up if its range
    /// wraps or meets another live segment's (or is empty: it holds no address, which
    /// the walk also says, but the index keeps only ranges that hold one).
    fn insert(&mut self, base: u64, size: u64, slot: u32) {
        if self.given_up {
            return;
        }
        let Some(end) = base.checked_add(size).filter(|_| size > 0) else {
            self.give_up();
            return;
        };
        let k = self.ranges.partition_point(|&(b, _, _)| b < base);
        let clear_before = k == 0 || self.ranges[k - 1].1 <= base;
        let clear_after = self.ranges.get(k).is_none_or(|&(b, _, _)| end <= b);
        if clear_before && clear_after {
            self.ranges.insert(k, (base, end, slot));
        } else {
            self.give_up();
        }
    }

    /// Segment `slot` at `base` is no longer live.
    fn remove(&mut self, base: u64, slot: u32) {
        if self.given_up {
            return;
        }
        let k = self.ranges.partition_point(|&(b, _, _)| b < base);
        if self
            .ranges
            .get(k)
            .is_some_and(|&(b, _, s)| b == base && s == slot)
        {
            self.ranges.remove(k);
        } else {
            // Not where it was put: the walk answers from here on.
            self.give_up();
        }
    }

    fn give_up(&mut self) {
        self.given_up = true;
        self.ranges = Vec::new();
    }
}
