//! `rmm-pool`: RAPIDS RMM's `pool_memory_resource`, a coalescing best-fit suballocator over
//! upstream `cudaMalloc` blocks, with RMM's per-stream free lists
//! (`stream_ordered_memory_resource`), after `rapidsai/rmm` (peers.md §B.3).
//!
//! Facts it rests on:
//! - Sizes are aligned up to 256 bytes (`CUDA_ALLOCATION_ALIGNMENT`).
//! - Best fit: the smallest free block that fits, the lowest address among equals (the
//!   address-ordered list and `std::min_element`). The allocation takes the block's low end,
//!   the remainder goes back to the list the block came from.
//! - Freed blocks go to their stream's list and merge with contiguous free blocks of that
//!   list, but never across upstream blocks (a "head" block never merges with its
//!   predecessor): growth leaves permanent seams (rmm#1957).
//! - Order of attempts (`get_block`): the request's own stream list; another stream's list
//!   (taking its best fit, after a `cudaStreamWaitEvent`); merging other streams' lists into
//!   this one, one at a time, until a block fits; growing the pool. Other streams are tried
//!   in the order they first appeared (RMM orders them by the handle of the event it
//!   creates at a stream's first use; a trace does not record handles).
//! - Growth (`size_to_grow`, `try_to_expand`): with a maximum pool size, by
//!   `max(size, remaining / 2)` (nothing when the request exceeds what remains); without,
//!   by `max(size, pool_size)` — doubling. When the upstream refuses, the try size halves,
//!   down to the request size; then the request fails.
//! - The initial pool is one upstream block on the default stream's list; RMM's Python
//!   default is half the free device memory (`initial_pool_size_mb` sets it; this model's
//!   default is an empty pool so that reserved memory reflects the trace).
//! - Nothing is returned to the device before destruction: `empty_cache` does nothing
//!   (RMM 26's reclaim of free upstream blocks under a maximum is not modelled).
//!
//! Private pools make no difference; a zero-byte request is served as 256 bytes.
//!
//! Config keys: `initial_pool_size_mb` (0), `maximum_pool_size_mb` (unset).

use super::AllocatorKind;
use super::common::{self, Arena, FreeKey, State, round_up};
use super::common::{ArenaPolicy, Block, Refusal, StreamLists};
use super::{AllocRequest, ModelEvent};
use crate::device::Device;
use crate::models::common::policy::arena_accessors;
use crate::units::format_size;

/// `CUDA_ALLOCATION_ALIGNMENT`.
pub const ALIGNMENT_BYTES: u64 = 256;

/// The options a config string sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RmmPoolConfig {
    pub initial_pool_bytes: u64,
    pub maximum_pool_bytes: Option<u64>,
}

impl RmmPoolConfig {
    /// Parses `key:value,…` on top of the defaults.
    pub fn parse(conf: &str) -> Result<RmmPoolConfig, common::ConfigError> {
        let kv = common::parse_config(
            AllocatorKind::RmmPool,
            conf,
            &["initial_pool_size_mb", "maximum_pool_size_mb"],
        )?;
        let mut c = RmmPoolConfig {
            initial_pool_bytes: 0,
            maximum_pool_bytes: None,
        };
        for (k, v) in kv {
            let bytes = common::parse_mib(AllocatorKind::RmmPool, k, v)?;
            if k == "initial_pool_size_mb" {
                c.initial_pool_bytes = bytes;
            } else {
                c.maximum_pool_bytes = Some(bytes);
            }
        }
        if let Some(m) = c.maximum_pool_bytes
            && c.initial_pool_bytes > m
        {
            return Err(common::ConfigError::Inconsistent {
                model: AllocatorKind::RmmPool,
                reason: "Initial pool size exceeds the maximum pool size!",
            });
        }
        Ok(c)
    }

    /// The options that differ from the defaults.
    #[must_use]
    pub fn canonical(&self) -> String {
        common::join_options([
            (self.initial_pool_bytes > 0).then(|| {
                format!(
                    "initial_pool_size_mb:{}",
                    common::fmt_mib(self.initial_pool_bytes)
                )
            }),
            self.maximum_pool_bytes
                .map(|m| format!("maximum_pool_size_mb:{}", common::fmt_mib(m))),
        ])
    }
}

/// The RMM pool of one device.
#[derive(Debug, Clone)]
pub struct RmmPoolModel {
    cfg: RmmPoolConfig,
    arena: Arena,
    initialized: bool,
    /// `current_pool_size_`: Σ upstream block sizes.
    pool_bytes: u64,
    /// The streams in the order they first appeared; a free list is named by its rank
    /// there (a block's `owner`).
    streams: StreamLists,
}

fn key(b: &common::Block) -> FreeKey {
    FreeKey::new(b.owner, b.size, b.addr)
}

impl RmmPoolModel {
    /// A model with this configuration.
    #[must_use]
    pub fn new(cfg: RmmPoolConfig) -> RmmPoolModel {
        RmmPoolModel {
            cfg,
            arena: Arena::new(),
            initialized: false,
            pool_bytes: 0,
            streams: StreamLists::default(),
        }
    }

    /// Inserts free block `i` into `list`, merging with contiguous blocks of that list.
    fn insert_block(&mut self, i: u32, list: u64) {
        self.arena.bm(i).owner = list;
        let m = self.arena.coalesce(i, |n| n.owner == list);
        let k = key(self.arena.b(m));
        self.arena.insert_free(m, k);
    }

    /// The best fit in `list`.
    fn best_fit(&self, list: u64, size: u64) -> Option<u32> {
        self.arena
            .first_free_from(FreeKey::new(list, size, 0))
            .filter(|(k, _)| k.a() == list)
            .map(|(_, i)| i)
    }

    /// The lists with free blocks, in the order their streams first appeared.
    fn lists(&self) -> Vec<u64> {
        let mut out = Vec::new();
        let mut from = FreeKey::new(0, 0, 0);
        while let Some((k, _)) = self.arena.first_free_from(from) {
            out.push(k.a());
            from = FreeKey::new(k.a() + 1, 0, 0);
        }
        out
    }

    /// `allocate_and_insert_remainder`: takes `size` bytes off the low end of free block `i`.
    fn take(&mut self, i: u32, size: u64) -> u32 {
        let list = self.arena.b(i).owner;
        self.arena.remove_free(i);
        if self.arena.b(i).size > size {
            let t = self.arena.split(i, size);
            let k = key(self.arena.b(t));
            self.arena.insert_free(t, k);
        }
        let _ = list;
        i
    }

    /// `try_to_expand`: an upstream block of `try_size`, halving down to `min_size`.
    fn try_to_expand(
        &mut self,
        dev: &mut dyn Device,
        mut try_size: u64,
        min_size: u64,
        stream: u64,
        out: &mut Vec<ModelEvent>,
    ) -> Result<u32, String> {
        while try_size >= min_size && try_size > 0 {
            if let Ok(addr) = self.arena.dev_malloc(dev, try_size, stream, out) {
                self.pool_bytes += try_size;
                let b = self.arena.add_free_segment(addr, try_size, stream, 0);
                let list = self.streams.list_of(stream);
                self.arena.bm(b).owner = list;
                return Ok(b);
            }
            if try_size == min_size {
                return Err(format!(
                    "the device refused an upstream block of {} ({} free)",
                    format_size(min_size),
                    format_size(dev.free_bytes())
                ));
            }
            try_size = min_size.max(try_size / 2);
        }
        let max = self
            .cfg
            .maximum_pool_bytes
            .map_or_else(|| "unlimited".to_string(), format_size);
        Err(format!(
            "Not enough room to grow, current/max/try size = {}, {max}, {}",
            format_size(self.pool_bytes),
            format_size(min_size)
        ))
    }

    /// `size_to_grow`.
    fn size_to_grow(&self, size: u64) -> u64 {
        match self.cfg.maximum_pool_bytes {
            Some(max) => {
                let remaining = round_up(max.saturating_sub(self.pool_bytes), ALIGNMENT_BYTES);
                let aligned = round_up(size, ALIGNMENT_BYTES);
                if aligned <= remaining {
                    aligned.max(remaining / 2)
                } else {
                    0
                }
            }
            None => size.max(self.pool_bytes),
        }
    }

    /// `get_block`.
    #[inline]
    fn get_block(
        &mut self,
        dev: &mut dyn Device,
        size: u64,
        stream: u64,
        out: &mut Vec<ModelEvent>,
    ) -> Result<u32, String> {
        let list = self.streams.list_of(stream);
        if let Some(i) = self.best_fit(list, size) {
            return Ok(self.take(i, size));
        }
        let others: Vec<u64> = self.lists().into_iter().filter(|&l| l != list).collect();
        for &o in &others {
            if let Some(i) = self.best_fit(o, size) {
                return Ok(self.take(i, size));
            }
        }
        for &o in &others {
            let moved: Vec<u32> = self
                .arena
                .free_range(FreeKey::new(o, 0, 0), FreeKey::new(o + 1, 0, 0))
                .map(|(_, i)| i)
                .collect();
            for i in moved {
                // A block may already have been merged into an earlier one of this batch.
                if self.arena.is_indexed(i) && self.arena.b(i).owner == o {
                    self.arena.remove_free(i);
                    self.insert_block(i, list);
                }
            }
            if let Some(i) = self.best_fit(list, size) {
                return Ok(self.take(i, size));
            }
        }
        let grow = self.size_to_grow(size);
        let b = self.try_to_expand(dev, grow, size, stream, out)?;
        if self.arena.b(b).size > size {
            let t = self.arena.split(b, size);
            self.insert_block(t, list);
        }
        Ok(b)
    }
}

impl ArenaPolicy for RmmPoolModel {
    const KIND: AllocatorKind = AllocatorKind::RmmPool;

    arena_accessors!(cfg);

    #[inline]
    fn find(
        &mut self,
        dev: &mut dyn Device,
        req: &AllocRequest,
        out: &mut Vec<ModelEvent>,
    ) -> Result<u32, Refusal> {
        let size = round_up(req.size_bytes.max(1), ALIGNMENT_BYTES);
        let stream = req.stream;
        let mut result = Ok(());
        if !self.initialized {
            self.initialized = true;
            if self.cfg.initial_pool_bytes > 0 {
                let init = self.cfg.initial_pool_bytes;
                match self.try_to_expand(dev, init, init, 0, out) {
                    Ok(b) => {
                        let k = key(self.arena.b(b));
                        self.arena.insert_free(b, k);
                    }
                    Err(e) => result = Err(format!("the initial pool could not be allocated: {e}")),
                }
            }
        }
        result
            .and_then(|()| self.get_block(dev, size, stream, out))
            .map_err(|reason| {
                Refusal::new(
                    size,
                    self.size_to_grow(size).max(size),
                    format!(
                        "Maximum pool size exceeded (failed to allocate {}): {reason}",
                        format_size(size)
                    ),
                )
            })
    }

    fn put_back(&mut self, _dev: &mut dyn Device, i: u32, _out: &mut Vec<ModelEvent>) {
        let stream = self.arena.b(i).stream;
        let list = self.streams.list_of(stream);
        self.insert_block(i, list);
    }

    fn adjacent_free_ok(&self, a: &Block, b: &Block) -> bool {
        // Free neighbours may stay apart only when they sit in different stream lists.
        a.owner != b.owner
    }

    fn check_policy(&self) -> Result<(), String> {
        let total: u64 = self.arena.segments().map(|(_, s)| s.size).sum();
        if total != self.pool_bytes {
            return Err(format!(
                "pool size {} != Σ upstream blocks {total}",
                self.pool_bytes
            ));
        }
        if let Some(m) = self.cfg.maximum_pool_bytes
            && self.pool_bytes > m
        {
            return Err(format!(
                "pool size {} exceeds the maximum {m}",
                self.pool_bytes
            ));
        }
        // Upstream blocks may have any size (the try size halves), so only addresses and
        // allocated sizes are 256-aligned.
        for (s, _) in self.arena.segments() {
            for b in self.arena.seg_blocks(s) {
                let blk = self.arena.b(b);
                let aligned = blk.addr.is_multiple_of(ALIGNMENT_BYTES)
                    && (blk.state == State::Free || blk.size.is_multiple_of(ALIGNMENT_BYTES));
                if !aligned {
                    return Err(format!(
                        "block at {:#x} ({} bytes) breaks the 256-byte alignment",
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
    use crate::models::Allocator;
    use crate::models::common::testing::Run;

    const MIB: u64 = 1 << 20;

    impl Run<RmmPoolModel> {
        fn with(conf: &str, cap: Option<u64>) -> Self {
            Run::new(RmmPoolModel::new(RmmPoolConfig::parse(conf).unwrap()), cap)
        }

        fn upstream_sizes(&self) -> Vec<u64> {
            let mut v: Vec<(u64, u64)> = self
                .m
                .layout()
                .segments
                .iter()
                .map(|s| (s.addr, s.size_bytes))
                .collect();
            v.sort_unstable();
            v.into_iter().map(|(_, s)| s).collect()
        }
    }

    #[test]
    fn growth_doubles_without_a_maximum() {
        let mut r = Run::with("", None);
        r.alloc(MIB).unwrap(); // grow by max(1 MiB, 0)
        r.alloc(MIB).unwrap(); // grow by max(1 MiB, 1 MiB)
        r.alloc(MIB).unwrap(); // grow by max(1 MiB, 2 MiB): 1 MiB left over
        r.alloc(MIB).unwrap(); // fits in the leftover
        assert_eq!(r.upstream_sizes(), vec![MIB, MIB, 2 * MIB]);
        // Each upstream block holds whole device pages.
        assert_eq!(r.m.stats().reserved_bytes, 6 * MIB);
    }

    #[test]
    fn growth_takes_half_the_remaining_room_under_a_maximum() {
        let mut r = Run::with("maximum_pool_size_mb:100", None);
        r.alloc(MIB).unwrap(); // max(1 MiB, 100/2) = 50 MiB
        assert_eq!(r.upstream_sizes(), vec![50 * MIB]);
        let e = r.alloc(60 * MIB).unwrap_err(); // 60 MiB > the 50 MiB that remain
        assert!(e.reason.contains("Not enough room to grow"), "{}", e.reason);
        r.alloc(30 * MIB).unwrap(); // fits in the first block (49 MiB free)
        r.alloc(30 * MIB).unwrap(); // grow by max(30, 50/2) = 30 MiB
        assert_eq!(r.upstream_sizes(), vec![50 * MIB, 30 * MIB]);
    }

    #[test]
    fn growth_halves_the_try_when_the_device_refuses() {
        let mut r = Run::with("", Some(10 * MIB));
        r.alloc(4 * MIB).unwrap();
        r.alloc(4 * MIB).unwrap();
        // Try 8 MiB (refused: 2 MiB left), then 4 MiB (refused), then 2 MiB.
        r.alloc(MIB).unwrap();
        assert_eq!(r.upstream_sizes(), vec![4 * MIB, 4 * MIB, 2 * MIB]);
        assert!(r.alloc(4 * MIB).unwrap_err().reason.contains("refused"));
    }

    #[test]
    fn blocks_never_merge_across_upstream_blocks() {
        let mut r = Run::with("", None);
        let a = r.alloc(MIB).unwrap();
        let b = r.alloc(MIB).unwrap();
        r.free(a);
        r.free(b);
        // Two free 1 MiB blocks in two upstream blocks: a 2 MiB request grows the pool.
        r.alloc(2 * MIB).unwrap();
        assert_eq!(r.upstream_sizes(), vec![MIB, MIB, 2 * MIB]);
    }

    #[test]
    fn other_streams_are_stolen_from_then_merged() {
        let mut r = Run::with("initial_pool_size_mb:4", None);
        let a = r.alloc_on(2 * MIB, 1).unwrap(); // from the default stream's list
        let b = r.alloc_on(2 * MIB, 2).unwrap();
        r.free(a); // stream 1's list: [a]
        r.free(b); // stream 2's list: [b], contiguous with a but in another list
        assert_eq!(r.m.stats().free_holes, 2);
        // Stream 3: no single list fits 4 MiB; merging stream 1's then stream 2's list into
        // its own coalesces them.
        r.alloc_on(4 * MIB, 3).unwrap();
        assert_eq!(r.upstream_sizes(), vec![4 * MIB]);
    }

    #[test]
    fn config_errors_are_clear() {
        assert!(RmmPoolConfig::parse("initial_pool_size_mb:10,maximum_pool_size_mb:5").is_err());
        assert!(
            RmmPoolConfig::parse("pool:1")
                .unwrap_err()
                .to_string()
                .contains("unknown config key")
        );
        assert_eq!(
            RmmPoolConfig::parse("maximum_pool_size_mb:1.5")
                .unwrap()
                .canonical(),
            "maximum_pool_size_mb:1.5"
        );
    }
}
