//! Segment and block bookkeeping shared by every model except `pytorch` (STYLE.md rule 3):
//! an index arena of segments and blocks with address-ordered neighbours, split and merge,
//! one ordered free index whose key each model chooses, the live-address map, the byte
//! counters, the device calls (with their events and the segment-op count), the layout
//! export, a generic `check_invariants`, and the `key:value` config parser.
//!
//! A model decides *policy* (which free block, when to split, what may merge, when to ask
//! the device); the [`Arena`] keeps the *structure* consistent. Nothing here iterates a
//! hash map, so every model built on it is deterministic.

use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use super::{
    Layout, LayoutBlock, LayoutBlockState, LayoutSegment, ModelError, ModelEvent, ModelStats,
    PoolId,
};
use crate::device::{Device, DeviceOom};
use crate::snapshot::Action;

use super::sorted_index::SortedIndex;

/// "No block" in the neighbour links.
pub const NIL: u32 = u32::MAX;

/// The physical page of CUDA memory: `cudaMalloc(n)` holds `n` rounded up to 2 MiB
/// (peers.md §B.5, §B.6), and the simulated device counts memory in these pages.
pub const PAGE_BYTES: u64 = 2 << 20;

/// `n` rounded up to a multiple of `align` (a power of two or any positive step).
#[must_use]
pub fn round_up(n: u64, align: u64) -> u64 {
    n.div_ceil(align).saturating_mul(align)
}

/// `n` rounded down to a multiple of `align`.
#[must_use]
pub fn round_down(n: u64, align: u64) -> u64 {
    n / align * align
}

/// Device memory a `cudaMalloc(size)` holds: whole 2 MiB pages.
#[must_use]
pub fn device_bytes(size: u64) -> u64 {
    round_up(size, PAGE_BYTES)
}

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

/// The largest free block in O(1): a max-heap of free sizes with a count per size; sizes
/// whose count drops to zero are popped once they reach the top, so the top is always live.
#[derive(Debug, Clone, Default)]
struct LargestFree {
    heap: BinaryHeap<u64>,
    counts: HashMap<u64, u32, BuildHasherDefault<AddrHasher>>,
}

impl LargestFree {
    fn insert(&mut self, size: u64) {
        let c = self.counts.entry(size).or_insert(0);
        if *c == 0 {
            self.heap.push(size);
        }
        *c += 1;
    }

    fn remove(&mut self, size: u64) {
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

    fn largest(&self) -> u64 {
        self.heap.peek().copied().unwrap_or(0)
    }
}

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

type AddrMap = HashMap<u64, u32, BuildHasherDefault<AddrHasher>>;

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

    /// Whether block `i` is in the free index.
    #[must_use]
    pub fn is_indexed(&self, i: u32) -> bool {
        self.b(i).indexed
    }

    /// Splits block `i` (not in the free index) after `first` bytes; the tail is a new block
    /// with the same state, owner and stream, not indexed. Returns the tail.
    pub fn split(&mut self, i: u32, first: u64) -> u32 {
        let (addr, size, seg, next, state, owner, stream) = {
            let b = self.b(i);
            (b.addr, b.size, b.seg, b.next, b.state, b.owner, b.stream)
        };
        debug_assert!(
            first > 0 && first < size,
            "split of a {size}-byte block at {first}"
        );
        let t = self.new_block(Block {
            addr: addr + first,
            size: size - first,
            requested: 0,
            stream,
            seg,
            prev: i,
            next,
            state,
            owner,
            key: FreeKey::default(),
            indexed: false,
        });
        if next != NIL {
            self.bm(next).prev = t;
        }
        let b = self.bm(i);
        b.size = first;
        b.next = t;
        t
    }

    /// Splits free block `i`, which stays in the free index under its key (a model whose keys
    /// do not depend on a block's size saves the re-keying), after `first` bytes. The tail is
    /// returned free and not indexed.
    pub fn split_indexed(&mut self, i: u32, first: u64) -> u32 {
        let size = self.b(i).size;
        debug_assert!(self.b(i).indexed, "split_indexed of an unindexed block");
        self.largest.remove(size);
        self.largest.insert(first);
        self.free_bytes -= size - first;
        self.split(i, first)
    }

    /// Merges the next block (free, not indexed) into free block `i`, which stays in the free
    /// index under its key (see [`Arena::split_indexed`]).
    pub fn absorb_next_indexed(&mut self, i: u32) {
        let size = self.b(i).size;
        debug_assert!(
            self.b(i).indexed,
            "absorb_next_indexed of an unindexed block"
        );
        let add = self.absorb_next(i);
        self.largest.remove(size);
        self.largest.insert(size + add);
        self.free_bytes += add;
    }

    /// Free block `i` (indexed, now `i_old_size` in the counts) leaves the free index and
    /// free block `t` (not indexed) enters it under `key`, in `i`'s slot when the order
    /// allows: one update instead of a removal and an insertion (a split that hands out the
    /// low part of a block whose keys follow addresses).
    pub fn transfer_index(&mut self, i: u32, i_old_size: u64, t: u32, key: FreeKey) {
        let old = self.b(i).key;
        self.largest.remove(i_old_size);
        self.free_bytes -= i_old_size;
        self.bm(i).indexed = false;
        if !self.free.replace(old, key, t) {
            self.free.remove(old);
            let fresh = self.free.insert(key, t);
            debug_assert!(fresh, "free key {key:?} used twice");
        }
        let size = {
            let b = self.bm(t);
            b.state = State::Free;
            b.key = key;
            b.indexed = true;
            b.size
        };
        self.largest.insert(size);
        self.free_bytes += size;
    }

    /// Merges `i`'s next neighbour into `i`. Neither may be in the free index; the next block
    /// must not be live. Returns the bytes absorbed.
    pub fn absorb_next(&mut self, i: u32) -> u64 {
        let n = self.b(i).next;
        let (nsize, nnext) = (self.b(n).size, self.b(n).next);
        if nnext != NIL {
            self.bm(nnext).prev = i;
        }
        let b = self.bm(i);
        b.size += nsize;
        b.next = nnext;
        self.free_block_slots.push(n);
        self.blocks[n as usize].state = State::Unmapped;
        nsize
    }

    /// Puts free block `i` into the free index under `key`.
    pub fn insert_free(&mut self, i: u32, key: FreeKey) {
        let size = {
            let b = self.bm(i);
            debug_assert!(!b.indexed, "block at {:#x} indexed twice", b.addr);
            b.state = State::Free;
            b.key = key;
            b.indexed = true;
            b.size
        };
        let fresh = self.free.insert(key, i);
        debug_assert!(fresh, "free key {key:?} used twice");
        self.largest.insert(size);
        self.free_bytes += size;
    }

    /// Takes free block `i` out of the free index (its state stays `Free` until the caller
    /// allocates or merges it).
    pub fn remove_free(&mut self, i: u32) {
        let (key, size) = (self.b(i).key, self.b(i).size);
        debug_assert!(
            self.b(i).indexed,
            "block at {:#x} is not indexed",
            self.b(i).addr
        );
        self.bm(i).indexed = false;
        self.free.remove(key);
        self.largest.remove(size);
        self.free_bytes -= size;
    }

    /// The first free block with key ≥ `from`.
    #[must_use]
    pub fn first_free_from(&self, from: FreeKey) -> Option<(FreeKey, u32)> {
        self.free.first_from(from)
    }

    /// The last free block with key < `below`.
    #[must_use]
    pub fn last_free_below(&self, below: FreeKey) -> Option<(FreeKey, u32)> {
        self.free.last_below(below)
    }

    /// Free blocks with keys in `[from, to)`, in key order.
    #[must_use = "an iterator does nothing unless used"]
    pub fn free_range(
        &self,
        from: FreeKey,
        to: FreeKey,
    ) -> impl Iterator<Item = (FreeKey, u32)> + '_ {
        self.free.range(from, to)
    }

    /// Marks block `i` (out of the free index) as allocated for a request of `requested`
    /// bytes on `stream`, and emits `alloc`.
    pub fn allocate(&mut self, i: u32, requested: u64, stream: u64, out: &mut Vec<ModelEvent>) {
        let b = self.bm(i);
        b.state = State::Allocated;
        b.requested = requested;
        b.stream = stream;
        let (addr, size) = (b.addr, b.size);
        self.allocated_bytes += size;
        self.requested_bytes += requested;
        self.live.insert(addr, i);
        out.push(ModelEvent {
            action: Action::Alloc,
            addr,
            size: requested,
            stream,
        });
    }

    /// The program frees `addr`: emits `free_requested`; with `deferred` the block becomes
    /// pending and `Ok(None)` is returned, else it is released (see [`Arena::complete`]).
    pub fn release(
        &mut self,
        addr: u64,
        deferred: bool,
        out: &mut Vec<ModelEvent>,
    ) -> Result<Option<u32>, ModelError> {
        let i = self
            .live_block(addr)
            .ok_or(ModelError::UnknownAddress(addr))?;
        if self.b(i).state != State::Allocated {
            return Err(ModelError::UnknownAddress(addr));
        }
        let (size, req, stream) = (self.b(i).size, self.b(i).requested, self.b(i).stream);
        self.allocated_bytes -= size;
        out.push(ModelEvent {
            action: Action::FreeRequested,
            addr,
            size: req,
            stream,
        });
        self.bm(i).state = State::Pending;
        if deferred {
            return Ok(None);
        }
        self.complete(addr, out).map(Some)
    }

    /// A pending free completes: emits `free_completed` and returns the block, now `Free`
    /// but neither merged nor indexed (the model does both).
    pub fn complete(&mut self, addr: u64, out: &mut Vec<ModelEvent>) -> Result<u32, ModelError> {
        let i = self.live_block(addr).ok_or(ModelError::NotPending(addr))?;
        if self.b(i).state != State::Pending {
            return Err(ModelError::NotPending(addr));
        }
        self.live.remove(&addr);
        let b = self.bm(i);
        let (req, stream) = (b.requested, b.stream);
        b.state = State::Free;
        b.requested = 0;
        self.requested_bytes -= req;
        out.push(ModelEvent {
            action: Action::FreeCompleted,
            addr,
            size: req,
            stream,
        });
        Ok(i)
    }

    /// Merges free block `i` (not indexed) with its free neighbours for which
    /// `can_merge(neighbour)` holds; merged neighbours leave the free index. Returns the
    /// surviving block (not indexed).
    pub fn coalesce(&mut self, i: u32, can_merge: impl Fn(&Block) -> bool) -> u32 {
        let mut cur = i;
        let n = self.b(cur).next;
        if n != NIL && self.b(n).indexed && can_merge(self.b(n)) {
            self.remove_free(n);
            self.absorb_next(cur);
        }
        let p = self.b(cur).prev;
        if p != NIL && self.b(p).indexed && can_merge(self.b(p)) {
            self.remove_free(p);
            self.absorb_next(p);
            cur = p;
        }
        cur
    }

    /// Merges adjacent `Unmapped` neighbours into unmapped block `i`. Returns the survivor.
    pub fn coalesce_unmapped(&mut self, i: u32) -> u32 {
        let mut cur = i;
        let n = self.b(cur).next;
        if n != NIL && self.b(n).state == State::Unmapped {
            self.absorb_next(cur);
        }
        let p = self.b(cur).prev;
        if p != NIL && self.b(p).state == State::Unmapped {
            self.absorb_next(p);
            cur = p;
        }
        cur
    }

    /// Turns free block `i` (not indexed) into unmapped address space.
    pub fn set_unmapped(&mut self, i: u32) {
        self.bm(i).state = State::Unmapped;
    }

    /// `cudaMalloc(size)` on the device: counts the op and emits `segment_alloc`.
    pub fn dev_malloc(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
        stream: u64,
        out: &mut Vec<ModelEvent>,
    ) -> Result<u64, DeviceOom> {
        let addr = dev.malloc(size, stream)?;
        self.segment_ops += 1;
        out.push(ModelEvent {
            action: Action::SegmentAlloc,
            addr,
            size,
            stream,
        });
        Ok(addr)
    }

    /// `cudaFree` of segment `s` (all its blocks free): removes it, counts the op and emits
    /// `segment_free`.
    pub fn dev_free(
        &mut self,
        dev: &mut dyn Device,
        s: u32,
        out: &mut Vec<ModelEvent>,
    ) -> Result<(), String> {
        let stream = self.seg(s).stream;
        let (base, size, _) = self.remove_segment(s)?;
        dev.free(base, size);
        self.segment_ops += 1;
        out.push(ModelEvent {
            action: Action::SegmentFree,
            addr: base,
            size,
            stream,
        });
        Ok(())
    }

    /// `cuMemCreate` + `cuMemMap` of `[addr, addr + size)` inside reservation segment `s`
    /// (or a reservation about to become one when `s` is `None`): counts the op, emits
    /// `segment_map` and adds the bytes to the segment's `held`.
    pub fn dev_map(
        &mut self,
        dev: &mut dyn Device,
        s: Option<u32>,
        addr: u64,
        size: u64,
        stream: u64,
        out: &mut Vec<ModelEvent>,
    ) -> Result<(), DeviceOom> {
        dev.map(addr, size, stream)?;
        self.segment_ops += 1;
        out.push(ModelEvent {
            action: Action::SegmentMap,
            addr,
            size,
            stream,
        });
        if let Some(s) = s {
            let held = self.seg(s).held + size;
            self.set_held(s, held);
        }
        Ok(())
    }

    /// `cuMemUnmap` + `cuMemRelease` of `[addr, addr + size)` inside segment `s`.
    pub fn dev_unmap(
        &mut self,
        dev: &mut dyn Device,
        s: u32,
        addr: u64,
        size: u64,
        out: &mut Vec<ModelEvent>,
    ) {
        let stream = self.seg(s).stream;
        dev.unmap(addr, size);
        self.segment_ops += 1;
        out.push(ModelEvent {
            action: Action::SegmentUnmap,
            addr,
            size,
            stream,
        });
        let held = self.seg(s).held.saturating_sub(size);
        self.set_held(s, held);
    }

    /// The layout: every live segment with its blocks, sorted by stream then address.
    #[must_use]
    pub fn layout(&self) -> Layout {
        let mut segments: Vec<LayoutSegment> = self
            .segments()
            .map(|(s, seg)| LayoutSegment {
                addr: seg.base,
                size_bytes: seg.size,
                stream: seg.stream,
                pool: PoolId::DEFAULT,
                small: seg.small,
                expandable: seg.expandable,
                blocks: self
                    .seg_blocks(s)
                    .map(|i| {
                        let b = self.b(i);
                        LayoutBlock {
                            addr: b.addr,
                            size_bytes: b.size,
                            requested_bytes: b.requested,
                            state: match b.state {
                                State::Free => LayoutBlockState::Free,
                                State::Allocated => LayoutBlockState::Allocated,
                                State::Pending => LayoutBlockState::PendingFree,
                                State::Unmapped => LayoutBlockState::Unmapped,
                            },
                        }
                    })
                    .collect(),
            })
            .collect();
        segments.sort_by_key(|s| (s.pool, s.stream, s.addr));
        Layout { segments }
    }

    /// Checks every structural invariant (see [`Arena`]); `adjacent_free_ok(a, b)` says
    /// whether two neighbouring free blocks `a` < `b` may stay unmerged under the model's
    /// rules. The error names the first invariant broken.
    pub fn check(&self, adjacent_free_ok: impl Fn(&Block, &Block) -> bool) -> Result<(), String> {
        let mut reserved = 0u64;
        let mut allocated = 0u64;
        let mut requested = 0u64;
        let mut free_blocks = 0usize;
        let mut free_bytes = 0u64;
        let mut live_blocks = 0usize;
        let mut sizes: BTreeMap<u64, u32> = BTreeMap::new();
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for (s, seg) in self.segments() {
            reserved += seg.held;
            ranges.push((seg.base, seg.size));
            let mut at = seg.base;
            let mut prev = NIL;
            let mut x = seg.head;
            while x != NIL {
                let b = self.b(x);
                if b.seg != s {
                    return Err(format!(
                        "segment {:#x}: block at {:#x} names segment {}",
                        seg.base, b.addr, b.seg
                    ));
                }
                if b.prev != prev {
                    return Err(format!(
                        "segment {:#x}: block at {:#x} has a wrong prev link",
                        seg.base, b.addr
                    ));
                }
                if b.addr != at {
                    return Err(format!(
                        "segment {:#x}: block at {:#x} does not follow the previous one (expected {at:#x})",
                        seg.base, b.addr
                    ));
                }
                if b.size == 0 {
                    return Err(format!(
                        "segment {:#x}: empty block at {:#x}",
                        seg.base, b.addr
                    ));
                }
                match b.state {
                    State::Free => {
                        free_blocks += 1;
                        free_bytes += b.size;
                        *sizes.entry(b.size).or_insert(0) += 1;
                        if !b.indexed || self.free.get(b.key) != Some(x) {
                            return Err(format!(
                                "free block at {:#x} is not in the free index under {:?}",
                                b.addr, b.key
                            ));
                        }
                        if prev != NIL {
                            let p = self.b(prev);
                            if p.state == State::Free && !adjacent_free_ok(p, b) {
                                return Err(format!(
                                    "free blocks at {:#x} and {:#x} should have been merged",
                                    p.addr, b.addr
                                ));
                            }
                        }
                    }
                    State::Allocated | State::Pending | State::Unmapped if b.indexed => {
                        return Err(format!(
                            "{:?} block at {:#x} is marked as in the free index",
                            b.state, b.addr
                        ));
                    }
                    State::Allocated | State::Pending => {
                        live_blocks += 1;
                        requested += b.requested;
                        if b.state == State::Allocated {
                            allocated += b.size;
                        }
                        if self.live.get(&b.addr) != Some(&x) {
                            return Err(format!(
                                "live block at {:#x} is not in the live map",
                                b.addr
                            ));
                        }
                    }
                    State::Unmapped => {
                        if prev != NIL && self.b(prev).state == State::Unmapped {
                            return Err(format!(
                                "unmapped blocks at {:#x} and {:#x} should have been merged",
                                self.b(prev).addr,
                                b.addr
                            ));
                        }
                    }
                }
                at += b.size;
                prev = x;
                x = b.next;
            }
            if at != seg.base + seg.size {
                return Err(format!(
                    "segment {:#x}: blocks cover {} bytes of {}",
                    seg.base,
                    at - seg.base,
                    seg.size
                ));
            }
        }
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            if w[0].0 + w[0].1 > w[1].0 {
                return Err(format!(
                    "segments at {:#x} and {:#x} overlap",
                    w[0].0, w[1].0
                ));
            }
        }
        self.free.check()?;
        if free_blocks != self.free.len() {
            return Err(format!(
                "{free_blocks} free blocks in segments, {} in the free index",
                self.free.len()
            ));
        }
        let counted: BTreeMap<u64, u32> =
            self.largest.counts.iter().map(|(&k, &v)| (k, v)).collect();
        if sizes != counted
            || self.largest.largest() != sizes.keys().next_back().copied().unwrap_or(0)
        {
            return Err("the free-size counts do not match the free blocks".to_string());
        }
        if live_blocks != self.live.len() {
            return Err(format!(
                "{live_blocks} live blocks in segments, {} in the live map",
                self.live.len()
            ));
        }
        for (name, counted, summed) in [
            ("reserved", self.reserved_bytes, reserved),
            ("allocated", self.allocated_bytes, allocated),
            ("requested", self.requested_bytes, requested),
            ("free", self.free_bytes, free_bytes),
        ] {
            if counted != summed {
                return Err(format!(
                    "{name} bytes {counted} != sum over blocks {summed}"
                ));
            }
        }
        if self.segments().count() != self.live_segments as usize {
            return Err("live segment count is wrong".to_string());
        }
        Ok(())
    }
}

/// A bad `--config` string for a model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Parses `key:value,key:value` (PyTorch's syntax) for `model`, accepting only `known`
/// keys; a key given twice keeps its last value, as PyTorch does.
pub fn parse_config<'a>(
    model: &str,
    conf: &'a str,
    known: &[&str],
) -> Result<Vec<(&'a str, &'a str)>, ConfigError> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for part in conf.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = part.split_once(':') else {
            return Err(ConfigError(format!(
                "{model}: expected key:value in config, got '{part}'"
            )));
        };
        let (k, v) = (k.trim(), v.trim());
        if !known.contains(&k) {
            let list = if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            };
            return Err(ConfigError(format!(
                "{model}: unknown config key '{k}' (known: {list})"
            )));
        }
        if v.is_empty() {
            return Err(ConfigError(format!(
                "{model}: config key '{k}' has no value"
            )));
        }
        out.retain(|(key, _)| *key != k);
        out.push((k, v));
    }
    Ok(out)
}

/// A `True`/`False` config value (also `true`/`false`, `1`/`0`).
pub fn parse_bool(model: &str, key: &str, v: &str) -> Result<bool, ConfigError> {
    match v {
        "True" | "true" | "1" => Ok(true),
        "False" | "false" | "0" => Ok(false),
        _ => Err(ConfigError(format!(
            "{model}: {key} expects True or False, got '{v}'"
        ))),
    }
}

/// A non-negative integer config value within `[min, max]`.
pub fn parse_u64(model: &str, key: &str, v: &str, min: u64, max: u64) -> Result<u64, ConfigError> {
    let n: u64 = v.parse().map_err(|_| {
        ConfigError(format!(
            "{model}: {key} expects a non-negative integer, got '{v}'"
        ))
    })?;
    if n < min || n > max {
        return Err(ConfigError(format!(
            "{model}: {key} must be between {min} and {max}, got {n}"
        )));
    }
    Ok(n)
}

/// A number config value in `(lo, hi]` (`lo` excluded unless `lo_inclusive`).
pub fn parse_f64(
    model: &str,
    key: &str,
    v: &str,
    lo: f64,
    hi: f64,
    lo_inclusive: bool,
) -> Result<f64, ConfigError> {
    let x: f64 = v
        .parse()
        .map_err(|_| ConfigError(format!("{model}: {key} expects a number, got '{v}'")))?;
    let above = if lo_inclusive { x >= lo } else { x > lo };
    if !(above && x <= hi && x.is_finite()) {
        let open = if lo_inclusive { '[' } else { '(' };
        return Err(ConfigError(format!(
            "{model}: {key} must be in {open}{lo}, {hi}], got {v}"
        )));
    }
    Ok(x)
}

/// A size in MiB given as a config value (decimals allowed), as bytes rounded down to
/// 256 bytes (CUDA's allocation alignment).
pub fn parse_mib(model: &str, key: &str, v: &str) -> Result<u64, ConfigError> {
    let x = parse_f64(model, key, v, 0.0, 1e9, true)?;
    Ok(round_down((x * f64::from(1u32 << 20)) as u64, 256))
}

/// Formats bytes as a MiB config value (`2`, `1.5`).
#[must_use]
pub fn fmt_mib(bytes: u64) -> String {
    format!("{}", bytes as f64 / f64::from(1u32 << 20))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arena_with_segment(size: u64) -> (Arena, u32, u32) {
        let mut a = Arena::new();
        let (s, b) = a.add_segment(
            0x1000_0000,
            size,
            device_bytes(size),
            0,
            false,
            false,
            0,
            State::Free,
        );
        a.insert_free(b, FreeKey::new(0, size, 0x1000_0000));
        (a, s, b)
    }

    #[test]
    #[allow(clippy::many_single_char_names)]
    fn split_allocate_free_and_merge_keep_the_invariants() {
        let (mut a, s, b) = arena_with_segment(4096);
        let mut out = Vec::new();
        a.remove_free(b);
        let t = a.split(b, 1024);
        a.insert_free(t, FreeKey::new(0, 3072, a.b(t).addr));
        a.allocate(b, 1000, 7, &mut out);
        a.check(|_, _| false).unwrap();
        assert_eq!(a.stats().allocated_bytes, 1024);
        assert_eq!(a.stats().requested_bytes, 1000);
        assert_eq!(a.largest_free(), 3072);
        let i = a.release(0x1000_0000, false, &mut out).unwrap().unwrap();
        // Freed but not yet merged or indexed: the check must notice.
        assert!(a.check(|_, _| false).is_err());
        let m = a.coalesce(i, |_| true);
        a.insert_free(m, FreeKey::new(0, a.b(m).size, a.b(m).addr));
        a.check(|_, _| false).unwrap();
        assert_eq!(a.free_count(), 1);
        assert_eq!(a.largest_free(), 4096);
        a.remove_segment(s).unwrap();
        a.check(|_, _| false).unwrap();
        assert_eq!(a.reserved_bytes(), 0);
    }

    #[test]
    fn adjacent_free_blocks_are_flagged_unless_the_model_allows_them() {
        let (mut a, _, b) = arena_with_segment(4096);
        a.remove_free(b);
        let t = a.split(b, 1024);
        a.insert_free(b, FreeKey::new(0, 1024, a.b(b).addr));
        a.insert_free(t, FreeKey::new(0, 3072, a.b(t).addr));
        assert!(
            a.check(|_, _| false)
                .unwrap_err()
                .contains("should have been merged")
        );
        a.check(|_, _| true).unwrap();
    }

    #[test]
    fn deferred_frees_stay_live_until_completion() {
        let (mut a, _, b) = arena_with_segment(4096);
        let mut out = Vec::new();
        a.remove_free(b);
        a.allocate(b, 4096, 0, &mut out);
        assert_eq!(a.release(0x1000_0000, true, &mut out).unwrap(), None);
        assert_eq!(a.allocated_bytes(), 0);
        assert_eq!(a.stats().requested_bytes, 4096);
        assert!(a.release(0x1000_0000, false, &mut out).is_err());
        let i = a.complete(0x1000_0000, &mut out).unwrap();
        a.insert_free(i, FreeKey::new(0, 4096, 0x1000_0000));
        a.check(|_, _| false).unwrap();
        assert!(a.complete(0x1000_0000, &mut out).is_err());
    }

    #[test]
    fn config_strings_parse_with_clear_errors() {
        let kv = parse_config(
            "bfc",
            "allow_growth:False, memory_fraction:0.5",
            &["allow_growth", "memory_fraction"],
        )
        .unwrap();
        assert_eq!(
            kv,
            vec![("allow_growth", "False"), ("memory_fraction", "0.5")]
        );
        assert!(
            parse_config("bfc", "bogus:1", &["allow_growth"])
                .unwrap_err()
                .0
                .contains("unknown config key 'bogus'")
        );
        assert!(parse_config("bfc", "allow_growth", &["allow_growth"]).is_err());
        assert!(parse_bool("bfc", "allow_growth", "yes").is_err());
        assert_eq!(parse_mib("x", "k", "1.5").unwrap(), 3 << 19);
        assert!(parse_f64("x", "k", "0", 0.0, 1.0, false).is_err());
        assert!(parse_u64("x", "k", "40", 1, 32).is_err());
    }
}
