//! The layout export and the invariant check.

use std::collections::BTreeMap;

use super::{Arena, Block, NIL, State};
use crate::models::{Layout, LayoutBlock, LayoutBlockState, LayoutSegment, PoolId};

impl Arena {
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
