//! Expandable segments (§7, `expandable_segments:True`): one reserved range per pool and
//! stream, mapped and unmapped a page at a time; finding the unmapped range a request can
//! grow into, mapping it, and unmapping a free block's whole pages on release.

use super::{Block, NIL, PyTorchModel, SMALL_BUFFER_BYTES, Segment};
use crate::device::Device;
use crate::models::ModelEvent;
use crate::snapshot::Action;

impl PyTorchModel {
    /// `find_expandable_block` (§7.2 step 1).
    pub(super) fn find_expandable_block(
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
            stream,
            pool,
            seg,
            mapped: false,
            ..Block::FREE
        });
        self.insert_unmapped(b);
        Some(b)
    }

    /// `map_block` (§7.2): maps the pages covering the first `size` bytes of the unmapped
    /// block `b`; returns the (merged) free block.
    pub(super) fn map_block(
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
                stream,
                pool: self.b(b).pool,
                seg: self.b(b).seg,
                prev: b,
                next: self.b(b).next,
                mapped: false,
                ..Block::FREE
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
    pub(super) fn try_allocate_expandable_block(
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

    /// `unmap_block` (§7.4): unmaps the whole pages inside a free mapped block.
    pub(super) fn unmap_block(&mut self, dev: &mut dyn Device, i: u32, out: &mut Vec<ModelEvent>) {
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
                stream,
                pool,
                seg: segi,
                prev,
                next: i,
                ..Block::FREE
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
                stream,
                pool,
                seg: segi,
                prev: i,
                next,
                ..Block::FREE
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
}
