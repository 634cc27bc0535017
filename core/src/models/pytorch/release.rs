//! The free path: a program's free (at once, or deferred until its streams' events
//! complete), and the releases of cached segments back to the device — one block
//! (`release_block`), a pool (`release_blocks`), everything cached
//! (`release_cached_blocks`: `empty_cache()` and the ladder's last step, default pools
//! first, then the freeable private pools in `graph_pools_freeable` order), and the
//! ladder's first step (`release_available_cached_blocks`): §5.6, §5.7, §6.

use super::{DEFAULT_LARGE, DEFAULT_SMALL, PyTorchModel};
use crate::device::Device;
use crate::models::{ModelError, ModelEvent};
use crate::snapshot::Action;
use std::collections::hash_map::Entry;

impl PyTorchModel {
    /// `release_block`: cudaFree of a whole cached segment.
    pub(super) fn release_block(
        &mut self,
        dev: &mut dyn Device,
        i: u32,
        out: &mut Vec<ModelEvent>,
    ) {
        self.remove_free(i);
        let (addr, size, stream, seg) = {
            let b = self.b(i);
            (b.addr, b.size, b.stream, b.seg)
        };
        dev.free(addr, size);
        self.reserved_bytes -= size;
        self.segment_ops += 1;
        self.retire_segment(seg);
        self.delete_block(i);
        out.push(ModelEvent {
            action: Action::SegmentFree,
            addr,
            size,
            stream,
        });
    }

    /// `release_blocks(pool)` (§5.7, §7.4).
    pub(super) fn release_blocks(
        &mut self,
        dev: &mut dyn Device,
        pool: u32,
        out: &mut Vec<ModelEvent>,
    ) {
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
                self.retire_segment(segi);
                self.delete_block(i);
            }
        }
    }

    /// Completes every pending free (`synchronize_and_free_events`).
    pub(super) fn synchronize_and_free_events(&mut self, out: &mut Vec<ModelEvent>) {
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
    pub(super) fn release_cached_blocks(
        &mut self,
        dev: &mut dyn Device,
        out: &mut Vec<ModelEvent>,
    ) {
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
    pub(super) fn release_available_cached_blocks(
        &mut self,
        dev: &mut dyn Device,
        pool: u32,
        stream: u64,
        size: u64,
        out: &mut Vec<ModelEvent>,
    ) -> bool {
        let (blocks, enough) =
            self.available_release(pool, stream, size, self.cfg.max_split_size_bytes);
        for v in blocks {
            self.release_block(dev, v, out);
        }
        enough
    }

    /// What `release_available_cached_blocks` releases for a request of `size` in `pool`
    /// on `stream` under the split limit `m` (the model's own, or one `core::prefix`
    /// compares it with), and whether it answers that enough was released. Changes
    /// nothing.
    pub(super) fn available_release(
        &self,
        pool: u32,
        stream: u64,
        size: u64,
        m: u64,
    ) -> (Vec<u32>, bool) {
        if m == u64::MAX {
            return (Vec::new(), false);
        }
        let key_size = size.max(m);
        // Only a block that is a whole segment can be released. PyTorch never splits a
        // block of max_split_size or more, so it checks only for expandable segments; a
        // start state rebuilt from a hostile or inconsistent snapshot can hold such a
        // split block, and releasing it would free part of a segment.
        let releasable = |v: u32| !self.is_expandable(v) && !self.is_split(v);
        let p = &self.pools[pool as usize];
        if let Some((_, _, v)) = p.blocks.at_least(stream, key_size).next()
            && releasable(v)
        {
            return (vec![v], true);
        }
        // Releasing one whole segment changes neither another block's segment nor the
        // list taken before the first release.
        let mut blocks = Vec::new();
        let mut released = 0;
        for (size, _, v) in p.blocks.below_size_rev(stream, key_size) {
            if released >= key_size || size < m {
                break;
            }
            if releasable(v) {
                released += size;
                blocks.push(v);
            }
        }
        (blocks, released >= key_size)
    }

    /// `free`: a block the program frees, at once or (`deferred`) once its streams' events
    /// complete.
    #[inline]
    pub(super) fn free_request(
        &mut self,
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

    /// The completion of a deferred free: the block goes back to its pool.
    pub(super) fn complete_pending(
        &mut self,
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
}
