//! PyTorch's CUDA caching allocator (`DeviceCachingAllocator`, PyTorch 2.5–2.11), rule for
//! rule as shared/docs/pytorch-allocator.md describes it: rounding, small/large pools per
//! stream, best fit ordered by (stream, size, address), splitting and merging, the
//! oversize rules, the OOM ladder, the memory-fraction cap, garbage collection, deferred
//! frees, private pools and expandable segments.
//!
//! Config keys (`--config`, PyTorch's own syntax): `max_split_size_mb`,
//! `max_non_split_rounding_mb`, `roundup_power2_divisions`, `garbage_collection_threshold`,
//! `expandable_segments`, `large_segment_size_mb`, `per_process_memory_fraction`.
//!
//! One concern per file (§ are pytorch-allocator.md's), each an `impl PyTorchModel` over
//! the types here: `sizes` (§4), `blocks` (slots, the free index, split and merge: §5.9,
//! §6), `malloc` (§5 and its ladder), `release` (the free path and segment releases: §5.6,
//! §5.7, §6), `gc` (§5.4), `expandable` (§7), `oom` (the reports: §5.8), `start` (a
//! rebuilt start state: §13) and `check` (layout and invariants); [`config`],
//! `free_index` and `freeable` hold the config and the two indexes.

mod blocks;
mod check;
pub mod config;
mod expandable;
mod free_index;
mod freeable;
mod gc;
mod malloc;
mod oom;
mod release;
mod sizes;
mod start;

use free_index::{FreeIndex, FreePos};
use freeable::FreeablePools;

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasherDefault;
use std::sync::atomic::Ordering;

use super::common::AddrHasher;

pub use config::{PyTorchConfig, PyTorchConfigError};
pub use malloc::MallocPeek;

use super::{
    AllocRequest, Allocator, AllocatorKind, Layout, ModelError, ModelEvent, ModelStats, OomInfo,
    PoolId,
};
use crate::device::Device;

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

impl Block {
    /// The fields a free block starts with (mapped, in no chain, serving no request):
    /// `Block { addr, size, stream, pool, seg, ..Block::FREE }`.
    const FREE: Block = Block {
        addr: 0,
        size: 0,
        requested: 0,
        stream: 0,
        pool: 0,
        seg: 0,
        prev: NIL,
        next: NIL,
        allocated: false,
        pending: false,
        mapped: true,
        gc_base: 0,
    };
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

/// The live segments' address ranges in address order, `(base, end, slot)`, so that the
/// segment holding an address is found by a binary search rather than a walk over every
/// segment (the build asks for each malloc it groups). Kept only while no two live
/// segments overlap and no range wraps past the end of the address space: then at most one
/// live segment holds an address, the one the walk in slot order would find. Once that
/// fails (a diverging replay can be handed an address inside a live segment) the index
/// is given up for good and the walk answers.
#[derive(Debug, Default)]
struct SegmentIndex {
    ranges: Vec<(u64, u64, u32)>,
    given_up: bool,
    /// Where in `ranges` the last address was found: a hint, checked before it is used
    /// (the mallocs the build groups land in the same segment run after run).
    last: std::sync::atomic::AtomicUsize,
}

impl Clone for SegmentIndex {
    fn clone(&self) -> SegmentIndex {
        SegmentIndex {
            ranges: self.ranges.clone(),
            given_up: self.given_up,
            last: std::sync::atomic::AtomicUsize::new(
                self.last.load(std::sync::atomic::Ordering::Relaxed),
            ),
        }
    }
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
    /// Some segment was ever expandable: until then the best-fit search need not look a
    /// block's segment up.
    any_expandable: bool,
    /// The live segments by address (`blocks.rs`, [`SegmentIndex`]), for
    /// [`PyTorchModel::segment_of`].
    seg_index: SegmentIndex,
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
            any_expandable: false,
            seg_index: SegmentIndex::default(),
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

    /// The same state under configuration `cfg` from here on (`core::prefix` forks a
    /// replay of the defaults into another configuration where that one first acts).
    pub fn set_config(&mut self, cfg: PyTorchConfig) {
        self.cfg = cfg;
    }

    /// The bytes reserved from the device now.
    #[must_use]
    pub fn reserved_bytes(&self) -> u64 {
        self.reserved_bytes
    }

    /// The memory limit in force.
    #[must_use]
    pub fn limit_bytes(&self) -> Option<u64> {
        self.limit_bytes
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
        self.live_segment_at(addr).map(|s| {
            (
                self.pools[s.pool as usize].id,
                s.stream,
                self.pools[s.pool as usize].small,
            )
        })
    }

    /// The live segment holding `addr`: the first in slot order, found through the
    /// segment index while it is kept.
    fn live_segment_at(&self, addr: u64) -> Option<&Segment> {
        if self.seg_index.given_up {
            return self
                .segments
                .iter()
                .find(|s| s.live && addr >= s.base && addr < s.base + s.size);
        }
        let ranges = &self.seg_index.ranges;
        let hint = self.seg_index.last.load(Ordering::Relaxed);
        if let Some(&(base, end, slot)) = ranges.get(hint)
            && base <= addr
            && addr < end
        {
            return Some(&self.segments[slot as usize]);
        }
        let k = ranges.partition_point(|&(base, _, _)| base <= addr);
        let &(_, end, slot) = ranges.get(k.checked_sub(1)?)?;
        self.seg_index.last.store(k - 1, Ordering::Relaxed);
        (addr < end).then(|| &self.segments[slot as usize])
    }

    /// The free mapped block that starts at `addr`: its index, where its entry stands in
    /// its pool's index, and its size. A walk over the pool's free blocks of the segment's
    /// stream: only checkpoint restores need it.
    fn free_block_starting_at(&self, addr: u64) -> Option<(u32, FreePos, u64)> {
        let seg = self.live_segment_at(addr)?;
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

    #[inline]
    fn malloc(
        &mut self,
        dev: &mut dyn Device,
        req: &AllocRequest,
        out: &mut Vec<ModelEvent>,
    ) -> Result<u64, OomInfo> {
        self.allocate(dev, req, out)
    }

    #[inline]
    fn free(
        &mut self,
        _dev: &mut dyn Device,
        addr: u64,
        deferred: bool,
        out: &mut Vec<ModelEvent>,
    ) -> Result<(), ModelError> {
        self.free_request(addr, deferred, out)
    }

    fn complete_free(
        &mut self,
        _dev: &mut dyn Device,
        addr: u64,
        out: &mut Vec<ModelEvent>,
    ) -> Result<(), ModelError> {
        self.complete_pending(addr, out)
    }

    fn empty_cache(&mut self, dev: &mut dyn Device, out: &mut Vec<ModelEvent>) {
        self.release_cached_blocks(dev, out);
    }

    fn alloc_at(
        &mut self,
        dev: &mut dyn Device,
        req: &AllocRequest,
        addr: u64,
        out: &mut Vec<ModelEvent>,
    ) -> Result<u64, OomInfo> {
        self.allocate_at(dev, req, addr, out)
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
        self.segments_layout()
    }

    fn check_invariants(&self) -> Result<(), String> {
        self.check()
    }

    fn clone_box(&self) -> Box<dyn Allocator> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests;
