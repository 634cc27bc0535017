//! The shared arena: segments, blocks, the free index, the live map and the counters. The
//! structure lives here; `blocks.rs` splits, merges, indexes and frees blocks, `device.rs`
//! makes the device calls, `check.rs` exports the layout and checks the invariants.

mod blocks;
mod check;
mod device;
#[cfg(test)]
mod tests;

use super::free_key::FreeKey;
use super::hasher::AddrMap;
use super::largest_free::LargestFree;
use crate::models::ModelStats;
use crate::models::sorted_index::SortedIndex;

/// "No block" in the neighbour links.
pub const NIL: u32 = u32::MAX;

/// State of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Free and held from the device: in the free index exactly once.
    Free,
    /// A live allocation: in the live map.
    Allocated,
    /// Freed by the program, waiting for other streams (`record_stream`): still in the
    /// live map, no longer counted as allocated.
    Pending,
    /// Reserved address space with no memory behind it (VMM models).
    Unmapped,
}

/// One block: a piece of a segment.
#[derive(Debug, Clone)]
pub struct Block {
    pub addr: u64,
    pub size: u64,
    /// Bytes the allocation asked for (0 unless allocated or pending).
    pub requested: u64,
    /// The stream of the allocation that holds (or last held) the block.
    pub stream: u64,
    /// Index of the segment.
    pub seg: u32,
    /// Address-order neighbours inside the segment (`NIL` at the ends).
    pub prev: u32,
    pub next: u32,
    pub state: State,
    /// Model-defined merge group (an RMM stream list, an arena superblock): the generic
    /// merge only joins free neighbours of the same owner.
    pub owner: u64,
    /// The block's key in the free index while it is [`State::Free`].
    pub key: FreeKey,
    /// Whether the block is in the free index (a free block between being freed or split
    /// and being indexed is not).
    pub indexed: bool,
}

/// One segment: a `cudaMalloc`'d range or a VMM reservation.
#[derive(Debug, Clone)]
pub struct Segment {
    pub base: u64,
    pub size: u64,
    /// Bytes of device memory this segment holds (its whole pages for a malloc, its mapped
    /// bytes for a reservation); the sum over live segments is `reserved_bytes`.
    pub held: u64,
    pub stream: u64,
    pub small: bool,
    /// A VMM reservation (mapped page by page) rather than a malloc.
    pub expandable: bool,
    /// Model-defined tag (a region number, a bin, a pool kind).
    pub tag: u64,
    /// First block (lowest address).
    pub head: u32,
    pub live: bool,
}

/// The shared arena: segments, blocks, free index, live map and counters.
///
/// Invariants (checked by [`Arena::check`]): the blocks of every live segment tile it in
/// address order with consistent `prev`/`next` links; every `Free` block is in the free
/// index exactly once under its stored key and nothing else is; every `Allocated` or
/// `Pending` block is in the live map under its address and nothing else is; the byte
/// counters equal the sums they stand for; live segments do not overlap.
#[derive(Debug, Clone, Default)]
pub struct Arena {
    blocks: Vec<Block>,
    free_block_slots: Vec<u32>,
    segs: Vec<Segment>,
    free_seg_slots: Vec<u32>,
    /// Allocated and pending blocks by address.
    live: AddrMap,
    /// Free blocks by their model-chosen key.
    free: SortedIndex<FreeKey>,
    /// The sizes of the free blocks: the largest free block in O(1).
    largest: LargestFree,
    /// Σ `held` over live segments.
    reserved_bytes: u64,
    /// Σ size of `Allocated` blocks.
    allocated_bytes: u64,
    /// Σ requested of `Allocated` and `Pending` blocks.
    requested_bytes: u64,
    /// Σ size of `Free` blocks.
    free_bytes: u64,
    /// Device calls so far (malloc, free, map, unmap).
    segment_ops: u64,
    live_segments: u32,
}

impl Arena {
    /// An empty arena.
    #[must_use]
    pub fn new() -> Arena {
        Arena::default()
    }

    /// Block `i`.
    #[must_use]
    pub fn b(&self, i: u32) -> &Block {
        &self.blocks[i as usize]
    }

    /// Block `i`, mutable. Changing `addr`, `size`, `state` or `key` directly breaks the
    /// invariants; use the arena's methods for those.
    pub fn bm(&mut self, i: u32) -> &mut Block {
        &mut self.blocks[i as usize]
    }

    /// Segment `s`.
    #[must_use]
    pub fn seg(&self, s: u32) -> &Segment {
        &self.segs[s as usize]
    }

    /// Segment `s`, mutable (only `tag` and `stream` may be changed directly).
    pub fn seg_mut(&mut self, s: u32) -> &mut Segment {
        &mut self.segs[s as usize]
    }

    /// Live segments in index order, with their indexes.
    pub fn segments(&self) -> impl Iterator<Item = (u32, &Segment)> {
        self.segs
            .iter()
            .enumerate()
            .filter(|(_, s)| s.live)
            .map(|(i, s)| (i as u32, s))
    }

    /// Number of live segments.
    #[must_use]
    pub fn segment_count(&self) -> u32 {
        self.live_segments
    }

    /// The blocks of segment `s` in address order.
    pub fn seg_blocks(&self, s: u32) -> impl Iterator<Item = u32> + '_ {
        let mut x = self.segs[s as usize].head;
        std::iter::from_fn(move || {
            if x == NIL {
                return None;
            }
            let cur = x;
            x = self.blocks[cur as usize].next;
            Some(cur)
        })
    }

    /// The live (allocated or pending) block at `addr`.
    #[must_use]
    pub fn live_block(&self, addr: u64) -> Option<u32> {
        self.live.get(&addr).copied()
    }

    /// Bytes held from the device.
    #[must_use]
    pub fn reserved_bytes(&self) -> u64 {
        self.reserved_bytes
    }

    /// Bytes of allocated blocks.
    #[must_use]
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated_bytes
    }

    /// Bytes of free blocks.
    #[must_use]
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Number of free blocks.
    #[must_use]
    pub fn free_count(&self) -> u64 {
        self.free.len() as u64
    }

    /// The largest free block.
    #[must_use]
    pub fn largest_free(&self) -> u64 {
        self.largest.largest()
    }

    /// Counts one more device call that did not go through the arena's device helpers
    /// (e.g. a `cudaMalloc` the driver serves from an already-held page).
    pub fn count_segment_op(&mut self) {
        self.segment_ops += 1;
    }

    /// Totals, with the model's own largest free block and free-hole count.
    #[must_use]
    pub fn stats_with(&self, largest_free_bytes: u64, free_holes: u64) -> ModelStats {
        ModelStats {
            reserved_bytes: self.reserved_bytes,
            allocated_bytes: self.allocated_bytes,
            requested_bytes: self.requested_bytes,
            largest_free_bytes,
            free_holes,
            segment_ops: self.segment_ops,
        }
    }

    /// Totals over all free blocks.
    #[must_use]
    pub fn stats(&self) -> ModelStats {
        self.stats_with(self.largest_free(), self.free_count())
    }

    fn new_block(&mut self, b: Block) -> u32 {
        if let Some(i) = self.free_block_slots.pop() {
            self.blocks[i as usize] = b;
            i
        } else {
            self.blocks.push(b);
            (self.blocks.len() - 1) as u32
        }
    }

    /// Adds a segment of `size` bytes at `base` holding `held` bytes of device memory, with
    /// one block covering it in `state` (`Free` blocks are *not* indexed yet: the caller
    /// allocates from it or calls [`Arena::insert_free`]). Returns (segment, block).
    #[allow(clippy::too_many_arguments)]
    pub fn add_segment(
        &mut self,
        base: u64,
        size: u64,
        held: u64,
        stream: u64,
        small: bool,
        expandable: bool,
        tag: u64,
        state: State,
    ) -> (u32, u32) {
        let seg = Segment {
            base,
            size,
            held,
            stream,
            small,
            expandable,
            tag,
            head: NIL,
            live: true,
        };
        let s = if let Some(s) = self.free_seg_slots.pop() {
            self.segs[s as usize] = seg;
            s
        } else {
            self.segs.push(seg);
            (self.segs.len() - 1) as u32
        };
        let b = self.new_block(Block {
            addr: base,
            size,
            requested: 0,
            stream,
            seg: s,
            prev: NIL,
            next: NIL,
            state,
            owner: 0,
            key: FreeKey::default(),
            indexed: false,
        });
        self.segs[s as usize].head = b;
        self.reserved_bytes += held;
        self.live_segments += 1;
        (s, b)
    }

    /// Changes the device memory a segment holds (a VMM map or unmap inside it).
    pub fn set_held(&mut self, s: u32, held: u64) {
        let seg = &mut self.segs[s as usize];
        self.reserved_bytes = self.reserved_bytes - seg.held + held;
        seg.held = held;
    }

    /// Removes segment `s`, whose blocks must all be free or unmapped (they leave the free
    /// index). Returns (base, size, held).
    pub fn remove_segment(&mut self, s: u32) -> Result<(u64, u64, u64), String> {
        let blocks: Vec<u32> = self.seg_blocks(s).collect();
        if let Some(&b) = blocks
            .iter()
            .find(|&&b| matches!(self.b(b).state, State::Allocated | State::Pending))
        {
            return Err(format!(
                "segment {:#x} still has a live block at {:#x}",
                self.seg(s).base,
                self.b(b).addr
            ));
        }
        for b in blocks {
            if self.b(b).state == State::Free && self.is_indexed(b) {
                self.remove_free(b);
            }
            self.free_block_slots.push(b);
            self.blocks[b as usize].state = State::Unmapped;
        }
        let seg = &mut self.segs[s as usize];
        seg.live = false;
        seg.head = NIL;
        self.reserved_bytes -= seg.held;
        self.live_segments -= 1;
        let r = (seg.base, seg.size, seg.held);
        self.free_seg_slots.push(s);
        Ok(r)
    }
}
