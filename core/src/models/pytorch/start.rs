//! A rebuilt start state loaded into the model (a trace whose ring buffer wrapped,
//! pytorch-allocator.md §13.2): its segments, their live blocks and the free blocks between.

use super::{Block, NIL, PyTorchModel, SMALL_BUFFER_BYTES, Segment};

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
