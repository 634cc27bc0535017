//! The device calls: each counts a segment op and emits its trace event.

use super::{Arena, Segment, State};
use crate::device::{Device, DeviceOom};
use crate::models::ModelEvent;
use crate::models::common::rounding::device_bytes;
use crate::snapshot::Action;

impl Arena {
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

    /// A new ordinary segment of `size` bytes at `addr` (a `cudaMalloc` just made), one
    /// free block not yet indexed, under `tag`: the block.
    pub fn add_free_segment(&mut self, addr: u64, size: u64, stream: u64, tag: u64) -> u32 {
        self.add_segment(
            addr,
            size,
            device_bytes(size),
            stream,
            false,
            false,
            tag,
            State::Free,
        )
        .1
    }

    /// Returns to the device every entirely free segment that `which` accepts, in segment
    /// order; whether there was any.
    pub fn release_free_segments(
        &mut self,
        dev: &mut dyn Device,
        out: &mut Vec<ModelEvent>,
        which: impl Fn(&Segment) -> bool,
    ) -> bool {
        let free: Vec<u32> = self
            .segments()
            .filter(|(_, s)| {
                which(s) && {
                    let h = self.b(s.head);
                    h.state == State::Free && h.size == s.size
                }
            })
            .map(|(s, _)| s)
            .collect();
        for &s in &free {
            let _ = self.dev_free(dev, s, out);
        }
        !free.is_empty()
    }
}
