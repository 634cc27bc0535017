//! The malloc path (§5): `get_free_block` (best fit by (stream, size, address) with the
//! oversize rules), `alloc_block` (a new segment or expandable pages, under the memory
//! limit and `throw_on_cudamalloc_oom`), `malloc` itself with its OOM ladder, and the
//! in-place allocation of a CUDA-graph checkpoint restore.

use super::free_index::FreePos;
use super::{Block, DEFAULT_LARGE, DEFAULT_SMALL, NIL, PyTorchModel, SMALL_SIZE_BYTES, Segment};
use crate::device::{Device, SimulatedDevice};
use crate::models::common::rounding::MAX_REQUEST_BYTES;
use crate::models::{AllocRequest, ModelEvent, OomInfo};
use crate::snapshot::Action;

/// What [`PyTorchModel::peek_malloc`] sees of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MallocPeek {
    /// The block size the request rounds to.
    pub rounded: u64,
    /// The size of the free block the search finds, before the oversize rules.
    pub found: Option<u64>,
    /// `get_free_block` takes that block.
    pub taken: bool,
}

impl PyTorchModel {
    /// `get_free_block` (§5.2).
    /// The block found and where its entry stands in the pool's index.
    pub(super) fn get_free_block(
        &mut self,
        pool: u32,
        stream: u64,
        size: u64,
    ) -> Option<(u32, FreePos)> {
        // PyTorch counts only where garbage collection is on; the count is read only
        // there (a block's age), so counting always changes no decision, and a replay of
        // the defaults carries the ages a collecting configuration forked from it needs
        // (`core::prefix`).
        self.pools[pool as usize].get_free_blocks_call_count += 1;
        let (bsize, idx, at) = self.best_free_block(pool, stream, size)?;
        if self.oversize_refuses(size, bsize, self.cfg.max_split_size_bytes) {
            return None;
        }
        // Still in the pool: `alloc_found_block` takes it out (or moves its entry to the
        // remainder of a split).
        Some((idx, at))
    }

    /// `get_free_block`'s oversize rules: a block of `max_split_size` or more is not
    /// taken for a smaller request, nor for a larger one if it would leave
    /// `max_non_split_rounding` or more unused. `m`: the `max_split_size` in bytes (the
    /// model's own, or another one `core::prefix` compares it with).
    #[must_use]
    pub fn oversize_refuses(&self, size: u64, bsize: u64, m: u64) -> bool {
        (size < m && bsize >= m)
            || (size >= m && bsize >= size.saturating_add(self.cfg.max_non_split_rounding_bytes))
    }

    /// `get_free_block`'s search before the oversize rules: the best fit for `size` on
    /// `stream` in `pool` (its size, the block, its place in the index). Changes nothing.
    #[inline]
    fn best_free_block(&self, pool: u32, stream: u64, size: u64) -> Option<(u64, u32, FreePos)> {
        let p = &self.pools[pool as usize];
        let mut it = p.blocks.at_least(stream, size);
        let (mut bsize, mut idx) = it.next().map(|(s, _, v)| (s, v))?;
        let mut at = it.pos();
        if self.any_expandable && self.segments[self.b(idx).seg as usize].expandable {
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
        Some((bsize, idx, at))
    }

    /// What `malloc` would do first with `req`, changing nothing (`core::prefix` asks where
    /// a setting can first act): the size it rounds to, the free block `get_free_block`'s
    /// search finds (its size, before the oversize rules), and whether it takes it (false:
    /// no block is taken, garbage collection and a new segment come next).
    #[must_use]
    pub fn peek_malloc(&self, req: &AllocRequest) -> MallocPeek {
        let rounded = self.round_size(req.size_bytes);
        let found = self
            .peek_pool(req, rounded)
            .and_then(|p| self.best_free_block(p, req.stream, rounded))
            .map(|(bsize, _, _)| bsize);
        let taken = found.is_some_and(|bsize| {
            !self.oversize_refuses(rounded, bsize, self.cfg.max_split_size_bytes)
        });
        MallocPeek {
            rounded,
            found,
            taken,
        }
    }

    /// Whether `alloc_block`'s first try for a request rounded to `rounded` certainly
    /// gets a new segment on `dev` (false: it may fail, and the release-and-retry ladder,
    /// which reads `max_split_size`, may follow). Expandable segments: never certain.
    /// Changes nothing (`core::prefix`).
    #[must_use]
    pub fn first_segment_fits(&self, rounded: u64, dev: &SimulatedDevice) -> bool {
        let alloc_size = self.allocation_size(rounded);
        !self.cfg.expandable_segments
            && self
                .limit_bytes
                .is_none_or(|l| self.reserved_bytes + alloc_size <= l)
            && !(self.cfg.throw_on_cudamalloc_oom
                && self.reserved_bytes + alloc_size > self.rejection_limit_bytes())
            && dev.malloc_fits(alloc_size)
    }

    /// The pool a malloc of `req` rounded to `rounded` searches, where it exists yet.
    fn peek_pool(&self, req: &AllocRequest, rounded: u64) -> Option<u32> {
        let small = rounded <= SMALL_SIZE_BYTES;
        if req.pool.is_private() {
            self.private
                .get(&req.pool)
                .map(|p| if small { p.small } else { p.large })
        } else {
            Some(if small { DEFAULT_SMALL } else { DEFAULT_LARGE })
        }
    }

    /// Whether `release_available_cached_blocks`, run now for `req` under the split
    /// limit `m`, would release a block (none: it answers as without a limit). Changes
    /// nothing (`core::prefix`).
    #[must_use]
    pub fn peek_releases(&self, req: &AllocRequest, m: u64) -> bool {
        let rounded = self.round_size(req.size_bytes);
        self.peek_pool(req, rounded).is_some_and(|p| {
            !self
                .available_release(p, req.stream, rounded, m)
                .0
                .is_empty()
        })
    }

    /// `alloc_block` (§5.5): a new segment (or mapped pages) for the request.
    #[allow(clippy::too_many_arguments)] // mirrors PyTorch's AllocParams fields one for one
    pub(super) fn alloc_block(
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
            stream,
            pool,
            seg,
            ..Block::FREE
        });
        out.push(ModelEvent {
            action: Action::SegmentAlloc,
            addr,
            size: alloc_size,
            stream,
        });
        Some(b)
    }

    /// `malloc` (§5): round, find a free block or a new segment (after garbage collection
    /// and, failing that, the release-and-retry ladder), split it, or report the OOM.
    pub(super) fn allocate(
        &mut self,
        dev: &mut dyn Device,
        req: &AllocRequest,
        out: &mut Vec<ModelEvent>,
    ) -> Result<u64, OomInfo> {
        let orig = req.size_bytes;
        let stream = req.stream;
        if orig > MAX_REQUEST_BYTES {
            return Err(self.too_large(dev, orig, stream, out));
        }
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
            return Err(self.rejected_oom(pool, stream, size, alloc_size));
        }
        let Some(i) = found else {
            return Err(self.out_of_memory(dev, pool, stream, size, alloc_size, out));
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

    /// `setSegmentStateToCheckpoint`: the block of `req.size_bytes` at `addr` is taken
    /// straight from the free block that starts there, in that block's own pool (small or
    /// large by the segment, not by the size), split whenever bytes remain
    /// (`split = curr_block->size - block_state.size > 0`, not `should_split`), and its
    /// requested size is the block size. Where no such block of the request's pool and
    /// stream is free (a what-if replay laid memory out differently), a malloc serves it.
    pub(super) fn allocate_at(
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
            return self.allocate(dev, req, out);
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
}
