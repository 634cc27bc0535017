//! PyTorch's CUDA caching allocator (`DeviceCachingAllocator`, PyTorch 2.5–2.11), rule for
//! rule as shared/docs/pytorch-allocator.md describes it: rounding, small/large pools per
//! stream, best fit ordered by (stream, size, address), splitting and merging, the
//! oversize rules, the OOM ladder, the memory-fraction cap, garbage collection, deferred
//! frees, private pools and expandable segments.
//!
//! Config keys (`--config`, PyTorch's own syntax): `max_split_size_mb`,
//! `max_non_split_rounding_mb`, `roundup_power2_divisions`, `garbage_collection_threshold`,
//! `expandable_segments`, `large_segment_size_mb`, `per_process_memory_fraction`.

pub mod config;
mod free_index;
mod freeable;

use free_index::{FreeIndex, FreePos};
use freeable::FreeablePools;

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasherDefault;

use super::common::AddrHasher;

pub use config::{PyTorchConfig, PyTorchConfigError};

use super::{
    AllocRequest, Allocator, AllocatorKind, Layout, LayoutBlock, LayoutBlockState, LayoutSegment,
    ModelError, ModelEvent, ModelStats, OomInfo, PoolId,
};
use crate::device::Device;
use crate::snapshot::Action;

/// `kMinBlockSize`: every size is rounded to at least 512 bytes.
pub const MIN_BLOCK_BYTES: u64 = 512;
/// `kSmallSize`: largest rounded size served from the small pool.
pub const SMALL_SIZE_BYTES: u64 = 1 << 20;
/// `kSmallBuffer`: small-pool segment size and small expandable page.
pub const SMALL_BUFFER_BYTES: u64 = 2 << 20;
/// `kMinLargeAlloc`: rounded requests below this get a large-segment-size segment.
pub const MIN_LARGE_ALLOC_BYTES: u64 = 10 << 20;
/// `kRoundLarge`: larger segments are rounded to 2 MiB.
pub const ROUND_LARGE_BYTES: u64 = 2 << 20;

const NIL: u32 = u32::MAX;

/// Address → block index.
type AddrMap = HashMap<u64, u32, BuildHasherDefault<AddrHasher>>;

/// Where the index entry a free block had before a split or merge is: under its old
/// address (its size is passed beside), or at a position just found.
#[derive(Debug, Clone, Copy)]
enum OldEntry {
    Addr(u64),
    At(FreePos),
}

/// One block: a piece of a segment, allocated, free (cached), pending or unmapped.
#[derive(Debug, Clone)]
struct Block {
    addr: u64,
    size: u64,
    /// Un-rounded size of the last allocation the block served.
    requested: u64,
    stream: u64,
    /// Index into `pools`.
    pool: u32,
    /// Index into `segments`.
    seg: u32,
    /// Address-order neighbours inside the segment (NIL at the ends).
    prev: u32,
    next: u32,
    allocated: bool,
    /// Freed by the program but waiting for `record_stream` events.
    pending: bool,
    mapped: bool,
    /// The pool's `get_free_blocks_call_count` when last inserted into the pool.
    gc_base: u64,
}

/// One cudaMalloc'd segment or one expandable reservation.
#[derive(Debug, Clone)]
struct Segment {
    base: u64,
    size: u64,
    stream: u64,
    pool: u32,
    expandable: bool,
    /// Expandable page size (2 MiB small, large segment size large).
    page: u64,
    live: bool,
}

/// A `BlockPool`: the free mapped blocks ordered by (stream, size, addr), and the unmapped
/// ranges ordered by (stream, addr). Each free block is in exactly one of them.
#[derive(Debug, Clone)]
struct Pool {
    id: PoolId,
    small: bool,
    blocks: FreeIndex,
    unmapped: BTreeMap<(u64, u64), u32>,
    get_free_blocks_call_count: u64,
}

/// A private pool's bookkeeping: its two `pools` indexes.
#[derive(Debug, Clone)]
struct PrivatePool {
    small: u32,
    large: u32,
}

/// The PyTorch caching allocator of one device.
#[derive(Debug, Clone)]
pub struct PyTorchModel {
    cfg: PyTorchConfig,
    /// The per-process memory limit (`set_per_process_memory_fraction`), if any.
    limit_bytes: Option<u64>,
    blocks: Vec<Block>,
    free_slots: Vec<u32>,
    segments: Vec<Segment>,
    free_segment_slots: Vec<u32>,
    pools: Vec<Pool>,
    /// Private pools by id, with their two `pools` indexes.
    private: BTreeMap<PoolId, PrivatePool>,
    /// The private pools whose `use_count` dropped to 0 (`graph_pools_freeable`): their
    /// cached segments go on the next `release_cached_blocks`, in this table's order.
    freeable: FreeablePools,
    /// Live (allocated or pending) blocks by address.
    active: AddrMap,
    /// Pending-free blocks in the order their frees were requested.
    pending_order: Vec<u32>,
    /// `total_allocated_memory`: bytes of segments and mapped pages (= reserved).
    reserved_bytes: u64,
    allocated_bytes: u64,
    requested_bytes: u64,
    free_holes: u64,
    segment_ops: u64,
    /// The largest free block, or None when it must be recomputed (a block of that size
    /// left a pool).
    largest_free_cache: std::cell::Cell<Option<u64>>,
    /// Counters of `memory_stats()` that tests cross-check.
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    /// `num_oom_rejections`: new segments refused by `throw_on_cudamalloc_oom`.
    pub num_oom_rejections: u64,
    /// The malloc under way had a segment refused by `throw_on_cudamalloc_oom`
    /// (`AllocParams::oom_rejection_info.rejected`).
    rejected: bool,
}

/// The small and large default pools are `pools[0]` and `pools[1]`.
const DEFAULT_SMALL: u32 = 0;
const DEFAULT_LARGE: u32 = 1;

impl PyTorchModel {
    /// A model with this configuration and an optional per-process memory limit in bytes.
    #[must_use]
    pub fn new(cfg: PyTorchConfig, limit_bytes: Option<u64>) -> PyTorchModel {
        let limit_bytes = limit_bytes.or_else(|| {
            (cfg.per_process_memory_fraction < 1.0).then(|| {
                (cfg.per_process_memory_fraction * cfg.device_total_bytes as f64).round() as u64
            })
        });
        let mk = |small| Pool {
            id: PoolId::DEFAULT,
            small,
            blocks: FreeIndex::default(),
            unmapped: BTreeMap::new(),
            get_free_blocks_call_count: 0,
        };
        PyTorchModel {
            cfg,
            limit_bytes,
            blocks: Vec::new(),
            free_slots: Vec::new(),
            segments: Vec::new(),
            free_segment_slots: Vec::new(),
            pools: vec![mk(true), mk(false)],
            private: BTreeMap::new(),
            freeable: FreeablePools::default(),
            active: AddrMap::with_capacity_and_hasher(1 << 12, BuildHasherDefault::default()),
            largest_free_cache: std::cell::Cell::new(Some(0)),
            pending_order: Vec::new(),
            reserved_bytes: 0,
            allocated_bytes: 0,
            requested_bytes: 0,
            free_holes: 0,
            segment_ops: 0,
            num_alloc_retries: 0,
            num_ooms: 0,
            num_oom_rejections: 0,
            rejected: false,
        }
    }

    /// The configuration in force.
    #[must_use]
    pub fn config(&self) -> &PyTorchConfig {
        &self.cfg
    }

    /// The memory limit in force.
    #[must_use]
    pub fn limit_bytes(&self) -> Option<u64> {
        self.limit_bytes
    }

    /// `round_size`: the block size a request of `size` bytes needs (§4.1).
    #[must_use]
    pub fn round_size(&self, size: u64) -> u64 {
        if size < MIN_BLOCK_BYTES {
            return MIN_BLOCK_BYTES;
        }
        let divisions = u64::from(self.divisions_for(size));
        if divisions > 1 && size > MIN_BLOCK_BYTES * divisions {
            return roundup_power2_next_division(size, divisions);
        }
        size.div_ceil(MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES
    }

    fn divisions_for(&self, size: u64) -> u32 {
        let log = 63 - u64::from(size.leading_zeros());
        let idx = log.saturating_sub(20).min(15) as usize;
        self.cfg.roundup_power2_divisions[idx]
    }

    /// `get_allocation_size`: the cudaMalloc size for a new segment (§4.3).
    #[must_use]
    pub fn allocation_size(&self, rounded: u64) -> u64 {
        if rounded <= SMALL_SIZE_BYTES {
            SMALL_BUFFER_BYTES
        } else if rounded < MIN_LARGE_ALLOC_BYTES {
            self.cfg.large_segment_size_bytes
        } else {
            rounded.div_ceil(ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES
        }
    }

    /// The bound `throw_on_cudamalloc_oom` checks new segments against:
    /// `(size_t)(per_process_memory_fraction × totalGlobalMem)`.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    fn rejection_limit_bytes(&self) -> u64 {
        (self.cfg.per_process_memory_fraction * self.cfg.device_total_bytes as f64) as u64
    }

    fn gc_enabled(&self) -> bool {
        self.limit_bytes.is_some() && self.cfg.garbage_collection_threshold > 0.0
    }

    fn pool_index(&mut self, pool: PoolId, small: bool) -> u32 {
        if !pool.is_private() {
            return if small { DEFAULT_SMALL } else { DEFAULT_LARGE };
        }
        if let Some(p) = self.private.get(&pool) {
            return if small { p.small } else { p.large };
        }
        let mk = |small| Pool {
            id: pool,
            small,
            blocks: FreeIndex::default(),
            unmapped: BTreeMap::new(),
            get_free_blocks_call_count: 0,
        };
        let s = self.pools.len() as u32;
        self.pools.push(mk(true));
        self.pools.push(mk(false));
        self.private.insert(
            pool,
            PrivatePool {
                small: s,
                large: s + 1,
            },
        );
        if small { s } else { s + 1 }
    }

    /// Gives a private pool another id (used when the pool a request went to is learned
    /// after the fact). No-op if `to` already exists.
    pub fn rename_pool(&mut self, from: PoolId, to: PoolId) {
        if self.private.contains_key(&to) {
            return;
        }
        if let Some(p) = self.private.remove(&from) {
            self.pools[p.small as usize].id = to;
            self.pools[p.large as usize].id = to;
            self.private.insert(to, p);
            if self.freeable.contains(from) {
                self.freeable.remove(from);
                self.freeable.insert(to);
            }
        }
    }

    /// The private pools the model knows.
    #[must_use]
    pub fn private_pools(&self) -> Vec<PoolId> {
        self.private.keys().copied().collect()
    }

    /// The pool and stream of the segment holding `addr`, if any.
    #[must_use]
    pub fn segment_of(&self, addr: u64) -> Option<(PoolId, u64, bool)> {
        self.segments
            .iter()
            .filter(|s| s.live && addr >= s.base && addr < s.base + s.size)
            .map(|s| {
                (
                    self.pools[s.pool as usize].id,
                    s.stream,
                    self.pools[s.pool as usize].small,
                )
            })
            .next()
    }

    /// The free mapped block that starts at `addr`: its index, where its entry stands in
    /// its pool's index, and its size. A walk over the pool's free blocks of the segment's
    /// stream: only checkpoint restores need it.
    fn free_block_starting_at(&self, addr: u64) -> Option<(u32, FreePos, u64)> {
        let seg = self
            .segments
            .iter()
            .find(|s| s.live && addr >= s.base && addr < s.base + s.size)?;
        let mut it = self.pools[seg.pool as usize].blocks.at_least(seg.stream, 0);
        while let Some((size, a, i)) = it.next() {
            if a == addr {
                return Some((i, it.pos(), size));
            }
        }
        None
    }

    /// The free block that starts at `addr`, if any: its size, and whether it spans its
    /// whole segment (the segment is entirely free).
    #[must_use]
    pub fn free_block_at(&self, addr: u64) -> Option<(u64, bool)> {
        self.free_block_starting_at(addr)
            .map(|(i, _, size)| (size, !self.is_split(i)))
    }

    // ---- arena helpers -------------------------------------------------------------

    fn new_block(&mut self, b: Block) -> u32 {
        if let Some(i) = self.free_slots.pop() {
            self.blocks[i as usize] = b;
            i
        } else {
            self.blocks.push(b);
            (self.blocks.len() - 1) as u32
        }
    }

    fn delete_block(&mut self, i: u32) {
        self.free_slots.push(i);
    }

    fn new_segment(&mut self, s: Segment) -> u32 {
        if let Some(i) = self.free_segment_slots.pop() {
            self.segments[i as usize] = s;
            i
        } else {
            self.segments.push(s);
            (self.segments.len() - 1) as u32
        }
    }

    fn b(&self, i: u32) -> &Block {
        &self.blocks[i as usize]
    }

    fn bm(&mut self, i: u32) -> &mut Block {
        &mut self.blocks[i as usize]
    }

    fn is_split(&self, i: u32) -> bool {
        let b = self.b(i);
        b.prev != NIL || b.next != NIL
    }

    fn is_expandable(&self, i: u32) -> bool {
        self.segments[self.b(i).seg as usize].expandable
    }

    fn insert_free(&mut self, i: u32) {
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

    fn remove_free(&mut self, i: u32) {
        let b = self.b(i);
        let (stream, size, addr) = (b.stream, b.size, b.addr);
        let pool = b.pool as usize;
        if self.pools[pool].blocks.remove(stream, size, addr) {
            self.removed_free(size);
        }
    }

    /// `remove_free` of block `i`, whose entry `get_free_block` has just found at `at`.
    fn remove_free_at(&mut self, i: u32, at: FreePos) {
        let b = self.b(i);
        let (size, pool) = (b.size, b.pool as usize);
        self.pools[pool].blocks.remove_at(at);
        self.removed_free(size);
    }

    /// The counters' side of taking a free block of `size` out of its pool.
    fn removed_free(&mut self, size: u64) {
        self.free_holes -= 1;
        if self.largest_free_cache.get().is_some_and(|l| l <= size) {
            self.largest_free_cache.set(None);
        }
    }

    /// `remove_free` of the entry `old` (of size `old_size`) followed by `insert_free(i)`,
    /// as one move inside the pool's index where the order allows (`i` is the block that
    /// entry stood for, split or merged since; same pool and stream).
    fn reindex_free(&mut self, i: u32, old_size: u64, old: OldEntry) {
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

    fn insert_unmapped(&mut self, i: u32) {
        let b = self.b(i);
        let key = (b.stream, b.addr);
        let pool = b.pool as usize;
        self.pools[pool].unmapped.insert(key, i);
    }

    fn remove_unmapped(&mut self, i: u32) {
        let b = self.b(i);
        let key = (b.stream, b.addr);
        let pool = b.pool as usize;
        self.pools[pool].unmapped.remove(&key);
    }

    fn free_mergeable(&self, i: u32) -> bool {
        i != NIL && {
            let b = self.b(i);
            !b.allocated && !b.pending
        }
    }

    /// `try_merge_blocks(dst, src)`: absorbs the free neighbour `src` into `dst`.
    fn try_merge(&mut self, dst: u32, src: u32) -> u64 {
        self.try_merge_reusing(dst, src, None)
    }

    /// `try_merge_blocks(dst, src)`. With `reuse` holding `None`, a mapped `src`'s index
    /// entry is left in place (counted as removed) and named in `reuse`, for the caller to
    /// move to the merged block with [`Self::reindex_free`].
    fn try_merge_reusing(
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

    // ---- malloc ------------------------------------------------------------------------

    /// `get_free_block` (§5.2).
    /// The block found and where its entry stands in the pool's index.
    fn get_free_block(&mut self, pool: u32, stream: u64, size: u64) -> Option<(u32, FreePos)> {
        if self.gc_enabled() {
            self.pools[pool as usize].get_free_blocks_call_count += 1;
        }
        let (bsize, idx, at) = {
            let p = &self.pools[pool as usize];
            let mut it = p.blocks.at_least(stream, size);
            let (mut bsize, mut idx) = it.next().map(|(s, _, v)| (s, v))?;
            let mut at = it.pos();
            if self.segments[self.b(idx).seg as usize].expandable {
                if self.cfg.expandable_segments {
                    let xsize = |m: &PyTorchModel, i: u32| {
                        let b = m.b(i);
                        b.size
                            + if b.next != NIL && !m.b(b.next).mapped {
                                m.b(b.next).size
                            } else {
                                0
                            }
                    };
                    loop {
                        if !self.segments[self.b(idx).seg as usize].expandable {
                            break;
                        }
                        let Some((ns, nv)) = it.next().map(|(s, _, v)| (s, v)) else {
                            break;
                        };
                        if xsize(self, nv) >= xsize(self, idx) {
                            break;
                        }
                        bsize = ns;
                        idx = nv;
                        at = it.pos();
                    }
                } else {
                    while self.segments[self.b(idx).seg as usize].expandable {
                        let (ns, nv) = it.next().map(|(s, _, v)| (s, v))?;
                        bsize = ns;
                        idx = nv;
                        at = it.pos();
                    }
                }
            }
            (bsize, idx, at)
        };
        let m = self.cfg.max_split_size_bytes;
        if size < m && bsize >= m {
            return None;
        }
        if size >= m && bsize >= size.saturating_add(self.cfg.max_non_split_rounding_bytes) {
            return None;
        }
        // Still in the pool: `alloc_found_block` takes it out (or moves its entry to the
        // remainder of a split).
        Some((idx, at))
    }

    /// `alloc_block` (§5.5): a new segment (or mapped pages) for the request.
    #[allow(clippy::too_many_arguments)] // mirrors PyTorch's AllocParams fields one for one
    fn alloc_block(
        &mut self,
        dev: &mut dyn Device,
        pool: u32,
        stream: u64,
        size: u64,
        alloc_size: u64,
        is_retry: bool,
        out: &mut Vec<ModelEvent>,
    ) -> Option<u32> {
        if is_retry {
            self.num_alloc_retries += 1;
        }
        if let Some(limit) = self.limit_bytes
            && self.reserved_bytes + alloc_size > limit
        {
            return None;
        }
        // After the cap (whose failure still runs the ladder): PyTorch truncates
        // fraction × totalGlobalMem here, where the cap rounds it.
        if self.cfg.throw_on_cudamalloc_oom
            && self.reserved_bytes + alloc_size > self.rejection_limit_bytes()
        {
            self.num_oom_rejections += 1;
            self.rejected = true;
            return None;
        }
        if self.cfg.expandable_segments {
            return self.try_allocate_expandable_block(dev, pool, stream, size, out);
        }
        let addr = dev.malloc(alloc_size, stream).ok()?;
        self.reserved_bytes += alloc_size;
        self.segment_ops += 1;
        let seg = self.new_segment(Segment {
            base: addr,
            size: alloc_size,
            stream,
            pool,
            expandable: false,
            page: 0,
            live: true,
        });
        let b = self.new_block(Block {
            addr,
            size: alloc_size,
            requested: 0,
            stream,
            pool,
            seg,
            prev: NIL,
            next: NIL,
            allocated: false,
            pending: false,
            mapped: true,
            gc_base: 0,
        });
        out.push(ModelEvent {
            action: Action::SegmentAlloc,
            addr,
            size: alloc_size,
            stream,
        });
        Some(b)
    }

    /// `find_expandable_block` (§7.2 step 1).
    fn find_expandable_block(
        &mut self,
        dev: &mut dyn Device,
        pool: u32,
        stream: u64,
        size: u64,
    ) -> Option<u32> {
        let allocatable =
            |m: &PyTorchModel, i: u32| i != NIL && !m.b(i).allocated && !m.b(i).pending;
        let candidates: Vec<u32> = self.pools[pool as usize]
            .unmapped
            .range((stream, 0)..)
            .take_while(|(k, _)| k.0 == stream)
            .map(|(_, v)| *v)
            .collect();
        for mut c in candidates {
            let prev = self.b(c).prev;
            if allocatable(self, prev) {
                c = prev;
            }
            let mut bytes = 0;
            let mut x = c;
            while bytes < size && allocatable(self, x) {
                bytes += self.b(x).size;
                x = self.b(x).next;
            }
            if bytes >= size {
                return Some(c);
            }
        }
        let page = if self.pools[pool as usize].small {
            SMALL_BUFFER_BYTES
        } else {
            self.cfg.large_segment_size_bytes
        };
        let total = self.cfg.device_total_bytes;
        let reserve = (total + total / 8).div_ceil(page) * page;
        let base = dev.reserve(reserve, page, stream).ok()?;
        let seg = self.new_segment(Segment {
            base,
            size: reserve,
            stream,
            pool,
            expandable: true,
            page,
            live: true,
        });
        let b = self.new_block(Block {
            addr: base,
            size: reserve,
            requested: 0,
            stream,
            pool,
            seg,
            prev: NIL,
            next: NIL,
            allocated: false,
            pending: false,
            mapped: false,
            gc_base: 0,
        });
        self.insert_unmapped(b);
        Some(b)
    }

    /// `map_block` (§7.2): maps the pages covering the first `size` bytes of the unmapped
    /// block `b`; returns the (merged) free block.
    fn map_block(
        &mut self,
        dev: &mut dyn Device,
        b: u32,
        size: u64,
        out: &mut Vec<ModelEvent>,
    ) -> Option<u32> {
        let seg = &self.segments[self.b(b).seg as usize];
        let page = seg.page;
        let base = seg.base;
        let (addr, bsize, stream) = (self.b(b).addr, self.b(b).size, self.b(b).stream);
        let first = (addr - base) / page;
        let last = (addr + size - base).div_ceil(page);
        let mapped = ((last - first) * page).min(bsize);
        dev.map(addr, mapped, stream).ok()?;
        self.remove_unmapped(b);
        if mapped < bsize {
            let rest = self.new_block(Block {
                addr: addr + mapped,
                size: bsize - mapped,
                requested: 0,
                stream,
                pool: self.b(b).pool,
                seg: self.b(b).seg,
                prev: b,
                next: self.b(b).next,
                allocated: false,
                pending: false,
                mapped: false,
                gc_base: 0,
            });
            let nx = self.b(b).next;
            if nx != NIL {
                self.bm(nx).prev = rest;
            }
            self.bm(b).next = rest;
            self.insert_unmapped(rest);
        }
        {
            let blk = self.bm(b);
            blk.mapped = true;
            blk.size = mapped;
        }
        self.merge_free(b);
        self.reserved_bytes += mapped;
        self.segment_ops += 1;
        out.push(ModelEvent {
            action: Action::SegmentMap,
            addr,
            size: mapped,
            stream,
        });
        Some(b)
    }

    /// `try_allocate_expandable_block` (§7.2).
    fn try_allocate_expandable_block(
        &mut self,
        dev: &mut dyn Device,
        pool: u32,
        stream: u64,
        size: u64,
        out: &mut Vec<ModelEvent>,
    ) -> Option<u32> {
        let mut c = self.find_expandable_block(dev, pool, stream, size)?;
        if !self.b(c).mapped {
            let n = self.b(c).size.min(size);
            c = self.map_block(dev, c, n, out)?;
        }
        while self.b(c).size < size {
            let remaining = size - self.b(c).size;
            let n = self.b(c).next;
            if n == NIL {
                return None;
            }
            let len = remaining.min(self.b(n).size);
            c = self.map_block(dev, n, len, out)?;
        }
        self.remove_free(c);
        Some(c)
    }

    /// `release_block`: cudaFree of a whole cached segment.
    fn release_block(&mut self, dev: &mut dyn Device, i: u32, out: &mut Vec<ModelEvent>) {
        self.remove_free(i);
        let (addr, size, stream, seg) = {
            let b = self.b(i);
            (b.addr, b.size, b.stream, b.seg)
        };
        dev.free(addr, size);
        self.reserved_bytes -= size;
        self.segment_ops += 1;
        self.segments[seg as usize].live = false;
        self.free_segment_slots.push(seg);
        self.delete_block(i);
        out.push(ModelEvent {
            action: Action::SegmentFree,
            addr,
            size,
            stream,
        });
    }

    /// `unmap_block` (§7.4): unmaps the whole pages inside a free mapped block.
    fn unmap_block(&mut self, dev: &mut dyn Device, i: u32, out: &mut Vec<ModelEvent>) {
        let (addr, size, stream, segi, pool) = {
            let b = self.b(i);
            (b.addr, b.size, b.stream, b.seg, b.pool)
        };
        let seg = &self.segments[segi as usize];
        let (base, page) = (seg.base, seg.page);
        let first = (addr - base).div_ceil(page);
        let last = (addr + size - base) / page;
        if last <= first {
            return;
        }
        let un_addr = base + first * page;
        let un_size = (last - first) * page;
        dev.unmap(un_addr, un_size);
        self.remove_free(i);
        let before = un_addr - addr;
        if before > 0 {
            let prev = self.b(i).prev;
            let bf = self.new_block(Block {
                addr,
                size: before,
                requested: 0,
                stream,
                pool,
                seg: segi,
                prev,
                next: i,
                allocated: false,
                pending: false,
                mapped: true,
                gc_base: 0,
            });
            if prev != NIL {
                self.bm(prev).next = bf;
            }
            self.bm(i).prev = bf;
            self.insert_free(bf);
        }
        let after = size - before - un_size;
        if after > 0 {
            let next = self.b(i).next;
            let af = self.new_block(Block {
                addr: un_addr + un_size,
                size: after,
                requested: 0,
                stream,
                pool,
                seg: segi,
                prev: i,
                next,
                allocated: false,
                pending: false,
                mapped: true,
                gc_base: 0,
            });
            if next != NIL {
                self.bm(next).prev = af;
            }
            self.bm(i).next = af;
            self.insert_free(af);
        }
        {
            let b = self.bm(i);
            b.addr = un_addr;
            b.size = un_size;
            b.mapped = false;
        }
        let prev = self.b(i).prev;
        self.try_merge(i, prev);
        let next = self.b(i).next;
        self.try_merge(i, next);
        self.insert_unmapped(i);
        self.reserved_bytes -= un_size;
        self.segment_ops += 1;
        out.push(ModelEvent {
            action: Action::SegmentUnmap,
            addr: un_addr,
            size: un_size,
            stream,
        });
    }

    /// `release_blocks(pool)` (§5.7, §7.4).
    fn release_blocks(&mut self, dev: &mut dyn Device, pool: u32, out: &mut Vec<ModelEvent>) {
        let all: Vec<u32> = self.pools[pool as usize].blocks.values();
        let mut to_unmap = Vec::new();
        for i in all {
            if self.is_expandable(i) {
                to_unmap.push(i);
            } else if !self.is_split(i) {
                self.release_block(dev, i, out);
            }
        }
        for i in to_unmap {
            self.unmap_block(dev, i, out);
            if !self.b(i).mapped && !self.is_split(i) {
                // The whole reservation is unmapped: release the address range (no event).
                let segi = self.b(i).seg;
                let (base, size) = (
                    self.segments[segi as usize].base,
                    self.segments[segi as usize].size,
                );
                self.remove_unmapped(i);
                dev.release(base, size);
                self.segments[segi as usize].live = false;
                self.free_segment_slots.push(segi);
                self.delete_block(i);
            }
        }
    }

    /// Completes every pending free (`synchronize_and_free_events`).
    fn synchronize_and_free_events(&mut self, out: &mut Vec<ModelEvent>) {
        let pending = std::mem::take(&mut self.pending_order);
        for i in pending {
            if self.b(i).pending {
                let addr = self.b(i).addr;
                self.active.remove(&addr);
                self.free_block(i, out);
            }
        }
    }

    /// `release_cached_blocks` (§5.7): also what `empty_cache()` does.
    fn release_cached_blocks(&mut self, dev: &mut dyn Device, out: &mut Vec<ModelEvent>) {
        self.synchronize_and_free_events(out);
        self.release_blocks(dev, DEFAULT_LARGE, out);
        self.release_blocks(dev, DEFAULT_SMALL, out);
        // Each freed pool small then large, the pools in `graph_pools_freeable`'s order; a
        // pool with no segment left is erased from it (`cudaMalloc_count == 0`).
        for id in self.freeable.in_order() {
            let Some(p) = self.private.get(&id).cloned() else {
                continue;
            };
            self.release_blocks(dev, p.small, out);
            self.release_blocks(dev, p.large, out);
            let any_left = self
                .segments
                .iter()
                .any(|s| s.live && (s.pool == p.small || s.pool == p.large));
            if !any_left {
                self.private.remove(&id);
                self.freeable.remove(id);
                // The two pool slots stay in `pools` (empty) so indexes remain valid.
            }
        }
    }

    /// `release_available_cached_blocks` (§5.6).
    fn release_available_cached_blocks(
        &mut self,
        dev: &mut dyn Device,
        pool: u32,
        stream: u64,
        size: u64,
        out: &mut Vec<ModelEvent>,
    ) -> bool {
        let m = self.cfg.max_split_size_bytes;
        if m == u64::MAX {
            return false;
        }
        let key_size = size.max(m);
        // Only a block that is a whole segment can be released. PyTorch never splits a
        // block of max_split_size or more, so it checks only for expandable segments; a
        // start state rebuilt from a hostile or inconsistent snapshot can hold such a
        // split block, and releasing it would free part of a segment.
        let releasable = |m: &PyTorchModel, v: u32| !m.is_expandable(v) && !m.is_split(v);
        let p = &self.pools[pool as usize];
        let at = p.blocks.at_least(stream, key_size).next();
        if let Some((_, _, v)) = at
            && releasable(self, v)
        {
            self.release_block(dev, v, out);
            return true;
        }
        let below: Vec<(u64, u32)> = p
            .blocks
            .below_size_rev(stream, key_size)
            .map(|(s, _, v)| (s, v))
            .collect();
        let mut released = 0;
        for (size, v) in below {
            if released >= key_size || size < m {
                break;
            }
            if releasable(self, v) {
                released += size;
                self.release_block(dev, v, out);
            }
        }
        released >= key_size
    }

    /// `garbage_collect_cached_blocks` (§5.4).
    fn garbage_collect(&mut self, dev: &mut dyn Device, out: &mut Vec<ModelEvent>) {
        let Some(limit) = self.limit_bytes else {
            return;
        };
        let threshold = (self.cfg.garbage_collection_threshold * limit as f64) as u64;
        if self.reserved_bytes <= threshold {
            return;
        }
        let target = self.reserved_bytes - threshold;
        let count_now = self.pools[DEFAULT_LARGE as usize].get_free_blocks_call_count;
        let mut total_age = 0.0f64;
        let mut count = 0u64;
        for i in self.pools[DEFAULT_LARGE as usize].blocks.values() {
            if !self.is_split(i) {
                total_age += (count_now - self.b(i).gc_base) as f64;
                count += 1;
            }
        }
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

    fn should_split(&self, i: u32, size: u64) -> bool {
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
    fn alloc_found_block(
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
    fn free_block(&mut self, i: u32, out: &mut Vec<ModelEvent>) {
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
    fn merge_free(&mut self, i: u32) {
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
    fn pool_stream_free(&self, pool: u32, stream: u64) -> (u64, u64, u64) {
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
    fn largest_free(&self) -> u64 {
        if let Some(l) = self.largest_free_cache.get() {
            return l;
        }
        let l = self.compute_largest_free();
        self.largest_free_cache.set(Some(l));
        l
    }

    fn compute_largest_free(&self) -> u64 {
        self.pools
            .iter()
            .map(|p| p.blocks.largest())
            .max()
            .unwrap_or(0)
    }
}

impl PyTorchModel {
    /// Puts the model in a rebuilt start state (a trace that does not start empty): the
    /// segments, their live blocks, and free blocks in the gaps.
    pub fn load_start(&mut self, start: &[crate::trace::StartSegment]) {
        for s in start {
            let small = s.small;
            let pool = self.pool_index(s.pool, small);
            let page = if small {
                SMALL_BUFFER_BYTES
            } else {
                self.cfg.large_segment_size_bytes
            };
            let seg = self.new_segment(Segment {
                base: s.addr,
                size: s.size_bytes,
                stream: s.stream,
                pool,
                expandable: s.expandable,
                page,
                live: true,
            });
            self.reserved_bytes += s.size_bytes;
            let mut pieces: Vec<(u64, u64, Option<&crate::trace::StartBlock>)> = Vec::new();
            let mut at = s.addr;
            for b in &s.blocks {
                if b.addr > at {
                    pieces.push((at, b.addr - at, None));
                }
                pieces.push((b.addr, b.size_bytes, Some(b)));
                at = b.addr + b.size_bytes;
            }
            if at < s.addr + s.size_bytes {
                pieces.push((at, s.addr + s.size_bytes - at, None));
            }
            let mut prev = NIL;
            for (addr, size, live) in pieces {
                let i = self.new_block(Block {
                    addr,
                    size,
                    requested: live.map_or(0, |b| b.requested_bytes),
                    stream: s.stream,
                    pool,
                    seg,
                    prev,
                    next: NIL,
                    allocated: live.is_some_and(|b| !b.pending),
                    pending: live.is_some_and(|b| b.pending),
                    mapped: true,
                    gc_base: 0,
                });
                if prev != NIL {
                    self.bm(prev).next = i;
                }
                prev = i;
                match live {
                    Some(b) => {
                        self.active.insert(addr, i);
                        self.requested_bytes += b.requested_bytes;
                        if b.pending {
                            self.pending_order.push(i);
                        } else {
                            self.allocated_bytes += size;
                        }
                    }
                    None => self.insert_free(i),
                }
            }
        }
    }
}

/// `roundup_power2_next_division` (§4.1).
fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor2 = 1u64 << size.ilog2();
    let step = floor2 >> divisions.ilog2();
    if step == 0 {
        return floor2 << 1;
    }
    let r = size & !(step - 1);
    if r == size { size } else { r + step }
}

impl Allocator for PyTorchModel {
    fn name(&self) -> &'static str {
        AllocatorKind::Pytorch.name()
    }

    fn kind(&self) -> Option<AllocatorKind> {
        Some(AllocatorKind::Pytorch)
    }

    fn private_pool_free_bytes(&self) -> u64 {
        self.pools
            .iter()
            .filter(|p| p.id.is_private())
            .flat_map(|p| p.blocks.iter())
            .map(|(_, size, _, _)| size)
            .sum()
    }

    fn config_string(&self) -> String {
        self.cfg.canonical()
    }

    fn malloc(
        &mut self,
        dev: &mut dyn Device,
        req: &AllocRequest,
        out: &mut Vec<ModelEvent>,
    ) -> Result<u64, OomInfo> {
        let orig = req.size_bytes;
        let stream = req.stream;
        let size = self.round_size(orig);
        let small = size <= SMALL_SIZE_BYTES;
        let pool = self.pool_index(req.pool, small);
        let alloc_size = self.allocation_size(size);
        let hit = self.get_free_block(pool, stream, size);
        let indexed = hit.map(|(_, at)| at);
        let mut found = hit.map(|(i, _)| i);
        self.rejected = false;
        if found.is_none() {
            if self.gc_enabled() {
                self.garbage_collect(dev, out);
            }
            found = self.alloc_block(dev, pool, stream, size, alloc_size, false, out);
            // A first attempt rejected by throw_on_cudamalloc_oom skips the
            // release-and-retry ladder; a rejection inside the ladder does not stop it.
            if found.is_none() && !self.rejected {
                if self.release_available_cached_blocks(dev, pool, stream, size, out) {
                    found = self.alloc_block(dev, pool, stream, size, alloc_size, false, out);
                }
                if found.is_none() {
                    self.release_cached_blocks(dev, out);
                    found = self.alloc_block(dev, pool, stream, size, alloc_size, true, out);
                }
            }
        }
        if found.is_none() && self.rejected {
            // PyTorch returns without an `oom` entry and without counting `num_ooms`.
            let (pool_free, holes, largest) = self.pool_stream_free(pool, stream);
            return Err(OomInfo {
                rounded_bytes: size,
                alloc_bytes: alloc_size,
                reserved_bytes: self.reserved_bytes,
                allocated_bytes: self.allocated_bytes,
                largest_free_bytes: largest,
                free_holes: holes,
                pool_free_bytes: pool_free,
                reason: format!(
                    "throw_on_cudamalloc_oom rejected a new {} segment: {} reserved would pass {} \
                     (per_process_memory_fraction × total memory)",
                    crate::units::format_size(alloc_size),
                    crate::units::format_size(self.reserved_bytes + alloc_size),
                    crate::units::format_size(self.rejection_limit_bytes())
                ),
            });
        }
        let Some(i) = found else {
            self.num_ooms += 1;
            let (pool_free, holes, largest) = self.pool_stream_free(pool, stream);
            let device_free = dev.free_bytes();
            out.push(ModelEvent {
                action: Action::Oom,
                addr: device_free,
                size,
                stream,
            });
            let reason = match self.limit_bytes {
                Some(l) if self.reserved_bytes + alloc_size > l => format!(
                    "the capacity of {} would be exceeded by a new {} segment",
                    crate::units::format_size(l),
                    crate::units::format_size(alloc_size)
                ),
                _ => "the device refused a new segment".to_string(),
            };
            return Err(OomInfo {
                rounded_bytes: size,
                alloc_bytes: alloc_size,
                reserved_bytes: self.reserved_bytes,
                allocated_bytes: self.allocated_bytes,
                largest_free_bytes: largest,
                free_holes: holes,
                pool_free_bytes: pool_free,
                reason,
            });
        };
        let split = self.should_split(i, size);
        let blk = self.alloc_found_block(i, orig, size, split, indexed);
        let addr = self.b(blk).addr;
        out.push(ModelEvent {
            action: Action::Alloc,
            addr,
            size: orig,
            stream: self.b(blk).stream,
        });
        Ok(addr)
    }

    fn free(
        &mut self,
        _dev: &mut dyn Device,
        addr: u64,
        deferred: bool,
        out: &mut Vec<ModelEvent>,
    ) -> Result<(), ModelError> {
        // One lookup: the entry goes at once unless the free waits for other streams.
        let Entry::Occupied(e) = self.active.entry(addr) else {
            return Err(ModelError::UnknownAddress(addr));
        };
        let i = *e.get();
        if !self.blocks[i as usize].allocated {
            return Err(ModelError::UnknownAddress(addr));
        }
        if !deferred {
            e.remove();
        }
        let (size, req, stream) = (self.b(i).size, self.b(i).requested, self.b(i).stream);
        self.allocated_bytes -= size;
        out.push(ModelEvent {
            action: Action::FreeRequested,
            addr,
            size: req,
            stream,
        });
        if deferred {
            let b = self.bm(i);
            b.allocated = false;
            b.pending = true;
            self.pending_order.push(i);
        } else {
            self.free_block(i, out);
        }
        Ok(())
    }

    fn complete_free(
        &mut self,
        _dev: &mut dyn Device,
        addr: u64,
        out: &mut Vec<ModelEvent>,
    ) -> Result<(), ModelError> {
        let Entry::Occupied(e) = self.active.entry(addr) else {
            return Err(ModelError::NotPending(addr));
        };
        let i = *e.get();
        if !self.blocks[i as usize].pending {
            return Err(ModelError::NotPending(addr));
        }
        e.remove();
        self.pending_order.retain(|&p| p != i);
        self.free_block(i, out);
        Ok(())
    }

    fn empty_cache(&mut self, dev: &mut dyn Device, out: &mut Vec<ModelEvent>) {
        self.release_cached_blocks(dev, out);
    }

    /// `setSegmentStateToCheckpoint`: the block of `req.size_bytes` at `addr` is taken
    /// straight from the free block that starts there, in that block's own pool (small or
    /// large by the segment, not by the size), split whenever bytes remain
    /// (`split = curr_block->size - block_state.size > 0`, not `should_split`), and its
    /// requested size is the block size. Where no such block of the request's pool and
    /// stream is free (a what-if replay laid memory out differently), a malloc serves it.
    fn alloc_at(
        &mut self,
        dev: &mut dyn Device,
        req: &AllocRequest,
        addr: u64,
        out: &mut Vec<ModelEvent>,
    ) -> Result<u64, OomInfo> {
        let size = req.size_bytes;
        let found = self.free_block_starting_at(addr).filter(|&(i, _, bsize)| {
            let b = self.b(i);
            bsize >= size
                && size > 0
                && b.stream == req.stream
                && self.pools[b.pool as usize].id == req.pool
        });
        let Some((i, at, bsize)) = found else {
            return self.malloc(dev, req, out);
        };
        let blk = self.alloc_found_block(i, size, size, bsize > size, Some(at));
        out.push(ModelEvent {
            action: Action::Alloc,
            addr,
            size,
            stream: self.b(blk).stream,
        });
        Ok(addr)
    }

    fn release_pool(&mut self, pool: PoolId) {
        if self.private.contains_key(&pool) {
            self.freeable.insert(pool);
        }
    }

    #[inline]
    fn stats(&self) -> ModelStats {
        ModelStats {
            reserved_bytes: self.reserved_bytes,
            allocated_bytes: self.allocated_bytes,
            requested_bytes: self.requested_bytes,
            largest_free_bytes: self.largest_free(),
            free_holes: self.free_holes,
            segment_ops: self.segment_ops,
        }
    }

    fn layout(&self) -> Layout {
        let mut segs: Vec<LayoutSegment> = Vec::new();
        // Walk every live segment's block chain from its lowest block.
        let mut heads: Vec<u32> = Vec::new();
        let mut live_block = vec![false; self.blocks.len()];
        for (i, b) in self.blocks.iter().enumerate() {
            let _ = b;
            live_block[i] = true;
        }
        for &f in &self.free_slots {
            live_block[f as usize] = false;
        }
        for (i, b) in self.blocks.iter().enumerate() {
            if live_block[i] && b.prev == NIL && self.segments[b.seg as usize].live {
                heads.push(i as u32);
            }
        }
        for h in heads {
            let s = &self.segments[self.b(h).seg as usize];
            let mut blocks = Vec::new();
            let mut x = h;
            while x != NIL {
                let b = self.b(x);
                let state = if b.allocated {
                    LayoutBlockState::Allocated
                } else if b.pending {
                    LayoutBlockState::PendingFree
                } else if !b.mapped {
                    LayoutBlockState::Unmapped
                } else {
                    LayoutBlockState::Free
                };
                blocks.push(LayoutBlock {
                    addr: b.addr,
                    size_bytes: b.size,
                    requested_bytes: b.requested,
                    state,
                });
                x = b.next;
            }
            let p = &self.pools[s.pool as usize];
            segs.push(LayoutSegment {
                addr: s.base,
                size_bytes: s.size,
                stream: s.stream,
                pool: p.id,
                small: p.small,
                expandable: s.expandable,
                blocks,
            });
        }
        segs.sort_by_key(|s| (s.pool, s.stream, s.addr));
        Layout { segments: segs }
    }

    fn check_invariants(&self) -> Result<(), String> {
        let layout = self.layout();
        let mut reserved = 0u64;
        let mut allocated = 0u64;
        let mut free_count = 0u64;
        for s in &layout.segments {
            let mut at = s.addr;
            let mut prev_free_state: Option<LayoutBlockState> = None;
            for b in &s.blocks {
                if b.addr != at {
                    return Err(format!(
                        "segment {:#x}: block at {:#x} does not follow the previous one (expected {at:#x})",
                        s.addr, b.addr
                    ));
                }
                if b.size_bytes == 0 {
                    return Err(format!(
                        "segment {:#x}: empty block at {:#x}",
                        s.addr, b.addr
                    ));
                }
                at += b.size_bytes;
                match b.state {
                    LayoutBlockState::Allocated => allocated += b.size_bytes,
                    LayoutBlockState::Free => free_count += 1,
                    _ => {}
                }
                let mergeable =
                    matches!(b.state, LayoutBlockState::Free | LayoutBlockState::Unmapped);
                if mergeable && prev_free_state == Some(b.state) {
                    return Err(format!(
                        "segment {:#x}: two adjacent {:?} blocks at {:#x}",
                        s.addr, b.state, b.addr
                    ));
                }
                prev_free_state = if mergeable { Some(b.state) } else { None };
                if b.state != LayoutBlockState::Unmapped {
                    reserved += b.size_bytes;
                }
            }
            if at != s.addr + s.size_bytes {
                return Err(format!(
                    "segment {:#x}: blocks cover {} bytes of {}",
                    s.addr,
                    at - s.addr,
                    s.size_bytes
                ));
            }
            if s.small && !s.expandable && s.size_bytes != SMALL_BUFFER_BYTES {
                return Err(format!(
                    "small segment {:#x} is {} bytes, not 2 MiB",
                    s.addr, s.size_bytes
                ));
            }
        }
        if reserved != self.reserved_bytes {
            return Err(format!(
                "reserved {} != sum of mapped blocks {}",
                self.reserved_bytes, reserved
            ));
        }
        if allocated != self.allocated_bytes {
            return Err(format!(
                "allocated {} != sum of allocated blocks {}",
                self.allocated_bytes, allocated
            ));
        }
        let indexed: u64 = self.pools.iter().map(|p| p.blocks.len() as u64).sum();
        if indexed != free_count || free_count != self.free_holes {
            return Err(format!(
                "free blocks: {free_count} in segments, {indexed} in pools, {} counted",
                self.free_holes
            ));
        }
        for p in &self.pools {
            p.blocks.check()?;
            for (stream, size, addr, i) in p.blocks.iter() {
                let b = self.b(i);
                if (b.stream, b.size, b.addr) != (stream, size, addr)
                    || b.allocated
                    || b.pending
                    || !b.mapped
                {
                    return Err(format!(
                        "pool index entry {:?} does not match its block",
                        (stream, size, addr)
                    ));
                }
            }
        }
        if let Some(l) = self.largest_free_cache.get()
            && l != self.compute_largest_free()
        {
            return Err(format!(
                "cached largest free block {l} != {}",
                self.compute_largest_free()
            ));
        }
        Ok(())
    }

    fn clone_box(&self) -> Box<dyn Allocator> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests;
