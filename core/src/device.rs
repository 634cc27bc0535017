//! Devices: what hands segments to an allocator model and can refuse them (DESIGN.md).
//! The simulated device lives here; the CUDA device is in the native-backend crate.

use std::collections::BTreeMap;

/// The device refused memory (`cudaErrorMemoryAllocation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the device is out of memory")]
pub struct DeviceOom;

/// The device interface a model allocates its segments from: cudaMalloc/cudaFree for
/// plain segments, and the VMM calls for expandable segments.
pub trait Device {
    /// `cudaMalloc(size)`: a new segment's base address.
    fn malloc(&mut self, size: u64, stream: u64) -> Result<u64, DeviceOom>;
    /// `cudaFree` of a segment returned by [`Device::malloc`].
    fn free(&mut self, addr: u64, size: u64);
    /// `cuMemAddressReserve(size)`: virtual address space, no memory.
    fn reserve(&mut self, size: u64, page: u64, stream: u64) -> Result<u64, DeviceOom>;
    /// Releases a reservation made by [`Device::reserve`].
    fn release(&mut self, addr: u64, size: u64);
    /// `cuMemCreate` + `cuMemMap` of `[addr, addr + size)` inside a reservation.
    fn map(&mut self, addr: u64, size: u64, stream: u64) -> Result<(), DeviceOom>;
    /// `cuMemUnmap` + `cuMemRelease` of `[addr, addr + size)`.
    fn unmap(&mut self, addr: u64, size: u64);
    /// Free device memory as `cudaMemGetInfo` reports it.
    fn free_bytes(&self) -> u64;
    /// A segment request of the model's current request matched nothing recorded (devices
    /// that follow a recording say where they stopped following). Default: never.
    fn diverged_at(&self) -> Option<u64> {
        None
    }
}

/// One recorded segment event the simulated device can follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordedSegmentOp {
    /// `segment_alloc(addr, size)`.
    Malloc { addr: u64, size: u64 },
    /// `segment_map(addr, size)`; `new_reservation` when it opens a new expandable segment.
    Map {
        addr: u64,
        size: u64,
        new_reservation: bool,
    },
}

const SYNTH_ALIGN: u64 = 2 << 20;
/// The synthetic segments' address range (8 TiB from `synth_base`).
const SYNTH_BYTES: u64 = 0x0800_0000_0000;

/// The simulated device: a capacity, a deterministic synthetic address layout, and
/// (optionally) a recording whose segment addresses it hands out while the model asks
/// for exactly what was recorded.
///
/// Synthetic policy (documented, deterministic): physical memory is counted in 2 MiB
/// pages; plain segments are placed first-fit at 2 MiB alignment in a synthetic range
/// above every recorded address; reservations are placed in a separate, higher range,
/// bump-allocated.
#[derive(Debug, Clone)]
pub struct SimulatedDevice {
    capacity_bytes: Option<u64>,
    used_bytes: u64,
    total_bytes: u64,
    follow: Vec<RecordedSegmentOp>,
    cursor: usize,
    following: bool,
    diverged_at_op: Option<u64>,
    ops: u64,
    /// Free address ranges of the synthetic heap: start → length.
    free_ranges: BTreeMap<u64, u64>,
    synth_base: u64,
    reserve_next: u64,
}

impl SimulatedDevice {
    /// A device of `total_bytes`, refusing beyond `capacity_bytes` (None: only the total).
    #[must_use]
    pub fn new(total_bytes: u64, capacity_bytes: Option<u64>) -> SimulatedDevice {
        let synth_base = 0x7000_0000_0000;
        let mut free_ranges = BTreeMap::new();
        free_ranges.insert(synth_base, SYNTH_BYTES);
        SimulatedDevice {
            capacity_bytes,
            used_bytes: 0,
            total_bytes,
            follow: Vec::new(),
            cursor: 0,
            following: false,
            diverged_at_op: None,
            ops: 0,
            free_ranges,
            synth_base,
            reserve_next: 0x6000_0000_0000,
        }
    }

    /// Follow a recording: hand out its addresses while requests match it one for one.
    #[must_use]
    pub fn following(mut self, ops: Vec<RecordedSegmentOp>) -> SimulatedDevice {
        self.follow = ops;
        self.following = true;
        self
    }

    /// Counts memory that was already in use before the replay starts (a trace's start
    /// state).
    pub fn preload(&mut self, bytes: u64) {
        self.used_bytes += bytes.div_ceil(SYNTH_ALIGN) * SYNTH_ALIGN;
    }

    /// Whether the device still follows the recording.
    #[must_use]
    pub fn is_following(&self) -> bool {
        self.following
    }

    /// Whether a `malloc` of `size` bytes would succeed now (`core::prefix` asks before
    /// a replay's next op).
    #[must_use]
    pub fn malloc_fits(&self, size: u64) -> bool {
        self.fits(size.div_ceil(SYNTH_ALIGN) * SYNTH_ALIGN)
    }

    fn fits(&self, size: u64) -> bool {
        let limit = self
            .capacity_bytes
            .unwrap_or(self.total_bytes)
            .min(self.total_bytes);
        self.used_bytes.saturating_add(size) <= limit
    }

    fn stop_following(&mut self) {
        if self.following {
            self.following = false;
            self.diverged_at_op = Some(self.ops);
        }
    }

    /// Whether `addr` starts inside a synthetic segment this device handed out and has not
    /// taken back (in the synthetic range, outside its free ranges).
    #[must_use]
    pub fn holds_synthetic(&self, addr: u64) -> bool {
        addr >= self.synth_base
            && addr < self.synth_base + SYNTH_BYTES
            && self
                .free_ranges
                .range(..=addr)
                .next_back()
                .is_none_or(|(&a, &l)| addr >= a + l)
    }

    fn synth_malloc(&mut self, size: u64) -> u64 {
        let len = size.div_ceil(SYNTH_ALIGN) * SYNTH_ALIGN;
        let found = self
            .free_ranges
            .iter()
            .find(|&(_, &l)| l >= len)
            .map(|(&a, &l)| (a, l));
        let Some((a, l)) = found else {
            // The synthetic range is 8 TiB; running out means an absurd workload.
            return self.synth_base;
        };
        self.free_ranges.remove(&a);
        if l > len {
            self.free_ranges.insert(a + len, l - len);
        }
        a
    }

    /// Takes `[addr, addr + size)` (in whole 2 MiB pages, as [`Self::synth_free`] gives
    /// it back) out of the synthetic heap's free ranges where it lies in them: a recorded
    /// segment handed out while following the recording may lie in the synthetic range (a
    /// recording this device made, e.g. `allocsim_core::record` of a workload), and the
    /// synthetic heap must not hand it out again while it is live (the model would get two
    /// segments over the same addresses).
    fn carve(&mut self, addr: u64, size: u64) {
        let end = addr.saturating_add(size.div_ceil(SYNTH_ALIGN) * SYNTH_ALIGN);
        let overlapping: Vec<(u64, u64)> = self
            .free_ranges
            .range(..end)
            .rev()
            .take_while(|&(&a, &l)| a + l > addr)
            .map(|(&a, &l)| (a, l))
            .collect();
        for (a, l) in overlapping {
            self.free_ranges.remove(&a);
            if a < addr {
                self.free_ranges.insert(a, addr - a);
            }
            if a + l > end {
                self.free_ranges.insert(end, a + l - end);
            }
        }
    }

    fn synth_free(&mut self, addr: u64, size: u64) {
        if addr < self.synth_base {
            return;
        }
        let mut start = addr;
        let mut len = size.div_ceil(SYNTH_ALIGN) * SYNTH_ALIGN;
        if let Some((&a, &l)) = self.free_ranges.range(..start).next_back()
            && a + l == start
        {
            self.free_ranges.remove(&a);
            start = a;
            len += l;
        }
        if let Some(&l) = self.free_ranges.get(&(start + len)) {
            self.free_ranges.remove(&(start + len));
            len += l;
        }
        self.free_ranges.insert(start, len);
    }
}

impl Device for SimulatedDevice {
    fn malloc(&mut self, size: u64, _stream: u64) -> Result<u64, DeviceOom> {
        let pages = size.div_ceil(SYNTH_ALIGN) * SYNTH_ALIGN;
        if !self.fits(pages) {
            return Err(DeviceOom);
        }
        self.ops += 1;
        self.used_bytes += pages;
        if self.following {
            if let Some(&RecordedSegmentOp::Malloc { addr, size: s }) = self.follow.get(self.cursor)
                && s == size
            {
                self.cursor += 1;
                self.carve(addr, size);
                return Ok(addr);
            }
            self.stop_following();
        }
        Ok(self.synth_malloc(size))
    }

    fn free(&mut self, addr: u64, size: u64) {
        self.ops += 1;
        self.used_bytes = self
            .used_bytes
            .saturating_sub(size.div_ceil(SYNTH_ALIGN) * SYNTH_ALIGN);
        self.synth_free(addr, size);
    }

    fn reserve(&mut self, size: u64, page: u64, _stream: u64) -> Result<u64, DeviceOom> {
        if self.following {
            if let Some(&RecordedSegmentOp::Map {
                addr,
                new_reservation: true,
                ..
            }) = self.follow.get(self.cursor)
            {
                return Ok(addr);
            }
            self.stop_following();
        }
        // Virtual ranges from 0x6000_0000_0000 up, never over the synthetic segments'
        // 8 TiB at `synth_base` (a range that would reach into them starts after them),
        // and never wrapping: a range past 2^64 is refused.
        let align = page.max(SYNTH_ALIGN);
        let len = size.div_ceil(align).checked_mul(align).ok_or(DeviceOom)?;
        let synth_end = self.synth_base + SYNTH_BYTES;
        let mut base = self.reserve_next.div_ceil(align) * align;
        if base < synth_end
            && base
                .checked_add(len)
                .is_none_or(|end| end > self.synth_base)
        {
            base = synth_end.div_ceil(align) * align;
        }
        self.reserve_next = base
            .checked_add(len)
            .and_then(|end| end.checked_add(align))
            .ok_or(DeviceOom)?;
        Ok(base)
    }

    fn release(&mut self, _addr: u64, _size: u64) {}

    fn map(&mut self, addr: u64, size: u64, _stream: u64) -> Result<(), DeviceOom> {
        if !self.fits(size) {
            return Err(DeviceOom);
        }
        self.ops += 1;
        self.used_bytes += size;
        if self.following {
            match self.follow.get(self.cursor) {
                Some(&RecordedSegmentOp::Map {
                    addr: a, size: s, ..
                }) if a == addr && s == size => self.cursor += 1,
                _ => self.stop_following(),
            }
        }
        Ok(())
    }

    fn unmap(&mut self, _addr: u64, size: u64) {
        self.ops += 1;
        self.used_bytes = self.used_bytes.saturating_sub(size);
    }

    fn free_bytes(&self) -> u64 {
        let limit = self
            .capacity_bytes
            .unwrap_or(self.total_bytes)
            .min(self.total_bytes);
        limit.saturating_sub(self.used_bytes)
    }

    fn diverged_at(&self) -> Option<u64> {
        self.diverged_at_op
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recording whose segments lie in the synthetic range (one this device made): the
    /// segments handed out while following it are never handed out again by the synthetic
    /// heap while live, and come back to it when freed (a replay of a recorded workload
    /// under another setting had two segments over the same addresses and a synthetic heap
    /// cut down to one segment).
    #[test]
    fn followed_segments_in_the_synthetic_range_are_not_handed_out_twice() {
        let base = 0x7000_0000_0000u64;
        let rec = vec![
            RecordedSegmentOp::Malloc {
                addr: base,
                size: 20 << 20,
            },
            RecordedSegmentOp::Malloc {
                addr: base + (40 << 20),
                size: 2 << 20,
            },
        ];
        let mut d = SimulatedDevice::new(u64::MAX, None).following(rec);
        assert_eq!(d.malloc(20 << 20, 0).unwrap(), base);
        assert_eq!(d.malloc(2 << 20, 0).unwrap(), base + (40 << 20));
        // Diverged: synthetic first-fit, around the two live recorded segments.
        let a = d.malloc(22 << 20, 0).unwrap();
        let b = d.malloc(4 << 20, 0).unwrap();
        assert!(!d.is_following());
        assert_eq!(a, base + (42 << 20));
        assert_eq!(b, base + (20 << 20));
        // The recorded ones come back when freed, and merge with their neighbours.
        d.free(base, 20 << 20);
        assert_eq!(d.malloc(20 << 20, 0).unwrap(), base);
        d.free(base + (40 << 20), 2 << 20);
        d.free(b, 4 << 20);
        assert_eq!(d.malloc(22 << 20, 0).unwrap(), base + (20 << 20));
    }

    /// A 128 TiB reservation (the largest request a recording can hold) never lands on the
    /// synthetic segments' range, and a range past 2^64 is refused, not wrapped (found by
    /// the structured fuzz target: vmm-stitch reserved over its own small segment).
    #[test]
    fn reservations_never_overlap_synthetic_segments_or_wrap() {
        let mut d = SimulatedDevice::new(u64::MAX, None);
        let big = d.reserve(1 << 47, 2 << 20, 0).unwrap();
        let seg = d.malloc(2 << 20, 0).unwrap();
        assert!(
            big >= seg + (2 << 20) || big + (1 << 47) <= seg,
            "reservation {big:#x} over segment {seg:#x}"
        );
        let next = d.reserve(2 << 20, 2 << 20, 0).unwrap();
        assert!(next >= big + (1 << 47), "{next:#x} inside {big:#x}");
        assert_eq!(d.reserve(u64::MAX - (1 << 20), 2 << 20, 0), Err(DeviceOom));
        // Small reservations keep their addresses (the outputs of real traces do not move).
        let mut fresh = SimulatedDevice::new(u64::MAX, None);
        assert_eq!(
            fresh.reserve(64 << 20, 2 << 20, 0).unwrap(),
            0x6000_0000_0000
        );
    }
}
