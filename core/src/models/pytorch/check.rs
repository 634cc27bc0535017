//! The model's layout (every live segment's blocks in address order) and its invariants:
//! blocks tile their segment, no two free (or unmapped) neighbours, small segments of
//! 2 MiB, the byte counters and the free index agree with the blocks.

use super::{NIL, PyTorchModel, SMALL_BUFFER_BYTES};
use crate::models::{Allocator, Layout, LayoutBlock, LayoutBlockState, LayoutSegment};

impl PyTorchModel {
    /// Every live segment with its blocks, ordered by (pool, stream, address).
    pub(super) fn segments_layout(&self) -> Layout {
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

    /// The invariants, checked on the layout and the indexes.
    pub(super) fn check(&self) -> Result<(), String> {
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
}
